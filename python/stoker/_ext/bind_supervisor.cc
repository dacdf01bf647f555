// The main process's side: watch workers, send tasks, receive batches and deaths.
#include <nanobind/stl/vector.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cmath>

#include "common.h"
#include "slot_handles.h"
#include "stoker/supervisor.h"

namespace stoker::py {
namespace {

double Now() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

class PySupervisor {
 public:
  PySupervisor() { Check(Supervisor::Create(&sup_)); }

  void AddWorker(int id, int sock, int pid) { Check(sup_->AddWorker(id, sock, pid)); }
  void RemoveWorker(int id) { sup_->RemoveWorker(id); }
  bool HasWorker(int id) const { return sup_->HasWorker(id); }

  void Send(int id, uint32_t type, uint64_t task, uint64_t a, nb::bytes payload) {
    MessageHeader h;
    h.type = type;
    h.task = task;
    h.a = a;
    Check(sup_->Send(id, h, payload.c_str(), payload.size()));
  }

  // Waits for the next event, at most `timeout` seconds (None: no limit). Returns None on
  // timeout, ("message", worker, type, task, a, b, c, payload, pending_batch) or
  // ("died", worker, exit_code, signal, core_dumped). Signals (Ctrl+C) are checked at least
  // every 50 ms, so a KeyboardInterrupt is raised promptly even if another thread got it.
  nb::object Wait(nb::object timeout) {
    const bool forever = timeout.is_none();
    const double deadline = forever ? 0 : Now() + nb::cast<double>(timeout);
    for (;;) {
      int slice = 50;
      if (!forever) {
        const double left = deadline - Now();
        if (left <= 0) slice = 0;
        else slice = std::min(50, static_cast<int>(std::ceil(left * 1000)));
      }
      SupervisorEvent ev;
      Status st;
      {
        nb::gil_scoped_release release;
        st = sup_->Wait(slice, &ev);
      }
      if (st.code() == Code::kInterrupted || (st.ok() && ev.kind == SupervisorEvent::Kind::kTimeout)) {
        if (PyErr_CheckSignals() != 0) throw nb::python_error();
        if (!forever && Now() >= deadline) return nb::none();
        continue;
      }
      Check(st);
      if (ev.kind == SupervisorEvent::Kind::kDied) {
        return nb::make_tuple("died", ev.worker, ev.exit.exit_code, ev.exit.signal,
                              ev.exit.core_dumped);
      }
      const MessageHeader& h = ev.message.header;
      nb::object pending = nb::none();
      if (ev.message.type() == MessageType::kBatch) {
        auto* p = new PendingBatch();
        p->segment = ev.slot;
        p->generation = static_cast<uint32_t>(h.b);
        p->nbytes = h.c;
        p->worker = ev.worker;
        pending = nb::cast(p, nb::rv_policy::take_ownership);
      }
      return nb::make_tuple("message", ev.worker, h.type, h.task, h.a, h.b, h.c,
                            nb::bytes(ev.message.payload.data(), ev.message.payload.size()),
                            pending);
    }
  }

  std::vector<int> OwnedFds() const { return sup_->OwnedFds(); }
  size_t mapped_slot_count() const { return sup_->mapped_slot_count(); }

 private:
  std::unique_ptr<Supervisor> sup_;
};

nb::tuple ChannelPair() {
  int fds[2];
  Check(MakeChannelPair(fds));
  return nb::make_tuple(fds[0], fds[1]);
}

}  // namespace

void register_supervisor(nb::module_& m) {
  register_slot_handles(m);
  nb::class_<PySupervisor>(m, "Supervisor", nb::is_weak_referenceable(),
                           "Watches workers: their channels and pidfds in one epoll set.")
      .def(nb::init<>())
      .def("add_worker", &PySupervisor::AddWorker, nb::arg("worker"), nb::arg("sock"),
           nb::arg("pid"))
      .def("remove_worker", &PySupervisor::RemoveWorker, nb::arg("worker"))
      .def("has_worker", &PySupervisor::HasWorker, nb::arg("worker"))
      .def("send", &PySupervisor::Send, nb::arg("worker"), nb::arg("type"), nb::arg("task"),
           nb::arg("a") = 0, nb::arg("payload") = nb::bytes(""))
      .def("wait", &PySupervisor::Wait, nb::arg("timeout").none() = nb::none())
      .def("owned_fds", &PySupervisor::OwnedFds)
      .def_prop_ro("mapped_slot_count", &PySupervisor::mapped_slot_count);
  m.def("channel_pair", &ChannelPair, "A connected SOCK_SEQPACKET pair (close-on-exec).");
  // Message types of the control channel (channel.h).
  m.attr("MSG_TASK") = static_cast<uint32_t>(MessageType::kTask);
  m.attr("MSG_RESUME") = static_cast<uint32_t>(MessageType::kResume);
  m.attr("MSG_STOP") = static_cast<uint32_t>(MessageType::kStop);
  m.attr("MSG_BATCH") = static_cast<uint32_t>(MessageType::kBatch);
  m.attr("MSG_ERROR") = static_cast<uint32_t>(MessageType::kError);
  m.attr("MSG_END") = static_cast<uint32_t>(MessageType::kEnd);
  m.attr("MSG_RESUMED") = static_cast<uint32_t>(MessageType::kResumed);
  m.attr("MSG_HELLO") = static_cast<uint32_t>(MessageType::kHello);
}

}  // namespace stoker::py
