#include "stoker/slot_pool.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "stoker/channel.h"
#include "stoker/futex.h"

namespace stoker {
namespace {
constexpr size_t kMinSlotBytes = 256 * 1024;
// A wait watches one in-use slot's word at a time; a slice this long bounds how late the worker
// notices that another slot came free.
constexpr int kWaitSliceMs = 50;

std::string Mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

using Clock = std::chrono::steady_clock;
}  // namespace

size_t SlotBytesFor(size_t bytes) {
  // Headroom of 1/8 so that batches whose size varies a little reuse the slot.
  size_t want = bytes + bytes / 8 + kSlotHeaderSize;
  if (want < kMinSlotBytes) want = kMinSlotBytes;
  const size_t page = PageSize();
  return (want + page - 1) / page * page;
}

uint64_t SlotPool::mapped_bytes() const {
  uint64_t total = 0;
  for (const Entry& e : slots_) total += e.segment->size();
  return total;
}

Status SlotPool::Create(size_t bytes, size_t* index) {
  const size_t want = SlotBytesFor(bytes);
  std::unique_ptr<Segment> seg;
  int fd = -1;
  const std::string name = "stoker-w" + std::to_string(worker_id_) + "-slot";
  STOKER_RETURN_IF_ERROR(Segment::Create(name.c_str(), want, &seg, &fd));
  const uint32_t id = next_id_++;
  SlotWord::Initialize(reinterpret_cast<SlotHeader*>(seg->data()), id,
                       seg->size() - kSlotHeaderSize);
  MessageHeader m;
  m.type = static_cast<uint32_t>(MessageType::kSlotNew);
  m.a = id;
  Status st = SendMessage(sock_, m, nullptr, 0, fd);
  close(fd);
  if (!st.ok()) return st;
  slots_.push_back(Entry{std::move(seg), id});
  *index = slots_.size() - 1;
  return Status::OK();
}

Status SlotPool::Retire(size_t index) {
  MessageHeader m;
  m.type = static_cast<uint32_t>(MessageType::kSlotRetire);
  m.a = slots_[index].id;
  STOKER_RETURN_IF_ERROR(SendMessage(sock_, m, nullptr, 0));
  slots_.erase(slots_.begin() + static_cast<long>(index));
  return Status::OK();
}

Status SlotPool::SetLimit(uint64_t cap_bytes, int patience_ms) {
  cap_bytes_ = cap_bytes;
  patience_ms_ = patience_ms;
  while (cap_bytes_ != 0 && mapped_bytes() > cap_bytes_) {
    size_t largest = slots_.size();
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (SlotWord(slots_[i].header()).state() != static_cast<uint32_t>(SlotState::kFree)) continue;
      if (largest == slots_.size() || slots_[i].capacity() > slots_[largest].capacity()) {
        largest = i;
      }
    }
    if (largest == slots_.size()) break;  // the rest is in use: it fits once it comes back
    STOKER_RETURN_IF_ERROR(Retire(largest));
  }
  return Status::OK();
}

size_t SlotPool::FindFree(size_t bytes) const {
  size_t best = slots_.size();
  for (size_t i = 0; i < slots_.size(); ++i) {
    SlotWord w(slots_[i].header());
    if (w.state() != static_cast<uint32_t>(SlotState::kFree) || slots_[i].capacity() < bytes) {
      continue;
    }
    if (best == slots_.size() || slots_[i].capacity() < slots_[best].capacity()) best = i;
  }
  return best;
}

Status SlotPool::MakeRoom(uint64_t want, bool* fits) {
  uint64_t mapped = mapped_bytes();
  while (cap_bytes_ != 0 && mapped + want > cap_bytes_) {
    size_t largest = slots_.size();
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (SlotWord(slots_[i].header()).state() != static_cast<uint32_t>(SlotState::kFree)) continue;
      if (largest == slots_.size() || slots_[i].capacity() > slots_[largest].capacity()) {
        largest = i;
      }
    }
    if (largest == slots_.size()) break;
    mapped -= slots_[largest].segment->size();
    STOKER_RETURN_IF_ERROR(Retire(largest));
  }
  *fits = cap_bytes_ == 0 || mapped + want <= cap_bytes_;
  return Status::OK();
}

