// WorkerStatus: one page of shared memory per worker that says what it is doing right now.
//
// The worker creates the page (a sealed memfd) and sends it to the main process at start-up; from
// then on it writes, lock-free, which state it is in, which task and which dataset index it is
// loading, since when, and counters of its work. The main process only reads. When a worker dies
// or hangs, the page names the sample it was on, so a death is attributed to one index, not a
// whole batch; the same counters feed loader statistics. Every field is one aligned 64-bit word,
// so a worker killed mid-update leaves each field either old or new, never torn.
//
// Threads and processes: one writer (the worker's thread that does the work) and any number of
// readers in any process and thread; every field is read and written atomically, so reads are
// safe for concurrent use with the writer. AddSample is an atomic add: any thread of the worker
// may call it (threads_per_worker's loading threads do). Two writers of the other fields
// REQUIRE: external synchronization.
#pragma once

#include <atomic>
#include <cstdint>

namespace stoker {

enum class WorkerState : uint64_t {
  kStarting = 0,
  kIdle = 1,       // waiting for a task
  kFetching = 2,   // in __getitem__ / __getitems__ / the iterator
  kCollating = 3,  // in collate_fn (or the Python collate fallback)
  kEncoding = 4,   // writing a batch into a slot
  kExiting = 5,
};
constexpr int kWorkerStateCount = 6;
const char* WorkerStateName(uint64_t state);

constexpr uint64_t kStatusMagic = 0x5354415455535054ull;  // "STATUSPT"
constexpr int64_t kNoIndex = INT64_MIN;  // the current index is not an int (or there is none)

struct WorkerStatusPage {
  uint64_t magic;
  uint64_t pid;
  uint64_t state;                        // WorkerState
  uint64_t task;                         // task being worked on
  int64_t index;                         // dataset index being loaded, or kNoIndex
  uint64_t since_ns;                     // CLOCK_MONOTONIC when `state` was entered
  uint64_t samples;                      // samples loaded
  uint64_t batches;                      // batches sent
  uint64_t rss_bytes;                    // resident memory, read by the worker after each batch
  uint64_t state_ns[kWorkerStateCount];  // time spent in each state
  uint64_t bytes_sent;                   // bytes of batches written into slots
  uint64_t worker_id;                    // the worker's number in its loader
  uint64_t loader_token;                 // names its loader, for readers in other processes
  int64_t position;    // where `index` is in its task's list of indices, or kNoIndex: names a
                       // sample whose index is not an int (a str, a tuple) to the main process
  uint64_t in_flight;  // samples loading on the worker's threads now (threads_per_worker: its
                       // gate's count, a task started ahead included; 0 without threads)
  // The worker's CPU time and its threads' run-queue time when it was ready to serve (0 until
  // then; a ready worker's ready_cpu_ns is at least 1): its start-up (imports, the dataset's
  // unpickling, worker_init_fn) is not work, and a reader that judges waiting from computing
  // subtracts it from what /proc says (and counts nothing of a worker not ready yet).
  uint64_t ready_cpu_ns;
  uint64_t ready_runqueue_ns;
};

// Lock-free single-writer updates (worker) and reads (main), on a page in shared memory.
class WorkerStatusWriter {
 public:
  explicit WorkerStatusWriter(WorkerStatusPage* page) : p_(page) {}
  static void Initialize(WorkerStatusPage* page, uint64_t pid, uint64_t worker_id,
                         uint64_t loader_token);
  // Enters `state`; the time spent in the previous state is added to its counter.
  void Enter(WorkerState state, uint64_t task, int64_t index, int64_t position = kNoIndex);
  void AddSample() { Add(&p_->samples, 1); }
  void AddBatch(uint64_t bytes);
  void SetRss(uint64_t rss) { Store(&p_->rss_bytes, rss); }
  void SetInFlight(uint64_t n) { Store(&p_->in_flight, n); }
  void SetReady(uint64_t cpu_ns, uint64_t runqueue_ns) {
    // run queue first: a reader that sees ready_cpu_ns set (release, then its acquire) sees it
    Store(&p_->ready_runqueue_ns, runqueue_ns);
    Store(&p_->ready_cpu_ns, cpu_ns > 0 ? cpu_ns : 1);  // (0 says: not ready)
  }

 private:
  static void Store(uint64_t* w, uint64_t v) {
    std::atomic_ref<uint64_t>(*w).store(v, std::memory_order_release);
  }
  static void Add(uint64_t* w, uint64_t v) {
    std::atomic_ref<uint64_t>(*w).fetch_add(v, std::memory_order_relaxed);
  }
  WorkerStatusPage* p_;
};

// A consistent-enough copy for the reader (each field read atomically).
WorkerStatusPage ReadWorkerStatus(const WorkerStatusPage* page);

uint64_t MonotonicNs();

}  // namespace stoker
