// The worker's side of the engine: receive tasks, encode batches into slots, report.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <unistd.h>

#include "common.h"
#include "py_encode.h"
#include "stoker/channel.h"
#include "stoker/slot_pool.h"
#include "stoker/worker_guard.h"

namespace stoker::py {
namespace {

class WorkerEndpoint {
 public:
  WorkerEndpoint(int sock, int worker_id)
      : sock_(sock), pool_(sock, static_cast<uint32_t>(worker_id)) {}
  WorkerEndpoint(const WorkerEndpoint&) = delete;
  WorkerEndpoint& operator=(const WorkerEndpoint&) = delete;
  ~WorkerEndpoint() {
    if (sock_ >= 0) close(sock_);
  }

  void ArmGuard(int parent_pid) { Check(ArmWorkerGuard(sock_, parent_pid)); }

  // (type, task, a, payload) or None when the main process closed the channel.
  nb::object Receive() {
    Message m;
    Status st;
    {
      nb::gil_scoped_release release;
      st = ReceiveMessage(sock_, &m);
    }
    if (st.code() == Code::kClosed) return nb::none();
    Check(st);
    if (m.fd >= 0) close(m.fd);
    return nb::make_tuple(m.header.type, m.header.task, m.header.a,
                          nb::bytes(m.payload.data(), m.payload.size()));
  }

  void Send(uint32_t type, uint64_t task, uint64_t a, nb::bytes payload) {
    MessageHeader h;
    h.type = type;
    h.task = task;
    h.a = a;
    const char* data = payload.c_str();
    const size_t size = payload.size();
    Status st;
    {
      nb::gil_scoped_release release;
      st = SendMessage(sock_, h, data, size);
    }
    Check(st);
  }

  // Encodes `obj` (mode: 0 collate, 1 convert, 2 as-is) into a slot and announces it.
  // False when the collate fast path declined: collate in Python and send with mode 2.
  bool SendBatch(uint64_t task, nb::handle obj, int mode, nb::handle indices) {
    if (!encoder_.Describe(obj, static_cast<EncodeMode>(mode), indices)) return false;
    const uint64_t bytes = encoder_.wire().Layout();
    WritableSlot slot;
    Status st = pool_.Acquire(bytes, &slot);
    if (!st.ok()) {
      encoder_.Reset();
      Raise(st);
    }
    {
      nb::gil_scoped_release release;
      st = encoder_.wire().Write(slot.payload, slot.capacity);
      if (st.ok()) {
        st = pool_.Publish(slot, bytes, task);
      } else {
        pool_.Abandon(slot);
      }
    }
    encoder_.Reset();
    Check(st);
    return true;
  }

  size_t slot_count() const { return pool_.slot_count(); }
  uint64_t mapped_bytes() const { return pool_.mapped_bytes(); }
  int fd() const { return sock_; }

 private:
  int sock_;
  SlotPool pool_;
  PyBatchEncoder encoder_;
};

}  // namespace

void register_worker(nb::module_& m) {
  nb::class_<WorkerEndpoint>(m, "WorkerEndpoint",
                             "A worker's end of its channel and its pool of slots.")
      .def(nb::init<int, int>(), nb::arg("sock"), nb::arg("worker_id"))
      .def("arm_guard", &WorkerEndpoint::ArmGuard, nb::arg("parent_pid"),
           "Die with the parent (PR_SET_PDEATHSIG) and when the main process closes the channel.")
      .def("receive", &WorkerEndpoint::Receive)
      .def("send", &WorkerEndpoint::Send, nb::arg("type"), nb::arg("task"), nb::arg("a") = 0,
           nb::arg("payload") = nb::bytes(""))
      .def("send_batch", &WorkerEndpoint::SendBatch, nb::arg("task"), nb::arg("obj"),
           nb::arg("mode"), nb::arg("indices") = nb::none())
      .def_prop_ro("slot_count", &WorkerEndpoint::slot_count)
      .def_prop_ro("mapped_bytes", &WorkerEndpoint::mapped_bytes)
      .def_prop_ro("fd", &WorkerEndpoint::fd);
}

}  // namespace stoker::py
