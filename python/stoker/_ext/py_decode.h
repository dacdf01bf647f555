// Building Python objects from a validated batch.
//
// Large arrays become torch tensors (or NumPy arrays) that are views of the slot and keep
// `owner` alive; when the last of them dies, so does the owner, which hands the slot back to its
// worker. Small arrays are copied into private memory instead (one allocation each), so that a
// few bytes held by the user never keep a whole slot lent: an array is a view only if it is at
// least ViewThreshold(slot_bytes) = max(kViewMinBytes, slot_bytes / kViewSlotDivisor) bytes.
// Hence every lent slot is pinned by a view of at least 1/kViewSlotDivisor of its size:
//   slot bytes kept lent by the user <= kViewSlotDivisor * bytes of the tensors they hold.
// If every array of a batch is copied, nothing refers to the owner once the batch is built and
// the slot is free again before the batch reaches the user.
//
// Threads: BuildBatch keeps no state; several threads may build batches at once (each from its
// own DecodedBatch), with or without the GIL.
#pragma once

#include <cstdint>

#include "common.h"
#include "stoker/wire_decoder.h"

namespace stoker::py {

constexpr uint64_t kViewMinBytes = 64 * 1024;
constexpr uint64_t kViewSlotDivisor = 8;

// The smallest array (in bytes) delivered as a view of a slot of `slot_bytes` (header included).
uint64_t ViewThreshold(uint64_t slot_bytes);

// `slot_bytes`: the size of the memory `owner` keeps alive (the whole slot).
nb::object BuildBatch(const DecodedBatch& batch, nb::handle owner, uint64_t slot_bytes);

}  // namespace stoker::py
