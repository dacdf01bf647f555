// The _stoker extension: one register_<area>() per part of the core it exposes.
#include "common.h"
#include "py_decode.h"
#include "stoker/segment.h"

namespace stoker::py {

void register_worker(nb::module_& m);
void register_supervisor(nb::module_& m);
void register_wire(nb::module_& m);
void register_constants(nb::module_& m);
void register_shared_list(nb::module_& m);

[[noreturn]] void Raise(const Status& st) {
  nb::object errors = nb::module_::import_("stoker.common.errors");
  PyObject* cls;
  switch (st.code()) {
    case Code::kOutOfMemory:
      cls = PyExc_MemoryError;
      break;
    case Code::kTimeout:
      cls = PyExc_TimeoutError;
      break;
    case Code::kLimitReached:
      cls = errors.attr("SharedMemoryLimitError").ptr();
      break;
    default:
      cls = errors.attr("EngineError").ptr();
      break;
  }
  PyErr_SetString(cls, st.message().c_str());
  throw nb::python_error();
}

[[noreturn]] void RaiseStoker(const char* name, const std::string& message) {
  nb::object errors = nb::module_::import_("stoker.common.errors");
  nb::object cls = errors.attr(name);
  PyErr_SetString(cls.ptr(), message.c_str());
  throw nb::python_error();
}

DType FromDLPack(nb::dlpack::dtype dt, bool* ok) {
  *ok = dt.lanes == 1;
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(dt.code);
  switch (code) {
    case C::Bool:
      if (dt.bits == 8) return DType::kBool;
      break;
    case C::Int:
      if (dt.bits == 8) return DType::kInt8;
      if (dt.bits == 16) return DType::kInt16;
      if (dt.bits == 32) return DType::kInt32;
      if (dt.bits == 64) return DType::kInt64;
      break;
    case C::UInt:
      if (dt.bits == 8) return DType::kUInt8;
      if (dt.bits == 16) return DType::kUInt16;
      if (dt.bits == 32) return DType::kUInt32;
      if (dt.bits == 64) return DType::kUInt64;
      break;
    case C::Float:
      if (dt.bits == 16) return DType::kFloat16;
      if (dt.bits == 32) return DType::kFloat32;
      if (dt.bits == 64) return DType::kFloat64;
      break;
    case C::Bfloat:
      if (dt.bits == 16) return DType::kBFloat16;
      break;
    case C::Complex:
      if (dt.bits == 64) return DType::kComplex64;
      if (dt.bits == 128) return DType::kComplex128;
      break;
    default:
      break;
  }
  *ok = false;
  return DType::kUInt8;
}

nb::dlpack::dtype ToDLPack(DType d) {
  using C = nb::dlpack::dtype_code;
  nb::dlpack::dtype dt;
  dt.lanes = 1;
  dt.bits = static_cast<uint8_t>(DTypeSize(d) * 8);
  switch (d) {
    case DType::kBool:
      dt.code = static_cast<uint8_t>(C::Bool);
      break;
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
      dt.code = static_cast<uint8_t>(C::Int);
      break;
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64:
      dt.code = static_cast<uint8_t>(C::UInt);
      break;
    case DType::kFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
      dt.code = static_cast<uint8_t>(C::Float);
      break;
    case DType::kBFloat16:
      dt.code = static_cast<uint8_t>(C::Bfloat);
      break;
    case DType::kComplex64:
    case DType::kComplex128:
      dt.code = static_cast<uint8_t>(C::Complex);
      break;
  }
  return dt;
}

NB_MODULE(_stoker, m) {
  m.doc() = "stoker's C++ engine: slots, channels, wire format and supervision.";
  m.attr("page_size") = PageSize();
  // Arrays smaller than max(VIEW_MIN_BYTES, slot bytes / VIEW_SLOT_DIVISOR) are copied out of
  // the slot instead of viewing it (py_decode.h).
  m.attr("VIEW_MIN_BYTES") = kViewMinBytes;
  m.attr("VIEW_SLOT_DIVISOR") = kViewSlotDivisor;
  register_constants(m);
  register_wire(m);
  register_worker(m);
  register_supervisor(m);
  register_shared_list(m);
}

}  // namespace stoker::py
