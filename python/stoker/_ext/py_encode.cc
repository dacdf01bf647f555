// Mapping one Python object onto wire nodes: as it is (kAsIs, a collate_fn's output) or as
// default_convert returns it (kConvert, batch_size=None). Containers keep their type, tensors
// and arrays are laid out flat, anything else is pickled.
#include "py_encode.h"

#include <string>
#include <vector>

#include "stoker/strided_copy.h"

namespace stoker::py {

void PyBatchEncoder::Reset() {
  held_.Clear();
  wire_.Clear();
}

bool PyBatchEncoder::AddSingle(const ArrayView& v, uint8_t flags) {
  const int64_t itemsize = static_cast<int64_t>(DTypeSize(v.dtype));
  int64_t numel = 1, last = 0;
  bool non_negative = true;
  for (int i = 0; i < v.ndim; ++i) {
    numel *= v.shape[i];
    if (v.strides[i] < 0 || v.strides[i] % itemsize != 0) non_negative = false;
    last += (v.shape[i] - 1) * v.strides[i];
  }
  const bool contiguous = IsContiguous(v.shape, v.strides, v.ndim, static_cast<size_t>(itemsize));
  // Keep the layout (channels_last, expanded, transposed) as torch does when it pickles a tensor,
  // unless the memory the strides span is much larger than the data (a thin slice of a big one).
  // Empty arrays keep their (meaningless but visible) strides too.
  if (non_negative && (numel == 0 || (!contiguous && last / itemsize + 1 <= 4 * numel))) {
    int64_t strides[kMaxDims];
    for (int i = 0; i < v.ndim; ++i) strides[i] = v.strides[i] / itemsize;
    const uint64_t extent = numel == 0 ? 0 : static_cast<uint64_t>(last + itemsize);
    Check(wire_.AddStridedArray(v.dtype, flags, v.shape, strides, v.ndim, v.data, extent));
    return true;
  }
  return AddStacked({v}, flags, false);
}

void PyBatchEncoder::Pickle(PyObject* obj) {
  PyObject* blob = PyObject_CallOneArg(Types().pickle_dumps.ptr(), obj);
  if (blob == nullptr) {
    nb::python_error cause;
    const std::string type_name = Py_TYPE(obj)->tp_name;
    RaiseStoker("BatchEncodingError",
                "cannot send an object of type '" + type_name +
                    "' from the worker to the main process: it is not a tensor, array, number, "
                    "string or container that stoker lays out directly, and pickling it failed: " +
                    std::string(cause.what()) +
                    ". Return tensors, NumPy arrays or plain Python data from the dataset or "
                    "collate_fn, or make the type picklable.");
  }
  wire_.AddPickled(std::string(PyBytes_AS_STRING(blob), PyBytes_GET_SIZE(blob)));
  Py_DECREF(blob);
}

bool PyBatchEncoder::Value(PyObject* obj, EncodeMode mode, int depth) {
  PyTypes& T = Types();
  if (depth >= kMaxNesting && (PyList_Check(obj) || PyTuple_Check(obj) || PyDict_Check(obj))) {
    // The wire carries kMaxNesting levels; deeper containers travel pickled, as torch's do.
    if (mode == EncodeMode::kConvert) return false;
    Pickle(obj);
    return true;
  }
  if (obj == Py_None) {
    wire_.AddNone();
    return true;
  }
  if (PyBool_Check(obj)) {
    wire_.AddBool(obj == Py_True);
    return true;
  }
  if (PyLong_CheckExact(obj)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow == 0) {
      wire_.AddInt(v);
      return true;
    }
    PyObject* text = PyObject_Str(obj);
    if (text == nullptr) {  // more digits than sys.get_int_max_str_digits() allows: pickled
      PyErr_Clear();
      Pickle(obj);
      return true;
    }
    Py_ssize_t size = 0;
    const char* digits = PyUnicode_AsUTF8AndSize(text, &size);
    if (digits == nullptr) {
      Py_DECREF(text);
      throw nb::python_error();
    }
    wire_.AddBigInt(std::string(digits, static_cast<size_t>(size)));
    Py_DECREF(text);
    return true;
  }
  if (PyFloat_CheckExact(obj)) {
    wire_.AddFloat(PyFloat_AS_DOUBLE(obj));
    return true;
  }
  if (PyUnicode_CheckExact(obj)) {
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(obj, &size);
    if (utf8 == nullptr) {  // lone surrogates: pickle keeps them
      PyErr_Clear();
      Pickle(obj);
      return true;
    }
    held_.Keep(obj);  // the UTF-8 bytes live as long as the str
    wire_.AddStr(utf8, static_cast<size_t>(size));
    return true;
  }
  if (PyBytes_CheckExact(obj)) {
    held_.Keep(obj);
    wire_.AddBytes(PyBytes_AS_STRING(obj), static_cast<size_t>(PyBytes_GET_SIZE(obj)));
    return true;
  }
  if (IsExactTensor(obj)) {  // a subclass is pickled: torch hands it over as it is
    ArrayView v;
    if (held_.ViewTensor(obj, &v)) return AddSingle(v, 0);
    Pickle(obj);
    return true;
  }
  if (Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(T.np_ndarray)) {
    ArrayView v;
    if (held_.ViewNumpy(obj, &v)) {
      const uint8_t flags = mode == EncodeMode::kConvert ? 0 : kArrayAsNumpy;
      return AddSingle(v, flags);
    }
    Pickle(obj);  // strings, objects, big-endian: unchanged by default_convert too
    return true;
  }
  if (mode == EncodeMode::kConvert && IsInstance(obj, T.np_generic) &&
      (IsInstance(obj, T.np_bool) || IsInstance(obj, T.np_number))) {
    ArrayView v;
    if (held_.ViewNumpy(obj, &v)) return AddSingle(v, 0);
    return false;
  }
  bool handled = false;
  const bool ok = Container(obj, mode, depth, &handled);
  if (handled) return ok;
  if (mode == EncodeMode::kConvert) return false;  // default_convert recurses into other types
  Pickle(obj);
  return true;
}

