// Slot: a reusable shared-memory buffer that carries one batch at a time from a worker to the
// main process.
//
// A slot is a Segment whose first 64 bytes are a SlotHeader; the encoded batch follows. Its
// ownership is one 32-bit state word, and each transition is made by one side only:
//
//   worker:  FREE -> WRITING -> READY      (encode a batch, then announce it on the channel)
//   main:    READY -> LENT                 (hand tensor views of it to the user)
//   main:    LENT -> FREE, READY -> FREE   (last view died / batch discarded) + FUTEX_WAKE
//
// The worker bumps `generation` every time it takes the slot for writing and names that
// generation in its BATCH message, so the main process never reads a recycled slot by mistake.
// Release is checked the same way: it names the generation it was lent with, and a release of
// any other generation (a stale handle, a copy inherited by a forked child) changes nothing, so
// no stray release can hand a slot that is still in use to the next batch. Each generation has
// one holder in the main process (a PendingBatch, then a SlotLease), which releases it once.
// The header is only a hint for the peer: the main process bounds everything by the size of its
// own mapping, never by fields a worker could scribble over.
#pragma once

#include <atomic>
#include <cstdint>

#include "stoker/status.h"

namespace stoker {

enum class SlotState : uint32_t {
  kFree = 0,     // owned by the worker, may be written
  kWriting = 1,  // the worker is encoding into it
  kReady = 2,    // holds a batch announced to the main process, not yet handed out
  kLent = 3,     // views of it are alive in the main process
};

const char* SlotStateName(uint32_t state);

constexpr uint32_t kSlotMagic = 0x534c4f54;  // "SLOT"
constexpr size_t kSlotHeaderSize = 64;

struct SlotHeader {
  uint32_t magic;
  uint32_t state;       // SlotState, accessed atomically
  uint32_t generation;  // bumped by the worker on FREE -> WRITING
  uint32_t slot_id;     // the worker's number for this slot
  uint64_t capacity;    // bytes available after the header
  uint64_t payload_bytes;
  uint8_t reserved[kSlotHeaderSize - 32];
};
static_assert(sizeof(SlotHeader) == kSlotHeaderSize, "the header is part of the wire format");

// Operations on a header that lives in shared memory. All of them are lock-free.
//
// Threads and processes: every operation is safe for concurrent use from any thread of any
// process that maps the slot; each transition is one atomic step on the state word.
class SlotWord {
 public:
  explicit SlotWord(SlotHeader* h) : h_(h) {}

  static void Initialize(SlotHeader* h, uint32_t slot_id, uint64_t capacity);

  uint32_t state() const { return ref(h_->state).load(std::memory_order_acquire); }
  uint32_t generation() const { return ref(h_->generation).load(std::memory_order_acquire); }

  // Worker: FREE -> WRITING; bumps the generation and returns it in *generation.
  bool BeginWrite(uint32_t* generation);
  // Worker: WRITING -> READY after `payload_bytes` were written.
  void Publish(uint64_t payload_bytes);
  // Worker: WRITING -> FREE when encoding failed.
  void AbandonWrite();
  // Main: READY -> LENT, only if the generation is the one announced.
  bool Lend(uint32_t generation);
  // Main: LENT or READY -> FREE, then wakes a worker waiting for a free slot; true if so.
  // False, and nothing changed, when `generation` is not the slot's current generation or the
  // slot is neither LENT nor READY (a stale or duplicate release).
  [[nodiscard]] bool Release(uint32_t generation);

 private:
  static std::atomic_ref<uint32_t> ref(uint32_t& w) { return std::atomic_ref<uint32_t>(w); }
  SlotHeader* h_;
};

}  // namespace stoker
