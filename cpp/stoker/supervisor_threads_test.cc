// Supervisor under threads and forks: a monitoring thread reads status while another thread
// waits on real worker processes, and a child forked from the main process gives up everything
// the Supervisor owns without touching the parent's workers.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "stoker/channel.h"
#include "stoker/slot.h"
#include "stoker/slot_pool.h"
#include "stoker/supervisor.h"
#include "stoker/worker_status.h"

namespace stoker {
namespace {

using Kind = SupervisorEvent::Kind;

MessageHeader Header(MessageType type, uint64_t task = 0, uint64_t a = 0) {
  MessageHeader h;
  h.type = static_cast<uint32_t>(type);
  h.task = task;
  h.a = a;
  return h;
}

// Worker side: waits for a message of `type`; false on anything else (EOF included).
bool Await(int sock, MessageType type) {
  Message m;
  return ReceiveMessage(sock, &m).ok() && m.type() == type;
}

// Worker side: shares a status page and a log memfd, as the Python worker does.
bool ShareStatusAndLog(int sock, uint32_t id, std::unique_ptr<Segment>* page_seg) {
  int page_fd = -1;
  if (!Segment::Create("stoker-status", sizeof(WorkerStatusPage), page_seg, &page_fd).ok()) {
    return false;
  }
  auto* page = reinterpret_cast<WorkerStatusPage*>((*page_seg)->data());
  WorkerStatusWriter::Initialize(page, static_cast<uint64_t>(getpid()), id, 1);
  const int log_fd = memfd_create("stoker-stderr", MFD_CLOEXEC);
  const bool ok =
      log_fd >= 0 && write(log_fd, "started\n", 8) == 8 &&
      SendMessage(sock, Header(MessageType::kStatusPage), nullptr, 0, page_fd).ok() &&
      SendMessage(sock, Header(MessageType::kLogFile, 0, static_cast<uint64_t>(LogKind::kStderr)),
                  nullptr, 0, log_fd)
          .ok();
  close(page_fd);
  if (log_fd >= 0) close(log_fd);
  return ok;
}

// Worker side: publishes one batch of `bytes` bytes filled with `fill`.
bool PublishBytes(SlotPool& pool, size_t bytes, uint64_t task, uint8_t fill) {
  WritableSlot slot;
  if (!pool.Acquire(bytes, &slot).ok()) return false;
  std::memset(slot.payload, fill, bytes);
  return pool.Publish(slot, bytes, task).ok();
}

class SupervisorThreadsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(Supervisor::Create(&sup_).ok()); }

  void TearDown() override {
    sup_.reset();
    for (pid_t pid : children_) {
      kill(pid, SIGKILL);
      int status;
      waitpid(pid, &status, 0);
    }
  }

  // Forks a worker running body(sock) and registers it as `id`. The fork handler closes the
  // supervisor's descriptors in the child by itself.
  pid_t AddWorker(int id, const std::function<int(int)>& body) {
    int fds[2];
    EXPECT_TRUE(MakeChannelPair(fds).ok());
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      _exit(body(fds[1]));
    }
    close(fds[1]);
    EXPECT_GT(pid, 0);
    children_.push_back(pid);
    Status st = sup_->AddWorker(id, fds[0], pid);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return pid;
  }

  // Waits (at most ~10 s, to catch a hang) for `pid` to exit; its wait status, or -1.
  int ReapWithin10s(pid_t pid) {
    for (int i = 0; i < 1000; ++i) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        children_.erase(std::remove(children_.begin(), children_.end(), pid), children_.end());
        return status;
      }
      usleep(10 * 1000);
    }
    return -1;
  }

  std::unique_ptr<Supervisor> sup_;
  std::vector<pid_t> children_;
};

