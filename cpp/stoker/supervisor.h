// Supervisor: the main process's view of its workers.
//
// One epoll set holds, for every worker, its channel socket and a pidfd. A message, a death and a
// deadline all wake the same wait, so a worker that dies is seen within milliseconds, not at the
// next polling interval. Slot announcements (kSlotNew / kSlotRetire) are handled here: the slot is
// mapped and its descriptor closed at once, so the main process holds two descriptors per worker
// whatever the number of batches. Every other message is returned to the caller; messages a worker
// sent before it died are delivered before its death.
//
// Threads: a Supervisor is safe for concurrent use from any thread without external
// synchronization (one internal mutex). Wait() holds the mutex only while it handles events,
// never while it sleeps in epoll_wait, so a status read from a monitoring thread does not wait
// for a wait slice. Concurrent Waits are safe but split the events between them; the engine
// has one waiter. The destructor REQUIRES: no other call in progress.
//
// Processes: a Supervisor belongs to the process that created it. In a child forked from that
// process (a worker, or anything else the user forks), a pthread_atfork handler closes every
// descriptor the Supervisor owns (epoll, sockets, pidfds, status and log memfds) and drops its
// slot mappings (a slot still held by a lease in the child stays mapped until that lease dies).
// From then on the child's copy answers every call that returns a Status with kWrongProcess,
// reports no workers, no descriptors and no slots, and its destructor closes nothing. The
// handler takes every live Supervisor's mutex while the process forks, so the child never sees
// a half-updated map.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "stoker/channel.h"
#include "stoker/segment.h"
#include "stoker/status.h"
#include "stoker/worker_status.h"

struct epoll_event;

namespace stoker {

struct WorkerExit {
  int exit_code = 0;  // when it exited
  int signal = 0;     // when a signal killed it (0 otherwise)
  bool core_dumped = false;
};

// What the slots of the live workers hold right now (states read from their headers).
struct SlotUsage {
  size_t slots = 0;
  uint64_t mapped_bytes = 0;
  size_t lent = 0;  // held by the user as tensor views
  uint64_t lent_bytes = 0;
  size_t ready = 0;  // written, waiting in the main process
  uint64_t ready_bytes = 0;
};

struct SupervisorEvent {
  enum class Kind { kTimeout, kMessage, kDied };
  Kind kind = Kind::kTimeout;
  int worker = -1;
  Message message;                // kMessage
  std::shared_ptr<Segment> slot;  // kMessage of type kBatch: the slot it names
  WorkerExit exit;                // kDied
};

class Supervisor {
 public:
  static Status Create(std::unique_ptr<Supervisor>* out);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts watching a worker. Takes ownership of `sock` (the main process's end).
  Status AddWorker(int worker, int sock, pid_t pid);
  // Stops watching; closes its descriptors. Slots stay mapped while something still holds them.
  void RemoveWorker(int worker);
  bool HasWorker(int worker) const;

  Status Send(int worker, const MessageHeader& header, const void* payload, size_t size);

  // Waits up to timeout_ms (0: poll) for the next event. kInterrupted when a signal arrived.
  Status Wait(int timeout_ms, SupervisorEvent* event);

  // Reads a worker's exit status without reaping it (the caller's process library reaps).
  static Status PeekExit(int pidfd, pid_t pid, WorkerExit* out, bool* exited);

  // What the worker's status page says now; false when it has sent none.
  bool ReadStatus(int worker, WorkerStatusPage* out) const;
  // The last `max_bytes` of a log the worker shares (see LogKind); empty when none.
  std::string ReadLog(int worker, LogKind kind, size_t max_bytes) const;
  // Sends a signal through the worker's pidfd (never to a recycled pid).
  Status Signal(int worker, int signum);

  // From now on the memfd of each slot a worker announces stays open with the slot's mapping
  // (Segment::fd), so the caller can pass a batch's slot on to another process (the node pool
  // does). Off by default: the main process of a local loader holds no descriptor per slot.
  void KeepSlotFds();

  // Every descriptor this supervisor owns (empty in a forked child: they were closed there).
  std::vector<int> OwnedFds() const;
  int worker_count() const;
  size_t mapped_slot_count() const;
  SlotUsage slot_usage() const;
  // The process this supervisor belongs to.
  pid_t owner_pid() const { return owner_pid_; }

 private:
  struct Worker {
    uint32_t serial = 0;  // tells its epoll events from those of an earlier worker of that id
    int sock = -1;
    int pidfd = -1;
    pid_t pid = 0;
    bool exited = false;  // its pidfd fired
    bool channel_closed = false;
    bool death_reported = false;
    std::map<uint32_t, std::shared_ptr<Segment>> slots;
    std::shared_ptr<Segment> status;  // the worker's status page
    int status_fd = -1;               // kept open: `stoker top` finds the page through /proc/PID/fd
    int logs[2] = {-1, -1};           // LogKind -> memfd
  };
  Supervisor(int epfd, pid_t owner);
  // Handles one message internally when it is a slot announcement; true if consumed.
  // REQUIRES: mu_ held (as do all the helpers below).
  Status Absorb(int id, Worker& w, Message& m, bool* consumed, SupervisorEvent* event);
  Status DrainDead(SupervisorEvent* event, bool* produced);
  Status HandleEvents(const ::epoll_event* evs, int n, SupervisorEvent* event, bool* produced);
  void CloseWorker(Worker& w);
  Status ForeignError() const;
  bool foreign() const { return epfd_ < 0; }

  // pthread_atfork handlers over every live Supervisor (see the comment at the top).
  static void PrepareFork();
  static void ParentAfterFork();
  static void ChildAfterFork();
  // In a forked child: closes every descriptor and drops every mapping this object holds.
  void AbandonInChild();

  mutable std::mutex mu_;
  int epfd_;  // -1 once abandoned in a forked child
  const pid_t owner_pid_;
  uint32_t next_serial_ = 0;
  bool keep_slot_fds_ = false;
  std::map<int, Worker> workers_;
};

}  // namespace stoker
