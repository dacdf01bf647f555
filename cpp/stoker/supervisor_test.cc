// Multi-process tests of Supervisor, SlotPool and WorkerGuard: forked workers publish batches
// into shared-memory slots, send messages and die in various ways; the parent watches them with
// a Supervisor.
#include "stoker/supervisor.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "stoker/channel.h"
#include "stoker/slot.h"
#include "stoker/slot_pool.h"
#include "stoker/wire_decoder.h"
#include "stoker/wire_encoder.h"
#include "stoker/worker_guard.h"
#include "stoker/worker_status.h"

namespace stoker {
namespace {

using Clock = std::chrono::steady_clock;
using Kind = SupervisorEvent::Kind;

int64_t MillisSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

MessageHeader Header(MessageType type, uint64_t task = 0, uint64_t a = 0) {
  MessageHeader h;
  h.type = static_cast<uint32_t>(type);
  h.task = task;
  h.a = a;
  return h;
}

// A batch as a worker would collate it: (float32[rows, 3] stacked from one source per sample,
// int task). Element j of sample s is task * 1000 + s * 3 + j.
struct SampleBatch {
  SampleBatch(int64_t rows, uint64_t task) : values(static_cast<size_t>(rows) * 3) {
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(task * 1000 + i);
    for (int64_t s = 0; s < rows; ++s) {
      sources.push_back(
          {reinterpret_cast<const uint8_t*>(values.data() + s * 3), row_shape, nullptr, 1});
    }
    shape[0] = rows;
    enc.AddContainer(NodeKind::kTuple, 2);
    add_status = enc.AddArray(DType::kFloat32, 0, shape, 2, sources.data(), sources.size());
    enc.AddInt(static_cast<int64_t>(task));
  }
  std::vector<float> values;
  int64_t row_shape[1] = {3};
  int64_t shape[2] = {0, 3};
  std::vector<ArraySource> sources;
  WireEncoder enc;
  Status add_status;
};

// Parent side: checks that a slot holds SampleBatch(rows, task), decoded with full validation.
::testing::AssertionResult HoldsSampleBatch(const Segment& slot, int64_t rows, uint64_t task) {
  DecodedBatch b;
  Status st = DecodeBatch(slot.data() + kSlotHeaderSize, slot.size() - kSlotHeaderSize, &b);
  if (!st.ok()) return ::testing::AssertionFailure() << st.ToString();
  if (b.nodes.size() != 3 || b.nodes[0].kind != NodeKind::kTuple ||
      b.nodes[1].kind != NodeKind::kArray || b.nodes[2].kind != NodeKind::kInt) {
    return ::testing::AssertionFailure() << "unexpected structure";
  }
  const DecodedNode& a = b.nodes[1];
  if (a.dtype != DType::kFloat32 || a.ndim != 2 || b.shape(a)[0] != rows || b.shape(a)[1] != 3) {
    return ::testing::AssertionFailure() << "unexpected array";
  }
  for (int64_t i = 0; i < rows * 3; ++i) {
    float v;
    std::memcpy(&v, a.data + i * 4, 4);
    if (v != static_cast<float>(task * 1000 + i)) {
      return ::testing::AssertionFailure() << "element " << i << " is " << v;
    }
  }
  if (b.nodes[2].int_value != static_cast<int64_t>(task)) {
    return ::testing::AssertionFailure() << "int is " << b.nodes[2].int_value;
  }
  return ::testing::AssertionSuccess();
}

// Worker side: encodes `enc` into a slot of `pool` and announces it as batch `task`.
Status PublishBatch(SlotPool& pool, WireEncoder& enc, uint64_t task) {
  const uint64_t total = enc.Layout();
  WritableSlot slot;
  STOKER_RETURN_IF_ERROR(pool.Acquire(total, &slot));
  if (slot.capacity < total) return Status::Error(Code::kTooLarge, "slot smaller than asked");
  Status st = enc.Write(slot.payload, slot.capacity);
  if (!st.ok()) {
    pool.Abandon(slot);
    return st;
  }
  return pool.Publish(slot, total, task);
}

// Worker side: blocks until the parent sends a message of `type` (exit code 20 otherwise).
void AwaitMessage(int sock, MessageType type) {
  Message m;
  if (!ReceiveMessage(sock, &m).ok() || m.type() != type) _exit(20);
}

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(Supervisor::Create(&sup_).ok()); }

  void TearDown() override {
    sup_.reset();  // closes the parent ends: workers blocked on their channel see EOF
    for (pid_t pid : children_) {
      kill(pid, SIGKILL);
      int status;
      waitpid(pid, &status, 0);
    }
  }

