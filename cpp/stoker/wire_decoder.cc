#include "stoker/wire_decoder.h"

#include <cstring>
#include <string>

namespace stoker {
namespace {

Status Corrupt(const std::string& what) {
  return Status::Error(Code::kCorrupt, "corrupt batch in shared memory: " + what);
}

bool RangeOk(uint64_t off, uint64_t len, uint64_t limit) {
  return off <= limit && len <= limit - off;
}

bool HasHeap(NodeKind k) {
  return k == NodeKind::kArray || k == NodeKind::kStr || k == NodeKind::kBytes ||
         k == NodeKind::kPickled || k == NodeKind::kNamedTuple || k == NodeKind::kBigInt;
}

// Checks that the subtree starting at nodes[*pos] is well formed; advances *pos past it.
Status CheckTree(const std::vector<DecodedNode>& nodes, size_t* pos, int depth) {
  if (depth > kMaxNesting) return Corrupt("nesting deeper than 64 levels");
  if (*pos >= nodes.size()) return Corrupt("a container claims more children than exist");
  const DecodedNode& n = nodes[(*pos)++];
  uint64_t children = 0;
  switch (n.kind) {
    case NodeKind::kList:
    case NodeKind::kTuple:
    case NodeKind::kNamedTuple:
      children = n.count;
      break;
    case NodeKind::kDict:
      children = 2ull * n.count;
      break;
    default:
      return Status::OK();
  }
  if (children > nodes.size() - *pos) return Corrupt("a container claims more children than exist");
  for (uint64_t i = 0; i < children; ++i) STOKER_RETURN_IF_ERROR(CheckTree(nodes, pos, depth + 1));
  return Status::OK();
}

}  // namespace

Status DecodeBatch(const uint8_t* buf, size_t size, DecodedBatch* out) {
  std::vector<DecodedNode>* nodes = &out->nodes;
  nodes->clear();
  out->dims.clear();
  if (size < sizeof(BatchHeader)) return Corrupt("smaller than its header");
  BatchHeader h;
  std::memcpy(&h, buf, sizeof(h));
  if (h.magic != kBatchMagic) return Corrupt("bad magic number");
  if (h.version != kWireVersion) {
    return Corrupt("wire version " + std::to_string(h.version) + ", expected " +
                   std::to_string(kWireVersion));
  }
  if (h.total_bytes > size) return Corrupt("claims more bytes than the slot holds");
  const uint64_t limit = h.total_bytes;
  if (h.node_count == 0) return Corrupt("no nodes");
  if (h.nodes_offset % 8 != 0 || h.dims_offset % 8 != 0) return Corrupt("misaligned tables");
  if (!RangeOk(h.nodes_offset, uint64_t{h.node_count} * sizeof(WireNode), limit)) {
    return Corrupt("node table out of bounds");
  }
  if (!RangeOk(h.dims_offset, uint64_t{h.dim_count} * sizeof(int64_t), limit)) {
    return Corrupt("dimension table out of bounds");
  }
  if (!RangeOk(h.heap_offset, h.heap_bytes, limit)) return Corrupt("heap out of bounds");
  const uint64_t heap_end = h.heap_offset + h.heap_bytes;
  const WireNode* raw = reinterpret_cast<const WireNode*>(buf + h.nodes_offset);
  const int64_t* dims = reinterpret_cast<const int64_t*>(buf + h.dims_offset);
  nodes->resize(h.node_count);
  for (uint32_t i = 0; i < h.node_count; ++i) {
    WireNode w;
    std::memcpy(&w, raw + i, sizeof(w));  // one read: a racing writer cannot change it under us
    if (w.kind >= kNodeKindCount) return Corrupt("unknown node kind " + std::to_string(w.kind));
    DecodedNode& d = (*nodes)[i];
    std::memset(&d, 0, sizeof(d));
    d.kind = static_cast<NodeKind>(w.kind);
    d.count = w.count;
    d.flags = w.flags;
    if (d.kind == NodeKind::kInt || d.kind == NodeKind::kBool) {
      d.int_value = static_cast<int64_t>(w.offset);
    } else if (d.kind == NodeKind::kFloat) {
      std::memcpy(&d.float_value, &w.offset, sizeof(double));
    }
    if (HasHeap(d.kind)) {
      if (w.offset < h.heap_offset || !RangeOk(w.offset, w.nbytes, heap_end)) {
        return Corrupt("node " + std::to_string(i) + " points outside the heap");
      }
      d.data = buf + w.offset;
      d.nbytes = w.nbytes;
    }
    if (d.kind == NodeKind::kArray) {
      if (w.dtype >= kDTypeCount) return Corrupt("unknown dtype " + std::to_string(w.dtype));
      if (w.ndim > kMaxDims) return Corrupt("array with more than 32 dimensions");
      d.strided = (w.flags & kArrayStrided) != 0;
      const uint64_t entries = d.strided ? 2ull * w.ndim : w.ndim;
      if (uint64_t{w.dims_index} + entries > h.dim_count) return Corrupt("shape out of bounds");
      d.dtype = static_cast<DType>(w.dtype);
      d.ndim = w.ndim;
      d.shape_index = static_cast<uint32_t>(out->dims.size());
      const uint64_t itemsize = DTypeSize(d.dtype);
      uint64_t bytes = itemsize;
      for (uint64_t k = 0; k < entries; ++k) {
        int64_t dim;
        std::memcpy(&dim, dims + w.dims_index + k, sizeof(dim));
        out->dims.push_back(dim);
        if (dim < 0) return Corrupt(k < w.ndim ? "negative dimension" : "negative stride");
        if (k < w.ndim && __builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes)) {
          return Corrupt("array size overflows");
        }
      }
      if (!d.strided) {
        if (bytes != w.nbytes) return Corrupt("array byte count does not match its shape");
      } else if (bytes != 0) {
        // The last element the strides reach must lie inside the bytes that travelled.
        const int64_t* shape = out->dims.data() + d.shape_index;
        uint64_t last = 0;
        for (int k = 0; k < d.ndim; ++k) {
          uint64_t step;
          if (__builtin_mul_overflow(static_cast<uint64_t>(shape[k] - 1),
                                     static_cast<uint64_t>(shape[k + d.ndim]), &step) ||
              __builtin_add_overflow(last, step, &last)) {
            return Corrupt("strides overflow");
          }
        }
        if (w.nbytes % itemsize != 0 || last >= w.nbytes / itemsize) {
          return Corrupt("strides reach outside the array's bytes");
        }
      }
      if (w.offset % kArrayAlignment != 0) return Corrupt("misaligned array");
    }
  }
  size_t pos = 0;
  STOKER_RETURN_IF_ERROR(CheckTree(*nodes, &pos, 0));
  if (pos != nodes->size()) return Corrupt("trailing nodes after the root");
  return Status::OK();
}

}  // namespace stoker
