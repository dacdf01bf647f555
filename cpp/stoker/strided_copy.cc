#include "stoker/strided_copy.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace stoker {

void StreamCopy(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__x86_64__)
  // Up to a 16-byte boundary of dst with memcpy, then 64 bytes (one cache line) per step.
  const size_t head = std::min(n, (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

bool IsContiguous(const int64_t* shape, const int64_t* strides, int ndim, size_t itemsize) {
  if (strides == nullptr) return true;
  int64_t expected = static_cast<int64_t>(itemsize);
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] == 0) return true;
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

namespace {

// Copies dims [d, ndim) where the innermost `inner_bytes` are contiguous in the source.
void CopyRec(uint8_t*& dst, const uint8_t* src, const int64_t* shape, const int64_t* strides, int d,
             int inner_dim, size_t inner_bytes) {
  if (d == inner_dim) {
    std::memcpy(dst, src, inner_bytes);
    dst += inner_bytes;
    return;
  }
  for (int64_t i = 0; i < shape[d]; ++i) {
    CopyRec(dst, src + i * strides[d], shape, strides, d + 1, inner_dim, inner_bytes);
  }
}

template <size_t N>
void CopyElements(uint8_t* dst, const uint8_t* src, int64_t n, int64_t stride) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * N, src + i * stride, N);
}

void CopyRow(uint8_t* dst, const uint8_t* src, int64_t n, int64_t stride, size_t itemsize) {
  switch (itemsize) {
    case 1:
      return CopyElements<1>(dst, src, n, stride);
    case 2:
      return CopyElements<2>(dst, src, n, stride);
    case 4:
      return CopyElements<4>(dst, src, n, stride);
    case 8:
      return CopyElements<8>(dst, src, n, stride);
    case 16:
      return CopyElements<16>(dst, src, n, stride);
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * itemsize, src + i * stride, itemsize);
  }
}

// Dims [d, last) recursively; dim `last` (the innermost) one strided row at a time.
void StridedRows(uint8_t*& out, const uint8_t* src, const int64_t* shape, const int64_t* strides,
                 int d, int last, size_t itemsize) {
  if (d == last) {
    CopyRow(out, src, shape[d], strides[d], itemsize);
    out += static_cast<size_t>(shape[d]) * itemsize;
    return;
  }
  for (int64_t i = 0; i < shape[d]; ++i) {
    StridedRows(out, src + i * strides[d], shape, strides, d + 1, last, itemsize);
  }
}

}  // namespace

size_t CopyToContiguous(uint8_t* dst, const uint8_t* src, const int64_t* shape,
                        const int64_t* strides, int ndim, size_t itemsize, bool stream) {
  size_t total = itemsize;
  for (int i = 0; i < ndim; ++i) total *= static_cast<size_t>(shape[i]);
  if (total == 0) return 0;
  if (IsContiguous(shape, strides, ndim, itemsize)) {
    if (stream && total >= kStreamRunBytes) {
      StreamCopy(dst, src, total);
    } else {
      std::memcpy(dst, src, total);
    }
    return total;
  }
  // Find the longest contiguous suffix of dims; copy it with one memcpy per outer position.
  int inner_dim = ndim;
  size_t inner_bytes = itemsize;
  int64_t expected = static_cast<int64_t>(itemsize);
  while (inner_dim > 0) {
    const int d = inner_dim - 1;
    if (shape[d] != 1 && strides[d] != expected) break;
    expected *= shape[d];
    inner_bytes *= static_cast<size_t>(shape[d]);
    --inner_dim;
  }
  if (inner_bytes == itemsize && inner_dim == ndim && ndim > 0) {
    // The innermost dim is strided (a permuted tensor, say HWC -> CHW): copy it element by
    // element with fixed-size copies the compiler turns into single loads and stores.
    uint8_t* out = dst;
    StridedRows(out, src, shape, strides, 0, ndim - 1, itemsize);
    return total;
  }
  uint8_t* out = dst;
  CopyRec(out, src, shape, strides, 0, inner_dim, inner_bytes);
  return total;
}

}  // namespace stoker
