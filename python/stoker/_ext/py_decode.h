// Building Python objects from a validated batch: arrays become torch tensors (or NumPy arrays)
// that are views of the slot and keep `owner` alive; when the last of them dies, so does the
// owner, which hands the slot back to its worker.
#pragma once

#include "common.h"
#include "stoker/wire_decoder.h"

namespace stoker::py {

nb::object BuildBatch(const DecodedBatch& batch, nb::handle owner);

}  // namespace stoker::py
