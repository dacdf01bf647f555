// Segment: one anonymous shared-memory file (memfd) mapped into this process.
//
// Created with memfd_create(MFD_CLOEXEC | MFD_ALLOW_SEALING), sized with ftruncate and then
// fallocate, so that a lack of memory is reported here, at creation, and never later as SIGBUS
// when a page is first touched. The size is then sealed (no shrink, no grow): a peer that maps
// the fd can trust that its mapping stays backed for as long as it exists.
//
// memfd memory does not live in /dev/shm, so the size of that mount (64 MB in Docker) does not
// limit it; the memory cgroup does.
//
// Threads: a Segment is immutable once it is shared (AdoptFd comes before); data(), size() and
// fd() are safe for concurrent use.
// The bytes it maps have whatever contract their user gives them (slot.h, worker_status.h). The
// mapping survives fork(); the Supervisor's fork handler drops the main process's slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "stoker/status.h"

namespace stoker {

class Segment {
 public:
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Creates a memfd of `size` bytes, reserves its pages and maps it read-write.
  // On success *fd receives the memfd (close-on-exec); the caller owns it.
  static Status Create(const char* name, size_t size, std::unique_ptr<Segment>* out, int* fd);

  // Maps an existing memfd read-write. The size comes from fstat, never from the peer.
  // The fd is not consumed: the caller may close it once this returns.
  static Status Map(int fd, std::unique_ptr<Segment>* out);

  // Wraps ordinary heap memory (for loading in-process, where nothing is shared).
  static std::unique_ptr<Segment> Private(size_t size);

  // Wraps memory someone else owns and frees (a buffer in another system's shared memory, such
  // as an object store's): the Segment never unmaps or frees it. REQUIRES: the memory outlives
  // the Segment (its user keeps the owner alive as long as the Segment).
  static std::unique_ptr<Segment> Borrowed(uint8_t* data, size_t size);

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // The memfd it maps, when it was given one to keep (AdoptFd); -1 otherwise. Closed with the
  // Segment: a caller that passes it on (SCM_RIGHTS) sends it while holding the Segment.
  int fd() const { return fd_; }
  // Keeps `fd` (the memfd this Segment maps) open for as long as the Segment lives, and closes
  // it then. REQUIRES: called once, before the Segment is shared with another thread.
  void AdoptFd(int fd) { fd_ = fd; }

 private:
  enum class Memory { kMapped, kHeap, kBorrowed };
  Segment(uint8_t* data, size_t size, Memory memory) : data_(data), size_(size), memory_(memory) {}
  uint8_t* data_;
  size_t size_;
  Memory memory_;
  int fd_ = -1;
};

size_t PageSize();
size_t RoundUpToPage(size_t n);

}  // namespace stoker