// One thread waits on two real workers whose slots are retired and replaced with every batch
// (so the supervisor's maps change all the time), while this thread reads status, logs, slot
// usage and descriptors in a loop. Before the Supervisor had its mutex, this crashed (an
// iterator of a map erased under it) and ThreadSanitizer reported Absorb against slot_usage.
TEST_F(SupervisorThreadsTest, StatusReadsRaceNothingWhileAnotherThreadWaits) {
  constexpr int kRounds = 150;
  for (int id = 0; id < 2; ++id) {
    AddWorker(id, [id](int sock) {
      SlotPool pool(sock, static_cast<uint32_t>(id));
      std::unique_ptr<Segment> page;
      if (!ShareStatusAndLog(sock, static_cast<uint32_t>(id), &page)) return 10;
      for (int r = 0; r < kRounds; ++r) {
        // Each batch is bigger than the last: the free slot is retired and a new one mapped.
        if (!PublishBytes(pool, 4096 * static_cast<size_t>(r + 1), r, 0x5a)) return 11;
        if (!Await(sock, MessageType::kTask)) return 12;  // the parent released the slot
      }
      return 0;
    });
  }

  std::atomic<bool> done{false};
  int batches = 0, deaths = 0, bad_exits = 0;
  Status wait_error;
  std::thread waiter([&] {
    while (deaths < 2) {
      SupervisorEvent ev;
      Status st = sup_->Wait(200, &ev);
      if (!st.ok()) {
        wait_error = st;
        break;
      }
      if (ev.kind == Kind::kDied) {
        ++deaths;
        if (ev.exit.exit_code != 0 || ev.exit.signal != 0) ++bad_exits;
      } else if (ev.kind == Kind::kMessage && ev.message.type() == MessageType::kBatch) {
        const uint32_t gen = static_cast<uint32_t>(ev.message.header.b);
        SlotWord word(reinterpret_cast<SlotHeader*>(ev.slot->data()));
        if (!word.Lend(gen) || !word.Release(gen)) {
          wait_error = Status::Error(Code::kCorrupt, "a batch's slot was not READY");
          break;
        }
        ++batches;
        Status sent = sup_->Send(ev.worker, Header(MessageType::kTask), nullptr, 0);
        if (!sent.ok()) {
          wait_error = sent;
          break;
        }
      }
    }
    done = true;
  });

  uint64_t reads = 0, statuses = 0;
  while (!done) {
    for (int id = 0; id < 2; ++id) {
      WorkerStatusPage page;
      if (sup_->ReadStatus(id, &page)) ++statuses;
      (void)sup_->HasWorker(id);
      (void)sup_->ReadLog(id, LogKind::kStderr, 64);
    }
    const SlotUsage u = sup_->slot_usage();
    EXPECT_LE(u.lent, u.slots);
    EXPECT_FALSE(sup_->OwnedFds().empty());
    (void)sup_->mapped_slot_count();
    (void)sup_->worker_count();
    ++reads;
  }
  waiter.join();
  EXPECT_TRUE(wait_error.ok()) << wait_error.ToString();
  EXPECT_EQ(batches, 2 * kRounds);
  EXPECT_EQ(bad_exits, 0);
  EXPECT_GT(reads, 0u);
  EXPECT_GT(statuses, 0u);
}

