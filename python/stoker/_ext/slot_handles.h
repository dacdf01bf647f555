// Python-visible handles on slots in the main process.
//
// SlotLease: owns one lent slot; every tensor view of the batch holds a reference to it, and
// its destructor hands the slot back (LENT -> FREE + futex wake). PendingBatch: a batch a worker
// announced that has not been handed out yet (it waits in the reorder buffer); decode() lends it,
// and a pending batch dropped without decode() goes straight back to FREE.
//
// Both belong to the process that created them and name the slot generation they hold. A copy
// inherited by a forked child (its GC may destroy it there) changes no slot state: the slot is
// still in use by the main process. Only the child's mapping goes away with it. Pending batches
// are useless in a forked child (decode() refuses), so a fork handler drops their mappings in
// the child at once; a lease keeps its mapping, because tensor views in the child may read it.
//
// ReleaseGate: when the main process copies batches to a GPU asynchronously (pin_memory, the
// `device` option), a copy may still be reading a slot after the last view of it died. A lease
// decoded with a gate does not hand its slot back when it dies: the hand-back waits in the gate
// until the caller, having made sure the copies are done (a CUDA event), lets it go
// (take() -> HeldReleases.release()). A gate that is closed, or held releases that are dropped,
// hand the slots back at once.
//
// Threads (with or without the GIL: the extension is free-threaded, common.h): a SlotLease is
// immutable once made and dies on whichever thread drops its last view; a gate and a
// HeldReleases each have their own mutex (held for a few instructions, no Python call inside);
// a PendingBatch is handed out at most once however many threads call decode(), lend() or
// discard() at once (an atomic flag: the first wins, the others are told it was handed out);
// the registry of pending batches has its own mutex (taken by the fork handler while the
// process forks). A MappedRegion is read-only; sole() is a snapshot.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "common.h"
#include "stoker/segment.h"

namespace stoker::py {

// One slot hand-back: the slot, the generation it was lent with, the process whose it is.
struct SlotRelease {
  std::shared_ptr<Segment> segment;
  uint32_t generation = 0;
  pid_t owner = 0;
  void Release();  // LENT -> FREE (+ wake), once; nothing in another process
};

class ReleaseGate {
 public:
  // Takes the hand-back; false when the gate is closed (the caller releases at once).
  bool Hold(SlotRelease release);
  // The hand-backs held since the last take().
  std::vector<SlotRelease> Take();
  size_t held() const;
  // From now on nothing is held; what is held is handed back now.
  void Close();

 private:
  mutable std::mutex mu_;
  bool closed_ = false;
  std::vector<SlotRelease> held_;
};

// Slot hand-backs taken from a gate, waiting for their copies: release() (or destruction).
// Thread-safe: release() from two threads at once hands each slot back once.
class HeldReleases {
 public:
  explicit HeldReleases(std::vector<SlotRelease> releases) : releases_(std::move(releases)) {}
  ~HeldReleases() { Release(); }
  void Release();
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::vector<SlotRelease> releases_;
};

struct SlotLease {
  std::shared_ptr<Segment> segment;
  bool shared = false;      // a real slot (release on death) or private memory
  uint32_t generation = 0;  // the generation it was lent with (shared only)
  pid_t owner = getpid();   // the process whose release counts
  nb::object keep;          // a borrowed segment's owner (an object store's buffer), kept alive
  std::shared_ptr<ReleaseGate> gate;  // where the hand-back waits (none: at once)
  ~SlotLease();
};

// The mapping of one slot in this process, for whoever must know where it lies and for how long
// (pinning it as page-locked memory for the GPU): holding it keeps the mapping alive; sole()
// says nobody else holds it any more (the worker retired the slot and no view is left), so it
// may be let go. Touched with the GIL held.
struct MappedRegion {
  std::shared_ptr<Segment> segment;
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(segment->data()); }
  size_t size() const { return segment->size(); }
  bool sole() const { return segment.use_count() == 1; }
};

struct PendingBatch {
  std::shared_ptr<Segment> segment;
  uint32_t generation = 0;
  uint64_t nbytes = 0;
  int worker = -1;
  std::atomic<bool> consumed{false};  // handed out (or discarded): exchanged, so once
  pid_t owner = getpid();
  PendingBatch();
  ~PendingBatch();
  PendingBatch(const PendingBatch&) = delete;
  PendingBatch& operator=(const PendingBatch&) = delete;
  nb::object Decode(std::shared_ptr<ReleaseGate> gate);
  nb::object Lend();  // the slot lent to a SlotLease, nothing decoded
  void Discard();
  MappedRegion Region() const { return MappedRegion{segment}; }

 private:
  void TakeSlot();  // validates the slot and moves it READY -> LENT (raises when it cannot)
};

// Decodes a batch in `segment` at `offset` (validated) and builds it with a new lease as owner.
// `shared`: the segment is a slot lent under `generation`, released when the lease dies.
nb::object DecodeInto(std::shared_ptr<Segment> segment, size_t offset, uint64_t nbytes, bool shared,
                      uint32_t generation = 0, nb::object keep = nb::object(),
                      std::shared_ptr<ReleaseGate> gate = nullptr);

void register_slot_handles(nb::module_& m);

}  // namespace stoker::py
