// Python-visible handles on slots in the main process.
//
// SlotLease: owns one lent slot; every tensor view of the batch holds a reference to it, and
// its destructor hands the slot back (LENT -> FREE + futex wake). PendingBatch: a batch a worker
// announced that has not been handed out yet (it waits in the reorder buffer); decode() lends it,
// and a pending batch dropped without decode() goes straight back to FREE.
#pragma once

#include <memory>

#include "common.h"
#include "stoker/segment.h"

namespace stoker::py {

struct SlotLease {
  std::shared_ptr<Segment> segment;
  bool shared = false;  // a real slot (release on death) or private memory
  ~SlotLease();
};

struct PendingBatch {
  std::shared_ptr<Segment> segment;
  uint32_t generation = 0;
  uint64_t nbytes = 0;
  int worker = -1;
  bool consumed = false;
  ~PendingBatch() { Discard(); }
  nb::object Decode();
  void Discard();
};

// Decodes a batch in `segment` at `offset` (validated) and builds it with a new lease as owner.
nb::object DecodeInto(std::shared_ptr<Segment> segment, size_t offset, uint64_t nbytes, bool shared);

void register_slot_handles(nb::module_& m);

}  // namespace stoker::py
