// Walking the samples' common structure as default_collate does: a dict gives one collated
// value per key, a namedtuple one per field (same type), a list or tuple one per position (a
// list). Every sample must have the first one's structure; where it does not, the error names
// both samples, the field and what differs, as torch would refuse the batch too.
#include <string>
#include <vector>

#include "py_encode.h"

namespace stoker::py {

std::string PyBatchEncoder::SampleName(size_t i) const {
  std::string s = "sample " + std::to_string(i);
  if (indices_.is_valid() && !indices_.is_none() && PyList_Check(indices_.ptr())) {
    // (a new reference: the list may change while the message is built)
    nb::object index = nb::steal(PySequence_GetItem(indices_.ptr(), static_cast<Py_ssize_t>(i)));
    if (index.is_valid()) {
      s += " (dataset index " + Repr(index) + ")";
    } else {
      PyErr_Clear();
    }
  }
  return s;
}

bool PyBatchEncoder::Collate(const std::vector<PyObject*>& s, std::string& path, int depth,
                             bool column_is_tuple) {
  // The wire carries kMaxNesting levels: deeper batches are collated in Python and pickled.
  if (depth >= kMaxNesting) return false;
  bool handled = false;
  const bool ok = CollateLeaves(s, path, depth, column_is_tuple, &handled);
  if (handled) return ok;
  PyObject* first = s[0];
  if (PyDict_CheckExact(first)) return CollateDict(s, path, depth);
  if (IsNamedTuple(first)) return CollateNamedTuple(s, path, depth);
  if (PyList_CheckExact(first) || PyTuple_CheckExact(first)) return CollateSequence(s, path, depth);
  return false;  // anything else: torch's own collate decides (and raises what torch raises)
}

bool PyBatchEncoder::CollateDict(const std::vector<PyObject*>& s, std::string& path, int depth) {
  const size_t n = s.size();
  PyObject* first = s[0];
  for (size_t i = 1; i < n; ++i) {
    if (!PyDict_CheckExact(s[i])) return false;
  }
  // The first sample's keys and every sample's values are held while the column is collated
  // (common.h: another thread, or a __repr__ this runs, may change the dicts meanwhile).
  const std::vector<nb::object> items = DictItems(first);
  wire_.AddContainer(NodeKind::kDict, static_cast<uint32_t>(items.size() / 2));
  std::vector<PyObject*> column(n);
  std::vector<nb::object> held(n);
  for (size_t k = 0; k < items.size(); k += 2) {
    PyObject* key = items[k].ptr();
    const size_t mark = path.size();
    path += "[" + Repr(key) + "]";
    for (size_t i = 0; i < n; ++i) {
      held[i] = i == 0 ? items[k + 1] : DictGet(s[i], key);
      column[i] = held[i].ptr();
      if (column[i] == nullptr) {
        const std::string msg = SampleName(i) + " has no key " + Repr(key) + " that " +
                                SampleName(0) + " has (at " +
                                (mark == 0 ? std::string("the top level") : path.substr(0, mark)) +
                                "); every sample of a batch must have the same keys";
        PyErr_SetObject(PyExc_KeyError, nb::str(msg.c_str()).ptr());
        throw nb::python_error();
      }
    }
    held_.Keep(key);
    if (!Value(key, EncodeMode::kAsIs, depth + 1)) return false;
    if (!Collate(column, path, depth + 1)) return false;
    path.resize(mark);
  }
  return true;
}

bool PyBatchEncoder::CollateNamedTuple(const std::vector<PyObject*>& s, std::string& path,
                                       int depth) {
  const size_t n = s.size();
  PyObject* first = s[0];
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(first));
  for (size_t i = 1; i < n; ++i) {
    if (Py_TYPE(s[i]) != Py_TYPE(first) || !IsNamedTuple(s[i])) return false;
  }
  nb::object blob = nb::steal(PyObject_CallOneArg(Types().pickle_dumps.ptr(), type));
  nb::object fields = nb::steal(PyObject_GetAttrString(type, "_fields"));
  if (!blob.is_valid() || !PyBytes_Check(blob.ptr()) || !fields.is_valid()) {
    PyErr_Clear();
    return false;  // torch's collate calls the type; pickling the batch reports what fails
  }
  const Py_ssize_t len = PyTuple_GET_SIZE(first);
  wire_.AddNamedTuple(static_cast<uint32_t>(len),
                      std::string(PyBytes_AS_STRING(blob.ptr()), PyBytes_GET_SIZE(blob.ptr())));
  std::vector<PyObject*> column(n);
  for (Py_ssize_t f = 0; f < len; ++f) {
    for (size_t i = 0; i < n; ++i) column[i] = PyTuple_GET_ITEM(s[i], f);
    const size_t mark = path.size();
    const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(fields.ptr(), f));  // IsNamedTuple: str
    if (name == nullptr) throw nb::python_error();
    path += "." + std::string(name);
    if (!Collate(column, path, depth + 1, true)) return false;
    path.resize(mark);
  }
  return true;
}

// list / tuple: transposed, each position collated; the result is a list (as torch's).
bool PyBatchEncoder::CollateSequence(const std::vector<PyObject*>& s, std::string& path,
                                     int depth) {
  const size_t n = s.size();
  // Each sample's items, held (a list is copied at once: common.h).
  std::vector<nb::object> seqs(n);
  for (size_t i = 0; i < n; ++i) {
    if (!PyList_CheckExact(s[i]) && !PyTuple_CheckExact(s[i])) return false;
    seqs[i] = AsTuple(s[i]);
  }
  const Py_ssize_t len = PyTuple_GET_SIZE(seqs[0].ptr());
  for (size_t i = 0; i < n; ++i) {
    const Py_ssize_t li = PyTuple_GET_SIZE(seqs[i].ptr());
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
    for (size_t i = 0; i < n; ++i) column[i] = PyTuple_GET_ITEM(seqs[i].ptr(), p);
    const size_t mark = path.size();
    path += "[" + std::to_string(p) + "]";
    if (!Collate(column, path, depth + 1, true)) return false;
    path.resize(mark);
  }
  return true;
}

}  // namespace stoker::py
