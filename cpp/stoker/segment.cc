#include "stoker/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace stoker {

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t RoundUpToPage(size_t n) {
  const size_t p = PageSize();
  return (n + p - 1) / p * p;
}

Segment::~Segment() {
  if (fd_ >= 0) close(fd_);
  if (data_ == nullptr) return;
  if (memory_ == Memory::kMapped) {
    munmap(data_, size_);
  } else if (memory_ == Memory::kHeap) {
    std::free(data_);
  }
}

Status Segment::Create(const char* name, size_t size, std::unique_ptr<Segment>* out, int* fd_out) {
  if (size == 0) return Status::Error(Code::kInvalidArgument, "a segment cannot be empty");
  size = RoundUpToPage(size);
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::FromErrno("memfd_create", errno);
  auto fail = [fd](const std::string& what, int err) {
    close(fd);
    return Status::FromErrno(what, err);
  };
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) return fail("ftruncate of a memfd", errno);
  // Reserve every page now: without this, a full memory cgroup or tmpfs would surface as SIGBUS
  // on first write instead of an error here.
  int rc;
  do {
    rc = fallocate(fd, 0, 0, static_cast<off_t>(size));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    return fail("cannot reserve " + std::to_string(size) + " bytes of shared memory (fallocate)",
                err);
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return fail("sealing a memfd", errno);
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap of a new segment", errno);
  out->reset(new Segment(static_cast<uint8_t*>(p), size, Memory::kMapped));
  *fd_out = fd;
  return Status::OK();
}

Status Segment::Map(int fd, std::unique_ptr<Segment>* out) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::FromErrno("fstat of a received segment", errno);
  if (st.st_size <= 0) return Status::Error(Code::kCorrupt, "received an empty segment");
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    // Without the shrink seal the sender could truncate the file under our mapping and turn a
    // later read into SIGBUS in this process.
    return Status::Error(Code::kCorrupt, "received a segment that is not sealed against shrinking");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status::FromErrno("mmap of a received segment", errno);
  out->reset(new Segment(static_cast<uint8_t*>(p), size, Memory::kMapped));
  return Status::OK();
}

std::unique_ptr<Segment> Segment::Private(size_t size) {
  if (size == 0) size = 64;
  void* p = std::aligned_alloc(64, (size + 63) / 64 * 64);
  if (p == nullptr) return nullptr;
  return std::unique_ptr<Segment>(new Segment(static_cast<uint8_t*>(p), size, Memory::kHeap));
}

std::unique_ptr<Segment> Segment::Borrowed(uint8_t* data, size_t size) {
  return std::unique_ptr<Segment>(new Segment(data, size, Memory::kBorrowed));
}

}  // namespace stoker
