// Channel: the control plane between the main process and one worker.
//
// One AF_UNIX SOCK_SEQPACKET socketpair per worker: message boundaries are kept, and a peer that
// dies shows up as end-of-file. Messages are small (task ids, index lists, slot ids); a file
// descriptor can travel with a message (SCM_RIGHTS, received close-on-exec). A payload larger
// than kInlinePayloadMax travels in a sealed memfd attached to the message, so no message ever
// exceeds the socket buffer.
//
// Threads: the functions keep no state; calls on different sockets are safe for concurrent use.
// Several threads sending (or receiving) on one socket REQUIRE: external synchronization (the
// engine has one sender and one receiver per socket end; the Supervisor holds its mutex).
#pragma once

#include <cstdint>
#include <string>

#include "stoker/status.h"

namespace stoker {

enum class MessageType : uint32_t {
  // main -> worker
  kTask = 1,    // task: load these indices (payload: int64[] or pickled, a = its format, Python's
                //   wire/protocol.py) or the next batch (iterable); b = 1: serial, its samples
                //   load one at a time whatever threads_per_worker says
  kResume = 2,  // a new epoch begins (persistent workers); reply kResumed
  kStop = 3,    // exit cleanly
  kLimit = 4,   // a = the most this worker's slots may take together, in bytes (0: no cap)
  // worker -> main
  kSlotNew = 10,     // a = slot id; the memfd is attached
  kSlotRetire = 11,  // a = slot id: the worker dropped this FREE slot
  kBatch = 12,       // task; a = slot id, b = generation, c = payload bytes
  kError = 13,       // task; payload: pickled error report
  kEnd = 14,         // task: an iterable dataset is exhausted in this worker
  kResumed = 15,
  kHello = 16,       // the worker finished starting up; a = pid
  kStatusPage = 17,  // the worker's WorkerStatusPage memfd is attached
  kLogFile = 18,     // a = LogKind; a memfd the worker writes a log into is attached
  kSkipped = 19,     // task; payload: pickled skip records; a = 1 when the whole task was dropped
  kIterState = 20,   // task; payload: a stateful iterable dataset's pickled state after the task
};

enum class LogKind : uint64_t {
  kCrash = 0,   // faulthandler's output: the Python stack at a fatal signal or on request
  kStderr = 1,  // a copy of what the worker wrote to sys.stderr
};

struct MessageHeader {
  uint32_t type = 0;
  uint32_t flags = 0;
  uint64_t task = 0;
  uint64_t a = 0, b = 0, c = 0;
  uint64_t large_payload_bytes = 0;  // set by SendMessage when the payload travels in a memfd
};

struct Message {
  MessageHeader header;
  std::string payload;
  int fd = -1;  // owned by the receiver when >= 0
  MessageType type() const { return static_cast<MessageType>(header.type); }
};

constexpr size_t kInlinePayloadMax = 32 * 1024;

// Creates a connected SOCK_SEQPACKET pair, both ends close-on-exec.
Status MakeChannelPair(int fds[2]);

// Sends one message; `fd` (if >= 0) is duplicated into the peer, not consumed. Retries EINTR.
Status SendMessage(int sock, const MessageHeader& header, const void* payload, size_t size,
                   int fd = -1);

// Receives one message. Blocks unless `nonblocking`; then kTimeout means "nothing there".
// kClosed when the peer has closed its end.
Status ReceiveMessage(int sock, Message* out, bool nonblocking = false);

}  // namespace stoker
