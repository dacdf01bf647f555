// Collating one column of leaves as default_collate does: tensors and arrays are stacked (each
// sample's bytes copied once, straight into its place in the slot), NumPy scalars and Python
// numbers become one tensor, strings and bytes come back as the column itself.
#include <cstring>
#include <string>
#include <vector>

#include "py_encode.h"

namespace stoker::py {
namespace {

std::string ShapeText(const int64_t* shape, int ndim) {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

bool PyBatchEncoder::CollateLeaves(const std::vector<PyObject*>& s, const std::string& path,
                                   int depth, bool column_is_tuple, bool* handled) {
  PyTypes& T = Types();
  PyObject* first = s[0];
  *handled = true;
  const bool tensor = IsInstance(first, T.torch_tensor);
  if (tensor || IsInstance(first, T.np_ndarray)) return StackArrays(s, path, tensor);
  if (IsInstance(first, T.np_generic)) return StackNumpyScalars(s);
  if (PyFloat_Check(first)) return CollateFloats(s);
  if (PyLong_Check(first)) return CollateInts(s);
  if (PyUnicode_Check(first) || PyBytes_Check(first)) {
    wire_.AddContainer(column_is_tuple ? NodeKind::kTuple : NodeKind::kList,
                       static_cast<uint32_t>(s.size()));
    for (PyObject* item : s) {
      if (!Value(item, EncodeMode::kAsIs, depth + 1)) return false;
    }
    return true;
  }
  *handled = false;
  return false;
}

// torch.stack / torch.as_tensor + stack. A tensor subclass (or a mix of types) is left to
// torch.stack in Python, whose result type its __torch_function__ decides.
bool PyBatchEncoder::StackArrays(const std::vector<PyObject*>& s, const std::string& path,
                                 bool tensor) {
  PyTypes& T = Types();
  std::vector<ArrayView> views(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (tensor ? !IsExactTensor(s[i]) : !IsInstance(s[i], T.np_ndarray)) return false;
    if (!(tensor ? held_.ViewTensor(s[i], &views[i]) : held_.ViewNumpy(s[i], &views[i]))) {
      return false;
    }
    if (views[i].dtype != views[0].dtype) return false;  // torch promotes: let it
    if (views[i].ndim != views[0].ndim ||
        std::memcmp(views[i].shape, views[0].shape, sizeof(int64_t) * views[0].ndim) != 0) {
      ShapeMismatch(path, 0, views[0], i, views[i]);
    }
  }
  return AddStacked(views, 0, true);
}

// NumPy scalars: torch.as_tensor(batch).
bool PyBatchEncoder::StackNumpyScalars(const std::vector<PyObject*>& s) {
  PyTypes& T = Types();
  if (!IsInstance(s[0], T.np_bool) && !IsInstance(s[0], T.np_number)) return false;
  std::vector<ArrayView> views(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (Py_TYPE(s[i]) != Py_TYPE(s[0]) || !held_.ViewNumpy(s[i], &views[i])) return false;
  }
  return AddStacked(views, 0, true);
}

// torch.tensor(batch, dtype=torch.float64).
bool PyBatchEncoder::CollateFloats(const std::vector<PyObject*>& s) {
  const size_t n = s.size();
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

// torch.tensor(batch): int64, or bool when every item is a bool.
bool PyBatchEncoder::CollateInts(const std::vector<PyObject*>& s) {
  const size_t n = s.size();
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

bool PyBatchEncoder::AddStacked(const std::vector<ArrayView>& views, uint8_t flags, bool stacked) {
  const ArrayView& f = views[0];
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

void PyBatchEncoder::ShapeMismatch(const std::string& path, size_t a, const ArrayView& va, size_t b,
                                   const ArrayView& vb) {
  std::string where = path.empty() ? "the samples themselves" : "field " + path;
  RaiseStoker("CollateError",
              "samples do not stack at " + where + ": " + SampleName(a) + " has shape " +
                  ShapeText(va.shape, va.ndim) + " but " + SampleName(b) + " has shape " +
                  ShapeText(vb.shape, vb.ndim) +
                  ". default_collate stacks each field of a batch into one tensor, so every "
                  "sample must have the same shape there. Resize or crop in the dataset, or pass "
                  "a collate_fn that pads (for example with torch.nn.utils.rnn.pad_sequence).");
}

}  // namespace stoker::py