// Wait sleeps without the mutex: while one thread is blocked in Wait (no event can arrive until
// this thread sends one), every other call completes. A Wait that held the mutex while asleep
// would deadlock here; the 10 s bound turns that into a failure.
TEST_F(SupervisorThreadsTest, WaitDoesNotHoldTheLockWhileAsleep) {
  AddWorker(0, [](int sock) {
    std::unique_ptr<Segment> page;
    if (!ShareStatusAndLog(sock, 0, &page)) return 10;
    if (!Await(sock, MessageType::kTask)) return 11;
    return SendMessage(sock, Header(MessageType::kHello), nullptr, 0).ok() ? 0 : 12;
  });
  // Absorb the status page and log announcements first.
  SupervisorEvent ev;
  ASSERT_TRUE(sup_->Wait(300, &ev).ok());

  std::promise<Status> woke;
  std::future<Status> woke_result = woke.get_future();
  std::thread waiter([&] {
    SupervisorEvent e;
    Status st;
    do {
      st = sup_->Wait(-1, &e);  // no timeout: only the worker's reply ends it
    } while (st.ok() && e.kind != Kind::kMessage);
    woke.set_value(st);
  });
  usleep(100 * 1000);  // most likely asleep in epoll_wait by now (not required for a pass)
  auto readers = std::async(std::launch::async, [&] {
    WorkerStatusPage page;
    for (int i = 0; i < 100; ++i) {
      (void)sup_->ReadStatus(0, &page);
      (void)sup_->slot_usage();
      (void)sup_->OwnedFds();
      (void)sup_->HasWorker(0);
    }
    return sup_->Send(0, Header(MessageType::kTask), nullptr, 0);
  });
  if (readers.wait_for(std::chrono::seconds(10)) != std::future_status::ready ||
      woke_result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "a call blocked while another thread slept in Wait";
    std::_Exit(1);  // the threads cannot be joined
  }
  waiter.join();
  EXPECT_TRUE(readers.get().ok());
  EXPECT_TRUE(woke_result.get().ok());
}

int CountMappings(const char* name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find(name) != std::string::npos;
  return n;
}

// A child forked from the main process (not a worker): every descriptor of the Supervisor is
// closed there, only the slot the child still holds stays mapped, every call says the engine
// belongs to the parent, and the destructor closes nothing twice. The parent's workers are
// untouched, and a worker whose channel the parent closes sees EOF although the child lives.
TEST_F(SupervisorThreadsTest, ForkedChildGivesUpDescriptorsAndUnheldSlots) {
  for (int id = 0; id < 2; ++id) {
    AddWorker(id, [id](int sock) {
      SlotPool pool(sock, static_cast<uint32_t>(id));
      std::unique_ptr<Segment> page;
      if (!ShareStatusAndLog(sock, static_cast<uint32_t>(id), &page)) return 10;
      if (!PublishBytes(pool, 1000, 1, static_cast<uint8_t>(id))) return 11;
      return Await(sock, MessageType::kStop) ? 0 : 20;  // 20: the channel closed
    });
  }
  std::shared_ptr<Segment> held;  // worker 0's batch, held as a lease would hold it
  int got = 0;
  for (int i = 0; i < 100 && got < 2; ++i) {
    SupervisorEvent ev;
    ASSERT_TRUE(sup_->Wait(100, &ev).ok());
    if (ev.kind == Kind::kMessage && ev.message.type() == MessageType::kBatch) {
      ++got;
      if (ev.worker == 0) held = ev.slot;
    }
  }
  ASSERT_EQ(got, 2);
  ASSERT_NE(held, nullptr);
  const std::vector<int> owned = sup_->OwnedFds();
  ASSERT_EQ(owned.size(), 1u + 2 * 4);  // epoll + (socket, pidfd, status page, log) per worker
  ASSERT_EQ(CountMappings("stoker-w"), 2);

  const pid_t parent = getpid();
  int gate[2];
  ASSERT_EQ(pipe(gate), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(gate[1]);
    for (int fd : owned) {
      if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) _exit(2);  // still open
    }
    if (!sup_->OwnedFds().empty() || sup_->HasWorker(0) || sup_->worker_count() != 0) _exit(3);
    if (sup_->mapped_slot_count() != 0 || sup_->slot_usage().slots != 0) _exit(4);
    if (CountMappings("stoker-w") != 1) _exit(5);  // only the held slot
    if (CountMappings("stoker-status") != 0) _exit(6);
    SupervisorEvent ev;
    Status st = sup_->Wait(0, &ev);
    if (st.code() != Code::kWrongProcess) _exit(7);
    if (st.message().find("belongs to process " + std::to_string(parent)) == std::string::npos) {
      _exit(8);
    }
    if (sup_->Send(1, Header(MessageType::kStop), nullptr, 0).code() != Code::kWrongProcess ||
        sup_->Signal(1, SIGKILL).code() != Code::kWrongProcess) {
      _exit(9);
    }
    // New descriptors reuse the freed numbers; destroying the supervisor must not close them.
    int p[2];
    if (pipe(p) != 0) _exit(10);
    sup_.reset();
    if (fcntl(p[0], F_GETFD) == -1 || fcntl(p[1], F_GETFD) == -1) _exit(11);
    held.reset();
    if (CountMappings("stoker-w") != 0) _exit(12);
    char c;
    while (read(gate[0], &c, 1) < 0 && errno == EINTR) {
    }
    _exit(0);  // the child stays alive (holding nothing) until the parent closes the gate
  }
  close(gate[0]);

  // The parent still owns everything. Closing worker 0's channel reaches it as EOF although
  // the child is alive: the child no longer holds the main end.
  sup_->RemoveWorker(0);
  const pid_t w0 = children_[0];
  const int w0_status = ReapWithin10s(w0);
  EXPECT_NE(w0_status, -1) << "worker 0 never saw its channel close";
  EXPECT_TRUE(w0_status != -1 && WIFEXITED(w0_status) && WEXITSTATUS(w0_status) == 20) << w0_status;
  ASSERT_TRUE(sup_->Send(1, Header(MessageType::kStop), nullptr, 0).ok());
  bool died = false;
  for (int i = 0; i < 100 && !died; ++i) {
    SupervisorEvent ev;
    ASSERT_TRUE(sup_->Wait(100, &ev).ok());
    died = ev.kind == Kind::kDied && ev.worker == 1 && ev.exit.exit_code == 0;
  }
  EXPECT_TRUE(died);
  EXPECT_EQ(CountMappings("stoker-w"), 2);  // the parent's mappings are its own

  close(gate[1]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "child check " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1) << " failed";
}

