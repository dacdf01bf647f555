// SlotPool: a worker's own slots.
//
// The worker asks for room for one encoded batch; the pool hands back a FREE slot that fits
// (the smallest one), grows a slot that is too small (a new memfd replaces it), or adds a slot
// when every slot is still lent to the user or waiting in the main process: memory in use is what
// the user holds plus the batches in flight.
//
// With a cap (SetLimit), the slots together never exceed `cap_bytes`: free slots that are too
// small are retired to make room, and when every slot is in use the worker waits (a futex wait
// on a slot's state word, in short slices) for the user to let go of one. A cap lowered while
// slots exist (the main process divides max_shared_memory among more workers) retires free
// slots at once until the pool fits; slots still in use count until they come back. If no slot
// comes free for `patience_ms`, or one batch alone needs more than the cap, Acquire fails with
// kLimitReached and a message that says what is held. Without a cap the worker never waits.
//
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

  // cap_bytes: the most all slots may take together, headers included (0: no cap). Free slots
  // beyond a lowered cap are retired (each announced with kSlotRetire); fails only when telling
  // the main process fails.
  [[nodiscard]] Status SetLimit(uint64_t cap_bytes, int patience_ms);
  uint64_t cap_bytes() const { return cap_bytes_; }

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
  // Index of the smallest FREE slot with `bytes` of capacity, or slots_.size().
  size_t FindFree(size_t bytes) const;
  // Makes room under the cap for a new slot of `want` bytes by retiring FREE slots (all of
  // them too small), largest first. True when the new slot fits.
  Status MakeRoom(uint64_t want, bool* fits);
  Status LimitError(size_t bytes, uint64_t want, const char* why) const;

  int sock_;
  uint32_t worker_id_;
  uint32_t next_id_ = 1;
  std::vector<Entry> slots_;
  uint64_t cap_bytes_ = 0;
  int patience_ms_ = 0;
  size_t wait_turn_ = 0;  // which in-use slot the next wait slice watches
};

// The size of the slot made for a batch of `bytes` (headroom and minimum included).
size_t SlotBytesFor(size_t bytes);

}  // namespace stoker
