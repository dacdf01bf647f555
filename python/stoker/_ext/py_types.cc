// The Python types the encoder and decoder recognise, looked up once per process, and the
// helpers that read a container's items into strong references (common.h).
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common.h"

namespace stoker::py {

namespace {

std::atomic<PyTypes*> g_types{nullptr};

// torch is in sys.modules (it may still be importing: import_ then waits for it).
bool TorchLoaded() {
  static PyObject* const kTorch = PyUnicode_InternFromString("torch");
  if (kTorch == nullptr) throw nb::python_error();
  PyObject* m = PyImport_GetModule(kTorch);  // a new reference, or null
  if (m == nullptr) {
    if (PyErr_Occurred()) throw nb::python_error();
    return false;
  }
  const bool loaded = m != Py_None;
  Py_DECREF(m);
  return loaded;
}

// A new set: `old`'s (or NumPy's and pickle's, the first time) and torch's when it is loaded.
PyTypes* Build(const PyTypes* old) {
  std::unique_ptr<PyTypes> t(old != nullptr ? new PyTypes(*old) : new PyTypes());
  if (old == nullptr) {
    nb::object np = nb::module_::import_("numpy");
    t->np_ndarray = np.attr("ndarray").ptr();
    t->np_generic = np.attr("generic").ptr();
    t->np_bool = np.attr("bool_").ptr();
    t->np_number = np.attr("number").ptr();
    for (PyObject* o : {t->np_ndarray, t->np_generic, t->np_bool, t->np_number}) Py_INCREF(o);
    t->pickle_dumps = nb::module_::import_("stoker.pickling.pickler").attr("dumps");
    t->pickle_loads = nb::module_::import_("pickle").attr("loads");
  }
  // torch may be imported after our first use (workers import it lazily).
  if (!t->torch_output && TorchLoaded()) {
    nb::object torch = nb::module_::import_("torch");
    t->torch_tensor = torch.attr("Tensor").ptr();
    Py_INCREF(t->torch_tensor);
    nb::object torch_c = torch.attr("_C");
    if (nb::hasattr(torch_c, "_from_dlpack")) t->torch_from_dlpack = torch_c.attr("_from_dlpack");
    t->torch_strided = torch.attr("strided").ptr();
    Py_INCREF(t->torch_strided);
    // The wire's dtype names are torch's (DTypeName), so the table is built from them; a new
    // dict (the old set's stays as it was for whoever reads it).
    nb::dict dtypes;
    for (uint8_t d = 0; d < kDTypeCount; ++d) {
      const char* name = DTypeName(static_cast<DType>(d));
      if (nb::hasattr(torch, name)) dtypes[torch.attr(name)] = static_cast<int>(d);
    }
    t->torch_dtypes = dtypes;
    t->torch_output = true;
  }
  return t.release();
}

}  // namespace

PyTypes& Types() {
  PyTypes* t = g_types.load(std::memory_order_acquire);
  if (t != nullptr && (t->torch_output || !TorchLoaded())) return *t;
  PyTypes* fresh = Build(t);
  if (g_types.compare_exchange_strong(t, fresh, std::memory_order_acq_rel)) {
    // The set it replaces is left alive on purpose: another thread may be reading it.
    return *fresh;
  }
  delete fresh;  // another thread published one first: `t` is it now
  return *t;
}

nb::object AsTuple(PyObject* seq) {
  if (PyTuple_Check(seq)) return nb::borrow(seq);
  PyObject* t = PyList_AsTuple(seq);
  if (t == nullptr) throw nb::python_error();
  return nb::steal(t);
}

std::vector<nb::object> DictItems(PyObject* dict) {
  std::vector<nb::object> out;
  nb::ft_object_guard guard{nb::handle(dict)};
  out.reserve(2 * static_cast<size_t>(PyDict_GET_SIZE(dict)));
  Py_ssize_t pos = 0;
  PyObject *k = nullptr, *v = nullptr;
  while (PyDict_Next(dict, &pos, &k, &v)) {
    out.push_back(nb::borrow(k));
    out.push_back(nb::borrow(v));
  }
  return out;
}

nb::object DictGet(PyObject* dict, PyObject* key) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* v = nullptr;
  if (PyDict_GetItemRef(dict, key, &v) < 0) throw nb::python_error();
  return nb::steal(v);
#else
  PyObject* v = PyDict_GetItemWithError(dict, key);  // borrowed: held at once, with the GIL
  if (v == nullptr && PyErr_Occurred()) throw nb::python_error();
  return nb::borrow(v);
#endif
}

std::string Repr(nb::handle obj) {
  PyObject* r = PyObject_Repr(obj.ptr());
  if (r == nullptr) {
    PyErr_Clear();
    return "<unprintable>";
  }
  std::string s = PyUnicode_AsUTF8(r);
  Py_DECREF(r);
  return s;
}

bool IsInstance(PyObject* obj, PyObject* cls) {
  if (cls == nullptr) return false;
  int r = PyObject_IsInstance(obj, cls);
  if (r < 0) {
    PyErr_Clear();
    return false;
  }
  return r == 1;
}

// A namedtuple: a tuple subclass whose class has `_fields`, a tuple of one name per item.
bool IsNamedTuple(PyObject* obj) {
  if (!PyTuple_Check(obj) || PyTuple_CheckExact(obj)) return false;
  PyObject* fields = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(obj)), "_fields");
  if (fields == nullptr) {
    PyErr_Clear();
    return false;
  }
  bool ok = PyTuple_Check(fields) && PyTuple_GET_SIZE(fields) == PyTuple_GET_SIZE(obj);
  for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(fields); ++i) {
    ok = PyUnicode_Check(PyTuple_GET_ITEM(fields, i));
  }
  Py_DECREF(fields);
  return ok;
}

bool IsExactTensor(PyObject* obj) {
  PyObject* cls = Types().torch_tensor;
  return cls != nullptr && Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(cls);
}

}  // namespace stoker::py
