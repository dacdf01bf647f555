#include "slot_handles.h"

#include <pthread.h>

#include <algorithm>
#include <mutex>
#include <set>

#include "py_decode.h"
#include "stoker/slot.h"
#include "stoker/wire_decoder.h"

namespace stoker::py {
namespace {

// Every live PendingBatch of this process, for the fork handler. Leaked on purpose (a fork or
// a destructor may run while statics are destroyed at exit).
std::mutex& PendingMutex() {
  static std::mutex* m = new std::mutex;
  return *m;
}
std::set<PendingBatch*>& Pending() {
  static std::set<PendingBatch*>* s = new std::set<PendingBatch*>;
  return *s;
}

void LockPending() { PendingMutex().lock(); }
void UnlockPending() { PendingMutex().unlock(); }
// In a forked child: the main process's pending batches are not ours; drop their mappings.
void DropPendingInChild() {
  for (PendingBatch* p : Pending()) {
    p->consumed = true;
    p->segment.reset();
  }
  PendingMutex().unlock();
}

}  // namespace

PendingBatch::PendingBatch() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(&LockPending, &UnlockPending, &DropPendingInChild); });
  std::lock_guard<std::mutex> lock(PendingMutex());
  Pending().insert(this);
}

PendingBatch::~PendingBatch() {
  Discard();
  std::lock_guard<std::mutex> lock(PendingMutex());
  Pending().erase(this);
}

SlotLease::~SlotLease() {
  // In a forked child the slot still belongs to the main process: only the mapping goes.
  // A release the slot refuses (stale generation) is dropped: nothing else holds the lease.
  if (shared && segment && owner == getpid()) {
    (void)SlotWord(reinterpret_cast<SlotHeader*>(segment->data())).Release(generation);
  }
}

nb::object DecodeInto(std::shared_ptr<Segment> segment, size_t offset, uint64_t nbytes, bool shared,
                      uint32_t generation, nb::object keep) {
  const size_t available = segment->size() - offset;
  DecodedBatch batch;
  Status st = DecodeBatch(segment->data() + offset, std::min<uint64_t>(nbytes, available), &batch);
  auto* held = new SlotLease();
  held->segment = segment;
  held->shared = shared;
  held->generation = generation;
  held->keep = std::move(keep);
  nb::object lease = nb::cast(held, nb::rv_policy::take_ownership);
  if (!st.ok()) {
    RaiseStoker("CorruptBatchError",
                st.message() +
                    ". A worker wrote something into its shared-memory slot that is "
                    "not a valid batch (a memory bug in a C extension used by the "
                    "dataset?). The batch was dropped; the main process is unharmed.");
  }
  return BuildBatch(batch, lease, segment->size());
}

nb::object PendingBatch::Decode() {
  if (owner != getpid()) {
    RaiseStoker("EngineError", "this batch belongs to the loader of process " +
                                   std::to_string(owner) + "; a forked child cannot take it. "
                                   "Iterate a DataLoader created in the child instead.");
  }
  if (consumed) RaiseStoker("EngineError", "this batch was already handed out");
  consumed = true;
  const SlotHeader* header = reinterpret_cast<SlotHeader*>(segment->data());
  SlotWord word(reinterpret_cast<SlotHeader*>(segment->data()));
  if (header->magic != kSlotMagic || !word.Lend(generation)) {
    const uint32_t now = word.generation();
    std::string what;
    if (header->magic != kSlotMagic) {
      what = "whose header is not a slot header any more";
    } else if (now != generation) {
      what = "that was written again before it was read (it holds generation " +
             std::to_string(now) + ", the batch was generation " + std::to_string(generation) +
             ", state '" + SlotStateName(word.state()) + "')";
    } else {
      what = std::string("in state '") + SlotStateName(word.state()) + "' instead of 'ready'";
    }
    RaiseStoker("CorruptBatchError",
                "worker " + std::to_string(worker) + " announced a batch in a slot " + what +
                    ": its shared memory was overwritten. The batch was dropped; the main "
                    "process is unharmed.");
  }
  return DecodeInto(segment, kSlotHeaderSize, nbytes, true, generation);
}

void PendingBatch::Discard() {
  if (consumed || !segment) return;
  consumed = true;
  if (owner != getpid()) return;  // inherited by a forked child: the slot is not ours to free
  // Only READY: a slot already LENT under this generation belongs to a lease.
  SlotWord word(reinterpret_cast<SlotHeader*>(segment->data()));
  if (word.state() == static_cast<uint32_t>(SlotState::kReady)) (void)word.Release(generation);
}

void register_slot_handles(nb::module_& m) {
  nb::class_<SlotLease>(m, "SlotLease",
                        "Keeps one batch's slot lent while any tensor view of it is alive.");
  nb::class_<PendingBatch>(m, "PendingBatch", "A batch announced by a worker, not yet handed out.")
      .def("decode", &PendingBatch::Decode,
           "Validates the slot and builds the batch as views of it.")
      .def("discard", &PendingBatch::Discard, "Hands the slot back without building anything.")
      .def_ro("worker", &PendingBatch::worker)
      .def_ro("nbytes", &PendingBatch::nbytes);
}

}  // namespace stoker::py
