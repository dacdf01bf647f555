// stoker.SharedList's items: laid out flat once, read back as fresh Python objects straight from
// the shared pages. The common shapes of metadata (dicts with str keys, lists, tuples, str,
// bytes, ints, floats, bools, None, nested as deep as 64) are encoded here and decoded without
// pickle; anything else (a subclass, an int past 64 bits, a str that is not valid UTF-8, a
// custom object) is pickled, in its place, and unpickled on read. A dict's keys are written once
// for every dict with the same keys in the same order (a "schema"), not once per item.
//
// One item's bytes: a value, where a value is a tag byte then
//   'n' None | 't' True | 'f' False | 'i' int64 | 'd' float64 |
//   's' u64 length + UTF-8 | 'b' u64 length + bytes | 'P' u64 length + pickle |
//   'l' u32 count + values (list) | 'u' u32 count + values (tuple) |
//   'D' u32 schema + one value per key of the schema (a dict)
// Numbers little-endian. Every read is checked against the item's end: a corrupt buffer raises
// ValueError, never reads past it.
//
// Threads: encode_items may run in several threads at once, each with its own `schemas` and
// `schema_ids` (they belong to the call: SharedList makes new ones); an item that another thread
// changes meanwhile is read as it was at some moment (its containers' items are held at once,
// common.h), never from freed memory. A SharedItems is immutable once made: any number of
// threads read it at once, with or without the GIL (each read builds fresh objects from the
// buffer, which nobody writes).
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"

namespace stoker::py {
namespace {

constexpr int kMaxDepth = 64;

// -- encoding ------------------------------------------------------------------------------------
class Encoder {
 public:
  Encoder(nb::list schemas, nb::dict schema_ids, nb::object dumps)
      : schemas_(std::move(schemas)), ids_(std::move(schema_ids)), dumps_(std::move(dumps)) {}

  // Appends `obj` to `out`; false with a Python error set when it cannot be pickled either.
  bool Value(PyObject* obj, int depth) {
    if (obj == Py_None) return Tag('n');
    if (obj == Py_True) return Tag('t');
    if (obj == Py_False) return Tag('f');
    if (PyLong_CheckExact(obj)) {
      int overflow = 0;
      long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
      if (overflow != 0) return Pickled(obj);
      if (v == -1 && PyErr_Occurred()) return false;
      Tag('i');
      return Raw(static_cast<int64_t>(v));
    }
    if (PyFloat_CheckExact(obj)) {
      Tag('d');
      return Raw(PyFloat_AS_DOUBLE(obj));
    }
    if (PyUnicode_CheckExact(obj)) {
      Py_ssize_t n = 0;
      const char* s = PyUnicode_AsUTF8AndSize(obj, &n);
      if (s == nullptr) {  // (lone surrogates: pickle keeps them)
        PyErr_Clear();
        return Pickled(obj);
      }
      Tag('s');
      Raw(static_cast<uint64_t>(n));
      out.append(s, static_cast<size_t>(n));
      return true;
    }
    if (PyBytes_CheckExact(obj)) {
      Tag('b');
      Raw(static_cast<uint64_t>(PyBytes_GET_SIZE(obj)));
      out.append(PyBytes_AS_STRING(obj), static_cast<size_t>(PyBytes_GET_SIZE(obj)));
      return true;
    }
    if (depth < kMaxDepth && (PyList_CheckExact(obj) || PyTuple_CheckExact(obj))) {
      const bool list = PyList_CheckExact(obj);
      // The items as they are now, held (common.h): pickling a value runs Python code, and
      // another thread may change the list meanwhile.
      PyObject* items = list ? PyList_AsTuple(obj) : obj;
      if (items == nullptr) return false;
      const nb::object held = list ? nb::steal(items) : nb::borrow(items);
      const Py_ssize_t n = PyTuple_GET_SIZE(items);
      if (n > static_cast<Py_ssize_t>(UINT32_MAX)) return Pickled(obj);
      Tag(list ? 'l' : 'u');
      Raw(static_cast<uint32_t>(n));
      for (Py_ssize_t i = 0; i < n; ++i) {
        if (!Value(PyTuple_GET_ITEM(items, i), depth + 1)) return false;
      }
      return true;
    }
    if (depth < kMaxDepth && PyDict_CheckExact(obj)) return Dict(obj, depth);
    return Pickled(obj);
  }

