// Shared pieces of the binding: Status -> Python exceptions, and the Python types the encoder
// and decoder need to recognise. The core stays free of Python; everything Python lives here.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>

#include "stoker/status.h"
#include "stoker/wire_format.h"

namespace nb = nanobind;

namespace stoker::py {

// Raises a Python exception for a failed Status: MemoryError for kOutOfMemory, TimeoutError,
// and stoker.EngineError (a RuntimeError) for everything else.
[[noreturn]] void Raise(const Status& st);
inline void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}

// Raises an exception of the class `name` from stoker.common.errors with `message`.
[[noreturn]] void RaiseStoker(const char* name, const std::string& message);

// Python types looked up once. torch is optional: torch_tensor is null when torch is not loaded.
struct PyTypes {
  PyObject* np_ndarray = nullptr;
  PyObject* np_generic = nullptr;
  PyObject* np_bool = nullptr;
  PyObject* np_number = nullptr;
  PyObject* torch_tensor = nullptr;
  nb::object pickle_dumps, pickle_loads;
  // torch._C._from_dlpack (a DLPack capsule to a tensor), when torch is loaded: called on the
  // capsule directly, it skips torch.utils.dlpack.from_dlpack's Python checks (~2 us a tensor).
  nb::object torch_from_dlpack;
  PyObject* torch_strided = nullptr;  // torch.strided
  nb::dict torch_dtypes;              // torch.dtype -> int(DType), the ones the wire carries
  bool torch_output = false;     // deliver torch tensors (torch importable in this process)
};
PyTypes& Types();

// repr(obj), or "<unprintable>" when repr raises.
std::string Repr(nb::handle obj);

// isinstance(obj, cls), false when cls is null or the check raises.
bool IsInstance(PyObject* obj, PyObject* cls);
// A namedtuple: a tuple subclass whose class has `_fields`, a tuple of one name per item.
bool IsNamedTuple(PyObject* obj);
// type(obj) is torch.Tensor (not a subclass); false when torch is not loaded.
bool IsExactTensor(PyObject* obj);

DType FromDLPack(nb::dlpack::dtype dt, bool* ok);
nb::dlpack::dtype ToDLPack(DType d);

}  // namespace stoker::py
