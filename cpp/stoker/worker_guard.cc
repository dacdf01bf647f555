#include "stoker/worker_guard.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

namespace stoker {

Status ArmWorkerGuard(int sock, pid_t expected_parent) {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
    return Status::FromErrno("prctl(PR_SET_PDEATHSIG)", errno);
  if (expected_parent > 0 && getppid() != expected_parent) _exit(0);  // orphaned already
  std::thread([sock]() {
    struct pollfd p;
    p.fd = sock;
    p.events = POLLRDHUP;
    for (;;) {
      p.revents = 0;
      int rc = poll(&p, 1, -1);
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0 || (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) _exit(0);
    }
  }).detach();
  return Status::OK();
}

}  // namespace stoker
