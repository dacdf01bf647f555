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
// Threads: these objects are touched with the GIL held; the registry of pending batches has
// its own mutex (taken by the fork handler while the process forks).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <memory>

#include "common.h"
#include "stoker/segment.h"

namespace stoker::py {

struct SlotLease {
  std::shared_ptr<Segment> segment;
  bool shared = false;      // a real slot (release on death) or private memory
  uint32_t generation = 0;  // the generation it was lent with (shared only)
  pid_t owner = getpid();   // the process whose release counts
  nb::object keep;          // a borrowed segment's owner (an object store's buffer), kept alive
  ~SlotLease();
};

struct PendingBatch {
  std::shared_ptr<Segment> segment;
  uint32_t generation = 0;
  uint64_t nbytes = 0;
  int worker = -1;
  bool consumed = false;
  pid_t owner = getpid();
  PendingBatch();
  ~PendingBatch();
  PendingBatch(const PendingBatch&) = delete;
  PendingBatch& operator=(const PendingBatch&) = delete;
  nb::object Decode();
  void Discard();
};

// Decodes a batch in `segment` at `offset` (validated) and builds it with a new lease as owner.
// `shared`: the segment is a slot lent under `generation`, released when the lease dies.
nb::object DecodeInto(std::shared_ptr<Segment> segment, size_t offset, uint64_t nbytes, bool shared,
                      uint32_t generation = 0, nb::object keep = nb::object());

void register_slot_handles(nb::module_& m);

}  // namespace stoker::py
