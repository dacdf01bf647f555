// The Python types the encoder and decoder recognise, looked up once per process.
#include <string>

#include "common.h"

namespace stoker::py {

PyTypes& Types() {
  static PyTypes* t = nullptr;
  if (t != nullptr) {
    if (t->torch_tensor == nullptr) {
      // torch may have been imported after our first use (workers import it lazily).
      nb::object modules = nb::module_::import_("sys").attr("modules");
      PyObject* loaded = PyDict_GetItemString(modules.ptr(), "torch");
      if (loaded != nullptr && loaded != Py_None) {
        nb::object torch = nb::module_::import_("torch");
        t->torch_tensor = torch.attr("Tensor").ptr();
        Py_INCREF(t->torch_tensor);
        nb::object torch_c = torch.attr("_C");
        if (nb::hasattr(torch_c, "_from_dlpack"))
          t->torch_from_dlpack = torch_c.attr("_from_dlpack");
        t->torch_strided = torch.attr("strided").ptr();
        Py_INCREF(t->torch_strided);
        // The wire's dtype names are torch's (DTypeName), so the table is built from them.
        for (uint8_t d = 0; d < kDTypeCount; ++d) {
          const char* name = DTypeName(static_cast<DType>(d));
          if (nb::hasattr(torch, name)) t->torch_dtypes[torch.attr(name)] = static_cast<int>(d);
        }
        t->torch_output = true;
      }
    }
    return *t;
  }
  t = new PyTypes();
  nb::object np = nb::module_::import_("numpy");
  t->np_ndarray = np.attr("ndarray").ptr();
  t->np_generic = np.attr("generic").ptr();
  t->np_bool = np.attr("bool_").ptr();
  t->np_number = np.attr("number").ptr();
  for (PyObject* o : {t->np_ndarray, t->np_generic, t->np_bool, t->np_number}) Py_INCREF(o);
  t->pickle_dumps = nb::module_::import_("stoker.pickling.pickler").attr("dumps");
  t->pickle_loads = nb::module_::import_("pickle").attr("loads");
  return Types();
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
