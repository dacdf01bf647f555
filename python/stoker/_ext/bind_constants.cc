// Facts both languages read, exported from the C++ definitions so that Python never keeps a
// hand-copied list: the worker status page's fields in order, worker state names, control
// message types, log kinds, encode modes and the dtype names of the wire format.
#include <nanobind/stl/string.h>

#include <cstddef>
#include <string>
#include <utility>

#include "common.h"
#include "py_encode.h"
#include "stoker/channel.h"
#include "stoker/worker_status.h"

namespace stoker::py {
namespace {

// WorkerStatusPage, one name per uint64 word in memory order: the words before state_ns, then
// state_ns[kWorkerStateCount] (named "ns_<state>"), then the words after it. The asserts tie the
// lists to the struct: adding, moving or resizing a field without updating them does not compile.
constexpr const char* kBeforeStateNs[] = {"magic",    "pid",     "state",   "task",     "index",
                                          "since_ns", "samples", "batches", "rss_bytes"};
constexpr const char* kAfterStateNs[] = {"bytes_sent",       "worker_id", "loader_token",
                                         "position",         "in_flight", "ready_cpu_ns",
                                         "ready_runqueue_ns"};
constexpr size_t kBefore = sizeof(kBeforeStateNs) / sizeof(kBeforeStateNs[0]);
constexpr size_t kAfter = sizeof(kAfterStateNs) / sizeof(kAfterStateNs[0]);
static_assert(sizeof(WorkerStatusPage) == 8 * (kBefore + kWorkerStateCount + kAfter),
              "the status field names are out of date");
static_assert(offsetof(WorkerStatusPage, state_ns) == 8 * kBefore,
              "the status field names are out of date");
static_assert(offsetof(WorkerStatusPage, bytes_sent) == 8 * (kBefore + kWorkerStateCount),
              "the status field names are out of date");

constexpr std::pair<const char*, MessageType> kMessages[] = {
    {"TASK", MessageType::kTask},
    {"RESUME", MessageType::kResume},
    {"STOP", MessageType::kStop},
    {"LIMIT", MessageType::kLimit},
    {"SLOT_NEW", MessageType::kSlotNew},
    {"SLOT_RETIRE", MessageType::kSlotRetire},
    {"BATCH", MessageType::kBatch},
    {"ERROR", MessageType::kError},
    {"END", MessageType::kEnd},
    {"RESUMED", MessageType::kResumed},
    {"HELLO", MessageType::kHello},
    {"STATUS_PAGE", MessageType::kStatusPage},
    {"LOG_FILE", MessageType::kLogFile},
    {"SKIPPED", MessageType::kSkipped},
    {"ITER_STATE", MessageType::kIterState},
};

}  // namespace

void register_constants(nb::module_& m) {
  nb::list fields;
  for (const char* name : kBeforeStateNs) fields.append(name);
  for (int s = 0; s < kWorkerStateCount; ++s) {
    fields.append(std::string("ns_") + WorkerStateName(static_cast<uint64_t>(s)));
  }
  for (const char* name : kAfterStateNs) fields.append(name);
  m.attr("STATUS_FIELDS") = nb::tuple(fields);
  m.attr("STATUS_PAGE_BYTES") = sizeof(WorkerStatusPage);
  m.attr("STATUS_MAGIC") = kStatusMagic;
  m.attr("NO_INDEX") = kNoIndex;

  nb::list states;
  for (int s = 0; s < kWorkerStateCount; ++s) {
    states.append(WorkerStateName(static_cast<uint64_t>(s)));
  }
  m.attr("WORKER_STATES") = nb::tuple(states);
  m.attr("STATE_STARTING") = static_cast<int>(WorkerState::kStarting);
  m.attr("STATE_IDLE") = static_cast<int>(WorkerState::kIdle);
  m.attr("STATE_FETCHING") = static_cast<int>(WorkerState::kFetching);
  m.attr("STATE_COLLATING") = static_cast<int>(WorkerState::kCollating);
  m.attr("STATE_ENCODING") = static_cast<int>(WorkerState::kEncoding);

  nb::dict messages;
  for (const auto& [name, type] : kMessages) {
    messages[name] = static_cast<uint32_t>(type);
    m.attr((std::string("MSG_") + name).c_str()) = static_cast<uint32_t>(type);
  }
  m.attr("MESSAGE_TYPES") = messages;
  m.attr("LOG_CRASH") = static_cast<int>(LogKind::kCrash);
  m.attr("LOG_STDERR") = static_cast<int>(LogKind::kStderr);

  nb::list dtypes;
  for (uint8_t d = 0; d < kDTypeCount; ++d) dtypes.append(DTypeName(static_cast<DType>(d)));
  m.attr("DTYPE_NAMES") = nb::tuple(dtypes);

  m.attr("MODE_COLLATE") = static_cast<int>(EncodeMode::kCollate);
  m.attr("MODE_CONVERT") = static_cast<int>(EncodeMode::kConvert);
  m.attr("MODE_AS_IS") = static_cast<int>(EncodeMode::kAsIs);
}

}  // namespace stoker::py