// Forks while another thread is handling events: every child sees a consistent, abandoned
// Supervisor (the fork handler took the mutex, so no map was half-updated).
TEST_F(SupervisorThreadsTest, ForkWhileAnotherThreadWaits) {
  constexpr int kRounds = 60;
  AddWorker(0, [](int sock) {
    SlotPool pool(sock, 0);
    for (int r = 0; r < kRounds; ++r) {
      if (!PublishBytes(pool, 4096 * static_cast<size_t>(r + 1), r, 1)) return 11;
      if (!Await(sock, MessageType::kTask)) return 12;
    }
    return 0;
  });
  std::atomic<bool> done{false};
  std::atomic<bool> forks_over{false};
  int batches = 0;
  std::thread waiter([&] {
    while (!done) {
      SupervisorEvent ev;
      if (!sup_->Wait(100, &ev).ok()) break;
      if (ev.kind == Kind::kDied) break;
      if (ev.kind == Kind::kMessage && ev.message.type() == MessageType::kBatch) {
        const uint32_t gen = static_cast<uint32_t>(ev.message.header.b);
        SlotWord word(reinterpret_cast<SlotHeader*>(ev.slot->data()));
        if (!word.Lend(gen) || !word.Release(gen)) break;
        ++batches;
        if (!sup_->Send(0, Header(MessageType::kTask), nullptr, 0).ok()) break;
      }
    }
    done = true;
    // The thread stays alive until the forking stops: a child forked between its end and its
    // join would inherit a finished, unjoined thread, which ThreadSanitizer reports as a leak
    // at the child's exit (exit code 66: a false failure).
    while (!forks_over) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  int forks = 0, bad = 0;
  while (!done && forks < 200) {
    const pid_t child = fork();
    if (child == 0) {
      // At most the slot of the event the waiter thread held at the fork stays mapped.
      const bool ok = sup_->OwnedFds().empty() && sup_->mapped_slot_count() == 0 &&
                      CountMappings("stoker-w") <= 1;
      _exit(ok ? 0 : 1);
    }
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
      ++bad;
    }
    ++forks;
  }
  forks_over = true;
  waiter.join();
  EXPECT_EQ(bad, 0) << "of " << forks << " forks";
  EXPECT_EQ(batches, kRounds);
}

}  // namespace
}  // namespace stoker
