// Status: the one error model of the stoker core. A Status is a value; OK carries nothing,
// an error carries a code, the errno that caused it (0 when none) and a message written for a
// person. The core never throws; the Python binding turns Status into exceptions.
//
// Threads: a Status is a plain value. Distinct Status objects may be used from any threads;
// one object shared between threads REQUIRES: external synchronization (like std::string).
// Status is [[nodiscard]]: a result nobody looks at is a bug, so the compiler says so.
#pragma once

#include <string>
#include <utility>

namespace stoker {

enum class Code {
  kOk = 0,
  kInvalidArgument,  // the caller passed something the core cannot use
  kSystem,           // a system call failed; errno_value() says which error
  kCorrupt,          // shared memory or a message failed validation
  kOutOfMemory,      // memory could not be reserved (memfd fallocate, mmap)
  kTimeout,          // a wait ran past its deadline
  kClosed,           // the peer closed its end of the channel
  kInterrupted,      // a wait returned early because of a signal (EINTR)
  kTooLarge,         // a batch or message exceeds what the format can describe
  kWrongProcess,     // the object belongs to another process (this one was forked from it)
  kLimitReached,     // a limit the user set (max_shared_memory) leaves no room
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status OK() { return Status(); }
  static Status Error(Code code, std::string message, int err = 0) {
    return Status(code, std::move(message), err);
  }
  // A failed system call: the message gets strerror(err) appended.
  static Status FromErrno(const std::string& what, int err);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  int errno_value() const { return errno_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  Status(Code code, std::string message, int err)
      : code_(code), errno_(err), message_(std::move(message)) {}
  Code code_ = Code::kOk;
  int errno_ = 0;
  std::string message_;
};

const char* CodeName(Code code);

}  // namespace stoker

#define STOKER_RETURN_IF_ERROR(expr) \
  do {                               \
    ::stoker::Status _st = (expr);   \
    if (!_st.ok()) return _st;       \
  } while (0)
