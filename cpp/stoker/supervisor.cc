#include "stoker/supervisor.h"

#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "stoker/slot.h"

namespace stoker {
namespace {

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// An event's tag: the worker id, the serial of that worker's registration, and which of its
// two descriptors fired.
uint64_t Tag(int worker, uint32_t serial, bool is_pidfd) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(worker)) << 32) |
         (static_cast<uint64_t>(serial & 0x7fffffffu) << 1) | (is_pidfd ? 1 : 0);
}
int TagWorker(uint64_t tag) { return static_cast<int>(static_cast<uint32_t>(tag >> 32)); }
uint32_t TagSerial(uint64_t tag) { return static_cast<uint32_t>(tag >> 1) & 0x7fffffffu; }

// Every live Supervisor of this process, for the fork handlers. Both are leaked on purpose: a
// fork (or a destructor) may run while static objects are being destroyed at exit.
std::mutex& RegistryMutex() {
  static std::mutex* m = new std::mutex;
  return *m;
}
std::set<Supervisor*>& Registry() {
  static std::set<Supervisor*>* r = new std::set<Supervisor*>;
  return *r;
}

}  // namespace

void Supervisor::PrepareFork() {
  RegistryMutex().lock();
  for (Supervisor* s : Registry()) s->mu_.lock();
}

void Supervisor::ParentAfterFork() {
  for (Supervisor* s : Registry()) s->mu_.unlock();
  RegistryMutex().unlock();
}

void Supervisor::ChildAfterFork() {
  // The child has one thread, the one that forked, and it holds every lock taken above.
  for (Supervisor* s : Registry()) {
    s->AbandonInChild();
    s->mu_.unlock();
  }
  RegistryMutex().unlock();
}

Supervisor::Supervisor(int epfd, pid_t owner) : epfd_(epfd), owner_pid_(owner) {}

Status Supervisor::Create(std::unique_ptr<Supervisor>* out) {
  static std::once_flag once;
  int rc = 0;
  std::call_once(once, [&rc] {
    rc = pthread_atfork(&Supervisor::PrepareFork, &Supervisor::ParentAfterFork,
                        &Supervisor::ChildAfterFork);
  });
  if (rc != 0) return Status::FromErrno("pthread_atfork", rc);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) return Status::FromErrno("epoll_create1", errno);
  out->reset(new Supervisor(ep, getpid()));
  std::lock_guard<std::mutex> registry(RegistryMutex());
  Registry().insert(out->get());
  return Status::OK();
}

Supervisor::~Supervisor() {
  {
    std::lock_guard<std::mutex> registry(RegistryMutex());
    Registry().erase(this);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : workers_) CloseWorker(kv.second);
  workers_.clear();
  if (epfd_ >= 0) close(epfd_);
  epfd_ = -1;
}

void Supervisor::AbandonInChild() {
  for (auto& kv : workers_) {
    Worker& w = kv.second;
    for (int* fd : {&w.sock, &w.pidfd, &w.status_fd, &w.logs[0], &w.logs[1]}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
  }
  // Dropping the maps unmaps every slot and status page nothing else in the child holds.
  workers_.clear();
  if (epfd_ >= 0) close(epfd_);
  epfd_ = -1;
}

Status Supervisor::ForeignError() const {
  return Status::Error(Code::kWrongProcess,
                       "this loader's engine belongs to process " + std::to_string(owner_pid_) +
                           "; a forked child (this is process " + std::to_string(getpid()) +
                           ") cannot use it. Create the DataLoader iterator in the child "
                           "instead, or start the child with 'spawn'.");
}

void Supervisor::CloseWorker(Worker& w) {
  if (w.sock >= 0) {
    epoll_ctl(epfd_, EPOLL_CTL_DEL, w.sock, nullptr);
    close(w.sock);
    w.sock = -1;
  }
  if (w.pidfd >= 0) {
    epoll_ctl(epfd_, EPOLL_CTL_DEL, w.pidfd, nullptr);
    close(w.pidfd);
    w.pidfd = -1;
  }
  for (int& fd : w.logs) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  if (w.status_fd >= 0) close(w.status_fd);
  w.status_fd = -1;
}

Status Supervisor::AddWorker(int worker, int sock, pid_t pid) {
  std::lock_guard<std::mutex> lock(mu_);
  if (foreign()) {
    close(sock);
    return ForeignError();
  }
  if (workers_.count(worker)) {
    close(sock);
    return Status::Error(Code::kInvalidArgument, "worker id already in use");
  }
  Worker w;
  w.serial = ++next_serial_;
  w.sock = sock;
  w.pid = pid;
  w.pidfd = PidfdOpen(pid);
  if (w.pidfd < 0) {
    const int err = errno;
    close(sock);
    return Status::FromErrno("pidfd_open for worker " + std::to_string(worker), err);
  }
  struct epoll_event ev;
  std::memset(&ev, 0, sizeof(ev));
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(worker, w.serial, false);
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, sock, &ev) != 0) {
    const int err = errno;
    close(sock);
    close(w.pidfd);
    return Status::FromErrno("epoll_ctl", err);
  }
  ev.data.u64 = Tag(worker, w.serial, true);
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, w.pidfd, &ev) != 0) {
    const int err = errno;
    epoll_ctl(epfd_, EPOLL_CTL_DEL, sock, nullptr);
    close(sock);
    close(w.pidfd);
    return Status::FromErrno("epoll_ctl", err);
  }
  workers_.emplace(worker, std::move(w));
  return Status::OK();
}

