// Decoding a batch from a slot, trusting nothing.
//
// A worker may have written anything into its slot (a bug, a stray pointer in a C extension).
// DecodeBatch checks the header, every node kind, dtype and rank, that containers hold as many
// children as they claim, that every array's shape multiplies out (without overflow) to its byte
// count, and that every byte range lies inside the buffer, before the caller builds a single
// object. A bad slot is a kCorrupt status, never a crash of the main process.
//
// Threads: DecodeBatch keeps no state and is safe for concurrent use; one DecodedBatch REQUIRES:
// external synchronization.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "stoker/status.h"
#include "stoker/wire_format.h"

namespace stoker {

struct DecodedNode {
  NodeKind kind;
  DType dtype;
  uint8_t flags;
  int ndim;
  uint32_t count;        // containers: children (dict: pairs)
  uint32_t shape_index;  // arrays: first of ndim entries in DecodedBatch::dims
  bool strided;          // arrays: ndim strides (elements) follow the shape in dims
  const uint8_t* data;   // heap data (arrays, str, bytes, pickled, namedtuple type)
  uint64_t nbytes;
  int64_t int_value;   // kInt, kBool
  double float_value;  // kFloat
};

struct DecodedBatch {
  std::vector<DecodedNode> nodes;  // pre-order
  std::vector<int64_t> dims;       // copied out of shared memory, so they cannot change later
  const int64_t* shape(const DecodedNode& n) const { return dims.data() + n.shape_index; }
  const int64_t* strides(const DecodedNode& n) const {
    return n.strided ? dims.data() + n.shape_index + n.ndim : nullptr;
  }
};

// Validates the batch in buf[0, size) and fills *out.
Status DecodeBatch(const uint8_t* buf, size_t size, DecodedBatch* out);

}  // namespace stoker
