// Describing Python objects to the WireEncoder, with torch's collate semantics.
//
// kCollate takes the list of samples and lays out what torch.utils.data.default_collate would
// return, stacking each leaf straight into the slot (one copy per byte). kConvert mirrors
// default_convert (batch_size=None). kAsIs encodes a collate_fn's output unchanged: tensors stay
// tensors, NumPy arrays stay arrays, other objects are pickled. When the fast path cannot be sure
// to reproduce torch's result exactly (an unusual type, mixed dtypes), Describe returns false and
// the caller collates in Python, then encodes the result with kAsIs.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include <nanobind/ndarray.h>

#include "common.h"
#include "stoker/wire_encoder.h"

namespace stoker::py {

enum class EncodeMode { kCollate = 0, kConvert = 1, kAsIs = 2 };

class PyBatchEncoder {
 public:
  ~PyBatchEncoder() { Reset(); }
  // `indices` (a list or None) names samples in error messages.
  bool Describe(nb::handle obj, EncodeMode mode, nb::handle indices);
  WireEncoder& wire() { return wire_; }
  // Drops the borrowed buffers; call after Write().
  void Reset();

 private:
  struct View {
    const uint8_t* data = nullptr;
    DType dtype = DType::kUInt8;
    int ndim = 0;
    int64_t shape[kMaxDims];
    int64_t strides[kMaxDims];
  };
  // column_is_tuple: the samples came from zip() (list/tuple/namedtuple fields), in which case
  // torch returns strings as a tuple; from a list or a dict's values they come back as a list.
  bool Collate(const std::vector<PyObject*>& samples, std::string& path, int depth,
               bool column_is_tuple = false);
  bool Value(PyObject* obj, EncodeMode mode, int depth);
  void Pickle(PyObject* obj);
  bool ViewNumpy(PyObject* obj, View* v);
  bool ViewTensor(PyObject* obj, View* v);
  bool ViewTensorDLPack(PyObject* obj, View* v);
  bool AddStacked(const std::vector<View>& views, uint8_t flags, bool stacked);
  // One array handed over as it is: keeps its strides when that costs little memory.
  bool AddSingle(const View& v, uint8_t flags);
  [[noreturn]] void ShapeMismatch(const std::string& path, size_t a, const View& va, size_t b,
                                  const View& vb);
  std::string SampleName(size_t i) const;

  WireEncoder wire_;
  std::deque<Py_buffer> buffers_;
  std::vector<nb::ndarray<nb::ro>> tensors_;
  std::vector<nb::object> keep_;
  nb::handle indices_;
};

}  // namespace stoker::py
