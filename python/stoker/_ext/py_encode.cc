#include "py_encode.h"

#include <cstring>

#include "stoker/strided_copy.h"

namespace stoker::py {
namespace {

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

// Buffer-protocol format -> DType; false for anything not plain native numbers.
bool ParseFormat(const char* f, Py_ssize_t itemsize, DType* out) {
  if (f == nullptr) f = "B";
  if (*f == '@' || *f == '=' || *f == '<') ++f;
  if (*f == '>' || *f == '!') return false;  // big-endian data would need a byte swap
  std::string s(f);
  if (s == "?") {
    *out = DType::kBool;
    return itemsize == 1;
  }
  if (s == "e") {
    *out = DType::kFloat16;
    return itemsize == 2;
  }
  if (s == "f") {
    *out = DType::kFloat32;
    return itemsize == 4;
  }
  if (s == "d") {
    *out = DType::kFloat64;
    return itemsize == 8;
  }
  if (s == "Zf") {
    *out = DType::kComplex64;
    return itemsize == 8;
  }
  if (s == "Zd") {
    *out = DType::kComplex128;
    return itemsize == 16;
  }
  if (s.size() != 1) return false;
  const char c = s[0];
  const bool is_signed = c == 'b' || c == 'h' || c == 'i' || c == 'l' || c == 'q' || c == 'n';
  const bool is_unsigned = c == 'B' || c == 'H' || c == 'I' || c == 'L' || c == 'Q' || c == 'N';
  if (!is_signed && !is_unsigned) return false;
  switch (itemsize) {
    case 1:
      *out = is_signed ? DType::kInt8 : DType::kUInt8;
      return true;
    case 2:
      *out = is_signed ? DType::kInt16 : DType::kUInt16;
      return true;
    case 4:
      *out = is_signed ? DType::kInt32 : DType::kUInt32;
      return true;
    case 8:
      *out = is_signed ? DType::kInt64 : DType::kUInt64;
      return true;
    default:
      return false;
  }
}

std::string ShapeText(const int64_t* shape, int ndim) {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

bool IsExactTensor(PyObject* obj) {
  PyObject* cls = Types().torch_tensor;
  return cls != nullptr && Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(cls);
}

}  // namespace

void PyBatchEncoder::Reset() {
  for (Py_buffer& b : buffers_) PyBuffer_Release(&b);
  buffers_.clear();
  tensors_.clear();
  keep_.clear();
  wire_.Clear();
}

std::string PyBatchEncoder::SampleName(size_t i) const {
  std::string s = "sample " + std::to_string(i);
  if (indices_.is_valid() && !indices_.is_none() && PyList_Check(indices_.ptr()) &&
      static_cast<Py_ssize_t>(i) < PyList_GET_SIZE(indices_.ptr())) {
    s += " (dataset index " + Repr(PyList_GET_ITEM(indices_.ptr(), i)) + ")";
  }
  return s;
}

bool PyBatchEncoder::ViewNumpy(PyObject* obj, View* v) {
  buffers_.emplace_back();
  Py_buffer& b = buffers_.back();
  if (PyObject_GetBuffer(obj, &b, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    buffers_.pop_back();
    return false;
  }
  if (b.ndim > kMaxDims || !ParseFormat(b.format, b.itemsize, &v->dtype)) {
    PyBuffer_Release(&b);
    buffers_.pop_back();
    return false;
  }
  v->data = static_cast<const uint8_t*>(b.buf);
  v->ndim = b.ndim;
  for (int i = 0; i < b.ndim; ++i) {
    v->shape[i] = b.shape[i];
    v->strides[i] = b.strides ? b.strides[i] : 0;
  }
  if (b.strides == nullptr) {  // C-contiguous
    int64_t st = b.itemsize;
    for (int i = b.ndim - 1; i >= 0; --i) {
      v->strides[i] = st;
      st *= b.shape[i];
    }
  }
  bool empty = false;
  for (int i = 0; i < b.ndim; ++i) empty = empty || b.shape[i] == 0;
  if (empty && PyObject_HasAttrString(obj, "strides")) {
    // The buffer protocol normalises an empty array's strides; torch.as_tensor keeps NumPy's.
    nb::object st = nb::steal(PyObject_GetAttrString(obj, "strides"));
    if (st.is_valid() && PyTuple_Check(st.ptr()) && PyTuple_GET_SIZE(st.ptr()) == b.ndim) {
      for (int i = 0; i < b.ndim; ++i) {
        v->strides[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(st.ptr(), i));
      }
    }
    PyErr_Clear();
  }
  return true;
}

// A plain CPU tensor read through its attributes: about six times cheaper than a DLPack export,
// which matters when a batch holds a thousand small tensors. Anything unusual (another device, a
// sparse layout, a conjugate view) goes through DLPack, which refuses what it cannot describe.
bool PyBatchEncoder::ViewTensor(PyObject* obj, View* v) {
  PyTypes& T = Types();
  auto attr = [obj](const char* name) { return nb::steal(PyObject_GetAttrString(obj, name)); };
  auto call = [obj](const char* name) {
    return nb::steal(PyObject_CallMethod(obj, name, nullptr));
  };
  nb::object is_cpu = attr("is_cpu");
  nb::object layout = attr("layout");
  nb::object dtype = attr("dtype");
  if (!is_cpu.is_valid() || !layout.is_valid() || !dtype.is_valid() || is_cpu.ptr() != Py_True ||
      layout.ptr() != T.torch_strided) {
    PyErr_Clear();
    return ViewTensorDLPack(obj, v);
  }
  PyObject* code = PyDict_GetItemWithError(T.torch_dtypes.ptr(), dtype.ptr());
  if (code == nullptr) {
    PyErr_Clear();
    return false;  // a dtype the wire does not carry: pickled
  }
  v->dtype = static_cast<DType>(PyLong_AsLong(code));
  // A lazily negated view (x.conj().imag is real and negated) or a conjugate view: the raw
  // memory is not the values. DLPack refuses them; they are pickled after resolving.
  nb::object neg = call("is_neg");
  if (!neg.is_valid() || neg.ptr() == Py_True) {
    PyErr_Clear();
    return false;
  }
  if (v->dtype == DType::kComplex64 || v->dtype == DType::kComplex128) {
    nb::object conj = call("is_conj");
    if (!conj.is_valid() || conj.ptr() == Py_True) {
      PyErr_Clear();
      return false;
    }
  }
  nb::object ptr = call("data_ptr");
  nb::object shape = attr("shape");
  nb::object strides = call("stride");
  if (!ptr.is_valid() || !shape.is_valid() || !strides.is_valid() || !PyTuple_Check(shape.ptr()) ||
      !PyTuple_Check(strides.ptr())) {
    PyErr_Clear();
    return ViewTensorDLPack(obj, v);
  }
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape.ptr());
  if (ndim > kMaxDims || PyTuple_GET_SIZE(strides.ptr()) != ndim) return false;
  const int64_t itemsize = static_cast<int64_t>(DTypeSize(v->dtype));
  v->data = static_cast<const uint8_t*>(PyLong_AsVoidPtr(ptr.ptr()));
  v->ndim = static_cast<int>(ndim);
  for (Py_ssize_t i = 0; i < ndim; ++i) {
    v->shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
    v->strides[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides.ptr(), i)) * itemsize;
  }
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return ViewTensorDLPack(obj, v);
  }
  // Only the data pointer is kept: hold the tensor until Write() has copied from it (Python code
  // run later in Describe, a __reduce__ for instance, may drop every other reference).
  keep_.push_back(nb::borrow(obj));
  return true;
}

