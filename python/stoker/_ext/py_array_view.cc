#include "py_array_view.h"

#include <string>

namespace stoker::py {
namespace {

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

}  // namespace

void BorrowedArrays::Clear() {
  for (Py_buffer& b : buffers_) PyBuffer_Release(&b);
  buffers_.clear();
  tensors_.clear();
  keep_.clear();
}

bool BorrowedArrays::ViewNumpy(PyObject* obj, ArrayView* v) {
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
bool BorrowedArrays::ViewTensor(PyObject* obj, ArrayView* v) {
  PyTypes& T = Types();
  // Names interned once, and methods called without a bound-method object: a batch of a
  // thousand small tensors makes seven or eight of these lookups per tensor.
  static PyObject* const kIsCpu = PyUnicode_InternFromString("is_cpu");
  static PyObject* const kLayout = PyUnicode_InternFromString("layout");
  static PyObject* const kDtype = PyUnicode_InternFromString("dtype");
  static PyObject* const kShape = PyUnicode_InternFromString("shape");
  static PyObject* const kIsNeg = PyUnicode_InternFromString("is_neg");
  static PyObject* const kIsConj = PyUnicode_InternFromString("is_conj");
  static PyObject* const kDataPtr = PyUnicode_InternFromString("data_ptr");
  static PyObject* const kStride = PyUnicode_InternFromString("stride");
  if (kIsCpu == nullptr || kLayout == nullptr || kDtype == nullptr || kShape == nullptr ||
      kIsNeg == nullptr || kIsConj == nullptr || kDataPtr == nullptr || kStride == nullptr) {
    PyErr_Clear();  // out of memory at the first call: the slower, general path
    return ViewTensorDLPack(obj, v);
  }
  auto attr = [obj](PyObject* name) { return nb::steal(PyObject_GetAttr(obj, name)); };
  auto call = [obj](PyObject* name) {
    PyObject* args[1] = {obj};
    return nb::steal(
        PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
  };
  nb::object is_cpu = attr(kIsCpu);
  nb::object layout = attr(kLayout);
  nb::object dtype = attr(kDtype);
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
  nb::object neg = call(kIsNeg);
  if (!neg.is_valid() || neg.ptr() == Py_True) {
    PyErr_Clear();
    return false;
  }
  if (v->dtype == DType::kComplex64 || v->dtype == DType::kComplex128) {
    nb::object conj = call(kIsConj);
    if (!conj.is_valid() || conj.ptr() == Py_True) {
      PyErr_Clear();
      return false;
    }
  }
  nb::object ptr = call(kDataPtr);
  nb::object shape = attr(kShape);
  nb::object strides = call(kStride);
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
  // Only the data pointer is read: hold the tensor itself (see the header).
  Keep(obj);
  return true;
}

bool BorrowedArrays::ViewTensorDLPack(PyObject* obj, ArrayView* v) {
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

}  // namespace stoker::py
