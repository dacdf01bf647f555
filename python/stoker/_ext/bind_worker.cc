// The worker's side of the engine: receive tasks, encode batches into slots, report.
//
// Threads (with or without the GIL: the extension is free-threaded, common.h): an endpoint has
// one caller, the worker's thread that runs its loop (worker/endpoint.py). The calls that use
// its channel, its pool of slots or its encoder (receive, send, send_batch, send_fd,
// open_status, set_shared_memory_limit, arm_guard) take the caller's turn: a second thread that
// makes one of them while another is in one gets an EngineError at once, and nothing is
// shared. The status calls (enter, set_in_flight, mark_ready, update_rss, add_sample) are safe
// from any thread: add_sample is an atomic add, the others write the page under a mutex of
// their own (held for a few stores, no Python call inside).
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "common.h"
#include "py_encode.h"
#include "stoker/channel.h"
#include "stoker/segment.h"
#include "stoker/slot_pool.h"
#include "stoker/worker_guard.h"
#include "stoker/worker_status.h"

namespace stoker::py {
namespace {

// Holds the caller's turn for one call (see the top); raises when another thread has it.
class Turn {
 public:
  Turn(std::atomic<bool>& busy, const char* call) : busy_(busy) {
    if (busy_.exchange(true, std::memory_order_acquire)) {
      RaiseStoker("EngineError",
                  std::string("WorkerEndpoint.") + call +
                      " was called while another thread was in a call of the same endpoint: an "
                      "endpoint has one caller, the worker's loop thread (stoker/worker/"
                      "endpoint.py); other threads may only call add_sample and the status calls");
    }
  }
  ~Turn() { busy_.store(false, std::memory_order_release); }
  Turn(const Turn&) = delete;
  Turn& operator=(const Turn&) = delete;

 private:
  std::atomic<bool>& busy_;
};

class WorkerEndpoint {
 public:
  WorkerEndpoint(int sock, int worker_id)
      : sock_(sock),
        worker_id_(static_cast<uint64_t>(worker_id)),
        pool_(sock, static_cast<uint32_t>(worker_id)) {}
  WorkerEndpoint(const WorkerEndpoint&) = delete;
  WorkerEndpoint& operator=(const WorkerEndpoint&) = delete;
  ~WorkerEndpoint() {
    if (sock_ >= 0) close(sock_);
  }

  void ArmGuard(int parent_pid) {
    Turn turn(busy_, "arm_guard");
    Check(ArmWorkerGuard(sock_, parent_pid));
  }

  // (type, task, a, b, payload) or None when the main process closed the channel.
  nb::object Receive() {
    Turn turn(busy_, "receive");
    Message m;
    Status st;
    {
      nb::gil_scoped_release release;
      st = ReceiveMessage(sock_, &m);
    }
    if (st.code() == Code::kClosed) return nb::none();
    Check(st);
    if (m.fd >= 0) close(m.fd);
    return nb::make_tuple(m.header.type, m.header.task, m.header.a, m.header.b,
                          nb::bytes(m.payload.data(), m.payload.size()));
  }

  void Send(uint32_t type, uint64_t task, uint64_t a, nb::bytes payload) {
    Turn turn(busy_, "send");
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
    Turn turn(busy_, "send_batch");
    if (!encoder_.Describe(obj, static_cast<EncodeMode>(mode), indices)) return false;
    const uint64_t bytes = encoder_.wire().Layout();
    WritableSlot slot;
    Status st;
    {
      nb::gil_scoped_release release;  // it may wait for the user to let go of a slot
      st = pool_.Acquire(bytes, &slot);
    }
    if (!st.ok()) {
      encoder_.Reset();
      Raise(st);
    }
    {
      nb::gil_scoped_release release;
      st = encoder_.wire().Write(slot.payload, slot.capacity);
      if (st.ok()) {
        st = pool_.Publish(slot, bytes, task);
        WorkerStatusPage* page = status_.load(std::memory_order_acquire);
        if (st.ok() && page != nullptr) WorkerStatusWriter(page).AddBatch(bytes);
      } else {
        pool_.Abandon(slot);
      }
    }
    encoder_.Reset();
    Check(st);
    return true;
  }

  // Creates this worker's status page and sends it to the main process.
  void OpenStatus(uint64_t loader_token) {
    Turn turn(busy_, "open_status");
    if (status_seg_) RaiseStoker("EngineError", "this worker's status page is open already");
    int fd = -1;
    Check(Segment::Create("stoker-status", sizeof(WorkerStatusPage), &status_seg_, &fd));
    auto* page = reinterpret_cast<WorkerStatusPage*>(status_seg_->data());
    WorkerStatusWriter::Initialize(page, static_cast<uint64_t>(getpid()), worker_id_, loader_token);
    status_.store(page, std::memory_order_release);  // (initialized before any thread sees it)
    MessageHeader h;
    h.type = static_cast<uint32_t>(MessageType::kStatusPage);
    Status st = SendMessage(sock_, h, nullptr, 0, fd);
    close(fd);
    Check(st);
  }