bool PyBatchEncoder::ViewTensorDLPack(PyObject* obj, View* v) {
  nb::ndarray<nb::ro> arr;
  if (!nb::try_cast(nb::handle(obj), arr, false)) {
    PyErr_Clear();
    // A tensor that requires grad refuses DLPack; its data is what default_collate would stack.
    if (!PyObject_HasAttrString(obj, "detach")) return false;
    PyObject* detached = PyObject_CallMethod(obj, "detach", nullptr);
    if (detached == nullptr) {
      PyErr_Clear();
      return false;
    }
    nb::object d = nb::steal(detached);
    if (!nb::try_cast(d, arr, false)) {
      PyErr_Clear();
      return false;
    }
    keep_.push_back(d);
  }
  if (arr.device_type() != nb::device::cpu::value || arr.ndim() > kMaxDims) return false;
  bool ok = false;
  v->dtype = FromDLPack(arr.dtype(), &ok);
  if (!ok) return false;
  const int64_t itemsize = static_cast<int64_t>(DTypeSize(v->dtype));
  v->data = static_cast<const uint8_t*>(arr.data());
  v->ndim = static_cast<int>(arr.ndim());
  for (int i = 0; i < v->ndim; ++i) {
    v->shape[i] = static_cast<int64_t>(arr.shape(i));
    v->strides[i] = arr.stride(i) * itemsize;
  }
  tensors_.push_back(std::move(arr));
  return true;
}