  std::string out;

 private:
  bool Dict(PyObject* obj, int depth) {
    // Its keys and values read first, in one go, held (common.h): writing a value may run
    // Python code (pickling) that changes the dict, and so may another thread.
    std::vector<nb::object> items;
    try {
      items = DictItems(obj);
    } catch (nb::python_error& e) {
      e.restore();
      return false;
    }
    const Py_ssize_t n = static_cast<Py_ssize_t>(items.size() / 2);
    nb::object keys = nb::steal(PyTuple_New(n));
    nb::object values = nb::steal(PyTuple_New(n));
    if (!keys.is_valid() || !values.is_valid()) return false;
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!PyUnicode_CheckExact(items[2 * i].ptr())) return Pickled(obj);
      PyTuple_SET_ITEM(keys.ptr(), i, items[2 * i].inc_ref().ptr());
      PyTuple_SET_ITEM(values.ptr(), i, items[2 * i + 1].inc_ref().ptr());
    }
    nb::object known;
    try {
      known = DictGet(ids_.ptr(), keys.ptr());
    } catch (nb::python_error& e) {
      e.restore();
      return false;
    }
    uint32_t id = 0;
    if (known.is_valid()) {
      id = static_cast<uint32_t>(PyLong_AsUnsignedLong(known.ptr()));
    } else {
      id = static_cast<uint32_t>(PyList_GET_SIZE(schemas_.ptr()));
      nb::object idobj = nb::steal(PyLong_FromUnsignedLong(id));
      if (!idobj.is_valid() || PyList_Append(schemas_.ptr(), keys.ptr()) != 0 ||
          PyDict_SetItem(ids_.ptr(), keys.ptr(), idobj.ptr()) != 0) {
        return false;
      }
    }
    Tag('D');
    Raw(id);
    for (Py_ssize_t j = 0; j < n; ++j) {
      if (!Value(PyTuple_GET_ITEM(values.ptr(), j), depth + 1)) return false;
    }
    return true;
  }

  bool Pickled(PyObject* obj) {
    nb::object blob = nb::steal(PyObject_CallOneArg(dumps_.ptr(), obj));
    if (!blob.is_valid()) return false;
    if (!PyBytes_Check(blob.ptr())) {
      PyErr_SetString(PyExc_TypeError, "stoker: pickling a SharedList item gave no bytes");
      return false;
    }
    Tag('P');
    Raw(static_cast<uint64_t>(PyBytes_GET_SIZE(blob.ptr())));
    out.append(PyBytes_AS_STRING(blob.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(blob.ptr())));
    return true;
  }

  bool Tag(char t) {
    out.push_back(t);
    return true;
  }
  template <typename T>
  bool Raw(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.append(b, sizeof(T));
    return true;
  }

  nb::list schemas_;
  nb::dict ids_;
  nb::object dumps_;
};

// items (any iterable) -> (data bytes, offsets as int64 bytes: count + 1 of them). `schemas`
// (a list of key tuples) and `schema_ids` (tuple -> its place) grow with the dicts' shapes.
nb::tuple EncodeItems(nb::handle items, nb::list schemas, nb::dict schema_ids, nb::object dumps) {
  Encoder enc(schemas, schema_ids, dumps);
  std::vector<int64_t> offsets{0};
  nb::object it = nb::steal(PyObject_GetIter(items.ptr()));
  if (!it.is_valid()) throw nb::python_error();
  while (PyObject* raw = PyIter_Next(it.ptr())) {
    nb::object item = nb::steal(raw);
    if (!enc.Value(item.ptr(), 0)) throw nb::python_error();
    offsets.push_back(static_cast<int64_t>(enc.out.size()));
  }
  if (PyErr_Occurred()) throw nb::python_error();
  nb::bytes data(enc.out.data(), enc.out.size());
  nb::bytes offs(reinterpret_cast<const char*>(offsets.data()), offsets.size() * sizeof(int64_t));
  return nb::make_tuple(data, offs);
}

