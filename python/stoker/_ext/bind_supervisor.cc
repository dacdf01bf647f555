// The main process's side: watch workers, send tasks, receive batches and deaths.
#include <nanobind/stl/string.h>
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
  void KeepSlotFds() { sup_->KeepSlotFds(); }

  void Send(int id, uint32_t type, uint64_t task, uint64_t a, nb::bytes payload, uint64_t b) {
    MessageHeader h;
    h.type = type;
    h.task = task;
    h.a = a;
    h.b = b;
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
        if (left <= 0)
          slice = 0;
        else
          slice = std::min(50, static_cast<int>(std::ceil(left * 1000)));
      }
      SupervisorEvent ev;
      Status st;
      {
        nb::gil_scoped_release release;
        st = sup_->Wait(slice, &ev);
      }
      if (st.code() == Code::kInterrupted ||
          (st.ok() && ev.kind == SupervisorEvent::Kind::kTimeout)) {
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

  // The worker's status page as a dict, or None when it has not sent one.
  nb::object StatusOf(int id) const {
    WorkerStatusPage p;
    if (!sup_->ReadStatus(id, &p)) return nb::none();
    nb::dict d;
    d["pid"] = p.pid;
    d["state"] = WorkerStateName(p.state);
    d["task"] = p.task;
    d["index"] = p.index == kNoIndex ? nb::none() : nb::cast(p.index);
    d["position"] = p.position == kNoIndex ? nb::none() : nb::cast(p.position);
    const uint64_t now = MonotonicNs();
    d["state_seconds"] = now > p.since_ns ? (now - p.since_ns) * 1e-9 : 0.0;
    d["samples"] = p.samples;
    d["batches"] = p.batches;
    d["rss_bytes"] = p.rss_bytes;
    d["bytes_sent"] = p.bytes_sent;
    d["in_flight"] = p.in_flight;
    // (None until the worker is ready to serve: what it spends until then is start-up)
    d["ready_cpu_seconds"] = p.ready_cpu_ns ? nb::cast(p.ready_cpu_ns * 1e-9) : nb::none();
    d["ready_runqueue_seconds"] =
        p.ready_cpu_ns ? nb::cast(p.ready_runqueue_ns * 1e-9) : nb::none();
    nb::dict times;
    for (int s = 0; s < kWorkerStateCount; ++s) times[WorkerStateName(s)] = p.state_ns[s] * 1e-9;
    d["seconds_in"] = times;
    return d;
  }
  std::string ReadLog(int id, int kind, size_t max_bytes) const {
    return sup_->ReadLog(id, static_cast<LogKind>(kind), max_bytes);
  }
  void Signal(int id, int signum) { Check(sup_->Signal(id, signum)); }

  nb::dict SlotUsageDict() const {
    const SlotUsage u = sup_->slot_usage();
    nb::dict d;
    d["slots"] = u.slots;
    d["bytes_mapped"] = u.mapped_bytes;
    d["slots_held_by_user"] = u.lent;
    d["bytes_held_by_user"] = u.lent_bytes;
    d["slots_waiting"] = u.ready;
    d["bytes_waiting"] = u.ready_bytes;
    return d;
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
      .def("keep_slot_fds", &PySupervisor::KeepSlotFds,
           "Keeps each slot's memfd open from now on (PendingBatch.fd), to pass it on.")
      .def("send", &PySupervisor::Send, nb::arg("worker"), nb::arg("type"), nb::arg("task"),
           nb::arg("a") = 0, nb::arg("payload") = nb::bytes(""), nb::arg("b") = 0)
      .def("wait", &PySupervisor::Wait, nb::arg("timeout").none() = nb::none())
      .def("status", &PySupervisor::StatusOf, nb::arg("worker"))
      .def("read_log", &PySupervisor::ReadLog, nb::arg("worker"), nb::arg("kind"),
           nb::arg("max_bytes") = 65536)
      .def("signal", &PySupervisor::Signal, nb::arg("worker"), nb::arg("signum"))
      .def("slot_usage", &PySupervisor::SlotUsageDict)
      .def("owned_fds", &PySupervisor::OwnedFds)
      .def_prop_ro("mapped_slot_count", &PySupervisor::mapped_slot_count);
  m.def("channel_pair", &ChannelPair, "A connected SOCK_SEQPACKET pair (close-on-exec).");
  // Message types, log kinds and states: bind_constants.cc.
}

}  // namespace stoker::py