void PyBatchEncoder::ShapeMismatch(const std::string& path, size_t a, const View& va, size_t b,
                                   const View& vb) {
  std::string where = path.empty() ? "the samples themselves" : "field " + path;
  RaiseStoker("CollateError",
              "samples do not stack at " + where + ": " + SampleName(a) + " has shape " +
                  ShapeText(va.shape, va.ndim) + " but " + SampleName(b) + " has shape " +
                  ShapeText(vb.shape, vb.ndim) +
                  ". default_collate stacks each field of a batch into one tensor, so every "
                  "sample must have the same shape there. Resize or crop in the dataset, or pass "
                  "a collate_fn that pads (for example with torch.nn.utils.rnn.pad_sequence).");
}

bool PyBatchEncoder::AddStacked(const std::vector<View>& views, uint8_t flags, bool stacked) {
  const View& f = views[0];
  int64_t shape[kMaxDims + 1];
  int ndim = 0;
  if (stacked) shape[ndim++] = static_cast<int64_t>(views.size());
  for (int i = 0; i < f.ndim; ++i) shape[ndim++] = f.shape[i];
  if (ndim > kMaxDims) return false;
  std::vector<ArraySource> sources(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    sources[i] = ArraySource{views[i].data, views[i].shape, views[i].strides, views[i].ndim};
  }
  Check(wire_.AddArray(f.dtype, flags, shape, ndim, sources.data(), sources.size()));
  return true;
}

