// Tests of Status, the error model of the core.
#include "stoker/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string>

namespace stoker {
namespace {

// A default Status and Status::OK() are OK and carry nothing.
TEST(StatusTest, OkCarriesNothing) {
  Status a;
  Status b = Status::OK();
  for (const Status& s : {a, b}) {
    EXPECT_TRUE(s.ok());
    EXPECT_EQ(s.code(), Code::kOk);
    EXPECT_EQ(s.errno_value(), 0);
    EXPECT_TRUE(s.message().empty());
    EXPECT_EQ(s.ToString(), "ok");
  }
}

// Error() keeps code, message and errno exactly as given.
TEST(StatusTest, ErrorKeepsItsFields) {
  Status s = Status::Error(Code::kCorrupt, "bad slot", EIO);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_EQ(s.errno_value(), EIO);
  EXPECT_EQ(s.message(), "bad slot");
  EXPECT_EQ(s.ToString(), "corrupt data: bad slot");

  Status t = Status::Error(Code::kTimeout, "late");
  EXPECT_EQ(t.errno_value(), 0);
  EXPECT_EQ(t.ToString(), "timeout: late");
}

// FromErrno maps errno values to codes and appends strerror to the message.
TEST(StatusTest, FromErrnoMapsErrnoToCode) {
  struct Case {
    int err;
    Code code;
  };
  const Case cases[] = {
      {ENOMEM, Code::kOutOfMemory}, {ENOSPC, Code::kOutOfMemory}, {EINTR, Code::kInterrupted},
      {EPIPE, Code::kClosed},       {ECONNRESET, Code::kClosed},  {EBADF, Code::kSystem},
      {EACCES, Code::kSystem},      {EINVAL, Code::kSystem},
  };
  for (const Case& c : cases) {
    Status s = Status::FromErrno("doing a thing", c.err);
    EXPECT_FALSE(s.ok()) << c.err;
    EXPECT_EQ(s.code(), c.code) << c.err;
    EXPECT_EQ(s.errno_value(), c.err);
    EXPECT_EQ(s.message(), std::string("doing a thing: ") + std::strerror(c.err));
  }
}

// Every code has its own human-readable name; an out-of-range code is "unknown".
TEST(StatusTest, CodeNamesAreDistinct) {
  std::set<std::string> names;
  const Code codes[] = {Code::kOk,           Code::kInvalidArgument, Code::kSystem,
                        Code::kCorrupt,      Code::kOutOfMemory,     Code::kTimeout,
                        Code::kClosed,       Code::kInterrupted,     Code::kTooLarge,
                        Code::kWrongProcess, Code::kLimitReached};
  for (Code c : codes) {
    const std::string name = CodeName(c);
    EXPECT_NE(name, "unknown");
    names.insert(name);
  }
  EXPECT_EQ(names.size(), sizeof(codes) / sizeof(codes[0]));
  EXPECT_STREQ(CodeName(static_cast<Code>(999)), "unknown");
}

Status Step(bool fail, int* reached) {
  STOKER_RETURN_IF_ERROR(fail ? Status::Error(Code::kClosed, "gone") : Status::OK());
  ++*reached;
  return Status::OK();
}

// STOKER_RETURN_IF_ERROR returns the error and skips the rest; an OK status falls through.
TEST(StatusTest, ReturnIfErrorPropagates) {
  int reached = 0;
  Status ok = Step(false, &reached);
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(reached, 1);
  Status err = Step(true, &reached);
  EXPECT_EQ(err.code(), Code::kClosed);
  EXPECT_EQ(err.message(), "gone");
  EXPECT_EQ(reached, 1);
}

}  // namespace
}  // namespace stoker
