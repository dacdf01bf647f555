// The wire format without processes: encode and decode in memory (tests, in-process use).
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

}  // namespace

void register_wire(nb::module_& m) {
  m.def("encode", &EncodeBytes, nb::arg("obj"), nb::arg("mode"), nb::arg("indices") = nb::none());
  m.def("decode", &DecodeBytes, nb::arg("data"));
  m.attr("MODE_COLLATE") = static_cast<int>(EncodeMode::kCollate);
  m.attr("MODE_CONVERT") = static_cast<int>(EncodeMode::kConvert);
  m.attr("MODE_AS_IS") = static_cast<int>(EncodeMode::kAsIs);
}

}  // namespace stoker::py
