// The wire format without processes: encode and decode in memory (tests, in-process use).
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
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

// Encodes obj into a new NumPy uint8 array (one copy of each byte): what a placement that hands
// batches to another system's buffers (an object store) sends.
nb::object EncodeArray(nb::handle obj, int mode, nb::handle indices) {
  PyBatchEncoder enc;
  if (!enc.Describe(obj, static_cast<EncodeMode>(mode), indices)) {
    RaiseStoker("FallbackRequired", "the collate fast path declined these samples");
  }
  const uint64_t n = enc.wire().Layout();
  auto* buf = static_cast<uint8_t*>(std::malloc(n > 0 ? n : 1));
  if (buf == nullptr) {
    Raise(Status::Error(Code::kOutOfMemory,
                        "cannot allocate " + std::to_string(n) + " bytes to encode a batch into"));
  }
  nb::capsule owner(buf, [](void* p) noexcept { std::free(p); });
  Check(enc.wire().Write(buf, n));
  size_t shape[1] = {static_cast<size_t>(n)};
  return nb::ndarray<nb::numpy, uint8_t>(buf, 1, shape, owner).cast();
}

// Decodes a batch where it lies (a read-only buffer of another system, an object store's):
// every offset is validated against the buffer, tensors are views of it, and the buffer's
// owner lives as long as the last view. No copy.
nb::object DecodeBuffer(nb::handle buffer) {
  // The export is held for as long as any view of the batch lives (the buffer protocol
  // promises the memory only while it is): the capsule, kept by the lease, releases it when
  // the lease dies (with the GIL held), and holds a reference to the exporter meanwhile.
  auto* view = new Py_buffer;
  if (PyObject_GetBuffer(buffer.ptr(), view, PyBUF_SIMPLE) != 0) {
    delete view;
    throw nb::python_error();
  }
  nb::capsule exported(view, [](void* p) noexcept {
    auto* v = static_cast<Py_buffer*>(p);
    PyBuffer_Release(v);
    delete v;
  });
  uint8_t* data = static_cast<uint8_t*>(view->buf);
  const size_t size = static_cast<size_t>(view->len);
  std::shared_ptr<Segment> seg(Segment::Borrowed(data, size).release());
  return DecodeInto(seg, 0, size, false, 0, std::move(exported));
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
    Raise(Status::Error(
        Code::kInvalidArgument,
        "map_shared needs a count between 1 and 2**37, got " + std::to_string(count)));
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
  m.def("encode_array", &EncodeArray, nb::arg("obj").none(), nb::arg("mode"),
        nb::arg("indices") = nb::none(),
        "Encodes a batch into a new NumPy uint8 array (one copy).");
  m.def("decode_buffer", &DecodeBuffer, nb::arg("buffer"),
        "Decodes a batch in place, as views of `buffer` (kept alive by them).");
}

}  // namespace stoker::py
