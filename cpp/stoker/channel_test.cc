// Tests of the control channel: SOCK_SEQPACKET messages, descriptors passed with SCM_RIGHTS,
// large payloads carried in a memfd, and how end-of-file and empty queues are reported.
#include "stoker/channel.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

// Records every close() while a test asks for it, so a test can prove that a descriptor is
// closed exactly once. The core library links against this definition instead of libc's.
namespace {
std::atomic<bool> g_record_closes{false};
int g_closed[64];
std::atomic<int> g_closed_count{0};
}  // namespace

extern "C" int close(int fd) {
  if (g_record_closes.load()) {
    const int i = g_closed_count.fetch_add(1);
    if (i < 64) g_closed[i] = fd;
  }
  return static_cast<int>(syscall(SYS_close, fd));
}

namespace stoker {
namespace {

int CountOpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

class ChannelTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(MakeChannelPair(fds_).ok()); }
  void TearDown() override {
    if (fds_[0] >= 0) close(fds_[0]);
    if (fds_[1] >= 0) close(fds_[1]);
  }
  int fds_[2] = {-1, -1};
};

// Both ends are SOCK_SEQPACKET and close-on-exec.
TEST_F(ChannelTest, PairIsSeqpacketAndCloexec) {
  for (int fd : fds_) {
    int type = 0;
    socklen_t len = sizeof(type);
    ASSERT_EQ(getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len), 0);
    EXPECT_EQ(type, SOCK_SEQPACKET);
    EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  }
}

// Header fields and an inline payload arrive unchanged, with no descriptor.
TEST_F(ChannelTest, HeaderAndPayloadRoundTrip) {
  MessageHeader h;
  h.type = static_cast<uint32_t>(MessageType::kTask);
  h.flags = 0x5;
  h.task = 0x1122334455667788ull;
  h.a = 1;
  h.b = UINT64_MAX;
  h.c = 42;
  const std::string payload = "index list \x01\x02\x00 with a NUL";
  ASSERT_TRUE(SendMessage(fds_[0], h, payload.data(), payload.size()).ok());
  Message m;
  ASSERT_TRUE(ReceiveMessage(fds_[1], &m).ok());
  EXPECT_EQ(m.type(), MessageType::kTask);
  EXPECT_EQ(m.header.flags, 0x5u);
  EXPECT_EQ(m.header.task, h.task);
  EXPECT_EQ(m.header.a, 1u);
  EXPECT_EQ(m.header.b, UINT64_MAX);
  EXPECT_EQ(m.header.c, 42u);
  EXPECT_EQ(m.header.large_payload_bytes, 0u);
  EXPECT_EQ(m.payload, payload);
  EXPECT_EQ(m.fd, -1);
}

// Message boundaries are kept: three sends are three receives, in order, even when empty.
TEST_F(ChannelTest, MessagesKeepBoundariesAndOrder) {
  const std::string payloads[] = {"first", "", std::string(1000, 'z')};
  for (int i = 0; i < 3; ++i) {
    MessageHeader h;
    h.type = static_cast<uint32_t>(MessageType::kHello);
    h.a = static_cast<uint64_t>(i);
    ASSERT_TRUE(SendMessage(fds_[1], h, payloads[i].data(), payloads[i].size()).ok());
  }
  for (int i = 0; i < 3; ++i) {
    Message m;
    ASSERT_TRUE(ReceiveMessage(fds_[0], &m).ok());
    EXPECT_EQ(m.header.a, static_cast<uint64_t>(i));
    EXPECT_EQ(m.payload, payloads[i]);
  }
  Message m;
  EXPECT_EQ(ReceiveMessage(fds_[0], &m, /*nonblocking=*/true).code(), Code::kTimeout);
}

