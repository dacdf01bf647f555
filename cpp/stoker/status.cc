#include "stoker/status.h"

#include <cstring>

namespace stoker {

Status Status::FromErrno(const std::string& what, int err) {
  Code code = Code::kSystem;
  if (err == ENOMEM || err == ENOSPC) code = Code::kOutOfMemory;
  if (err == EINTR) code = Code::kInterrupted;
  if (err == EPIPE || err == ECONNRESET) code = Code::kClosed;
  return Status(code, what + ": " + std::strerror(err), err);
}

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kSystem:
      return "system error";
    case Code::kCorrupt:
      return "corrupt data";
    case Code::kOutOfMemory:
      return "out of memory";
    case Code::kTimeout:
      return "timeout";
    case Code::kClosed:
      return "closed";
    case Code::kInterrupted:
      return "interrupted";
    case Code::kTooLarge:
      return "too large";
    case Code::kWrongProcess:
      return "wrong process";
    case Code::kLimitReached:
      return "limit reached";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(code_)) + ": " + message_;
}

}  // namespace stoker
