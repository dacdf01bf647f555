#include "stoker/worker_status.h"

#include <time.h>

#include <cstring>

namespace stoker {

uint64_t MonotonicNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

const char* WorkerStateName(uint64_t state) {
  switch (static_cast<WorkerState>(state)) {
    case WorkerState::kStarting:
      return "starting";
    case WorkerState::kIdle:
      return "idle";
    case WorkerState::kFetching:
      return "loading";
    case WorkerState::kCollating:
      return "collating";
    case WorkerState::kEncoding:
      return "encoding";
    case WorkerState::kExiting:
      return "exiting";
  }
  return "unknown";
}

void WorkerStatusWriter::Initialize(WorkerStatusPage* page, uint64_t pid, uint64_t worker_id,
                                    uint64_t loader_token) {
  std::memset(page, 0, sizeof(*page));
  page->pid = pid;
  page->worker_id = worker_id;
  page->loader_token = loader_token;
  page->index = kNoIndex;
  page->position = kNoIndex;
  page->since_ns = MonotonicNs();
  std::atomic_ref<uint64_t>(page->magic).store(kStatusMagic, std::memory_order_release);
}

void WorkerStatusWriter::Enter(WorkerState state, uint64_t task, int64_t index, int64_t position) {
  const uint64_t now = MonotonicNs();
  const uint64_t prev = std::atomic_ref<uint64_t>(p_->state).load(std::memory_order_relaxed);
  const uint64_t since = std::atomic_ref<uint64_t>(p_->since_ns).load(std::memory_order_relaxed);
  if (prev < kWorkerStateCount && now > since) Add(&p_->state_ns[prev], now - since);
  Store(&p_->task, task);
  Store(reinterpret_cast<uint64_t*>(&p_->index), static_cast<uint64_t>(index));
  Store(reinterpret_cast<uint64_t*>(&p_->position), static_cast<uint64_t>(position));
  Store(&p_->since_ns, now);
  Store(&p_->state, static_cast<uint64_t>(state));
}

void WorkerStatusWriter::AddBatch(uint64_t bytes) {
  Add(&p_->batches, 1);
  Add(&p_->bytes_sent, bytes);
}

WorkerStatusPage ReadWorkerStatus(const WorkerStatusPage* page) {
  WorkerStatusPage out;
  const uint64_t* src = reinterpret_cast<const uint64_t*>(page);
  uint64_t* dst = reinterpret_cast<uint64_t*>(&out);
  for (size_t i = 0; i < sizeof(WorkerStatusPage) / sizeof(uint64_t); ++i) {
    dst[i] =
        std::atomic_ref<uint64_t>(const_cast<uint64_t&>(src[i])).load(std::memory_order_acquire);
  }
  return out;
}

}  // namespace stoker