void Supervisor::RemoveWorker(int worker) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end()) return;
  CloseWorker(it->second);
  workers_.erase(it);  // slot mappings die with their last holder
}

bool Supervisor::HasWorker(int worker) const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_.count(worker) != 0;
}

int Supervisor::worker_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(workers_.size());
}

Status Supervisor::Send(int worker, const MessageHeader& header, const void* payload, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (foreign()) return ForeignError();
  auto it = workers_.find(worker);
  if (it == workers_.end()) return Status::Error(Code::kInvalidArgument, "no such worker");
  if (it->second.channel_closed)
    return Status::Error(Code::kClosed, "the worker's channel is closed");
  return SendMessage(it->second.sock, header, payload, size);
}

Status Supervisor::PeekExit(int pidfd, pid_t pid, WorkerExit* out, bool* exited) {
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  int rc = waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info,
                  WEXITED | WNOWAIT | WNOHANG);
  if (rc != 0 && errno == EINVAL) {  // kernels before 5.4: by pid
    rc = waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT | WNOHANG);
  }
  if (rc != 0) {
    if (errno == ECHILD) {  // already reaped by someone else: we cannot know more
      *exited = true;
      return Status::OK();
    }
    return Status::FromErrno("waitid", errno);
  }
  *exited = info.si_pid != 0;
  if (!*exited) return Status::OK();
  if (info.si_code == CLD_EXITED) {
    out->exit_code = info.si_status;
  } else {
    out->signal = info.si_status;
    out->core_dumped = info.si_code == CLD_DUMPED;
  }
  return Status::OK();
}

Status Supervisor::Absorb(int id, Worker& w, Message& m, bool* consumed, SupervisorEvent* event) {
  *consumed = false;
  switch (m.type()) {
    case MessageType::kSlotNew: {
      if (m.fd < 0)
        return Status::Error(Code::kCorrupt, "a slot announcement came without its memfd");
      std::unique_ptr<Segment> seg;
      Status st = Segment::Map(m.fd, &seg);
      if (st.ok() && keep_slot_fds_) {
        seg->AdoptFd(m.fd);  // closed with the Segment
      } else {
        close(m.fd);
      }
      m.fd = -1;
      if (!st.ok()) return st;
      if (seg->size() < kSlotHeaderSize) return Status::Error(Code::kCorrupt, "slot too small");
      w.slots[static_cast<uint32_t>(m.header.a)] = std::shared_ptr<Segment>(std::move(seg));
      *consumed = true;
      return Status::OK();
    }
    case MessageType::kSlotRetire:
      w.slots.erase(static_cast<uint32_t>(m.header.a));
      *consumed = true;
      return Status::OK();
    case MessageType::kStatusPage: {
      *consumed = true;
      if (m.fd < 0) return Status::OK();
      std::unique_ptr<Segment> seg;
      Status st = Segment::Map(m.fd, &seg);
      if (st.ok() && seg->size() >= sizeof(WorkerStatusPage)) {
        w.status = std::move(seg);
        if (w.status_fd >= 0) close(w.status_fd);
        w.status_fd = m.fd;
      } else {
        close(m.fd);
      }
      m.fd = -1;
      return Status::OK();
    }
    case MessageType::kLogFile: {
      *consumed = true;
      const uint64_t kind = m.header.a;
      if (m.fd >= 0 && kind < 2) {
        if (w.logs[kind] >= 0) close(w.logs[kind]);
        w.logs[kind] = m.fd;
      } else if (m.fd >= 0) {
        close(m.fd);
      }
      m.fd = -1;
      return Status::OK();
    }
    case MessageType::kBatch: {
      auto it = w.slots.find(static_cast<uint32_t>(m.header.a));
      if (it == w.slots.end()) {
        return Status::Error(Code::kCorrupt, "worker " + std::to_string(id) +
                                                 " announced a batch in an unknown slot");
      }
      event->slot = it->second;
      break;
    }
    default:
      break;
  }
  if (m.fd >= 0) {  // no other message carries a descriptor
    close(m.fd);
    m.fd = -1;
  }
  event->kind = SupervisorEvent::Kind::kMessage;
  event->worker = id;
  event->message = std::move(m);
  return Status::OK();
}

