// Tests of the slot state machine and of futex waits on the state word, in one process and
// across processes.
#include "stoker/slot.h"

#include <gtest/gtest.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

#include "stoker/futex.h"
#include "stoker/segment.h"

namespace stoker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kFree = static_cast<uint32_t>(SlotState::kFree);
constexpr uint32_t kWriting = static_cast<uint32_t>(SlotState::kWriting);
constexpr uint32_t kReady = static_cast<uint32_t>(SlotState::kReady);
constexpr uint32_t kLent = static_cast<uint32_t>(SlotState::kLent);

int64_t MillisSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// What a peer waiting for a slot to change state would do: a non-private FUTEX_WAIT on the
// state word, with a timeout. OK when woken or when the word differs already.
Status WaitWhileState(const SlotHeader* h, uint32_t state, int timeout_ms) {
  if (SlotWord(const_cast<SlotHeader*>(h)).state() != state) return Status::OK();
  return FutexWait(&h->state, state, timeout_ms);
}

// A slot header in a MAP_SHARED memfd segment, so forked children share it.
class SlotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int fd = -1;
    ASSERT_TRUE(Segment::Create("slot-test", 4096, &seg_, &fd).ok());
    close(fd);
    std::memset(seg_->data(), 0xee, kSlotHeaderSize);  // garbage that Initialize must overwrite
    h_ = reinterpret_cast<SlotHeader*>(seg_->data());
    SlotWord::Initialize(h_, 7, seg_->size() - kSlotHeaderSize);
  }
  std::unique_ptr<Segment> seg_;
  SlotHeader* h_ = nullptr;
};

// Initialize writes magic, id, capacity, a zero generation and the FREE state.
TEST_F(SlotTest, InitializeWritesHeader) {
  EXPECT_EQ(h_->magic, kSlotMagic);
  EXPECT_EQ(h_->slot_id, 7u);
  EXPECT_EQ(h_->capacity, seg_->size() - kSlotHeaderSize);
  EXPECT_EQ(h_->payload_bytes, 0u);
  SlotWord w(h_);
  EXPECT_EQ(w.state(), kFree);
  EXPECT_EQ(w.generation(), 0u);
}

// The full cycle FREE -> WRITING -> READY -> LENT -> FREE, with the generation bumped per write.
TEST_F(SlotTest, FullCycleAndGenerationBump) {
  SlotWord w(h_);
  for (uint32_t round = 1; round <= 3; ++round) {
    uint32_t gen = 0;
    ASSERT_TRUE(w.BeginWrite(&gen));
    EXPECT_EQ(gen, round);
    EXPECT_EQ(w.generation(), round);
    EXPECT_EQ(w.state(), kWriting);
    w.Publish(1234 + round);
    EXPECT_EQ(w.state(), kReady);
    EXPECT_EQ(h_->payload_bytes, 1234u + round);
    ASSERT_TRUE(w.Lend(gen));
    EXPECT_EQ(w.state(), kLent);
    EXPECT_TRUE(w.Release(gen));
    EXPECT_EQ(w.state(), kFree);
  }
}

// BeginWrite succeeds only from FREE and leaves the generation alone when it fails.
TEST_F(SlotTest, BeginWriteOnNonFreeSlotFails) {
  SlotWord w(h_);
  uint32_t gen = 0;
  ASSERT_TRUE(w.BeginWrite(&gen));
  uint32_t other = 99;
  EXPECT_FALSE(w.BeginWrite(&other));  // WRITING
  EXPECT_EQ(other, 99u);
  w.Publish(8);
  EXPECT_FALSE(w.BeginWrite(&other));  // READY
  ASSERT_TRUE(w.Lend(gen));
  EXPECT_FALSE(w.BeginWrite(&other));  // LENT
  EXPECT_EQ(w.generation(), gen);
  EXPECT_EQ(w.state(), kLent);
}

// Lend requires the announced generation and the READY state.
TEST_F(SlotTest, LendChecksGenerationAndState) {
  SlotWord w(h_);
  uint32_t gen = 0;
  ASSERT_TRUE(w.BeginWrite(&gen));
  EXPECT_FALSE(w.Lend(gen));  // still WRITING
  w.Publish(16);
  EXPECT_FALSE(w.Lend(gen + 1));
  EXPECT_FALSE(w.Lend(gen - 1));
  EXPECT_EQ(w.state(), kReady);
  EXPECT_TRUE(w.Lend(gen));
  EXPECT_FALSE(w.Lend(gen));  // already LENT
  EXPECT_EQ(w.state(), kLent);
}

// A READY batch can be discarded (READY -> FREE) and a failed encode abandoned (WRITING -> FREE).
TEST_F(SlotTest, ReleaseFromReadyAndAbandonWrite) {
  SlotWord w(h_);
  uint32_t gen = 0;
  ASSERT_TRUE(w.BeginWrite(&gen));
  w.AbandonWrite();
  EXPECT_EQ(w.state(), kFree);
  ASSERT_TRUE(w.BeginWrite(&gen));
  EXPECT_EQ(gen, 2u);  // the abandoned write still consumed a generation
  w.Publish(1);
  EXPECT_TRUE(w.Release(gen));
  EXPECT_EQ(w.state(), kFree);
  EXPECT_FALSE(w.Lend(gen));  // a discarded batch cannot be lent any more
}