// list, tuple, dict and namedtuple keep their type (default_convert makes tuples lists).
bool PyBatchEncoder::Container(PyObject* obj, EncodeMode mode, int depth, bool* handled) {
  *handled = true;
  // A list's or dict's items are read at once into held references (common.h): another thread,
  // or Python code the encoding runs (a __reduce__), may change the container meanwhile.
  if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
    const bool as_tuple = PyTuple_CheckExact(obj) && mode == EncodeMode::kAsIs;
    const nb::object items = AsTuple(obj);
    const Py_ssize_t len = PyTuple_GET_SIZE(items.ptr());
    wire_.AddContainer(as_tuple ? NodeKind::kTuple : NodeKind::kList, static_cast<uint32_t>(len));
    for (Py_ssize_t i = 0; i < len; ++i) {
      if (!Value(PyTuple_GET_ITEM(items.ptr(), i), mode, depth + 1)) return false;
    }
    return true;
  }
  if (PyDict_CheckExact(obj)) {
    const std::vector<nb::object> items = DictItems(obj);
    wire_.AddContainer(NodeKind::kDict, static_cast<uint32_t>(items.size() / 2));
    for (size_t i = 0; i < items.size(); i += 2) {
      if (!Value(items[i].ptr(), EncodeMode::kAsIs, depth + 1)) return false;
      if (!Value(items[i + 1].ptr(), mode, depth + 1)) return false;
    }
    return true;
  }
  if (IsNamedTuple(obj)) {
    PyObject* blob =
        PyObject_CallOneArg(Types().pickle_dumps.ptr(), reinterpret_cast<PyObject*>(Py_TYPE(obj)));
    if (blob != nullptr && PyBytes_Check(blob)) {
      std::string type_bytes(PyBytes_AS_STRING(blob), PyBytes_GET_SIZE(blob));
      Py_DECREF(blob);
      const Py_ssize_t len = PyTuple_GET_SIZE(obj);
      wire_.AddNamedTuple(static_cast<uint32_t>(len), std::move(type_bytes));
      for (Py_ssize_t i = 0; i < len; ++i) {
        if (!Value(PyTuple_GET_ITEM(obj, i), mode, depth + 1)) return false;
      }
      return true;
    }
    Py_XDECREF(blob);
    PyErr_Clear();  // a type pickle cannot find: the namedtuple is pickled whole (and fails)
  }
  *handled = false;
  return false;
}

bool PyBatchEncoder::Describe(nb::handle obj, EncodeMode mode, nb::handle indices) {
  Reset();
  indices_ = indices;
  bool ok;
  try {
    if (mode == EncodeMode::kCollate) {
      const nb::object held = PyList_Check(obj.ptr()) ? AsTuple(obj.ptr()) : nb::object();
      if (!held.is_valid() || PyTuple_GET_SIZE(held.ptr()) == 0) {
        ok = false;
      } else {
        PyObject** items = &PyTuple_GET_ITEM(held.ptr(), 0);
        std::vector<PyObject*> samples(items, items + PyTuple_GET_SIZE(held.ptr()));
        std::string path;
        ok = Collate(samples, path, 0);
      }
    } else {
      ok = Value(obj.ptr(), mode, 0);
    }
  } catch (...) {
    Reset();  // release the batch's buffers now, not at the next batch
    throw;
  }
  if (!ok) Reset();
  return ok;
}

}  // namespace stoker::py