// A worker whose process has exited: first hand out what it sent before dying, then its death.
Status Supervisor::DrainDead(SupervisorEvent* event, bool* produced) {
  *produced = false;
  for (auto& kv : workers_) {
    Worker& w = kv.second;
    if (!w.exited || w.death_reported) continue;
    while (!w.channel_closed) {
      Message m;
      Status st = ReceiveMessage(w.sock, &m, /*nonblocking=*/true);
      if (!st.ok()) {  // nothing more (kTimeout), end of file, or a broken channel
        w.channel_closed = true;
        // A readable-at-EOF socket left in the set would make every later wait return at once.
        epoll_ctl(epfd_, EPOLL_CTL_DEL, w.sock, nullptr);
        break;
      }
      bool consumed = false;
      STOKER_RETURN_IF_ERROR(Absorb(kv.first, w, m, &consumed, event));
      if (!consumed) {
        *produced = true;
        return Status::OK();
      }
    }
    bool exited = false;
    STOKER_RETURN_IF_ERROR(PeekExit(w.pidfd, w.pid, &event->exit, &exited));
    w.death_reported = true;
    event->kind = SupervisorEvent::Kind::kDied;
    event->worker = kv.first;
    *produced = true;
    return Status::OK();
  }
  return Status::OK();
}

// Handles what one epoll_wait returned. Sockets first: a message that arrived before a death
// must not be lost.
Status Supervisor::HandleEvents(const ::epoll_event* evs, int n, SupervisorEvent* event,
                                bool* produced) {
  *produced = false;
  for (int i = 0; i < n; ++i) {
    const uint64_t tag = evs[i].data.u64;
    const int id = TagWorker(tag);
    auto it = workers_.find(id);
    // A worker removed (or replaced under the same id) while this thread slept in epoll_wait.
    if (it == workers_.end() || it->second.serial != TagSerial(tag)) continue;
    Worker& w = it->second;
    if (tag & 1) {
      if (!w.exited && w.pidfd >= 0) {
        w.exited = true;
        epoll_ctl(epfd_, EPOLL_CTL_DEL, w.pidfd, nullptr);  // level-triggered: stop repeating
      }
      continue;
    }
    if (w.channel_closed) continue;
    Message m;
    Status st = ReceiveMessage(w.sock, &m, /*nonblocking=*/true);
    if (st.code() == Code::kTimeout) continue;  // another waiter took it
    if (!st.ok()) {
      // The worker closed its end (exiting or dead): its pidfd will say how it ended.
      w.channel_closed = true;
      epoll_ctl(epfd_, EPOLL_CTL_DEL, w.sock, nullptr);
      continue;
    }
    bool consumed = false;
    STOKER_RETURN_IF_ERROR(Absorb(id, w, m, &consumed, event));
    if (!consumed) {
      *produced = true;
      return Status::OK();
    }
  }
  return DrainDead(event, produced);
}

