// WireEncoder: lays a batch out in the wire format (wire_format.h).
//
// The caller describes the batch in pre-order (containers first, then their children), then
// calls Layout() to learn how many bytes it needs and Write() to fill a slot. Array nodes are
// described by their sources: one piece per sample for a stacked leaf, in order, so each byte is
// copied exactly once, straight into its stacked position. The encoder does not copy sources or
// string bytes when they are added: they must stay alive and unchanged until Write() returns.
//
// Threads: REQUIRES: external synchronization. A WireEncoder is used by one thread at a time;
// distinct encoders are independent.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "stoker/status.h"
#include "stoker/wire_format.h"

namespace stoker {

// One piece of an array: data, shape and byte strides (nullptr strides = C-contiguous).
struct ArraySource {
  const uint8_t* data;
  const int64_t* shape;
  const int64_t* strides;
  int ndim;
};

// Batches with at least this many bytes of array and string data are written with streaming
// stores (strided_copy.h: StreamCopy): larger than the share of the caches they could stay in
// until the main process reads them.
inline constexpr uint64_t kStreamBatchBytes = 4u << 20;

class WireEncoder {
 public:
  void Clear();

  void AddNone();
  void AddBool(bool v);
  void AddInt(int64_t v);
  void AddFloat(double v);
  void AddStr(const char* data, size_t size);    // borrowed
  void AddBytes(const char* data, size_t size);  // borrowed
  void AddPickled(std::string blob);             // owned
  void AddBigInt(std::string decimal);           // owned
  void AddContainer(NodeKind kind, uint32_t count);
  void AddNamedTuple(uint32_t count, std::string pickled_type);

  // An array of `shape` filled from `sources` in order; their elements must add up to the
  // product of `shape`. Source shapes and strides are copied; source data is borrowed.
  Status AddArray(DType dtype, uint8_t flags, const int64_t* shape, int ndim,
                  const ArraySource* sources, size_t source_count);
  // One array that keeps its layout: `strides` in elements (all >= 0); the `extent_bytes` of
  // memory from `data` that they span are copied as they are.
  Status AddStridedArray(DType dtype, uint8_t flags, const int64_t* shape, const int64_t* strides,
                         int ndim, const uint8_t* data, uint64_t extent_bytes);
  // An array whose bytes the encoder keeps (for instance collated Python numbers).
  Status AddOwnedArray(DType dtype, uint8_t flags, const int64_t* shape, int ndim,
                       std::string bytes);

  size_t node_count() const { return nodes_.size(); }

  // Assigns offsets; returns the total number of bytes Write() will produce.
  uint64_t Layout();
  // Writes the batch into dst (capacity bytes). Layout() must have been called. A batch of
  // kStreamBatchBytes or more is written with streaming stores.
  Status Write(uint8_t* dst, size_t capacity) const;

 private:
  struct Piece {
    const uint8_t* data;
    uint32_t dims_index;  // into piece_dims_ (shape then strides, ndim each)
    int ndim;
    bool has_strides;
  };
  struct Pending {
    const char* borrowed = nullptr;     // str/bytes
    uint32_t owned_index = UINT32_MAX;  // into owned_
    uint32_t first_piece = 0, piece_count = 0;
  };
  void Push(NodeKind kind, uint64_t offset_or_value, uint64_t nbytes);

  std::vector<WireNode> nodes_;
  std::vector<Pending> pending_;
  std::vector<int64_t> dims_;
  std::vector<Piece> pieces_;
  std::vector<int64_t> piece_dims_;
  std::deque<std::string> owned_;  // a deque: pieces point into these, so they must not move
  uint64_t heap_offset_ = 0, heap_bytes_ = 0, total_ = 0;
  bool laid_out_ = false;
};

}  // namespace stoker