  // Records what the worker is doing: state (WorkerState), task, dataset index (an int that
  // fits int64, or anything else for "not an int") and its position in the task's index list
  // (-1: none), which names a sample whose index is not an int.
  void Enter(int state, uint64_t task, nb::handle index, int64_t position) {
    WorkerStatusPage* page = status_.load(std::memory_order_acquire);
    if (page == nullptr) return;
    int64_t idx = kNoIndex;
    if (PyLong_CheckExact(index.ptr())) {
      int overflow = 0;
      long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
      if (overflow == 0 && !(v == -1 && PyErr_Occurred())) idx = v;
      PyErr_Clear();
    }
    std::lock_guard<std::mutex> lock(status_mu_);  // (the page's one writer at a time)
    WorkerStatusWriter(page).Enter(static_cast<WorkerState>(state), task, idx,
                                   position >= 0 ? position : kNoIndex);
  }
  void SetInFlight(uint64_t n) {
    WorkerStatusPage* page = status_.load(std::memory_order_acquire);
    if (page == nullptr) return;
    std::lock_guard<std::mutex> lock(status_mu_);
    WorkerStatusWriter(page).SetInFlight(n);
  }
  // Says the worker is ready to serve: its CPU and run-queue seconds now, which readers
  // subtract as start-up (WorkerStatusPage::ready_cpu_ns).
  void MarkReady(double cpu_s, double runqueue_s) {
    WorkerStatusPage* page = status_.load(std::memory_order_acquire);
    if (page == nullptr) return;
    std::lock_guard<std::mutex> lock(status_mu_);
    auto ns = [](double s) { return s > 0 ? static_cast<uint64_t>(s * 1e9) : uint64_t{0}; };
    WorkerStatusWriter(page).SetReady(ns(cpu_s), ns(runqueue_s));
  }
  void AddSample() {  // an atomic add: no lock
    WorkerStatusPage* page = status_.load(std::memory_order_acquire);
    if (page != nullptr) WorkerStatusWriter(page).AddSample();
  }
  void UpdateRss() {
    WorkerStatusPage* page = status_.load(std::memory_order_acquire);
    if (page == nullptr) return;
    FILE* f = fopen("/proc/self/statm", "r");
    if (f == nullptr) return;
    unsigned long size = 0, resident = 0;
    if (fscanf(f, "%lu %lu", &size, &resident) == 2) {
      std::lock_guard<std::mutex> lock(status_mu_);
      WorkerStatusWriter(page).SetRss(static_cast<uint64_t>(resident) * PageSize());
    }
    fclose(f);
  }

  // Sends a descriptor to the main process (a log memfd): `type` and `a` say what it is.
  void SendFd(uint32_t type, uint64_t a, int fd) {
    Turn turn(busy_, "send_fd");
    MessageHeader h;
    h.type = type;
    h.a = a;
    Check(SendMessage(sock_, h, nullptr, 0, fd));
  }

  // Caps this worker's slots at cap_bytes together (0: no cap); see SlotPool::SetLimit.
  void SetSharedMemoryLimit(uint64_t cap_bytes, double patience_s) {
    Turn turn(busy_, "set_shared_memory_limit");
    Check(pool_.SetLimit(cap_bytes, static_cast<int>(patience_s * 1000)));
  }

  size_t slot_count() {
    Turn turn(busy_, "slot_count");
    return pool_.slot_count();
  }
  uint64_t mapped_bytes() {
    Turn turn(busy_, "mapped_bytes");
    return pool_.mapped_bytes();
  }
  int fd() const { return sock_; }

 private:
  int sock_;
  uint64_t worker_id_;
  SlotPool pool_;
  PyBatchEncoder encoder_;
  std::unique_ptr<Segment> status_seg_;
  std::atomic<WorkerStatusPage*> status_{nullptr};  // set once, by open_status
  std::mutex status_mu_;
  std::atomic<bool> busy_{false};  // the caller's turn (Turn)
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
      .def("send_batch", &WorkerEndpoint::SendBatch, nb::arg("task"), nb::arg("obj").none(),
           nb::arg("mode"), nb::arg("indices") = nb::none())
      .def("set_shared_memory_limit", &WorkerEndpoint::SetSharedMemoryLimit, nb::arg("cap_bytes"),
           nb::arg("patience_s"),
           "Caps this worker's slots (0: no cap); a batch waits at most patience_s for room.")
      .def("open_status", &WorkerEndpoint::OpenStatus, nb::arg("loader_token") = 0)
      .def("enter", &WorkerEndpoint::Enter, nb::arg("state"), nb::arg("task"),
           nb::arg("index").none(), nb::arg("position") = -1)
      .def("add_sample", &WorkerEndpoint::AddSample)
      .def("set_in_flight", &WorkerEndpoint::SetInFlight)
      .def("mark_ready", &WorkerEndpoint::MarkReady, nb::arg("cpu_s"), nb::arg("runqueue_s"))
      .def("update_rss", &WorkerEndpoint::UpdateRss)
      .def("send_fd", &WorkerEndpoint::SendFd, nb::arg("type"), nb::arg("a"), nb::arg("fd"))
      .def_prop_ro("slot_count", &WorkerEndpoint::slot_count)
      .def_prop_ro("mapped_bytes", &WorkerEndpoint::mapped_bytes)
      .def_prop_ro("fd", &WorkerEndpoint::fd);
}

}  // namespace stoker::py