  // Forks a worker running `body(sock)`; its return value is the exit code. The child closes
  // the supervisor's descriptors, so only the parent holds the parent ends of the channels.
  pid_t Spawn(const std::function<int(int)>& body, int* parent_sock) {
    int fds[2];
    if (!MakeChannelPair(fds).ok()) return -1;
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      for (int fd : sup_->OwnedFds()) close(fd);
      _exit(body(fds[1]));
    }
    close(fds[1]);
    if (pid > 0) children_.push_back(pid);
    *parent_sock = fds[0];
    return pid;
  }

  // Forks a worker and registers it with the supervisor as `id`.
  pid_t AddWorker(int id, const std::function<int(int)>& body) {
    int sock = -1;
    const pid_t pid = Spawn(body, &sock);
    EXPECT_GT(pid, 0);
    Status st = sup_->AddWorker(id, sock, pid);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return pid;
  }

  // The next event other than a timeout, waiting at most `budget_ms` in all.
  SupervisorEvent Next(int budget_ms = 3000) {
    const auto t0 = Clock::now();
    SupervisorEvent ev;
    for (;;) {
      const int left = budget_ms - static_cast<int>(MillisSince(t0));
      if (left <= 0) break;
      Status st = sup_->Wait(left, &ev);
      EXPECT_TRUE(st.ok()) << st.ToString();
      if (!st.ok() || ev.kind != Kind::kTimeout) break;
    }
    return ev;
  }

  // Reaps `pid` (which PeekExit must have left unreaped) and returns its wait status.
  int Reap(pid_t pid) {
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, 0), pid);
    children_.erase(std::remove(children_.begin(), children_.end(), pid), children_.end());
    return status;
  }

  // Blocks until `pid` has exited, without reaping it.
  static void AwaitZombie(pid_t pid) {
    siginfo_t info;
    std::memset(&info, 0, sizeof(info));
    ASSERT_EQ(waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT), 0);
  }

  std::unique_ptr<Supervisor> sup_;
  std::vector<pid_t> children_;
};