// A descriptor sent with a message arrives as a new, close-on-exec descriptor of the same file;
// the sender's descriptor is not consumed.
TEST_F(ChannelTest, PassedDescriptorIsUsable) {
  int mfd = memfd_create("chan-test", MFD_CLOEXEC);
  ASSERT_GE(mfd, 0);
  const char text[] = "through SCM_RIGHTS";
  ASSERT_EQ(write(mfd, text, sizeof(text)), static_cast<ssize_t>(sizeof(text)));
  MessageHeader h;
  h.type = static_cast<uint32_t>(MessageType::kSlotNew);
  h.a = 9;
  ASSERT_TRUE(SendMessage(fds_[0], h, nullptr, 0, mfd).ok());
  EXPECT_GE(fcntl(mfd, F_GETFD), 0);  // still open on the sending side

  Message m;
  ASSERT_TRUE(ReceiveMessage(fds_[1], &m).ok());
  EXPECT_EQ(m.type(), MessageType::kSlotNew);
  EXPECT_EQ(m.header.a, 9u);
  EXPECT_EQ(m.header.flags, 0u);  // the transport's own flags are not visible
  ASSERT_GE(m.fd, 0);
  EXPECT_NE(m.fd, mfd);
  EXPECT_NE(fcntl(m.fd, F_GETFD) & FD_CLOEXEC, 0);
  char buf[sizeof(text)] = {};
  ASSERT_EQ(pread(m.fd, buf, sizeof(buf), 0), static_cast<ssize_t>(sizeof(text)));
  EXPECT_STREQ(buf, text);
  // Same open file: a write through the received descriptor is seen through the original.
  ASSERT_EQ(pwrite(m.fd, "T", 1, 0), 1);
  char first = 0;
  ASSERT_EQ(pread(mfd, &first, 1, 0), 1);
  EXPECT_EQ(first, 'T');
  close(m.fd);
  close(mfd);
}

// Payloads above kInlinePayloadMax travel in a memfd and round trip byte for byte; the exact
// inline maximum still travels inline. No descriptor leaks on either side.
TEST_F(ChannelTest, LargePayloadRoundTrip) {
  const int open_before = CountOpenFds();
  for (size_t size : {kInlinePayloadMax, kInlinePayloadMax + 1, size_t{1} << 20}) {
    std::string payload(size, '\0');
    for (size_t i = 0; i < size; ++i) payload[i] = static_cast<char>((i * 131 + size) & 0xff);
    MessageHeader h;
    h.type = static_cast<uint32_t>(MessageType::kError);
    h.task = size;
    ASSERT_TRUE(SendMessage(fds_[0], h, payload.data(), payload.size()).ok()) << size;
    Message m;
    ASSERT_TRUE(ReceiveMessage(fds_[1], &m).ok()) << size;
    EXPECT_EQ(m.header.task, size);
    EXPECT_EQ(m.header.large_payload_bytes, 0u);
    EXPECT_EQ(m.header.flags, 0u);
    EXPECT_EQ(m.fd, -1);
    ASSERT_EQ(m.payload.size(), size);
    EXPECT_TRUE(m.payload == payload) << "payload of " << size << " bytes differs";
  }
  EXPECT_EQ(CountOpenFds(), open_before);
}

// A descriptor and a large payload in the same message both arrive.
TEST_F(ChannelTest, DescriptorAndLargePayloadTogether) {
  int mfd = memfd_create("chan-test", MFD_CLOEXEC);
  ASSERT_GE(mfd, 0);
  ASSERT_EQ(write(mfd, "X", 1), 1);
  std::string payload(200 * 1024, 'q');
  payload.back() = 'e';
  MessageHeader h;
  h.type = static_cast<uint32_t>(MessageType::kTask);
  ASSERT_TRUE(SendMessage(fds_[0], h, payload.data(), payload.size(), mfd).ok());
  Message m;
  ASSERT_TRUE(ReceiveMessage(fds_[1], &m).ok());
  EXPECT_TRUE(m.payload == payload);
  ASSERT_GE(m.fd, 0);
  char c = 0;
  ASSERT_EQ(pread(m.fd, &c, 1, 0), 1);
  EXPECT_EQ(c, 'X');
  close(m.fd);
  close(mfd);
}

