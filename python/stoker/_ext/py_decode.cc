#include "py_decode.h"

#include <nanobind/ndarray.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

namespace stoker::py {
namespace {

// A value the validator cannot check (the bytes of a str or of a big int) turned out invalid:
// the worker's memory was overwritten, as for any other corrupt batch.
[[noreturn]] void CorruptValue(size_t node, const char* what) {
  PyErr_Clear();
  RaiseStoker("CorruptBatchError",
              "corrupt batch in shared memory: node " + std::to_string(node) + " holds " + what +
                  ". A worker wrote something into its shared-memory slot that is not a valid "
                  "batch (a memory bug in a C extension used by the dataset?). The batch was "
                  "dropped; the main process is unharmed.");
}

// Python allocation failed (MemoryError is set): raise it.
PyObject* Checked(PyObject* obj) {
  if (obj == nullptr) throw nb::python_error();
  return obj;
}

// The decimal text of an int outside int64: an optional '-' and at least one digit.
bool IsDecimal(const uint8_t* p, uint64_t n) {
  uint64_t i = (n > 0 && p[0] == '-') ? 1 : 0;
  if (i == n) return false;
  for (; i < n; ++i) {
    if (p[i] < '0' || p[i] > '9') return false;
  }
  return true;
}

class Builder {
 public:
  Builder(const DecodedBatch& b, nb::handle owner, uint64_t view_threshold)
      : b_(b), owner_(owner), view_threshold_(view_threshold) {}

  nb::object Next(int depth) {
    const size_t at = pos_;
    const DecodedNode& n = b_.nodes[pos_++];
    switch (n.kind) {
      case NodeKind::kNone:
        return nb::none();
      case NodeKind::kBool:
        return nb::bool_(n.int_value != 0);
      case NodeKind::kInt:
        return nb::int_(n.int_value);
      case NodeKind::kFloat:
        return nb::float_(n.float_value);
      case NodeKind::kStr: {
        PyObject* s = PyUnicode_DecodeUTF8(reinterpret_cast<const char*>(n.data),
                                           static_cast<Py_ssize_t>(n.nbytes), "strict");
        if (s == nullptr) {
          if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            CorruptValue(at, "a str that is not valid UTF-8");
          }
          throw nb::python_error();
        }
        return nb::steal(s);
      }
      case NodeKind::kBytes:
        return nb::steal(Checked(PyBytes_FromStringAndSize(reinterpret_cast<const char*>(n.data),
                                                           static_cast<Py_ssize_t>(n.nbytes))));
      case NodeKind::kBigInt: {
        // Copied first: the slot's bytes could change between the check and the parse.
        std::string text(reinterpret_cast<const char*>(n.data), n.nbytes);
        if (!IsDecimal(reinterpret_cast<const uint8_t*>(text.data()), text.size())) {
          CorruptValue(at, "an int whose text is not a decimal number");
        }
        PyObject* v = PyLong_FromString(text.c_str(), nullptr, 10);
        // A valid decimal can still fail here: sys.set_int_max_str_digits is lower in this
        // process than in the worker. That ValueError is Python's own, so it is raised as is.
        if (v == nullptr) throw nb::python_error();
        return nb::steal(v);
      }
      case NodeKind::kPickled:
        return Unpickle(n.data, n.nbytes);
      case NodeKind::kArray:
        return Array(n);
      case NodeKind::kList:
      case NodeKind::kTuple: {
        PyObject* seq =
            Checked(n.kind == NodeKind::kList ? PyList_New(n.count) : PyTuple_New(n.count));
        nb::object out = nb::steal(seq);
        for (uint32_t i = 0; i < n.count; ++i) {
          nb::object item = Next(depth + 1);
          if (n.kind == NodeKind::kList) {
            PyList_SET_ITEM(seq, i, item.release().ptr());
          } else {
            PyTuple_SET_ITEM(seq, i, item.release().ptr());
          }
        }
        return out;
      }
      case NodeKind::kDict: {
        nb::dict d;
        for (uint32_t i = 0; i < n.count; ++i) {
          nb::object k = Next(depth + 1);
          nb::object v = Next(depth + 1);
          d[k] = v;
        }
        return d;
      }
      case NodeKind::kNamedTuple: {
        nb::object type = Unpickle(n.data, n.nbytes);
        nb::list fields;
        for (uint32_t i = 0; i < n.count; ++i) fields.append(Next(depth + 1));
        return type(*nb::tuple(fields));
      }
    }
    throw std::runtime_error("unreachable node kind");
  }

