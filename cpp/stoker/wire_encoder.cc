#include "stoker/wire_encoder.h"

#include <cstring>

#include "stoker/strided_copy.h"

namespace stoker {
namespace {

uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

void WireEncoder::Clear() {
  nodes_.clear();
  pending_.clear();
  dims_.clear();
  pieces_.clear();
  piece_dims_.clear();
  owned_.clear();
  heap_offset_ = heap_bytes_ = total_ = 0;
  laid_out_ = false;
}

void WireEncoder::Push(NodeKind kind, uint64_t offset_or_value, uint64_t nbytes) {
  WireNode n;
  std::memset(&n, 0, sizeof(n));
  n.kind = static_cast<uint8_t>(kind);
  n.offset = offset_or_value;
  n.nbytes = nbytes;
  nodes_.push_back(n);
  pending_.emplace_back();
  laid_out_ = false;
}

void WireEncoder::AddNone() { Push(NodeKind::kNone, 0, 0); }
void WireEncoder::AddBool(bool v) { Push(NodeKind::kBool, v ? 1 : 0, 0); }
void WireEncoder::AddInt(int64_t v) { Push(NodeKind::kInt, static_cast<uint64_t>(v), 0); }
void WireEncoder::AddFloat(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  Push(NodeKind::kFloat, bits, 0);
}

void WireEncoder::AddStr(const char* data, size_t size) {
  Push(NodeKind::kStr, 0, size);
  pending_.back().borrowed = data;
}

void WireEncoder::AddBytes(const char* data, size_t size) {
  Push(NodeKind::kBytes, 0, size);
  pending_.back().borrowed = data;
}

void WireEncoder::AddPickled(std::string blob) {
  Push(NodeKind::kPickled, 0, blob.size());
  pending_.back().owned_index = static_cast<uint32_t>(owned_.size());
  owned_.push_back(std::move(blob));
}

void WireEncoder::AddBigInt(std::string decimal) {
  Push(NodeKind::kBigInt, 0, decimal.size());
  pending_.back().owned_index = static_cast<uint32_t>(owned_.size());
  owned_.push_back(std::move(decimal));
}

void WireEncoder::AddContainer(NodeKind kind, uint32_t count) {
  Push(kind, 0, 0);
  nodes_.back().count = count;
}

void WireEncoder::AddNamedTuple(uint32_t count, std::string pickled_type) {
  Push(NodeKind::kNamedTuple, 0, pickled_type.size());
  nodes_.back().count = count;
  pending_.back().owned_index = static_cast<uint32_t>(owned_.size());
  owned_.push_back(std::move(pickled_type));
}

Status WireEncoder::AddArray(DType dtype, uint8_t flags, const int64_t* shape, int ndim,
                             const ArraySource* sources, size_t source_count) {
  if (ndim < 0 || ndim > kMaxDims) {
    return Status::Error(Code::kTooLarge, "arrays may have at most 32 dimensions");
  }
  const size_t itemsize = DTypeSize(dtype);
  uint64_t elements = 1;
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] < 0) return Status::Error(Code::kInvalidArgument, "negative dimension");
    if (MulOverflows(elements, static_cast<uint64_t>(shape[i]), &elements)) {
      return Status::Error(Code::kTooLarge, "array too large");
    }
  }
  uint64_t nbytes;
  if (MulOverflows(elements, itemsize, &nbytes)) {
    return Status::Error(Code::kTooLarge, "array too large");
  }
  uint64_t source_elements = 0;
  const uint32_t first_piece = static_cast<uint32_t>(pieces_.size());
  for (size_t s = 0; s < source_count; ++s) {
    const ArraySource& src = sources[s];
    uint64_t e = 1;
    for (int i = 0; i < src.ndim; ++i) e *= static_cast<uint64_t>(src.shape[i]);
    source_elements += e;
    Piece p;
    p.data = src.data;
    p.ndim = src.ndim;
    p.dims_index = static_cast<uint32_t>(piece_dims_.size());
    p.has_strides =
        src.strides != nullptr && !IsContiguous(src.shape, src.strides, src.ndim, itemsize);
    piece_dims_.insert(piece_dims_.end(), src.shape, src.shape + src.ndim);
    if (p.has_strides) piece_dims_.insert(piece_dims_.end(), src.strides, src.strides + src.ndim);
    pieces_.push_back(p);
  }
  if (source_elements != elements) {
    pieces_.resize(first_piece);
    return Status::Error(Code::kInvalidArgument,
                         "array sources hold " + std::to_string(source_elements) +
                             " elements but the shape needs " + std::to_string(elements));
  }
  Push(NodeKind::kArray, 0, nbytes);
  WireNode& n = nodes_.back();
  n.dtype = static_cast<uint8_t>(dtype);
  n.ndim = static_cast<uint8_t>(ndim);
  n.flags = flags & ~kArrayStrided;  // only AddStridedArray describes strides
  n.dims_index = static_cast<uint32_t>(dims_.size());
  dims_.insert(dims_.end(), shape, shape + ndim);
  pending_.back().first_piece = first_piece;
  pending_.back().piece_count = static_cast<uint32_t>(source_count);
  return Status::OK();
}

