// Reading the memory of a torch tensor or NumPy array without copying it.
//
// An ArrayView is what the WireEncoder needs of an array: a data pointer, a dtype, a shape and
// byte strides. The pointer is borrowed, so BorrowedArrays holds a strong reference to every
// object it viewed (a Py_buffer, a DLPack export or the tensor itself) until Clear(): the encoder
// copies from these pointers later, with the GIL released, and Python code it runs meanwhile (a
// __reduce__ while pickling another part of the batch) may drop every other reference.
// Threads: a BorrowedArrays belongs to one encoder, used by one thread at a time; its members
// call Python (attached to the interpreter; the GIL where there is one).
#pragma once

#include <deque>
#include <vector>

#include "common.h"

namespace stoker::py {

struct ArrayView {
  const uint8_t* data = nullptr;
  DType dtype = DType::kUInt8;
  int ndim = 0;
  int64_t shape[kMaxDims];
  int64_t strides[kMaxDims];  // bytes
};

class BorrowedArrays {
 public:
  BorrowedArrays() = default;
  BorrowedArrays(const BorrowedArrays&) = delete;
  BorrowedArrays& operator=(const BorrowedArrays&) = delete;
  ~BorrowedArrays() { Clear(); }

  // False (no Python error set) when the object's memory cannot be carried as it is: another
  // device, an unsupported dtype, a lazily negated or conjugated view, big-endian data.
  bool ViewNumpy(PyObject* obj, ArrayView* v);
  bool ViewTensor(PyObject* obj, ArrayView* v);
  // Holds `obj` until Clear() (a str or bytes whose bytes the encoder borrows).
  void Keep(nb::handle obj) { keep_.push_back(nb::borrow(obj)); }
  // Lets go of everything viewed so far.
  void Clear();

 private:
  bool ViewTensorDLPack(PyObject* obj, ArrayView* v);

  std::deque<Py_buffer> buffers_;  // a deque: Py_buffer must not move once filled
  std::vector<nb::ndarray<nb::ro>> tensors_;
  std::vector<nb::object> keep_;
};

}  // namespace stoker::py