Status Supervisor::Wait(int timeout_ms, SupervisorEvent* event) {
  event->kind = SupervisorEvent::Kind::kTimeout;
  event->slot.reset();
  int epfd = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (foreign()) return ForeignError();
    bool produced = false;
    STOKER_RETURN_IF_ERROR(DrainDead(event, &produced));
    if (produced) return Status::OK();
    epfd = epfd_;  // stays open until the destructor, which no Wait may overlap
  }
  constexpr int kMaxEvents = 16;
  ::epoll_event evs[kMaxEvents];
  for (;;) {
    // Sleeps without the mutex: other threads may read status or add and remove workers.
    int n = epoll_wait(epfd, evs, kMaxEvents, timeout_ms);
    if (n < 0) {
      if (errno == EINTR)
        return Status::Error(Code::kInterrupted, "interrupted by a signal", EINTR);
      return Status::FromErrno("epoll_wait", errno);
    }
    if (n == 0) return Status::OK();  // kTimeout
    {
      std::lock_guard<std::mutex> lock(mu_);
      bool produced = false;
      STOKER_RETURN_IF_ERROR(HandleEvents(evs, n, event, &produced));
      if (produced) return Status::OK();
    }
    if (timeout_ms == 0) return Status::OK();
    // Only slot announcements arrived: wait again (the caller's deadline is approximate).
  }
}

void Supervisor::KeepSlotFds() {
  std::lock_guard<std::mutex> lock(mu_);
  keep_slot_fds_ = true;
}

std::vector<int> Supervisor::OwnedFds() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (foreign()) return {};
  std::vector<int> fds{epfd_};
  for (const auto& kv : workers_) {
    for (const auto& slot : kv.second.slots) {
      if (slot.second->fd() >= 0) fds.push_back(slot.second->fd());
    }
    if (kv.second.sock >= 0) fds.push_back(kv.second.sock);
    if (kv.second.pidfd >= 0) fds.push_back(kv.second.pidfd);
    for (int fd : kv.second.logs) {
      if (fd >= 0) fds.push_back(fd);
    }
    if (kv.second.status_fd >= 0) fds.push_back(kv.second.status_fd);
  }
  return fds;
}

bool Supervisor::ReadStatus(int worker, WorkerStatusPage* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end() || !it->second.status) return false;
  *out = ReadWorkerStatus(reinterpret_cast<const WorkerStatusPage*>(it->second.status->data()));
  return out->magic == kStatusMagic;
}

std::string Supervisor::ReadLog(int worker, LogKind kind, size_t max_bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end()) return "";
  const int fd = it->second.logs[static_cast<int>(kind)];
  if (fd < 0) return "";
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) return "";
  const size_t size = static_cast<size_t>(st.st_size);
  const size_t start = size > max_bytes ? size - max_bytes : 0;  // the fd stays open: mu_ held
  std::string out(size - start, '\0');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t r = pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(start + done));
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      break;
    }
    done += static_cast<size_t>(r);
  }
  out.resize(done);
  return out;
}

Status Supervisor::Signal(int worker, int signum) {
  std::lock_guard<std::mutex> lock(mu_);
  if (foreign()) return ForeignError();
  auto it = workers_.find(worker);
  if (it == workers_.end() || it->second.pidfd < 0) {
    return Status::Error(Code::kInvalidArgument, "no such worker");
  }
  if (syscall(SYS_pidfd_send_signal, it->second.pidfd, signum, nullptr, 0) != 0) {
    return Status::FromErrno("pidfd_send_signal", errno);
  }
  return Status::OK();
}

SlotUsage Supervisor::slot_usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  SlotUsage u;
  for (const auto& kv : workers_) {
    for (const auto& s : kv.second.slots) {
      const Segment& seg = *s.second;
      ++u.slots;
      u.mapped_bytes += seg.size();
      const uint32_t state = SlotWord(reinterpret_cast<SlotHeader*>(seg.data())).state();
      if (state == static_cast<uint32_t>(SlotState::kLent)) {
        ++u.lent;
        u.lent_bytes += seg.size();
      } else if (state == static_cast<uint32_t>(SlotState::kReady)) {
        ++u.ready;
        u.ready_bytes += seg.size();
      }
    }
  }
  return u;
}

size_t Supervisor::mapped_slot_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& kv : workers_) n += kv.second.slots.size();
  return n;
}

}  // namespace stoker
