// Copies an N-d strided array into a dense C-ordered destination, one pass over the bytes.
//
// Threads: pure functions; safe for concurrent use (on destinations that do not overlap).
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker {

// strides are in bytes; nullptr means C-contiguous. Returns the number of bytes written.
size_t CopyToContiguous(uint8_t* dst, const uint8_t* src, const int64_t* shape,
                        const int64_t* strides, int ndim, size_t itemsize);

// True when strides describe a C-contiguous layout (size-1 dims may have any stride).
bool IsContiguous(const int64_t* shape, const int64_t* strides, int ndim, size_t itemsize);

}  // namespace stoker