// A release that does not name the slot's current generation, or that finds the slot neither
// LENT nor READY, changes nothing: a stale handle (or one a forked child inherited) cannot hand
// a slot that holds a newer batch back to the worker.
TEST_F(SlotTest, StrayReleaseChangesNothing) {
  SlotWord w(h_);
  uint32_t old_gen = 0, gen = 0;
  ASSERT_TRUE(w.BeginWrite(&old_gen));
  w.Publish(1);
  ASSERT_TRUE(w.Lend(old_gen));
  ASSERT_TRUE(w.Release(old_gen));
  EXPECT_FALSE(w.Release(old_gen));  // twice: already FREE
  EXPECT_EQ(w.state(), kFree);

  ASSERT_TRUE(w.BeginWrite(&gen));
  EXPECT_FALSE(w.Release(gen));  // WRITING belongs to the worker
  EXPECT_EQ(w.state(), kWriting);
  w.Publish(2);
  ASSERT_TRUE(w.Lend(gen));
  EXPECT_FALSE(w.Release(old_gen));  // the previous batch's holder, late
  EXPECT_FALSE(w.Release(gen + 1));
  EXPECT_EQ(w.state(), kLent);
  EXPECT_EQ(w.generation(), gen);
  EXPECT_TRUE(w.Release(gen));
  EXPECT_EQ(w.state(), kFree);
}

// A slot recycled by the worker is not lent under the generation of its previous batch.
TEST_F(SlotTest, StaleGenerationIsRejectedAfterRecycle) {
  SlotWord w(h_);
  uint32_t old_gen = 0, new_gen = 0;
  ASSERT_TRUE(w.BeginWrite(&old_gen));
  w.Publish(1);
  ASSERT_TRUE(w.Release(old_gen));
  ASSERT_TRUE(w.BeginWrite(&new_gen));
  w.Publish(2);
  EXPECT_NE(old_gen, new_gen);
  EXPECT_FALSE(w.Lend(old_gen));
  EXPECT_TRUE(w.Lend(new_gen));
}

// SlotStateName names the four states and flags anything else.
TEST(SlotStateNameTest, Names) {
  EXPECT_STREQ(SlotStateName(kFree), "free");
  EXPECT_STREQ(SlotStateName(kWriting), "writing");
  EXPECT_STREQ(SlotStateName(kReady), "ready");
  EXPECT_STREQ(SlotStateName(kLent), "lent");
  EXPECT_STREQ(SlotStateName(4), "invalid");
}

// Waiting while the state holds runs into the timeout; a different state returns at once.
TEST_F(SlotTest, WaitWhileTimesOut) {
  auto t0 = Clock::now();
  Status st = WaitWhileState(h_, kFree, 60);
  const int64_t ms = MillisSince(t0);
  EXPECT_EQ(st.code(), Code::kTimeout) << st.ToString();
  EXPECT_GE(ms, 50);
  EXPECT_LT(ms, 2000);

  t0 = Clock::now();
  EXPECT_TRUE(WaitWhileState(h_, kLent, 5000).ok());
  EXPECT_LT(MillisSince(t0), 1000);
}

// FutexWait returns OK at once when the word already differs, kTimeout when it does not change.
TEST(FutexTest, WaitSemantics) {
  alignas(4) uint32_t word = 5;
  auto t0 = Clock::now();
  EXPECT_TRUE(FutexWait(&word, 4, 5000).ok());
  EXPECT_LT(MillisSince(t0), 1000);
  t0 = Clock::now();
  EXPECT_EQ(FutexWait(&word, 5, 30).code(), Code::kTimeout);
  EXPECT_GE(MillisSince(t0), 25);
  // Second-scale timeouts are split into seconds and nanoseconds correctly.
  t0 = Clock::now();
  EXPECT_EQ(FutexWait(&word, 5, 1010).code(), Code::kTimeout);
  const int64_t ms = MillisSince(t0);
  EXPECT_GE(ms, 1000);
  EXPECT_LT(ms, 3000);
}

// A forked child waiting while the state is LENT on the shared word is woken by the parent's
// Release(): it returns OK well before its own 3 s timeout and sees FREE.
TEST_F(SlotTest, ReleaseWakesWaiterInAnotherProcess) {
  SlotWord w(h_);
  uint32_t gen = 0;
  ASSERT_TRUE(w.BeginWrite(&gen));
  w.Publish(64);
  ASSERT_TRUE(w.Lend(gen));

  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(ready[0]);
    SlotWord cw(h_);
    char c = 'r';
    if (write(ready[1], &c, 1) != 1) _exit(10);
    const auto t0 = Clock::now();
    Status st = WaitWhileState(h_, kLent, 3000);
    const int64_t ms = MillisSince(t0);
    if (!st.ok()) _exit(st.code() == Code::kTimeout ? 2 : 3);
    if (cw.state() != kFree) _exit(4);
    if (ms >= 2500) _exit(5);
    _exit(0);
  }
  close(ready[1]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  usleep(150 * 1000);  // let the child block in FUTEX_WAIT
  const auto t0 = Clock::now();
  ASSERT_TRUE(w.Release(gen));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_LT(MillisSince(t0), 2000);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: not woken (timed out), 4: wrong state after wake";
}

}  // namespace
}  // namespace stoker