 private:
  nb::object Unpickle(const uint8_t* data, uint64_t nbytes) {
    nb::object blob = nb::steal(Checked(PyBytes_FromStringAndSize(
        reinterpret_cast<const char*>(data), static_cast<Py_ssize_t>(nbytes))));
    return Types().pickle_loads(blob);
  }

  nb::object Array(const DecodedNode& n) {
    size_t shape[kMaxDims];
    const int64_t* s = b_.shape(n);
    for (int i = 0; i < n.ndim; ++i) shape[i] = static_cast<size_t>(s[i]);
    void* data = const_cast<uint8_t*>(n.data);
    const nb::dlpack::dtype dt = ToDLPack(n.dtype);
    const bool numpy = (n.flags & kArrayAsNumpy) != 0 || !Types().torch_output;
    if (numpy && n.dtype == DType::kBFloat16) {
      throw std::runtime_error("a bfloat16 tensor cannot be delivered without torch installed");
    }
    nb::handle owner = owner_;
    nb::object copy_owner;
    if (n.nbytes < view_threshold_) {
      // Small: a private copy, so that holding it does not keep the slot lent. The bytes the
      // strides span are copied as they are, so the layout (and every stride) is kept.
      void* copy = nullptr;
      if (posix_memalign(&copy, kArrayAlignment, n.nbytes > 0 ? n.nbytes : 1) != 0) {
        throw std::bad_alloc();
      }
      std::memcpy(copy, n.data, n.nbytes);
      copy_owner = nb::capsule(copy, [](void* p) noexcept { free(p); });
      data = copy;
      owner = copy_owner;
    }
    if (numpy) {
      return nb::ndarray<nb::numpy>(data, static_cast<size_t>(n.ndim), shape, owner, b_.strides(n),
                                    dt)
          .cast();
    }
    if (Types().torch_from_dlpack.is_valid()) {
      // The capsule straight to torch's converter: what torch.utils.dlpack.from_dlpack (which
      // nb::ndarray<nb::pytorch> calls) ends with, without its Python-level checks.
      nb::object nd =
          nb::ndarray<>(data, static_cast<size_t>(n.ndim), shape, owner, b_.strides(n), dt).cast();
      // nanobind exports a framework-less ndarray as a DLPack capsule (older versions: an
      // object with __dlpack__).
      if (PyCapsule_CheckExact(nd.ptr())) return Types().torch_from_dlpack(nd);
      return Types().torch_from_dlpack(nd.attr("__dlpack__")());
    }
    return nb::ndarray<nb::pytorch>(data, static_cast<size_t>(n.ndim), shape, owner, b_.strides(n),
                                    dt)
        .cast();
  }

  const DecodedBatch& b_;
  nb::handle owner_;
  uint64_t view_threshold_;
  size_t pos_ = 0;
};

}  // namespace

uint64_t ViewThreshold(uint64_t slot_bytes) {
  const uint64_t share = slot_bytes / kViewSlotDivisor;
  return share > kViewMinBytes ? share : kViewMinBytes;
}

nb::object BuildBatch(const DecodedBatch& batch, nb::handle owner, uint64_t slot_bytes) {
  Builder b(batch, owner, ViewThreshold(slot_bytes));
  return b.Next(0);
}

}  // namespace stoker::py
