#include "stoker/slot.h"

#include "stoker/futex.h"

namespace stoker {

const char* SlotStateName(uint32_t state) {
  switch (static_cast<SlotState>(state)) {
    case SlotState::kFree:
      return "free";
    case SlotState::kWriting:
      return "writing";
    case SlotState::kReady:
      return "ready";
    case SlotState::kLent:
      return "lent";
  }
  return "invalid";
}

void SlotWord::Initialize(SlotHeader* h, uint32_t slot_id, uint64_t capacity) {
  h->magic = kSlotMagic;
  h->generation = 0;
  h->slot_id = slot_id;
  h->capacity = capacity;
  h->payload_bytes = 0;
  ref(h->state).store(static_cast<uint32_t>(SlotState::kFree), std::memory_order_release);
}

bool SlotWord::BeginWrite(uint32_t* generation) {
  uint32_t expected = static_cast<uint32_t>(SlotState::kFree);
  if (!ref(h_->state).compare_exchange_strong(expected, static_cast<uint32_t>(SlotState::kWriting),
                                              std::memory_order_acq_rel)) {
    return false;
  }
  *generation = ref(h_->generation).fetch_add(1, std::memory_order_acq_rel) + 1;
  return true;
}

void SlotWord::Publish(uint64_t payload_bytes) {
  h_->payload_bytes = payload_bytes;
  ref(h_->state).store(static_cast<uint32_t>(SlotState::kReady), std::memory_order_release);
}

void SlotWord::AbandonWrite() {
  ref(h_->state).store(static_cast<uint32_t>(SlotState::kFree), std::memory_order_release);
}

bool SlotWord::Lend(uint32_t generation) {
  if (this->generation() != generation) return false;
  uint32_t expected = static_cast<uint32_t>(SlotState::kReady);
  return ref(h_->state).compare_exchange_strong(expected, static_cast<uint32_t>(SlotState::kLent),
                                                std::memory_order_acq_rel);
}

bool SlotWord::Release(uint32_t generation) {
  // The generation only changes on FREE -> WRITING, so while the state below is LENT or READY
  // the generation checked here is still the slot's.
  if (this->generation() != generation) return false;
  uint32_t state = this->state();
  for (;;) {
    if (state != static_cast<uint32_t>(SlotState::kLent) &&
        state != static_cast<uint32_t>(SlotState::kReady)) {
      return false;
    }
    if (ref(h_->state).compare_exchange_weak(state, static_cast<uint32_t>(SlotState::kFree),
                                             std::memory_order_acq_rel)) {
      break;
    }
  }
  FutexWake(&h_->state, 1);
  return true;
}

}  // namespace stoker
