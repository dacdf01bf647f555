#include "stoker/channel.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace stoker {
namespace {

constexpr uint32_t kFlagPayloadInMemfd = 1u << 31;
constexpr uint32_t kFlagHasFd = 1u << 30;

Status WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("writing a message payload", errno);
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

}  // namespace

Status MakeChannelPair(int fds[2]) {
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    return Status::FromErrno("socketpair", errno);
  }
  return Status::OK();
}

Status SendMessage(int sock, const MessageHeader& header_in, const void* payload, size_t size,
                   int fd) {
  MessageHeader header = header_in;
  header.flags &= ~(kFlagPayloadInMemfd | kFlagHasFd);  // the transport's own bits
  header.large_payload_bytes = 0;
  int big_fd = -1;
  if (size > kInlinePayloadMax) {
    // Too large for one packet: put the payload in a sealed memfd and send its descriptor.
    big_fd = memfd_create("stoker-message", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (big_fd < 0) return Status::FromErrno("memfd_create for a large message", errno);
    Status st = WriteAll(big_fd, payload, size);
    if (!st.ok()) {
      close(big_fd);
      return st;
    }
    // Sealed, so the receiver can trust its size and contents once it has checked the seals.
    if (fcntl(big_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
      const int err = errno;
      close(big_fd);
      return Status::FromErrno("sealing the memfd of a large message", err);
    }
    header.flags |= kFlagPayloadInMemfd;
    header.large_payload_bytes = size;
    payload = nullptr;
    size = 0;
  }
  int fds[2];
  int nfds = 0;
  if (fd >= 0) {
    fds[nfds++] = fd;
    header.flags |= kFlagHasFd;
  }
  if (big_fd >= 0) fds[nfds++] = big_fd;

  struct iovec iov[2];
  iov[0].iov_base = &header;
  iov[0].iov_len = sizeof(header);
  iov[1].iov_base = const_cast<void*>(payload);
  iov[1].iov_len = size;
  struct msghdr msg;
  std::memset(&msg, 0, sizeof(msg));
  msg.msg_iov = iov;
  msg.msg_iovlen = size > 0 ? 2 : 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 2)];
  if (nfds > 0) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    struct cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
  }
  ssize_t rc;
  do {
    rc = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (rc < 0 && errno == EINTR);
  const int err = errno;
  if (big_fd >= 0) close(big_fd);
  if (rc < 0) return Status::FromErrno("sending a message to the peer process", err);
  return Status::OK();
}

Status ReceiveMessage(int sock, Message* out, bool nonblocking) {
  out->payload.clear();
  out->fd = -1;
  static thread_local std::vector<char> buffer(sizeof(MessageHeader) + kInlinePayloadMax);
  struct iovec iov;
  iov.iov_base = buffer.data();
  iov.iov_len = buffer.size();
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 2)];
  struct msghdr msg;
  std::memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | (nonblocking ? MSG_DONTWAIT : 0));
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return Status::Error(Code::kTimeout, "no message waiting");
    }
    if (errno == ECONNRESET) return Status::Error(Code::kClosed, "the peer closed the channel");
    return Status::FromErrno("receiving a message", errno);
  }
  // Collect descriptors first so that none leaks whatever happens next.
  int fds[2] = {-1, -1};
  int nfds = 0;
  for (struct cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      int* data = reinterpret_cast<int*>(CMSG_DATA(cm));
      for (size_t i = 0; i < count; ++i) {
        if (nfds < 2) {
          fds[nfds++] = data[i];
        } else {
          close(data[i]);
        }
      }
    }
  }
  auto close_fds = [&]() {
    for (int i = 0; i < nfds; ++i) close(fds[i]);
  };
  if (n == 0) {
    close_fds();
    return Status::Error(Code::kClosed, "the peer closed the channel");
  }
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 ||
      static_cast<size_t>(n) < sizeof(MessageHeader)) {
    close_fds();
    return Status::Error(Code::kCorrupt, "received a malformed control message");
  }
  std::memcpy(&out->header, buffer.data(), sizeof(MessageHeader));
  const uint32_t flags = out->header.flags;
  // Hand out the descriptors the header announces; every other one is closed exactly once.
  int next = 0;
  int fd = -1, big = -1;
  if (flags & kFlagHasFd) {
    if (next >= nfds) {
      close_fds();
      return Status::Error(Code::kCorrupt, "a message announced a descriptor that did not arrive");
    }
    fd = fds[next++];
  }
  if (flags & kFlagPayloadInMemfd) {
    if (next >= nfds) {
      close_fds();
      return Status::Error(Code::kCorrupt, "a large message arrived without its payload");
    }
    big = fds[next++];
  }
  for (int i = next; i < nfds; ++i) close(fds[i]);  // extra descriptors nobody announced
  if (big >= 0) {
    struct stat st;
    const size_t size = out->header.large_payload_bytes;
    if (size > (size_t{1} << 31) || fstat(big, &st) != 0 ||
        static_cast<size_t>(st.st_size) != size) {
      close(big);
      if (fd >= 0) close(fd);
      return Status::Error(Code::kCorrupt, "a large message payload has the wrong size");
    }
    out->payload.resize(size);
    size_t done = 0;
    while (done < size) {
      ssize_t r = pread(big, out->payload.data() + done, size - done, static_cast<off_t>(done));
      if (r <= 0) {
        if (r < 0 && errno == EINTR) continue;
        close(big);
        if (fd >= 0) close(fd);
        out->payload.clear();
        return Status::Error(Code::kCorrupt, "could not read a large message payload");
      }
      done += static_cast<size_t>(r);
    }
    close(big);
    out->header.large_payload_bytes = 0;
  } else {
    out->payload.assign(buffer.data() + sizeof(MessageHeader),
                        static_cast<size_t>(n) - sizeof(MessageHeader));
  }
  out->fd = fd;
  out->header.flags &= ~(kFlagPayloadInMemfd | kFlagHasFd);
  return Status::OK();
}

}  // namespace stoker
