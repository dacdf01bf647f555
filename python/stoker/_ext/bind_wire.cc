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
  if (!seg) {
    Raise(Status::Error(Code::kOutOfMemory, "cannot allocate " + std::to_string(data.size()) +
                                                " bytes to decode a batch into"));
  }
  std::memcpy(seg->data(), data.c_str(), data.size());
  return DecodeInto(seg, 0, data.size(), false);
}

// An int64 NumPy view of a shared mapping of `fd` (no descriptor is duplicated, unlike Python's
// mmap module, so a forked child inherits nothing it must close).
// The capsule's pointer is a heap record of what was mapped, so munmap gets the exact length.
struct SharedMapping {
  void* addr;
  size_t bytes;
};

nb::object MapShared(int fd, size_t count, bool writable) {
  if (count == 0 || count > (static_cast<size_t>(1) << 40) / sizeof(int64_t)) {
    Raise(Status::Error(Code::kInvalidArgument,
                        "map_shared needs a count between 1 and 2**37, got " +
                            std::to_string(count)));
  }
  const size_t bytes = count * sizeof(int64_t);
  void* p = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) Raise(Status::FromErrno("mmap of a shared page", errno));
  auto* mapping = new SharedMapping{p, bytes};
  nb::capsule owner(mapping, [](void* q) noexcept {
    auto* m = static_cast<SharedMapping*>(q);
    munmap(m->addr, m->bytes);
    delete m;
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
