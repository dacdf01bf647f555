// The wire format: how one batch is laid out in a slot (after the SlotHeader).
//
//   BatchHeader (64 bytes)
//   WireNode[node_count]     the batch's structure, in pre-order
//   int64 dims[dim_count]    shapes of the array nodes
//   heap                     array data (each 64-byte aligned), string bytes, pickled blobs
//
// All offsets are relative to the start of the BatchHeader. Containers (list, tuple, dict,
// namedtuple) are followed by their children; a dict's children alternate key, value. Scalars
// (int, float, bool) are stored inline in the node. Array nodes become tensors (or NumPy arrays)
// that are views of the slot: no pickle, no copy on the reading side. What cannot be laid out
// flat is a kPickled node whose bytes the reader unpickles.
//
// The reader validates every offset, length, dtype and shape against the size of its own mapping
// before it builds anything (see wire_decoder.h).
//
// Threads: constants and pure functions only; safe for concurrent use.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker {

constexpr uint32_t kBatchMagic = 0x424b5453;  // "STKB"
constexpr uint32_t kWireVersion = 1;
constexpr size_t kArrayAlignment = 64;
constexpr int kMaxDims = 32;
// The deepest node sits kMaxNesting containers below the root. Writers keep to it by pickling
// deeper subtrees (a kPickled node carries any depth); a reader rejects anything deeper as
// corrupt, so a hostile slot cannot make it recurse without bound.
constexpr int kMaxNesting = 64;

enum class NodeKind : uint8_t {
  kNone = 0,
  kBool = 1,
  kInt = 2,          // int64 inline
  kFloat = 3,        // double inline
  kStr = 4,          // UTF-8 bytes in the heap
  kBytes = 5,        // bytes in the heap
  kArray = 6,        // dense C-ordered array in the heap
  kList = 7,         // count children
  kTuple = 8,        // count children
  kDict = 9,         // count (key, value) pairs = 2*count children
  kNamedTuple = 10,  // count fields; the type is pickled in the heap at offset/nbytes
  kPickled = 11,     // pickled object in the heap
  kBigInt = 12,      // int outside int64: decimal text in the heap
};
constexpr uint8_t kNodeKindCount = 13;

enum class DType : uint8_t {
  kBool = 0,
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt16,
  kUInt32,
  kUInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kComplex64,
  kComplex128,
};
constexpr uint8_t kDTypeCount = 15;

size_t DTypeSize(DType d);
const char* DTypeName(DType d);

// Flags of an array node.
constexpr uint8_t kArrayAsNumpy = 1;  // deliver a NumPy array, not a torch tensor
// The array keeps its source's strides: the dims table holds ndim shape entries then ndim
// strides (in elements, >= 0), and the heap holds the memory the strides span. Used where torch
// hands a tensor over as it is (batch_size=None, a collate_fn's output): channels_last and
// expanded tensors keep their layout.
constexpr uint8_t kArrayStrided = 2;

struct BatchHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t node_count;
  uint32_t dim_count;
  uint64_t total_bytes;  // header + nodes + dims + heap
  uint64_t nodes_offset;
  uint64_t dims_offset;
  uint64_t heap_offset;
  uint64_t heap_bytes;
  uint8_t reserved[8];
};
static_assert(sizeof(BatchHeader) == 64, "part of the wire format");

struct WireNode {
  uint8_t kind;         // NodeKind
  uint8_t dtype;        // DType (arrays)
  uint8_t ndim;         // arrays
  uint8_t flags;        // arrays: kArrayAsNumpy
  uint32_t count;       // containers: children (dict: pairs)
  uint64_t offset;      // heap offset of data; or the inline value of a scalar
  uint64_t nbytes;      // bytes of data in the heap
  uint32_t dims_index;  // arrays: first of ndim entries in dims
  uint32_t reserved;
};
static_assert(sizeof(WireNode) == 32, "part of the wire format");

}  // namespace stoker