Status SlotPool::LimitError(size_t bytes, uint64_t want, const char* why) const {
  size_t lent = 0, ready = 0;
  uint64_t lent_bytes = 0, ready_bytes = 0;
  for (const Entry& e : slots_) {
    const uint32_t state = SlotWord(e.header()).state();
    if (state == static_cast<uint32_t>(SlotState::kLent)) {
      ++lent;
      lent_bytes += e.segment->size();
    } else if (state == static_cast<uint32_t>(SlotState::kReady)) {
      ++ready;
      ready_bytes += e.segment->size();
    }
  }
  return Status::Error(Code::kLimitReached,
                       "worker " + std::to_string(worker_id_) + " needs " + Mib(want) +
                           " of shared memory for a batch of " + Mib(bytes) +
                           ", but its share of max_shared_memory is " + Mib(cap_bytes_) + " and " +
                           why + ". Its slots: " + std::to_string(lent) +
                           " batch(es) still held by your code (" + Mib(lent_bytes) + "), " +
                           std::to_string(ready) + " waiting in the main process (" +
                           Mib(ready_bytes) + ").");
}

Status SlotPool::Acquire(size_t bytes, WritableSlot* out) {
  const uint64_t want = SlotBytesFor(bytes);
  if (cap_bytes_ != 0 && want > cap_bytes_) {
    return LimitError(bytes, want, "this one batch does not fit in it");
  }
  const auto patience = std::chrono::milliseconds(patience_ms_);
  Clock::time_point deadline = Clock::now() + patience;
  size_t best = FindFree(bytes);
  while (best == slots_.size()) {
    // No free slot fits. Grow: free slots that are too small are replaced by a bigger one (the
    // largest of them is retired; under a cap, as many as needed to make room).
    size_t largest_free = slots_.size();
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (SlotWord(slots_[i].header()).state() != static_cast<uint32_t>(SlotState::kFree)) continue;
      if (largest_free == slots_.size() || slots_[i].capacity() > slots_[largest_free].capacity()) {
        largest_free = i;
      }
    }
    if (largest_free != slots_.size()) STOKER_RETURN_IF_ERROR(Retire(largest_free));
    bool fits = true;
    STOKER_RETURN_IF_ERROR(MakeRoom(want, &fits));
    if (fits) {
      // Otherwise every slot is in use (held by the user or in flight): add one.
      STOKER_RETURN_IF_ERROR(Create(bytes, &best));
      break;
    }
    // Every slot is in use and the cap allows no more: wait for the user to let go of one.
    const int64_t left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      return LimitError(bytes, want,
                        ("no slot came free in " + std::to_string(patience_ms_ / 1000) +
                         " s while every slot was in use")
                            .c_str());
    }
    const Entry& watched = slots_[wait_turn_++ % slots_.size()];
    const uint32_t state = SlotWord(watched.header()).state();
    if (state != static_cast<uint32_t>(SlotState::kFree)) {
      Status st = FutexWait(&watched.header()->state, state,
                            static_cast<int>(left < kWaitSliceMs ? left : kWaitSliceMs));
      if (!st.ok() && st.code() != Code::kTimeout && st.code() != Code::kInterrupted) return st;
    }
    best = FindFree(bytes);
    for (const Entry& e : slots_) {
      if (SlotWord(e.header()).state() == static_cast<uint32_t>(SlotState::kFree)) {
        deadline = Clock::now() + patience;  // the user let go of something: keep waiting
        break;
      }
    }
  }
  Entry& e = slots_[best];
  SlotWord w(e.header());
  uint32_t gen = 0;
  if (!w.BeginWrite(&gen)) {
    return Status::Error(Code::kCorrupt, "a free slot changed state under the worker");
  }
  out->slot_id = e.id;
  out->generation = gen;
  out->header = e.header();
  out->payload = e.segment->data() + kSlotHeaderSize;
  out->capacity = e.capacity();
  return Status::OK();
}

Status SlotPool::Publish(const WritableSlot& slot, uint64_t bytes, uint64_t task) {
  SlotWord(slot.header).Publish(bytes);
  MessageHeader m;
  m.type = static_cast<uint32_t>(MessageType::kBatch);
  m.task = task;
  m.a = slot.slot_id;
  m.b = slot.generation;
  m.c = bytes;
  return SendMessage(sock_, m, nullptr, 0);
}

void SlotPool::Abandon(const WritableSlot& slot) { SlotWord(slot.header).AbandonWrite(); }

}  // namespace stoker
