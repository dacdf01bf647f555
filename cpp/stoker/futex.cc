#include "stoker/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

namespace stoker {

Status FutexWait(const uint32_t* word, uint32_t expected, int timeout_ms) {
  struct timespec ts;
  ts.tv_sec = timeout_ms / 1000;
  ts.tv_nsec = static_cast<long>(timeout_ms % 1000) * 1000000L;
  long rc = syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
  if (rc == 0) return Status::OK();
  if (errno == EAGAIN) return Status::OK();  // the value had already changed
  if (errno == ETIMEDOUT) return Status::Error(Code::kTimeout, "futex wait timed out");
  if (errno == EINTR) return Status::Error(Code::kInterrupted, "futex wait interrupted", EINTR);
  return Status::FromErrno("futex wait", errno);
}

void FutexWake(const uint32_t* word, int count) {
  syscall(SYS_futex, word, FUTEX_WAKE, count, nullptr, nullptr, 0);
}

}  // namespace stoker
