// Shared pieces of the binding: Status -> Python exceptions, and the Python types the encoder
// and decoder need to recognise. The core stays free of Python; everything Python lives here.
//
// Threads: the extension declares that it runs without the GIL (FREE_THREADED in
// CMakeLists.txt), so on a free-threaded interpreter every binding may be entered by several
// threads at once, and a container it reads may be changed by another thread meanwhile. Each
// class states its own contract in its header or where it is defined; the rules they follow:
// - No borrowed reference outlives the call that gave it where another thread could drop it:
//   a list's or a dict's items are read into strong references at once (AsTuple, DictItems,
//   DictGet below), never walked by pointer while Python code runs. (With the GIL the same
//   holds whenever Python code runs in between: a __reduce__ while pickling, a __repr__.)
// - State shared between calls is either immutable once published (Types()), atomic, or behind
//   a mutex taken for a few instructions with no Python call inside it.
// - An object with one caller by contract (WorkerEndpoint) refuses a second caller at once with
//   an error instead of corrupting itself.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>
#include <vector>

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
// Immutable once Types() returned it: any thread may read it without a lock.
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
  bool torch_output = false;          // deliver torch tensors (torch importable in this process)
};
// The types of this process. Thread-safe: a set is built whole, then published atomically;
// when torch is imported later, a new set with torch's types replaces it (the old one is kept,
// as a caller may still read it).
PyTypes& Types();

// `seq` (a list or tuple) as a tuple whose items are held: a tuple itself, or a copy of a list's
// items taken at once (PyList_AsTuple holds the list's lock on a free-threaded interpreter).
// Raises on failure.
nb::object AsTuple(PyObject* seq);
// A dict's keys and values, held, in the dict's order: k0, v0, k1, v1, ... read in one go under
// the dict's critical section (no Python code runs while it is held).
std::vector<nb::object> DictItems(PyObject* dict);
// dict[key] as a strong reference, or an invalid object (no error set) when the key is absent;
// raises on error (a key whose __eq__ raises).
nb::object DictGet(PyObject* dict, PyObject* key);

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
