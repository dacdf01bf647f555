#include "stoker/slot_pool.h"

#include <unistd.h>

#include <string>

#include "stoker/channel.h"

namespace stoker {
namespace {
constexpr size_t kMinSlotBytes = 256 * 1024;
}  // namespace

uint64_t SlotPool::mapped_bytes() const {
  uint64_t total = 0;
  for (const Entry& e : slots_) total += e.segment->size();
  return total;
}

Status SlotPool::Create(size_t bytes, size_t* index) {
  // Headroom of 1/8 so that batches whose size varies a little reuse the slot.
  size_t want = bytes + bytes / 8 + kSlotHeaderSize;
  if (want < kMinSlotBytes) want = kMinSlotBytes;
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

Status SlotPool::Acquire(size_t bytes, WritableSlot* out) {
  // 1. The smallest free slot that fits.
  size_t best = slots_.size();
  size_t largest_free_small = slots_.size();
  for (size_t i = 0; i < slots_.size(); ++i) {
    SlotWord w(slots_[i].header());
    if (w.state() != static_cast<uint32_t>(SlotState::kFree)) continue;
    if (slots_[i].capacity() >= bytes) {
      if (best == slots_.size() || slots_[i].capacity() < slots_[best].capacity()) best = i;
    } else if (largest_free_small == slots_.size() ||
               slots_[i].capacity() > slots_[largest_free_small].capacity()) {
      largest_free_small = i;
    }
  }
  if (best == slots_.size()) {
    // 2. Grow: a free slot that is too small is replaced by a bigger one.
    if (largest_free_small != slots_.size()) {
      STOKER_RETURN_IF_ERROR(Retire(largest_free_small));
    }
    // 3. Otherwise every slot is in use (held by the user or in flight): add one.
    STOKER_RETURN_IF_ERROR(Create(bytes, &best));
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
