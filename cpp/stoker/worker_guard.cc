#include "stoker/worker_guard.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

namespace stoker {

Status ArmWorkerGuard(int sock, pid_t expected_parent) {
  int parent_fd = -1;
  if (expected_parent > 0) {
    parent_fd = static_cast<int>(syscall(SYS_pidfd_open, expected_parent, 0));  // close-on-exec
    if (parent_fd < 0) {
      if (errno == ESRCH) _exit(0);  // the parent is gone already
      // Kernels before 5.3 have no pidfd_open: the channel's EOF still ends the worker.
      if (errno != ENOSYS) return Status::FromErrno("pidfd_open of the main process", errno);
    }
    // The pidfd was opened while the process was alive; if it is no longer our parent, the
    // pid may have been reused between its death and pidfd_open: we are orphaned already.
    if (getppid() != expected_parent) _exit(0);
  }
  std::thread([sock, parent_fd]() {
    struct pollfd p[2];
    p[0].fd = sock;
    p[0].events = POLLRDHUP;
    p[1].fd = parent_fd;  // a negative fd is ignored by poll
    p[1].events = POLLIN;
    for (;;) {
      p[0].revents = p[1].revents = 0;
      int rc = poll(p, 2, -1);
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) break;
      if (p[0].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) break;
      if (p[1].revents != 0) break;  // POLLIN: the parent exited
    }
    // An idle worker sees the same EOF in its receive and exits on its own, flushing its
    // stdout/stderr and running its exit handlers; only one busy in a long sample is cut short.
    std::this_thread::sleep_for(std::chrono::milliseconds(kWorkerExitGraceMs));
    _exit(0);
  }).detach();
  return Status::OK();
}

}  // namespace stoker
