#include "slot_handles.h"

#include <nanobind/stl/shared_ptr.h>
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
    p->consumed.store(true);
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

void SlotRelease::Release() {
  // In a forked child the slot still belongs to the main process: only the mapping goes.
  // A release the slot refuses (stale generation) is dropped: nothing else holds the lease.
  if (segment && owner == getpid()) {
    (void)SlotWord(reinterpret_cast<SlotHeader*>(segment->data())).Release(generation);
  }
  segment.reset();
}

bool ReleaseGate::Hold(SlotRelease release) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  held_.push_back(std::move(release));
  return true;
}

std::vector<SlotRelease> ReleaseGate::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SlotRelease> out;
  out.swap(held_);
  return out;
}

size_t ReleaseGate::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_.size();
}

void ReleaseGate::Close() {
  std::vector<SlotRelease> now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    now.swap(held_);
  }
  for (SlotRelease& r : now) r.Release();
}

void HeldReleases::Release() {
  std::vector<SlotRelease> now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    now.swap(releases_);
  }
  for (SlotRelease& r : now) r.Release();
}

size_t HeldReleases::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return releases_.size();
}

SlotLease::~SlotLease() {
  if (!shared || !segment) return;
  SlotRelease release{segment, generation, owner};
  if (gate && owner == getpid() && gate->Hold(release)) return;
  release.Release();
}

nb::object DecodeInto(std::shared_ptr<Segment> segment, size_t offset, uint64_t nbytes, bool shared,
                      uint32_t generation, nb::object keep, std::shared_ptr<ReleaseGate> gate) {
  const size_t available = segment->size() - offset;
  DecodedBatch batch;
  Status st = DecodeBatch(segment->data() + offset, std::min<uint64_t>(nbytes, available), &batch);
  auto* held = new SlotLease();
  held->segment = segment;
  held->shared = shared;
  held->generation = generation;
  held->keep = std::move(keep);
  held->gate = std::move(gate);
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

void PendingBatch::TakeSlot() {
  if (owner != getpid()) {
    RaiseStoker("EngineError", "this batch belongs to the loader of process " +
                                   std::to_string(owner) +
                                   "; a forked child cannot take it. "
                                   "Iterate a DataLoader created in the child instead.");
  }
  if (consumed.exchange(true)) RaiseStoker("EngineError", "this batch was already handed out");
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
}

nb::object PendingBatch::Decode(std::shared_ptr<ReleaseGate> gate) {
  TakeSlot();
  return DecodeInto(segment, kSlotHeaderSize, nbytes, true, generation, nb::object(),
                    std::move(gate));
}

nb::object PendingBatch::Lend() {
  TakeSlot();
  auto* held = new SlotLease();
  held->segment = segment;
  held->shared = true;
  held->generation = generation;
  return nb::cast(held, nb::rv_policy::take_ownership);
}

void PendingBatch::Discard() {
  if (!segment || consumed.exchange(true)) return;
  if (owner != getpid()) return;  // inherited by a forked child: the slot is not ours to free
  // Only READY: a slot already LENT under this generation belongs to a lease.
  SlotWord word(reinterpret_cast<SlotHeader*>(segment->data()));
  if (word.state() == static_cast<uint32_t>(SlotState::kReady)) (void)word.Release(generation);
}

void register_slot_handles(nb::module_& m) {
  nb::class_<SlotLease>(m, "SlotLease",
                        "Keeps one batch's slot lent while any tensor view of it is alive.");
  nb::class_<HeldReleases>(m, "HeldReleases",
                           "Slot hand-backs taken from a gate, waiting for the copies that read "
                           "the slots; handed back by release() or when this is dropped.")
      .def("release", &HeldReleases::Release, "Hands the slots back to their workers.")
      .def("__len__", &HeldReleases::size);
  nb::class_<ReleaseGate>(m, "ReleaseGate",
                          "Where the hand-back of a dead lease's slot waits (GPU copies).")
      .def(nb::init<>())
      .def(
          "take", [](ReleaseGate& g) { return new HeldReleases(g.Take()); },
          nb::rv_policy::take_ownership, "The hand-backs held since the last take().")
      .def_prop_ro("held", &ReleaseGate::held)
      .def("close", &ReleaseGate::Close, "Hands back what is held; nothing is held from now on.");
  nb::class_<MappedRegion>(m, "MappedRegion",
                           "A slot's mapping in this process, kept alive while this is held.")
      .def_prop_ro("address", &MappedRegion::address)
      .def_prop_ro("size", &MappedRegion::size)
      .def("sole", &MappedRegion::sole, "Nothing else holds the mapping any more.");
  nb::class_<PendingBatch>(m, "PendingBatch", "A batch announced by a worker, not yet handed out.")
      .def("decode", &PendingBatch::Decode, nb::arg("gate").none() = nb::none(),
           "Validates the slot and builds the batch as views of it; with a gate, the slot's "
           "hand-back waits there when the last view dies.")
      .def("region", &PendingBatch::Region, "The slot's mapping (for pinning it once).")
      .def("discard", &PendingBatch::Discard, "Hands the slot back without building anything.")
      .def("lend", &PendingBatch::Lend,
           "Validates the slot and lends it without building anything: the slot stays the "
           "batch's until the returned SlotLease is dropped (the node pool holds it while ranks "
           "map the slot).")
      .def_prop_ro(
          "fd", [](const PendingBatch& p) { return p.segment ? p.segment->fd() : -1; },
          "The slot's memfd while this is held (-1 unless its Supervisor keeps slot fds).")
      .def_prop_ro(
          "offset", [](const PendingBatch&) { return kSlotHeaderSize; },
          "Where a batch begins in its slot (after the slot's header).")
      .def_ro("worker", &PendingBatch::worker)
      .def_ro("nbytes", &PendingBatch::nbytes);
}

}  // namespace stoker::py
