// SlotPool: a worker's own slots.
//
// The worker asks for room for one encoded batch; the pool hands back a FREE slot that fits
// (the smallest one), grows a slot that is too small (a new memfd replaces it), or adds a slot
// when every slot is still lent to the user or waiting in the main process: memory in use is what
// the user holds plus the batches in flight, and the worker never waits for the user to let go.
// Every new slot's memfd is sent to the main process (kSlotNew) before the first batch that uses
// it; both sides close the descriptor once mapped, so neither holds one fd per slot.
//
// Threads: REQUIRES: external synchronization. A pool belongs to one worker, used by the thread
// that encodes batches.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "stoker/segment.h"
#include "stoker/slot.h"
#include "stoker/status.h"

namespace stoker {

struct WritableSlot {
  uint32_t slot_id = 0;
  uint32_t generation = 0;
  uint8_t* payload = nullptr;  // where the batch goes
  size_t capacity = 0;
  SlotHeader* header = nullptr;
};

class SlotPool {
 public:
  // sock: the worker's end of its channel (not owned).
  SlotPool(int sock, uint32_t worker_id) : sock_(sock), worker_id_(worker_id) {}

  // A slot with at least `bytes` of payload capacity, in state WRITING.
  Status Acquire(size_t bytes, WritableSlot* out);
  // WRITING -> READY, then tells the main process: kBatch(task, slot, generation, bytes).
  Status Publish(const WritableSlot& slot, uint64_t bytes, uint64_t task);
  // WRITING -> FREE after a failed encode.
  void Abandon(const WritableSlot& slot);

  size_t slot_count() const { return slots_.size(); }
  uint64_t mapped_bytes() const;

 private:
  struct Entry {
    std::unique_ptr<Segment> segment;
    uint32_t id;
    SlotHeader* header() const { return reinterpret_cast<SlotHeader*>(segment->data()); }
    size_t capacity() const { return segment->size() - kSlotHeaderSize; }
  };
  Status Create(size_t bytes, size_t* index);
  Status Retire(size_t index);

  int sock_;
  uint32_t worker_id_;
  uint32_t next_id_ = 1;
  std::vector<Entry> slots_;
};

}  // namespace stoker