bool PyBatchEncoder::AddSingle(const View& v, uint8_t flags) {
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

bool PyBatchEncoder::Collate(const std::vector<PyObject*>& s, std::string& path, int depth,
                             bool column_is_tuple) {
  if (depth >= kMaxNesting) return false;  // torch's collate in Python; the result is pickled
  PyTypes& T = Types();
  PyObject* first = s[0];
  const size_t n = s.size();

  // torch.Tensor and np.ndarray: stack. A tensor subclass (or a mix of types) is stacked by
  // torch.stack in Python, whose result type its __torch_function__ decides.
  const bool tensor = IsInstance(first, T.torch_tensor);
  if (tensor || IsInstance(first, T.np_ndarray)) {
    std::vector<View> views(n);
    for (size_t i = 0; i < n; ++i) {
      if (tensor ? !IsExactTensor(s[i]) : !IsInstance(s[i], T.np_ndarray)) return false;
      if (!(tensor ? ViewTensor(s[i], &views[i]) : ViewNumpy(s[i], &views[i]))) return false;
      if (views[i].dtype != views[0].dtype) return false;  // torch promotes: let it
      if (views[i].ndim != views[0].ndim ||
          std::memcmp(views[i].shape, views[0].shape, sizeof(int64_t) * views[0].ndim) != 0) {
        ShapeMismatch(path, 0, views[0], i, views[i]);
      }
    }
    return AddStacked(views, 0, true);
  }
  // NumPy scalars: torch.as_tensor(batch).
  if (IsInstance(first, T.np_generic)) {
    if (!IsInstance(first, T.np_bool) && !IsInstance(first, T.np_number)) return false;
    std::vector<View> views(n);
    for (size_t i = 0; i < n; ++i) {
      if (Py_TYPE(s[i]) != Py_TYPE(first) || !ViewNumpy(s[i], &views[i])) return false;
    }
    return AddStacked(views, 0, true);
  }
  // Python numbers: torch.tensor(batch, dtype=float64) / torch.tensor(batch).
  if (PyFloat_Check(first)) {
    std::string bytes(n * sizeof(double), '\0');
    for (size_t i = 0; i < n; ++i) {
      double v;
      if (PyFloat_Check(s[i])) {
        v = PyFloat_AS_DOUBLE(s[i]);
      } else if (PyLong_Check(s[i])) {
        v = PyLong_AsDouble(s[i]);
        if (v == -1.0 && PyErr_Occurred()) {
          PyErr_Clear();
          return false;
        }
      } else {
        return false;
      }
      std::memcpy(&bytes[i * sizeof(double)], &v, sizeof(double));
    }
    const int64_t shape[1] = {static_cast<int64_t>(n)};
    Check(wire_.AddOwnedArray(DType::kFloat64, 0, shape, 1, std::move(bytes)));
    return true;
  }
  if (PyLong_Check(first)) {
    bool all_bool = true;
    std::string bytes(n * sizeof(int64_t), '\0');
    for (size_t i = 0; i < n; ++i) {
      if (!PyLong_Check(s[i])) return false;  // a float among ints: torch picks float32
      if (!PyBool_Check(s[i])) all_bool = false;
      int overflow = 0;
      long long v = PyLong_AsLongLongAndOverflow(s[i], &overflow);
      if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return false;
      }
      const int64_t v64 = v;
      std::memcpy(&bytes[i * sizeof(int64_t)], &v64, sizeof(int64_t));
    }
    const int64_t shape[1] = {static_cast<int64_t>(n)};
    if (all_bool) {
      std::string b(n, '\0');
      for (size_t i = 0; i < n; ++i) b[i] = s[i] == Py_True ? 1 : 0;
      Check(wire_.AddOwnedArray(DType::kBool, 0, shape, 1, std::move(b)));
    } else {
      Check(wire_.AddOwnedArray(DType::kInt64, 0, shape, 1, std::move(bytes)));
    }
    return true;
  }
  // str / bytes: the column is returned as it is.
  if (PyUnicode_Check(first) || PyBytes_Check(first)) {
    wire_.AddContainer(column_is_tuple ? NodeKind::kTuple : NodeKind::kList,
                       static_cast<uint32_t>(n));
    for (size_t i = 0; i < n; ++i) {
      if (!Value(s[i], EncodeMode::kAsIs, depth + 1)) return false;
    }
    return true;
  }
  // dict: one collated value per key of the first sample.
  if (PyDict_CheckExact(first)) {
    for (size_t i = 1; i < n; ++i) {
      if (!PyDict_CheckExact(s[i])) return false;
    }
    const Py_ssize_t nkeys = PyDict_GET_SIZE(first);
    wire_.AddContainer(NodeKind::kDict, static_cast<uint32_t>(nkeys));
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    std::vector<PyObject*> column(n);
    while (PyDict_Next(first, &pos, &key, &value)) {
      const size_t mark = path.size();
      path += "[" + Repr(key) + "]";
      for (size_t i = 0; i < n; ++i) {
        column[i] = PyDict_GetItemWithError(s[i], key);
        if (column[i] == nullptr) {
          if (PyErr_Occurred()) throw nb::python_error();
          const std::string msg =
              SampleName(i) + " has no key " + Repr(key) + " that " + SampleName(0) + " has (at " +
              (mark == 0 ? std::string("the top level") : path.substr(0, mark)) +
              "); every sample of a batch must have the same keys";
          PyErr_SetObject(PyExc_KeyError, nb::str(msg.c_str()).ptr());
          throw nb::python_error();
        }
      }
      Py_INCREF(key);
      nb::object k = nb::steal(key);
      keep_.push_back(k);
      if (!Value(key, EncodeMode::kAsIs, depth + 1)) return false;
      if (!Collate(column, path, depth + 1)) return false;
      path.resize(mark);
    }
    return true;
  }
  // namedtuple: the same type, each field collated.
  if (IsNamedTuple(first)) {
    for (size_t i = 1; i < n; ++i) {
      if (Py_TYPE(s[i]) != Py_TYPE(first) || !IsNamedTuple(s[i])) return false;
    }
    PyObject* blob = PyObject_CallOneArg(Types().pickle_dumps.ptr(),
                                         reinterpret_cast<PyObject*>(Py_TYPE(first)));
    if (blob == nullptr) {
      PyErr_Clear();
      return false;
    }
    std::string type_bytes(PyBytes_AS_STRING(blob), PyBytes_GET_SIZE(blob));
    Py_DECREF(blob);
    const Py_ssize_t len = PyTuple_GET_SIZE(first);
    wire_.AddNamedTuple(static_cast<uint32_t>(len), std::move(type_bytes));
    std::vector<PyObject*> column(n);
    for (Py_ssize_t f = 0; f < len; ++f) {
      for (size_t i = 0; i < n; ++i) column[i] = PyTuple_GET_ITEM(s[i], f);
      const size_t mark = path.size();
      path +=
          "." +
          std::string(PyUnicode_AsUTF8(PyTuple_GET_ITEM(
              nb::borrow(reinterpret_cast<PyObject*>(Py_TYPE(first))).attr("_fields").ptr(), f)));
      if (!Collate(column, path, depth + 1, true)) return false;
      path.resize(mark);
    }
    return true;
  }
  // list / tuple: transposed, each position collated; the result is a list (as torch's).
  if (PyList_CheckExact(first) || PyTuple_CheckExact(first)) {
    const Py_ssize_t len = PySequence_Fast_GET_SIZE(first);
    for (size_t i = 0; i < n; ++i) {
      if (!PyList_CheckExact(s[i]) && !PyTuple_CheckExact(s[i])) return false;
      const Py_ssize_t li = PySequence_Fast_GET_SIZE(s[i]);
      if (li != len) {
        std::string where = path.empty() ? "the top level" : path;
        RaiseStoker("CollateError",
                    "each element in list of batch should be of equal size: at " + where + ", " +
                        SampleName(0) + " has " + std::to_string(len) + " elements but " +
                        SampleName(i) + " has " + std::to_string(li) +
                        ". Return the same structure from every __getitem__, or pass a "
                        "collate_fn that handles variable-length samples.");
      }
    }
    wire_.AddContainer(NodeKind::kList, static_cast<uint32_t>(len));
    std::vector<PyObject*> column(n);
    for (Py_ssize_t p = 0; p < len; ++p) {
      for (size_t i = 0; i < n; ++i) column[i] = PySequence_Fast_ITEMS(s[i])[p];
      const size_t mark = path.size();
      path += "[" + std::to_string(p) + "]";
      if (!Collate(column, path, depth + 1, true)) return false;
      path.resize(mark);
    }
    return true;
  }
  return false;  // anything else: torch's own collate decides (and raises what torch raises)
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
    keep_.push_back(nb::borrow(obj));  // the UTF-8 bytes live as long as the str
    wire_.AddStr(utf8, static_cast<size_t>(size));
    return true;
  }
  if (PyBytes_CheckExact(obj)) {
    keep_.push_back(nb::borrow(obj));
    wire_.AddBytes(PyBytes_AS_STRING(obj), static_cast<size_t>(PyBytes_GET_SIZE(obj)));
    return true;
  }
  if (T.torch_tensor != nullptr &&
      Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(T.torch_tensor)) {
    View v;
    if (ViewTensor(obj, &v)) return AddSingle(v, 0);
    Pickle(obj);
    return true;
  }
  if (Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(T.np_ndarray)) {
    View v;
    if (ViewNumpy(obj, &v)) {
      const uint8_t flags = mode == EncodeMode::kConvert ? 0 : kArrayAsNumpy;
      return AddSingle(v, flags);
    }
    Pickle(obj);  // strings, objects, big-endian: unchanged by default_convert too
    return true;
  }
  if (mode == EncodeMode::kConvert && IsInstance(obj, T.np_generic) &&
      (IsInstance(obj, T.np_bool) || IsInstance(obj, T.np_number))) {
    View v;
    if (ViewNumpy(obj, &v)) return AddSingle(v, 0);
    return false;
  }
  if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
    const bool as_tuple = PyTuple_CheckExact(obj) && mode == EncodeMode::kAsIs;
    const Py_ssize_t len = PySequence_Fast_GET_SIZE(obj);
    wire_.AddContainer(as_tuple ? NodeKind::kTuple : NodeKind::kList, static_cast<uint32_t>(len));
    PyObject** items = PySequence_Fast_ITEMS(obj);
    for (Py_ssize_t i = 0; i < len; ++i) {
      if (!Value(items[i], mode, depth + 1)) return false;
    }
    return true;
  }
  if (PyDict_CheckExact(obj)) {
    wire_.AddContainer(NodeKind::kDict, static_cast<uint32_t>(PyDict_GET_SIZE(obj)));
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(obj, &pos, &key, &value)) {
      if (!Value(key, EncodeMode::kAsIs, depth + 1)) return false;
      if (!Value(value, mode, depth + 1)) return false;
    }
    return true;
  }
  if (IsNamedTuple(obj)) {
    PyObject* blob =
        PyObject_CallOneArg(Types().pickle_dumps.ptr(), reinterpret_cast<PyObject*>(Py_TYPE(obj)));
    if (blob != nullptr) {
      std::string type_bytes(PyBytes_AS_STRING(blob), PyBytes_GET_SIZE(blob));
      Py_DECREF(blob);
      const Py_ssize_t len = PyTuple_GET_SIZE(obj);
      wire_.AddNamedTuple(static_cast<uint32_t>(len), std::move(type_bytes));
      for (Py_ssize_t i = 0; i < len; ++i) {
        if (!Value(PyTuple_GET_ITEM(obj, i), mode, depth + 1)) return false;
      }
      return true;
    }
    PyErr_Clear();
  }
  if (mode == EncodeMode::kConvert) return false;  // default_convert recurses into other types
  Pickle(obj);
  return true;
}

bool PyBatchEncoder::Describe(nb::handle obj, EncodeMode mode, nb::handle indices) {
  Reset();
  indices_ = indices;
  bool ok;
  if (mode == EncodeMode::kCollate) {
    if (!PyList_Check(obj.ptr()) || PyList_GET_SIZE(obj.ptr()) == 0) {
      ok = false;
    } else {
      std::vector<PyObject*> samples(PySequence_Fast_ITEMS(obj.ptr()),
                                     PySequence_Fast_ITEMS(obj.ptr()) + PyList_GET_SIZE(obj.ptr()));
      std::string path;
      try {
        ok = Collate(samples, path, 0);
      } catch (...) {
        Reset();  // release the batch's buffers now, not at the next batch
        throw;
      }
    }
  } else {
    try {
      ok = Value(obj.ptr(), mode, 0);
    } catch (...) {
      Reset();
      throw;
    }
  }
  if (!ok) Reset();
  return ok;
}

}  // namespace stoker::py
