// Describing Python objects to the WireEncoder, with torch's collate semantics.
//
// kCollate takes the list of samples and lays out what torch.utils.data.default_collate would
// return, stacking each leaf straight into the slot (one copy per byte). kConvert mirrors
// default_convert (batch_size=None). kAsIs encodes a collate_fn's output unchanged: tensors stay
// tensors, NumPy arrays stay arrays, other objects are pickled. When the fast path cannot be sure
// to reproduce torch's result exactly (an unusual type, mixed dtypes, a tensor subclass, nesting
// deeper than the wire carries), Describe returns false and the caller collates in Python, then
// encodes the result with kAsIs.
//
// The work is split by job: py_encode.cc maps one Python object onto wire nodes (kAsIs and
// kConvert); py_collate.cc walks the samples' common structure (dict, namedtuple, list) and
// checks that every sample has it; py_collate_leaves.cc stacks one column of leaves (tensors,
// arrays, numbers, strings). py_array_view.h reads the memory of tensors and arrays.
// Threads: a PyBatchEncoder is used by one thread at a time (its owner: a WorkerEndpoint's one
// caller, or one encode() call); distinct encoders run in parallel threads, with or without the
// GIL. Describe() calls Python (attached to the interpreter); a container it walks may be
// changed by another thread meanwhile: its items are read into held references at once
// (common.h), so the batch is laid out as the container was at some moment, and nothing freed
// is read.
#pragma once

#include <string>
#include <vector>

#include "common.h"
#include "py_array_view.h"
#include "stoker/wire_encoder.h"

namespace stoker::py {

enum class EncodeMode { kCollate = 0, kConvert = 1, kAsIs = 2 };

class PyBatchEncoder {
 public:
  ~PyBatchEncoder() { Reset(); }
  // `indices` (a list or None) names samples in error messages. Raises (a Python exception) for
  // samples torch would refuse too, naming the sample and the field.
  bool Describe(nb::handle obj, EncodeMode mode, nb::handle indices);
  // Layout() and Write() may run without the GIL: every object whose memory they read is held.
  WireEncoder& wire() { return wire_; }
  // Drops the held objects and the description; call after Write().
  void Reset();

 private:
  // py_encode.cc: one object as it is (kAsIs) or as default_convert returns it (kConvert).
  bool Value(PyObject* obj, EncodeMode mode, int depth);
  // Sets *handled for a list, tuple, dict or namedtuple.
  bool Container(PyObject* obj, EncodeMode mode, int depth, bool* handled);
  void Pickle(PyObject* obj);
  // One array handed over as it is: keeps its strides when that costs little memory.
  bool AddSingle(const ArrayView& v, uint8_t flags);

  // py_collate.cc: the samples' structure. column_is_tuple: the samples came from zip()
  // (list/tuple/namedtuple fields), in which case torch returns strings as a tuple; from a list
  // or a dict's values they come back as a list.
  bool Collate(const std::vector<PyObject*>& samples, std::string& path, int depth,
               bool column_is_tuple = false);
  bool CollateDict(const std::vector<PyObject*>& samples, std::string& path, int depth);
  bool CollateNamedTuple(const std::vector<PyObject*>& samples, std::string& path, int depth);
  bool CollateSequence(const std::vector<PyObject*>& samples, std::string& path, int depth);
  std::string SampleName(size_t i) const;

  // py_collate_leaves.cc: one column of leaves. Sets *handled when samples[0] is a leaf type;
  // returns false when the fast path declines.
  bool CollateLeaves(const std::vector<PyObject*>& samples, const std::string& path, int depth,
                     bool column_is_tuple, bool* handled);
  bool StackArrays(const std::vector<PyObject*>& samples, const std::string& path, bool tensor);
  bool StackNumpyScalars(const std::vector<PyObject*>& samples);
  bool CollateFloats(const std::vector<PyObject*>& samples);
  bool CollateInts(const std::vector<PyObject*>& samples);
  bool AddStacked(const std::vector<ArrayView>& views, uint8_t flags, bool stacked);
  [[noreturn]] void ShapeMismatch(const std::string& path, size_t a, const ArrayView& va, size_t b,
                                  const ArrayView& vb);

  WireEncoder wire_;
  BorrowedArrays held_;
  nb::handle indices_;
};

}  // namespace stoker::py