// -- decoding ------------------------------------------------------------------------------------
class SharedItems {
 public:
  SharedItems(nb::handle buffer, int64_t count, int64_t offsets_at, int64_t data_at,
              nb::list schemas, nb::object loads)
      : loads_(std::move(loads)) {
    if (PyObject_GetBuffer(buffer.ptr(), &view_, PyBUF_SIMPLE) != 0) throw nb::python_error();
    held_ = true;
    // (in unsigned arithmetic, divided rather than multiplied: a corrupt header cannot wrap)
    const auto size = static_cast<uint64_t>(view_.len);
    if (count < 0 || offsets_at < 0 || data_at < 0 || static_cast<uint64_t>(offsets_at) > size ||
        static_cast<uint64_t>(data_at) > size ||
        static_cast<uint64_t>(count) >= (size - static_cast<uint64_t>(offsets_at)) / 8) {
      Fail("stoker: a SharedList buffer whose header does not fit it");
    }
    base_ = static_cast<const uint8_t*>(view_.buf);
    n_ = count;
    offsets_ = base_ + offsets_at;
    data_ = base_ + data_at;
    data_len_ = static_cast<int64_t>(size) - data_at;
    int64_t prev = 0;
    for (int64_t i = 0; i <= n_; ++i) {  // once: every read then trusts them
      const int64_t o = Offset(i);
      if (o < prev || o > data_len_ || (i == 0 && o != 0)) {
        Fail("stoker: a SharedList buffer whose offsets are corrupt");
      }
      prev = o;
    }
    for (nb::handle s : schemas) {
      if (!PyTuple_Check(s.ptr())) Fail("stoker: a SharedList schema is corrupt");
      schemas_.push_back(nb::borrow(s));
    }
  }

  ~SharedItems() {
    if (held_) PyBuffer_Release(&view_);
  }

  // A constructor that throws has no destructor run: the buffer is let go of here first.
  [[noreturn]] void Fail(const char* message) {
    PyBuffer_Release(&view_);
    held_ = false;
    throw nb::value_error(message);
  }
  SharedItems(const SharedItems&) = delete;
  SharedItems& operator=(const SharedItems&) = delete;

  Py_ssize_t Len() const { return static_cast<Py_ssize_t>(n_); }

  nb::object GetItem(nb::handle key) const {
    if (PySlice_Check(key.ptr())) {
      Py_ssize_t start = 0, stop = 0, step = 0;
      if (PySlice_Unpack(key.ptr(), &start, &stop, &step) < 0) throw nb::python_error();
      const Py_ssize_t len = PySlice_AdjustIndices(Len(), &start, &stop, step);
      nb::object out = nb::steal(PyList_New(len));
      if (!out.is_valid()) throw nb::python_error();
      for (Py_ssize_t k = 0, i = start; k < len; ++k, i += step) {
        PyList_SET_ITEM(out.ptr(), k, Item(i).release().ptr());
      }
      return out;
    }
    Py_ssize_t i = PyNumber_AsSsize_t(key.ptr(), PyExc_IndexError);
    if (i == -1 && PyErr_Occurred()) throw nb::python_error();
    if (i < 0) i += Len();
    if (i < 0 || i >= Len()) throw nb::index_error("SharedList index out of range");
    return Item(i);
  }

 private:
  int64_t Offset(int64_t i) const {
    int64_t o;
    std::memcpy(&o, offsets_ + i * static_cast<int64_t>(sizeof(int64_t)), sizeof(o));
    return o;
  }

  nb::object Item(Py_ssize_t i) const {
    const uint8_t* p = data_ + Offset(i);
    const uint8_t* end = data_ + Offset(i + 1);
    PyObject* obj = Decode(p, end, 0);
    if (obj == nullptr) throw nb::python_error();
    return nb::steal(obj);
  }

  static PyObject* Corrupt() {
    PyErr_SetString(PyExc_ValueError, "stoker: a SharedList item is corrupt");
    return nullptr;
  }

  template <typename T>
  static bool Read(const uint8_t*& p, const uint8_t* end, T* v) {
    if (end - p < static_cast<ptrdiff_t>(sizeof(T))) return false;
    std::memcpy(v, p, sizeof(T));
    p += sizeof(T);
    return true;
  }