// The whole path: a worker encodes a batch into a SlotPool slot; the supervisor maps the slot
// from the kSlotNew memfd and delivers kBatch with that slot; the batch decodes and validates.
TEST_F(SupervisorTest, WorkerPublishesBatchThroughSlot) {
  const pid_t pid = AddWorker(0, [](int sock) {
    SlotPool pool(sock, 0);
    SampleBatch batch(4, 7);
    if (!batch.add_status.ok()) return 10;
    if (!PublishBatch(pool, batch.enc, 7).ok()) return 11;
    if (pool.slot_count() != 1) return 12;
    AwaitMessage(sock, MessageType::kStop);
    return 0;
  });
  SupervisorEvent ev = Next();
  ASSERT_EQ(ev.kind, Kind::kMessage);
  EXPECT_EQ(ev.worker, 0);
  ASSERT_EQ(ev.message.type(), MessageType::kBatch);
  EXPECT_EQ(ev.message.header.task, 7u);
  EXPECT_EQ(ev.message.header.a, 1u);  // the first slot id
  EXPECT_EQ(ev.message.header.b, 1u);  // its first generation
  EXPECT_EQ(ev.message.fd, -1);
  ASSERT_NE(ev.slot, nullptr);
  EXPECT_EQ(sup_->mapped_slot_count(), 1u);

  SlotHeader* h = reinterpret_cast<SlotHeader*>(ev.slot->data());
  EXPECT_EQ(h->magic, kSlotMagic);
  EXPECT_EQ(h->slot_id, 1u);
  EXPECT_EQ(h->payload_bytes, ev.message.header.c);
  SlotWord w(h);
  EXPECT_EQ(w.state(), static_cast<uint32_t>(SlotState::kReady));
  EXPECT_FALSE(w.Lend(static_cast<uint32_t>(ev.message.header.b) + 1));
  ASSERT_TRUE(w.Lend(static_cast<uint32_t>(ev.message.header.b)));
  EXPECT_TRUE(HoldsSampleBatch(*ev.slot, 4, 7));
  EXPECT_TRUE(w.Release(static_cast<uint32_t>(ev.message.header.b)));

  ASSERT_TRUE(sup_->Send(0, Header(MessageType::kStop), nullptr, 0).ok());
  ev = Next();
  ASSERT_EQ(ev.kind, Kind::kDied);
  EXPECT_EQ(ev.worker, 0);
  EXPECT_EQ(ev.exit.exit_code, 0);
  EXPECT_EQ(ev.exit.signal, 0);
  const int status = Reap(pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// With KeepSlotFds the slot's memfd stays open with its mapping (the node pool passes it on):
// another mapping of that descriptor sees the same batch; the descriptor is one the supervisor
// owns (a forked child closes it), and it closes when the last holder of the slot lets go.
TEST_F(SupervisorTest, KeptSlotFdMapsTheSameBatch) {
  sup_->KeepSlotFds();
  const pid_t pid = AddWorker(0, [](int sock) {
    SlotPool pool(sock, 0);
    SampleBatch batch(4, 7);
    if (!batch.add_status.ok()) return 10;
    if (!PublishBatch(pool, batch.enc, 7).ok()) return 11;
    AwaitMessage(sock, MessageType::kStop);
    return 0;
  });
  SupervisorEvent ev = Next();
  ASSERT_EQ(ev.kind, Kind::kMessage);
  ASSERT_EQ(ev.message.type(), MessageType::kBatch);
  ASSERT_NE(ev.slot, nullptr);
  const int fd = ev.slot->fd();
  ASSERT_GE(fd, 0);
  const std::vector<int> owned = sup_->OwnedFds();
  EXPECT_NE(std::find(owned.begin(), owned.end(), fd), owned.end());
  std::unique_ptr<Segment> again;
  ASSERT_TRUE(Segment::Map(fd, &again).ok());
  EXPECT_TRUE(HoldsSampleBatch(*again, 4, 7));

  ASSERT_TRUE(sup_->Send(0, Header(MessageType::kStop), nullptr, 0).ok());
  ev = Next();
  ASSERT_EQ(ev.kind, Kind::kDied);
  Reap(pid);
  sup_->RemoveWorker(0);  // the last holder of the slot (the batch event's copy is gone)
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);
  EXPECT_TRUE(HoldsSampleBatch(*again, 4, 7));  // a mapping outlives the descriptor
}

// A released slot is reused (same id, next generation); a free slot too small for the next
// batch is replaced by a bigger one (retired, so the mapped count stays 1); when every slot is
// lent a new one is added (mapped count 2).
TEST_F(SupervisorTest, SlotPoolReusesGrowsAndAddsSlots) {
  const pid_t pid = AddWorker(3, [](int sock) {
    SlotPool pool(sock, 3);
    {
      SampleBatch small(2, 1);
      if (!PublishBatch(pool, small.enc, 1).ok()) return 10;
    }
    AwaitMessage(sock, MessageType::kTask);  // the parent released slot 1
    {
      SampleBatch again(2, 2);
      if (!PublishBatch(pool, again.enc, 2).ok()) return 11;
    }
    AwaitMessage(sock, MessageType::kTask);  // the parent released slot 1 again
    {
      SampleBatch big(100000, 3);  // 1.2 MB: more than the 256 KB slot holds
      if (!PublishBatch(pool, big.enc, 3).ok()) return 12;
    }
    if (!SendMessage(sock, Header(MessageType::kHello, 0, pool.slot_count()), nullptr, 0).ok()) {
      return 13;
    }
    AwaitMessage(sock, MessageType::kTask);  // the parent keeps the big slot lent
    {
      SampleBatch small(2, 4);
      if (!PublishBatch(pool, small.enc, 4).ok()) return 14;
    }
    if (!SendMessage(sock, Header(MessageType::kHello, 0, pool.slot_count()), nullptr, 0).ok()) {
      return 15;
    }
    AwaitMessage(sock, MessageType::kStop);
    return 0;
  });
  auto lend = [](const SupervisorEvent& ev) {
    return SlotWord(reinterpret_cast<SlotHeader*>(ev.slot->data()))
        .Lend(static_cast<uint32_t>(ev.message.header.b));
  };
  auto release = [](const SupervisorEvent& ev) {
    return SlotWord(reinterpret_cast<SlotHeader*>(ev.slot->data()))
        .Release(static_cast<uint32_t>(ev.message.header.b));
  };

  SupervisorEvent b1 = Next();
  ASSERT_EQ(b1.message.type(), MessageType::kBatch);
  ASSERT_NE(b1.slot, nullptr);
  EXPECT_EQ(b1.message.header.a, 1u);
  ASSERT_TRUE(lend(b1));
  EXPECT_TRUE(HoldsSampleBatch(*b1.slot, 2, 1));
  EXPECT_TRUE(release(b1));
  ASSERT_TRUE(sup_->Send(3, Header(MessageType::kTask), nullptr, 0).ok());

  SupervisorEvent b2 = Next();
  ASSERT_EQ(b2.message.type(), MessageType::kBatch);
  EXPECT_EQ(b2.message.header.a, 1u);  // reused
  EXPECT_EQ(b2.message.header.b, 2u);  // next generation
  EXPECT_EQ(b2.slot, b1.slot);
  EXPECT_EQ(sup_->mapped_slot_count(), 1u);
  ASSERT_TRUE(lend(b2));
  EXPECT_TRUE(HoldsSampleBatch(*b2.slot, 2, 2));
  EXPECT_TRUE(release(b2));
  ASSERT_TRUE(sup_->Send(3, Header(MessageType::kTask), nullptr, 0).ok());

  SupervisorEvent b3 = Next();
  ASSERT_EQ(b3.message.type(), MessageType::kBatch);
  ASSERT_NE(b3.slot, nullptr);
  EXPECT_EQ(b3.message.header.a, 2u);  // a new, bigger slot replaced slot 1
  EXPECT_EQ(b3.message.header.b, 1u);
  EXPECT_GE(b3.slot->size(), kSlotHeaderSize + 100000 * 12);
  EXPECT_EQ(sup_->mapped_slot_count(), 1u);
  ASSERT_TRUE(lend(b3));
  EXPECT_TRUE(HoldsSampleBatch(*b3.slot, 100000, 3));
  SupervisorEvent hello = Next();
  ASSERT_EQ(hello.message.type(), MessageType::kHello);
  EXPECT_EQ(hello.message.header.a, 1u);  // the worker's own count agrees
  ASSERT_TRUE(sup_->Send(3, Header(MessageType::kTask), nullptr, 0).ok());

  SupervisorEvent b4 = Next();
  ASSERT_EQ(b4.message.type(), MessageType::kBatch);
  EXPECT_EQ(b4.message.header.a, 3u);  // slot 2 is lent: a third slot is added
  EXPECT_EQ(sup_->mapped_slot_count(), 2u);
  ASSERT_TRUE(lend(b4));
  EXPECT_TRUE(HoldsSampleBatch(*b4.slot, 2, 4));
  // The big batch is still intact while lent.
  EXPECT_TRUE(HoldsSampleBatch(*b3.slot, 100000, 3));
  hello = Next();
  ASSERT_EQ(hello.message.type(), MessageType::kHello);
  EXPECT_EQ(hello.message.header.a, 2u);

  ASSERT_TRUE(sup_->Send(3, Header(MessageType::kStop), nullptr, 0).ok());
  SupervisorEvent died = Next();
  ASSERT_EQ(died.kind, Kind::kDied);
  EXPECT_EQ(died.exit.exit_code, 0);
  Reap(pid);
}

// A worker that raises SIGSEGV is reported as kDied with signal SIGSEGV within 1 s, and
// PeekExit leaves the zombie for the caller to reap.
TEST_F(SupervisorTest, SegfaultIsReportedWithItsSignal) {
  const auto t0 = Clock::now();
  const pid_t pid = AddWorker(1, [](int) {
    prctl(PR_SET_DUMPABLE, 0);  // no core file
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    signal(SIGSEGV, SIG_DFL);  // a sanitizer's handler would otherwise turn it into an exit
    raise(SIGSEGV);
    return 0;
  });
  SupervisorEvent ev = Next(1000);
  ASSERT_EQ(ev.kind, Kind::kDied) << "no death reported within 1 s";
  EXPECT_LT(MillisSince(t0), 1000);
  EXPECT_EQ(ev.worker, 1);
  EXPECT_EQ(ev.exit.signal, SIGSEGV);
  EXPECT_EQ(ev.exit.exit_code, 0);
  EXPECT_FALSE(ev.exit.core_dumped);
  const int status = Reap(pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << status;
}

// A worker that kills itself with SIGKILL is reported with SIGKILL.
TEST_F(SupervisorTest, SelfKillIsReportedWithSigkill) {
  const pid_t pid = AddWorker(2, [](int) {
    kill(getpid(), SIGKILL);
    return 0;
  });
  SupervisorEvent ev = Next(1000);
  ASSERT_EQ(ev.kind, Kind::kDied);
  EXPECT_EQ(ev.worker, 2);
  EXPECT_EQ(ev.exit.signal, SIGKILL);
  Reap(pid);
}

// A worker blocked on its channel and killed from outside is reported within 1 s of the kill.
TEST_F(SupervisorTest, ExternalKillOfBlockedWorkerIsSeenQuickly) {
  const pid_t pid = AddWorker(4, [](int sock) {
    AwaitMessage(sock, MessageType::kStop);
    return 0;
  });
  SupervisorEvent ev;
  ASSERT_TRUE(sup_->Wait(100, &ev).ok());
  EXPECT_EQ(ev.kind, Kind::kTimeout);  // alive and silent
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ev = Next(1000);
  ASSERT_EQ(ev.kind, Kind::kDied);
  EXPECT_LT(MillisSince(t0), 1000);
  EXPECT_EQ(ev.exit.signal, SIGKILL);
  Reap(pid);
}

// A worker that exits with code 3 reports exit_code 3 and no signal.
TEST_F(SupervisorTest, ExitCodeIsReported) {
  const pid_t pid = AddWorker(5, [](int) { return 3; });
  SupervisorEvent ev = Next(1000);
  ASSERT_EQ(ev.kind, Kind::kDied);
  EXPECT_EQ(ev.worker, 5);
  EXPECT_EQ(ev.exit.exit_code, 3);
  EXPECT_EQ(ev.exit.signal, 0);
  const int status = Reap(pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;
}

// Every message a worker sent before it died is delivered, in order, before its kDied; the
// worker has fully exited before the parent looks, so death and messages are pending together.
TEST_F(SupervisorTest, MessagesSentBeforeDeathArriveFirst) {
  const pid_t pid = AddWorker(6, [](int sock) {
    for (uint64_t i = 0; i < 5; ++i) {
      const std::string text = "message " + std::to_string(i);
      if (!SendMessage(sock, Header(MessageType::kError, i), text.data(), text.size()).ok()) {
        return 10;
      }
    }
    return 9;
  });
  AwaitZombie(pid);
  for (uint64_t i = 0; i < 5; ++i) {
    SupervisorEvent ev = Next(1000);
    ASSERT_EQ(ev.kind, Kind::kMessage) << "message " << i << " lost or late";
    EXPECT_EQ(ev.message.type(), MessageType::kError);
    EXPECT_EQ(ev.message.header.task, i);
    EXPECT_EQ(ev.message.payload, "message " + std::to_string(i));
  }
  SupervisorEvent ev = Next(1000);
  ASSERT_EQ(ev.kind, Kind::kDied);
  EXPECT_EQ(ev.exit.exit_code, 9);
  Reap(pid);
}

// The same with a batch: a dead worker's kSlotNew is absorbed, its kBatch still arrives with a
// readable slot, then its last message, then its death.
TEST_F(SupervisorTest, BatchSentBeforeDeathArrivesFirst) {
  const pid_t pid = AddWorker(7, [](int sock) {
    SlotPool pool(sock, 7);
    SampleBatch batch(3, 5);
    if (!PublishBatch(pool, batch.enc, 5).ok()) return 10;
    if (!SendMessage(sock, Header(MessageType::kEnd, 5), nullptr, 0).ok()) return 11;
    return 0;
  });
  AwaitZombie(pid);
  SupervisorEvent ev = Next(1000);
  ASSERT_EQ(ev.kind, Kind::kMessage);
  ASSERT_EQ(ev.message.type(), MessageType::kBatch);
  ASSERT_NE(ev.slot, nullptr);
  EXPECT_TRUE(HoldsSampleBatch(*ev.slot, 3, 5));
  ev = Next(1000);
  ASSERT_EQ(ev.kind, Kind::kMessage);
  EXPECT_EQ(ev.message.type(), MessageType::kEnd);
  ev = Next(1000);
  ASSERT_EQ(ev.kind, Kind::kDied);
  EXPECT_EQ(ev.worker, 7);
  Reap(pid);
}

// After a death has been reported, Wait(100) with nothing left to report must return kTimeout
// after about 100 ms. The Wait runs in a forked helper so that a Wait that never returns fails
// this test instead of hanging the binary.
TEST_F(SupervisorTest, WaitHonorsTimeoutAfterDeathWasReported) {
  const pid_t pid = AddWorker(8, [](int sock) {
    SlotPool pool(sock, 8);
    SampleBatch batch(1, 1);
    return PublishBatch(pool, batch.enc, 1).ok() ? 0 : 10;
  });
  AwaitZombie(pid);
  SupervisorEvent ev = Next(1000);
  ASSERT_EQ(ev.kind, Kind::kMessage);
  ASSERT_EQ(ev.message.type(), MessageType::kBatch);
  ev = Next(1000);
  ASSERT_EQ(ev.kind, Kind::kDied);

  // In another thread, so that a Wait that never returns fails the test instead of hanging it.
  std::promise<bool> returned;
  std::future<bool> result = returned.get_future();
  std::thread waiter([&] {
    SupervisorEvent e;
    Status st = sup_->Wait(100, &e);
    returned.set_value(st.ok() && e.kind == Kind::kTimeout);
  });
  if (result.wait_for(std::chrono::seconds(3)) != std::future_status::ready) {
    ADD_FAILURE() << "Supervisor::Wait(100) still had not returned after 3 s";
    std::_Exit(1);  // the waiter cannot be joined
  }
  waiter.join();
  EXPECT_TRUE(result.get()) << "Wait(100) did not return a timeout";
  Reap(pid);
}

// Send reaches the worker; its reply comes back as a kMessage with the same payload.
TEST_F(SupervisorTest, SendAndReply) {
  const pid_t pid = AddWorker(9, [](int sock) {
    Message m;
    if (!ReceiveMessage(sock, &m).ok() || m.type() != MessageType::kTask) return 10;
    MessageHeader h = Header(MessageType::kHello, m.header.task, static_cast<uint64_t>(getpid()));
    if (!SendMessage(sock, h, m.payload.data(), m.payload.size()).ok()) return 11;
    AwaitMessage(sock, MessageType::kStop);
    return 0;
  });
  const std::string indices = "0,1,2,3";
  ASSERT_TRUE(sup_->Send(9, Header(MessageType::kTask, 42), indices.data(), indices.size()).ok());
  SupervisorEvent ev = Next();
  ASSERT_EQ(ev.kind, Kind::kMessage);
  EXPECT_EQ(ev.message.type(), MessageType::kHello);
  EXPECT_EQ(ev.message.header.task, 42u);
  EXPECT_EQ(ev.message.header.a, static_cast<uint64_t>(pid));
  EXPECT_EQ(ev.message.payload, indices);
  EXPECT_EQ(ev.slot, nullptr);
  EXPECT_EQ(sup_->Send(99, Header(MessageType::kStop), nullptr, 0).code(), Code::kInvalidArgument);
  ASSERT_TRUE(sup_->Send(9, Header(MessageType::kStop), nullptr, 0).ok());
  EXPECT_EQ(Next().kind, Kind::kDied);
  Reap(pid);
}

// Registration bookkeeping: duplicate ids are refused (and their socket closed), OwnedFds lists
// the epoll fd plus a socket and a pidfd per worker, Wait(0) polls, RemoveWorker forgets.
TEST_F(SupervisorTest, Bookkeeping) {
  EXPECT_EQ(sup_->OwnedFds().size(), 1u);
  const pid_t pid = AddWorker(10, [](int sock) {
    AwaitMessage(sock, MessageType::kStop);
    return 0;
  });
  EXPECT_TRUE(sup_->HasWorker(10));
  EXPECT_EQ(sup_->worker_count(), 1);
  EXPECT_EQ(sup_->OwnedFds().size(), 3u);
  for (int fd : sup_->OwnedFds()) EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0) << fd;

  int dup_fds[2];
  ASSERT_TRUE(MakeChannelPair(dup_fds).ok());
  EXPECT_EQ(sup_->AddWorker(10, dup_fds[0], pid).code(), Code::kInvalidArgument);
  EXPECT_EQ(fcntl(dup_fds[0], F_GETFD), -1);  // ownership was taken: closed
  close(dup_fds[1]);

  SupervisorEvent ev;
  const auto t0 = Clock::now();
  ASSERT_TRUE(sup_->Wait(0, &ev).ok());
  EXPECT_EQ(ev.kind, Kind::kTimeout);
  EXPECT_LT(MillisSince(t0), 50);

  sup_->RemoveWorker(10);
  EXPECT_FALSE(sup_->HasWorker(10));
  EXPECT_EQ(sup_->worker_count(), 0);
  EXPECT_EQ(sup_->OwnedFds().size(), 1u);
  sup_->RemoveWorker(10);  // twice is harmless
  // The worker saw its channel close and exited on its own.
  const int status = Reap(pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 20) << status;
}

// AddWorker for a pid that does not exist fails and closes the socket it was given.
TEST_F(SupervisorTest, AddWorkerWithoutProcessFails) {
  int fds[2];
  ASSERT_TRUE(MakeChannelPair(fds).ok());
  Status st = sup_->AddWorker(0, fds[0], 0x3ffffff0);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.errno_value(), ESRCH) << st.ToString();
  EXPECT_EQ(fcntl(fds[0], F_GETFD), -1);
  EXPECT_FALSE(sup_->HasWorker(0));
  close(fds[1]);
}

// A slot handed out in an event stays mapped and readable after its worker is removed.
TEST_F(SupervisorTest, SlotOutlivesRemovedWorker) {
  const pid_t pid = AddWorker(11, [](int sock) {
    SlotPool pool(sock, 11);
    SampleBatch batch(8, 11);
    if (!PublishBatch(pool, batch.enc, 11).ok()) return 10;
    AwaitMessage(sock, MessageType::kStop);
    return 0;
  });
  SupervisorEvent ev = Next();
  ASSERT_EQ(ev.message.type(), MessageType::kBatch);
  std::shared_ptr<Segment> slot = ev.slot;
  ASSERT_NE(slot, nullptr);
  sup_->RemoveWorker(11);
  EXPECT_EQ(sup_->mapped_slot_count(), 0u);
  Reap(pid);  // the worker is gone too
  EXPECT_TRUE(HoldsSampleBatch(*slot, 8, 11));
}

// A batch naming a slot that was never announced is corrupt, not a crash.
TEST_F(SupervisorTest, BatchInUnknownSlotIsCorrupt) {
  const pid_t pid = AddWorker(12, [](int sock) {
    MessageHeader h = Header(MessageType::kBatch, 1, 99);
    if (!SendMessage(sock, h, nullptr, 0).ok()) return 10;
    AwaitMessage(sock, MessageType::kStop);
    return 0;
  });
  SupervisorEvent ev;
  Status st;
  const auto t0 = Clock::now();
  do {
    st = sup_->Wait(1000, &ev);
  } while (st.ok() && ev.kind == Kind::kTimeout && MillisSince(t0) < 3000);
  EXPECT_EQ(st.code(), Code::kCorrupt) << st.ToString();
  kill(pid, SIGKILL);
  Reap(pid);
}

// A slot announced with a memfd the worker could still shrink is refused (kCorrupt): mapping it
// would let the worker turn the main process's reads into SIGBUS.
TEST_F(SupervisorTest, UnsealedSlotAnnouncementIsRefused) {
  const pid_t pid = AddWorker(13, [](int sock) {
    int fd = memfd_create("unsealed-slot", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, 1 << 20) != 0) return 10;
    if (!SendMessage(sock, Header(MessageType::kSlotNew, 0, 1), nullptr, 0, fd).ok()) return 11;
    AwaitMessage(sock, MessageType::kStop);
    return 0;
  });
  SupervisorEvent ev;
  Status st;
  const auto t0 = Clock::now();
  do {
    st = sup_->Wait(1000, &ev);
  } while (st.ok() && ev.kind == Kind::kTimeout && MillisSince(t0) < 3000);
  EXPECT_EQ(st.code(), Code::kCorrupt) << st.ToString();
  EXPECT_EQ(sup_->mapped_slot_count(), 0u);
  kill(pid, SIGKILL);
  Reap(pid);
}