// Messages queued before the peer closed are still delivered; then every receive is kClosed.
TEST_F(ChannelTest, EofAfterPeerCloseIsClosed) {
  MessageHeader h;
  h.type = static_cast<uint32_t>(MessageType::kEnd);
  ASSERT_TRUE(SendMessage(fds_[1], h, "x", 1).ok());
  close(fds_[1]);
  fds_[1] = -1;
  Message m;
  ASSERT_TRUE(ReceiveMessage(fds_[0], &m).ok());
  EXPECT_EQ(m.type(), MessageType::kEnd);
  EXPECT_EQ(ReceiveMessage(fds_[0], &m).code(), Code::kClosed);
  EXPECT_EQ(ReceiveMessage(fds_[0], &m, /*nonblocking=*/true).code(), Code::kClosed);
}

// Sending to a closed peer is kClosed (EPIPE) and raises no SIGPIPE.
TEST_F(ChannelTest, SendToClosedPeerIsClosed) {
  close(fds_[1]);
  fds_[1] = -1;
  MessageHeader h;
  h.type = static_cast<uint32_t>(MessageType::kStop);
  Status st = SendMessage(fds_[0], h, nullptr, 0);
  EXPECT_EQ(st.code(), Code::kClosed) << st.ToString();
  EXPECT_EQ(st.errno_value(), EPIPE);
}

// A nonblocking receive on an empty channel returns kTimeout at once.
TEST_F(ChannelTest, NonblockingReceiveWithNothingIsTimeout) {
  Message m;
  EXPECT_EQ(ReceiveMessage(fds_[0], &m, /*nonblocking=*/true).code(), Code::kTimeout);
  EXPECT_EQ(ReceiveMessage(fds_[1], &m, /*nonblocking=*/true).code(), Code::kTimeout);
}

// A packet shorter than a MessageHeader is corrupt, and the descriptor sent with it is closed.
TEST_F(ChannelTest, ShortPacketIsCorruptAndItsDescriptorClosed) {
  int mfd = memfd_create("chan-test", MFD_CLOEXEC);
  ASSERT_GE(mfd, 0);
  char data[8] = {};
  struct iovec iov = {data, sizeof(data)};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  struct cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &mfd, sizeof(int));
  ASSERT_EQ(sendmsg(fds_[0], &msg, 0), static_cast<ssize_t>(sizeof(data)));
  close(mfd);
  const int open_before = CountOpenFds();
  Message m;
  EXPECT_EQ(ReceiveMessage(fds_[1], &m).code(), Code::kCorrupt);
  EXPECT_EQ(CountOpenFds(), open_before);
}

// Closes recorded while `fn` runs, in order.
template <typename F>
std::vector<int> RecordCloses(F fn) {
  g_closed_count.store(0);
  g_record_closes.store(true);
  fn();
  g_record_closes.store(false);
  const int n = std::min(g_closed_count.load(), 64);
  return std::vector<int>(g_closed, g_closed + n);
}

// A header that claims a memfd payload but carries only the caller's descriptor is rejected as
// corrupt, and each received descriptor is closed exactly once (a second close() of the same
// number could close a descriptor another thread has just opened).
TEST_F(ChannelTest, MissingLargePayloadClosesEachDescriptorOnce) {
  int mfd = memfd_create("chan-test", MFD_CLOEXEC);
  ASSERT_GE(mfd, 0);
  // SendMessage masks the transport's own flag bits, so a confused peer is simulated with a raw
  // packet: "payload in memfd" and "has fd" set, but only one descriptor attached.
  MessageHeader h;
  h.type = static_cast<uint32_t>(MessageType::kTask);
  h.flags = (1u << 31) | (1u << 30);
  struct iovec iov {
    &h, sizeof(h)
  };
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  std::memset(control, 0, sizeof(control));
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  struct cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &mfd, sizeof(int));
  ASSERT_EQ(sendmsg(fds_[0], &msg, 0), static_cast<ssize_t>(sizeof(h)));
  close(mfd);
  Message m;
  Status st;
  std::vector<int> closed = RecordCloses([&] { st = ReceiveMessage(fds_[1], &m); });
  EXPECT_EQ(st.code(), Code::kCorrupt) << st.ToString();
  ASSERT_FALSE(closed.empty());
  for (size_t i = 0; i < closed.size(); ++i) {
    for (size_t j = i + 1; j < closed.size(); ++j) {
      EXPECT_NE(closed[i], closed[j]) << "descriptor " << closed[i] << " closed twice";
    }
  }
}

}  // namespace
}  // namespace stoker