  // A new reference, or nullptr with an exception set.
  PyObject* Decode(const uint8_t*& p, const uint8_t* end, int depth) const {
    if (p >= end || depth > kMaxDepth) return Corrupt();
    const char tag = static_cast<char>(*p++);
    switch (tag) {
      case 'n':
        Py_RETURN_NONE;
      case 't':
        Py_RETURN_TRUE;
      case 'f':
        Py_RETURN_FALSE;
      case 'i': {
        int64_t v;
        if (!Read(p, end, &v)) return Corrupt();
        return PyLong_FromLongLong(v);
      }
      case 'd': {
        double v;
        if (!Read(p, end, &v)) return Corrupt();
        return PyFloat_FromDouble(v);
      }
      case 's':
      case 'b':
      case 'P': {
        uint64_t n;
        if (!Read(p, end, &n) || static_cast<uint64_t>(end - p) < n) return Corrupt();
        const char* s = reinterpret_cast<const char*>(p);
        p += n;
        if (tag == 's') return PyUnicode_DecodeUTF8(s, static_cast<Py_ssize_t>(n), "strict");
        if (tag == 'b') return PyBytes_FromStringAndSize(s, static_cast<Py_ssize_t>(n));
        PyObject* mv =
            PyMemoryView_FromMemory(const_cast<char*>(s), static_cast<Py_ssize_t>(n), PyBUF_READ);
        if (mv == nullptr) return nullptr;
        PyObject* out = PyObject_CallOneArg(loads_.ptr(), mv);
        Py_DECREF(mv);
        return out;
      }
      case 'l':
      case 'u': {
        uint32_t n;
        if (!Read(p, end, &n) || static_cast<uint64_t>(end - p) < n) return Corrupt();
        PyObject* out = tag == 'l' ? PyList_New(n) : PyTuple_New(n);
        if (out == nullptr) return nullptr;
        for (uint32_t k = 0; k < n; ++k) {
          PyObject* v = Decode(p, end, depth + 1);
          if (v == nullptr) {
            Py_DECREF(out);
            return nullptr;
          }
          if (tag == 'l') {
            PyList_SET_ITEM(out, k, v);
          } else {
            PyTuple_SET_ITEM(out, k, v);
          }
        }
        return out;
      }
      case 'D': {
        uint32_t id;
        if (!Read(p, end, &id) || id >= schemas_.size()) return Corrupt();
        PyObject* keys = schemas_[id].ptr();
        const Py_ssize_t n = PyTuple_GET_SIZE(keys);
        PyObject* out = PyDict_New();
        if (out == nullptr) return nullptr;
        for (Py_ssize_t k = 0; k < n; ++k) {
          PyObject* v = Decode(p, end, depth + 1);
          if (v == nullptr || PyDict_SetItem(out, PyTuple_GET_ITEM(keys, k), v) != 0) {
            Py_XDECREF(v);
            Py_DECREF(out);
            return nullptr;
          }
          Py_DECREF(v);
        }
        return out;
      }
      default:
        return Corrupt();
    }
  }

  Py_buffer view_{};
  bool held_ = false;
  const uint8_t* base_ = nullptr;
  const uint8_t* offsets_ = nullptr;
  const uint8_t* data_ = nullptr;
  int64_t data_len_ = 0;
  int64_t n_ = 0;
  std::vector<nb::object> schemas_;
  nb::object loads_;
};

}  // namespace

void register_shared_list(nb::module_& m) {
  m.def("encode_items", &EncodeItems, nb::arg("items"), nb::arg("schemas"), nb::arg("schema_ids"),
        nb::arg("dumps"),
        "(data, int64 offsets) of items laid out for SharedItems; schemas grow with the dicts' "
        "key tuples.");
  nb::class_<SharedItems>(m, "SharedItems",
                          "Items laid out by encode_items in a buffer, read as fresh objects.")
      .def(nb::init<nb::handle, int64_t, int64_t, int64_t, nb::list, nb::object>(),
           nb::arg("buffer"), nb::arg("count"), nb::arg("offsets_at"), nb::arg("data_at"),
           nb::arg("schemas"), nb::arg("loads"))
      .def("__len__", &SharedItems::Len)
      .def("__getitem__", &SharedItems::GetItem, nb::arg("key"));
}

}  // namespace stoker::py
