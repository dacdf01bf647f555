// Copies an N-d strided array into a dense C-ordered destination, one pass over the bytes.
//
// Threads: pure functions; safe for concurrent use (on destinations that do not overlap).
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker {

// strides are in bytes; nullptr means C-contiguous. Returns the number of bytes written.
// `stream`: a contiguous source of kStreamRunBytes or more is written with non-temporal stores
// (see StreamCopy); strided sources are copied with memcpy runs as without it.
size_t CopyToContiguous(uint8_t* dst, const uint8_t* src, const int64_t* shape,
                        const int64_t* strides, int ndim, size_t itemsize, bool stream = false);

// Runs shorter than this are copied with memcpy even when streaming.
inline constexpr size_t kStreamRunBytes = 4096;

// memcpy with non-temporal (streaming) stores where the CPU has them (x86-64; elsewhere
// memcpy): the destination's cache lines are not read first and do not evict the cache. For a
// batch larger than the caches, written into a slot the main process reads later from another
// core: the lines would be gone by then anyway, and reading them first costs a second pass over
// memory. Ends with a store fence: what it wrote is visible to a reader that synchronises after.
void StreamCopy(uint8_t* dst, const uint8_t* src, size_t n);

// True when strides describe a C-contiguous layout (size-1 dims may have any stride).
bool IsContiguous(const int64_t* shape, const int64_t* strides, int ndim, size_t itemsize);

}  // namespace stoker