// Signal() reaches the worker through its pidfd; an unknown worker is refused.
TEST_F(SupervisorTest, SignalReachesWorkerThroughPidfd) {
  const pid_t pid = AddWorker(14, [](int sock) {
    AwaitMessage(sock, MessageType::kStop);
    return 0;
  });
  EXPECT_EQ(sup_->Signal(99, SIGTERM).code(), Code::kInvalidArgument);
  ASSERT_TRUE(sup_->Signal(14, SIGTERM).ok());
  SupervisorEvent ev = Next(1000);
  ASSERT_EQ(ev.kind, Kind::kDied);
  EXPECT_EQ(ev.exit.signal, SIGTERM);
  Reap(pid);
}

// A worker's status page and log memfds are absorbed (not returned as events) and read live:
// later writes by the worker show up in ReadStatus/ReadLog; ReadLog returns the tail.
TEST_F(SupervisorTest, StatusPageAndLogsAreReadLive) {
  const pid_t pid = AddWorker(15, [](int sock) {
    std::unique_ptr<Segment> page_seg;
    int page_fd = -1;
    if (!Segment::Create("status", sizeof(WorkerStatusPage), &page_seg, &page_fd).ok()) return 10;
    auto* page = reinterpret_cast<WorkerStatusPage*>(page_seg->data());
    WorkerStatusWriter::Initialize(page, static_cast<uint64_t>(getpid()), 0, 7);
    WorkerStatusWriter writer(page);
    writer.Enter(WorkerState::kFetching, 5, 42);
    const int log_fd = memfd_create("log", MFD_CLOEXEC);
    if (log_fd < 0 || write(log_fd, "line1\nline2\n", 12) != 12) return 11;
    const int junk_fd = memfd_create("junk", MFD_CLOEXEC);
    if (!SendMessage(sock, Header(MessageType::kStatusPage), nullptr, 0, page_fd).ok() ||
        !SendMessage(sock,
                     Header(MessageType::kLogFile, 0, static_cast<uint64_t>(LogKind::kStderr)),
                     nullptr, 0, log_fd)
             .ok() ||
        !SendMessage(sock, Header(MessageType::kLogFile, 0, 7), nullptr, 0, junk_fd).ok() ||
        !SendMessage(sock, Header(MessageType::kHello), nullptr, 0).ok()) {
      return 12;
    }
    AwaitMessage(sock, MessageType::kTask);
    writer.Enter(WorkerState::kEncoding, 6, kNoIndex);
    writer.AddBatch(1000);
    writer.SetReady(2'000'000'000, 30'000'000);
    if (write(log_fd, "line3\n", 6) != 6) return 13;
    if (!SendMessage(sock, Header(MessageType::kHello), nullptr, 0).ok()) return 14;
    AwaitMessage(sock, MessageType::kStop);
    return 0;
  });
  WorkerStatusPage st;
  EXPECT_FALSE(sup_->ReadStatus(15, &st));  // nothing announced yet
  SupervisorEvent ev = Next();
  ASSERT_EQ(ev.kind, Kind::kMessage);
  ASSERT_EQ(ev.message.type(), MessageType::kHello);  // the three announcements were absorbed
  ASSERT_TRUE(sup_->ReadStatus(15, &st));
  EXPECT_EQ(st.pid, static_cast<uint64_t>(pid));
  EXPECT_EQ(st.state, static_cast<uint64_t>(WorkerState::kFetching));
  EXPECT_EQ(st.task, 5u);
  EXPECT_EQ(st.index, 42);
  EXPECT_EQ(st.ready_cpu_ns, 0u);  // (not ready yet: nothing to subtract)
  EXPECT_EQ(sup_->ReadLog(15, LogKind::kStderr, 1000), "line1\nline2\n");
  EXPECT_EQ(sup_->ReadLog(15, LogKind::kStderr, 6), "line2\n");
  EXPECT_EQ(sup_->ReadLog(15, LogKind::kCrash, 1000), "");
  EXPECT_EQ(sup_->ReadLog(99, LogKind::kStderr, 1000), "");
  // epoll, socket, pidfd, one log and the status page (kept for readers in other processes);
  // the junk fd was closed
  EXPECT_EQ(sup_->OwnedFds().size(), 5u);

  ASSERT_TRUE(sup_->Send(15, Header(MessageType::kTask), nullptr, 0).ok());
  ev = Next();
  ASSERT_EQ(ev.message.type(), MessageType::kHello);
  ASSERT_TRUE(sup_->ReadStatus(15, &st));
  EXPECT_EQ(st.state, static_cast<uint64_t>(WorkerState::kEncoding));
  EXPECT_EQ(st.index, kNoIndex);
  EXPECT_EQ(st.batches, 1u);
  EXPECT_EQ(st.bytes_sent, 1000u);
  EXPECT_EQ(st.ready_cpu_ns, 2'000'000'000u);
  EXPECT_EQ(st.ready_runqueue_ns, 30'000'000u);
  EXPECT_EQ(sup_->ReadLog(15, LogKind::kStderr, 12), "line2\nline3\n");

  ASSERT_TRUE(sup_->Send(15, Header(MessageType::kStop), nullptr, 0).ok());
  EXPECT_EQ(Next().kind, Kind::kDied);
  Reap(pid);
}

// The worker guard ends a worker (exit code 0) within 1 s of the main process closing its end of
// the channel, even while the worker is busy and never reads its socket.
TEST_F(SupervisorTest, WorkerGuardExitsWhenMainEndCloses) {
  int sock = -1;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t parent = getpid();
  const pid_t pid = Spawn(
      [&](int s) {
        close(ready[0]);
        if (!ArmWorkerGuard(s, parent).ok()) return 10;
        char c = 'g';
        if (write(ready[1], &c, 1) != 1) return 11;
        sleep(10);  // "busy": only the guard can end this process early
        return 12;
      },
      &sock);
  ASSERT_GT(pid, 0);
  close(ready[1]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  const auto t0 = Clock::now();
  close(sock);
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 && MillisSince(t0) < 2000) {
    usleep(5 * 1000);
  }
  ASSERT_EQ(done, pid) << "the worker outlived its channel";
  children_.erase(std::remove(children_.begin(), children_.end(), pid), children_.end());
  EXPECT_LT(MillisSince(t0), 1000);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace stoker