Status WireEncoder::AddStridedArray(DType dtype, uint8_t flags, const int64_t* shape,
                                    const int64_t* strides, int ndim, const uint8_t* data,
                                    uint64_t extent_bytes) {
  if (ndim < 0 || ndim > kMaxDims) {
    return Status::Error(Code::kTooLarge, "arrays may have at most 32 dimensions");
  }
  const int64_t flat_shape[1] = {static_cast<int64_t>(extent_bytes)};
  ArraySource src{data, flat_shape, nullptr, 1};
  // The bytes travel as one flat run; the node then describes them with shape and strides.
  STOKER_RETURN_IF_ERROR(AddArray(DType::kUInt8, flags, flat_shape, 1, &src, 1));
  WireNode& n = nodes_.back();
  n.dtype = static_cast<uint8_t>(dtype);
  n.ndim = static_cast<uint8_t>(ndim);
  n.flags = flags | kArrayStrided;
  n.dims_index = static_cast<uint32_t>(dims_.size() - 1);
  dims_.pop_back();
  dims_.insert(dims_.end(), shape, shape + ndim);
  dims_.insert(dims_.end(), strides, strides + ndim);
  return Status::OK();
}

Status WireEncoder::AddOwnedArray(DType dtype, uint8_t flags, const int64_t* shape, int ndim,
                                  std::string bytes) {
  owned_.push_back(std::move(bytes));
  const std::string& b = owned_.back();
  std::vector<int64_t> flat_shape(1, static_cast<int64_t>(b.size() / DTypeSize(dtype)));
  ArraySource src{reinterpret_cast<const uint8_t*>(b.data()), flat_shape.data(), nullptr, 1};
  return AddArray(dtype, flags, shape, ndim, &src, 1);
}

uint64_t WireEncoder::Layout() {
  uint64_t off = sizeof(BatchHeader);
  off += nodes_.size() * sizeof(WireNode);
  off += dims_.size() * sizeof(int64_t);
  heap_offset_ = AlignUp(off, kArrayAlignment);
  uint64_t h = heap_offset_;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    WireNode& n = nodes_[i];
    const NodeKind kind = static_cast<NodeKind>(n.kind);
    const bool has_heap = kind == NodeKind::kArray || kind == NodeKind::kStr ||
                          kind == NodeKind::kBytes || kind == NodeKind::kPickled ||
                          kind == NodeKind::kNamedTuple || kind == NodeKind::kBigInt;
    if (!has_heap) continue;
    if (kind == NodeKind::kArray) h = AlignUp(h, kArrayAlignment);
    n.offset = h;
    h += n.nbytes;
  }
  heap_bytes_ = h - heap_offset_;
  total_ = h;
  laid_out_ = true;
  return total_;
}

Status WireEncoder::Write(uint8_t* dst, size_t capacity) const {
  if (!laid_out_) return Status::Error(Code::kInvalidArgument, "Layout() was not called");
  if (total_ > capacity) {
    return Status::Error(Code::kTooLarge, "the batch needs " + std::to_string(total_) +
                                              " bytes but the slot holds " +
                                              std::to_string(capacity));
  }
  BatchHeader hdr;
  std::memset(&hdr, 0, sizeof(hdr));
  hdr.magic = kBatchMagic;
  hdr.version = kWireVersion;
  hdr.node_count = static_cast<uint32_t>(nodes_.size());
  hdr.dim_count = static_cast<uint32_t>(dims_.size());
  hdr.total_bytes = total_;
  hdr.nodes_offset = sizeof(BatchHeader);
  hdr.dims_offset = hdr.nodes_offset + nodes_.size() * sizeof(WireNode);
  hdr.heap_offset = heap_offset_;
  hdr.heap_bytes = heap_bytes_;
  std::memcpy(dst, &hdr, sizeof(hdr));
  if (!nodes_.empty()) {
    std::memcpy(dst + hdr.nodes_offset, nodes_.data(), nodes_.size() * sizeof(WireNode));
  }
  if (!dims_.empty()) {
    std::memcpy(dst + hdr.dims_offset, dims_.data(), dims_.size() * sizeof(int64_t));
  }
  // A batch larger than the caches is written with streaming stores (strided_copy.h).
  const bool stream = heap_bytes_ >= kStreamBatchBytes;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const WireNode& n = nodes_[i];
    const Pending& p = pending_[i];
    const NodeKind kind = static_cast<NodeKind>(n.kind);
    if (kind == NodeKind::kNone || kind == NodeKind::kBool || kind == NodeKind::kInt ||
        kind == NodeKind::kFloat || kind == NodeKind::kList || kind == NodeKind::kTuple ||
        kind == NodeKind::kDict) {
      continue;  // no heap data; `offset` may hold an inline value
    }
    uint8_t* out = dst + n.offset;
    switch (kind) {
      case NodeKind::kStr:
      case NodeKind::kBytes:
        if (n.nbytes) std::memcpy(out, p.borrowed, n.nbytes);
        break;
      case NodeKind::kPickled:
      case NodeKind::kNamedTuple:
      case NodeKind::kBigInt:
        if (n.nbytes) std::memcpy(out, owned_[p.owned_index].data(), n.nbytes);
        break;
      case NodeKind::kArray: {
        // A strided array's bytes travelled as one run of bytes (see AddStridedArray).
        const size_t itemsize =
            (n.flags & kArrayStrided) ? 1 : DTypeSize(static_cast<DType>(n.dtype));
        for (uint32_t k = 0; k < p.piece_count; ++k) {
          const Piece& piece = pieces_[p.first_piece + k];
          const int64_t* shape = piece_dims_.data() + piece.dims_index;
          const int64_t* strides = piece.has_strides ? shape + piece.ndim : nullptr;
          out += CopyToContiguous(out, piece.data, shape, strides, piece.ndim, itemsize, stream);
        }
        break;
      }
      default:
        break;
    }
  }
  return Status::OK();
}

}  // namespace stoker
