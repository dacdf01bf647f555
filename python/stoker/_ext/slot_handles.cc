#include "slot_handles.h"

#include <algorithm>

#include "py_decode.h"
#include "stoker/slot.h"
#include "stoker/wire_decoder.h"

namespace stoker::py {

SlotLease::~SlotLease() {
  if (shared && segment) SlotWord(reinterpret_cast<SlotHeader*>(segment->data())).Release();
}

nb::object DecodeInto(std::shared_ptr<Segment> segment, size_t offset, uint64_t nbytes,
                      bool shared) {
  const size_t available = segment->size() - offset;
  DecodedBatch batch;
  Status st = DecodeBatch(segment->data() + offset, std::min<uint64_t>(nbytes, available), &batch);
  nb::object lease = nb::cast(new SlotLease{segment, shared}, nb::rv_policy::take_ownership);
  if (!st.ok()) {
    RaiseStoker("CorruptBatchError",
                st.message() +
                    ". A worker wrote something into its shared-memory slot that is "
                    "not a valid batch (a memory bug in a C extension used by the "
                    "dataset?). The batch was dropped; the main process is unharmed.");
  }
  return BuildBatch(batch, lease, segment->size());
}

nb::object PendingBatch::Decode() {
  if (consumed) RaiseStoker("EngineError", "this batch was already handed out");
  consumed = true;
  SlotWord word(reinterpret_cast<SlotHeader*>(segment->data()));
  if (reinterpret_cast<SlotHeader*>(segment->data())->magic != kSlotMagic ||
      !word.Lend(generation)) {
    RaiseStoker("CorruptBatchError",
                "worker " + std::to_string(worker) +
                    " announced a batch in a slot that is not "
                    "ready (state '" +
                    SlotStateName(word.state()) +
                    "'): its shared memory was "
                    "overwritten. The batch was dropped; the main process is unharmed.");
  }
  return DecodeInto(segment, kSlotHeaderSize, nbytes, true);
}

void PendingBatch::Discard() {
  if (consumed || !segment) return;
  consumed = true;
  SlotWord word(reinterpret_cast<SlotHeader*>(segment->data()));
  if (word.generation() == generation && word.state() == static_cast<uint32_t>(SlotState::kReady)) {
    word.Release();
  }
}

void register_slot_handles(nb::module_& m) {
  nb::class_<SlotLease>(m, "SlotLease",
                        "Keeps one batch's slot lent while any tensor view of it is alive.");
  nb::class_<PendingBatch>(m, "PendingBatch", "A batch announced by a worker, not yet handed out.")
      .def("decode", &PendingBatch::Decode,
           "Validates the slot and builds the batch as views of it.")
      .def("discard", &PendingBatch::Discard, "Hands the slot back without building anything.")
      .def_ro("worker", &PendingBatch::worker)
      .def_ro("nbytes", &PendingBatch::nbytes);
}

}  // namespace stoker::py
