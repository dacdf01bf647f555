// The wire format without processes: encode and decode in memory (tests, in-process use).
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common.h"
#include "py_encode.h"
#include "slot_handles.h"

namespace stoker::py {
namespace {

// Encodes obj into private memory and returns the raw batch bytes.
nb::bytes EncodeBytes(nb::handle obj, int mode, nb::handle indices) {
  PyBatchEncoder enc;
  if (!enc.Describe(obj, static_cast<EncodeMode>(mode), indices)) {
    RaiseStoker("FallbackRequired", "the collate fast path declined these samples");
  }
  const uint64_t n = enc.wire().Layout();
  std::string out(n, '\0');
  Check(enc.wire().Write(reinterpret_cast<uint8_t*>(out.data()), n));
  return nb::bytes(out.data(), out.size());
}

// Decodes raw batch bytes (copied into private memory first), validating everything.
nb::object DecodeBytes(nb::bytes data) {
  std::shared_ptr<Segment> seg(Segment::Private(data.size()).release());
  std::memcpy(seg->data(), data.c_str(), data.size());
  return DecodeInto(seg, 0, data.size(), false);
}

// An int64 NumPy view of a shared mapping of `fd` (no descriptor is duplicated, unlike Python's
// mmap module, so a forked child inherits nothing it must close).
nb::object MapShared(int fd, size_t count, bool writable) {
  const size_t bytes = count * sizeof(int64_t);
  void* p = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) Raise(Status::FromErrno("mmap of a shared page", errno));
  nb::capsule owner(p, [](void* q) noexcept {
    // The size travels in the mapping's first page size: count is small, one page at most.
    munmap(q, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  });
  size_t shape[1] = {count};
  return nb::ndarray<nb::numpy, int64_t>(p, 1, shape, owner).cast();
}

}  // namespace

void register_wire(nb::module_& m) {
  m.def("map_shared", &MapShared, nb::arg("fd"), nb::arg("count"), nb::arg("writable") = true,
        "An int64 array over a MAP_SHARED mapping of fd (count * 8 <= one page).");
  m.def("encode", &EncodeBytes, nb::arg("obj").none(), nb::arg("mode"),
        nb::arg("indices") = nb::none());
  m.def("decode", &DecodeBytes, nb::arg("data"));
}

}  // namespace stoker::py
