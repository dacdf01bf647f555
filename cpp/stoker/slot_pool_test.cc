// Tests of a worker's SlotPool: reuse, growth, and the cap on the bytes of all its slots
// (max_shared_memory), with the main process's side played by this test (Lend, Release).
#include "stoker/slot_pool.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "stoker/channel.h"

namespace stoker {
namespace {

using Clock = std::chrono::steady_clock;

class SlotPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(MakeChannelPair(fds_).ok()); }
  void TearDown() override {
    close(fds_[0]);
    close(fds_[1]);
  }

  // Acquire + Publish + Lend: a batch of `bytes` now held by the "user".
  WritableSlot Hold(SlotPool* pool, size_t bytes) {
    WritableSlot s;
    Status st = pool->Acquire(bytes, &s);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(pool->Publish(s, bytes, 0).ok());
    EXPECT_TRUE(SlotWord(s.header).Lend(s.generation));
    return s;
  }

  // The user drops the last view of the batch in `s`.
  static void Free(const WritableSlot& s) { EXPECT_TRUE(SlotWord(s.header).Release(s.generation)); }

  // Counts the messages of `type` the pool sent so far (closing any descriptors).
  int Count(MessageType type) {
    int n = 0;
    while (true) {
      Message m;
      if (!ReceiveMessage(fds_[1], &m, true).ok()) break;
      if (m.fd >= 0) close(m.fd);
      if (m.type() == type) ++n;
    }
    return n;
  }

  int fds_[2] = {-1, -1};
};

TEST_F(SlotPoolTest, WithoutCapAddsSlotsWhileAllAreHeld) {
  SlotPool pool(fds_[0], 1);
  for (int i = 0; i < 4; ++i) Hold(&pool, 100 * 1024);
  EXPECT_EQ(pool.slot_count(), 4u);
  EXPECT_EQ(Count(MessageType::kSlotNew), 4);
}

TEST_F(SlotPoolTest, FreedSlotIsReused) {
  SlotPool pool(fds_[0], 1);
  WritableSlot a = Hold(&pool, 100 * 1024);
  Free(a);
  WritableSlot b = Hold(&pool, 100 * 1024);
  EXPECT_EQ(b.slot_id, a.slot_id);
  EXPECT_EQ(pool.slot_count(), 1u);
}

TEST_F(SlotPoolTest, BatchLargerThanCapFailsAtOnce) {
  SlotPool pool(fds_[0], 3);
  ASSERT_TRUE(pool.SetLimit(1 << 20, 60 * 1000).ok());
  WritableSlot s;
  const auto t0 = Clock::now();
  Status st = pool.Acquire(2 << 20, &s);
  EXPECT_EQ(st.code(), Code::kLimitReached);
  EXPECT_NE(st.message().find("worker 3"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("does not fit"), std::string::npos) << st.message();
  // It did not wait out its patience (a minute) for a batch that can never fit.
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));
  EXPECT_EQ(pool.slot_count(), 0u);
}

TEST_F(SlotPoolTest, CapReachedWithEverySlotHeldFailsAfterPatience) {
  SlotPool pool(fds_[0], 2);
  const uint64_t slot = SlotBytesFor(100 * 1024);
  ASSERT_TRUE(pool.SetLimit(2 * slot, 200).ok());
  Hold(&pool, 100 * 1024);
  Hold(&pool, 100 * 1024);
  WritableSlot s;
  const auto t0 = Clock::now();
  Status st = pool.Acquire(100 * 1024, &s);
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(200));  // it waited for room first
  ASSERT_EQ(st.code(), Code::kLimitReached);
  EXPECT_NE(st.message().find("2 batch(es) still held by your code"), std::string::npos)
      << st.message();
  EXPECT_LE(pool.mapped_bytes(), 2 * slot);
  EXPECT_EQ(pool.slot_count(), 2u);
}

TEST_F(SlotPoolTest, WaitingWorkerResumesWhenTheUserLetsGo) {
  SlotPool pool(fds_[0], 2);
  const uint64_t slot = SlotBytesFor(100 * 1024);
  ASSERT_TRUE(pool.SetLimit(2 * slot, 20 * 1000).ok());
  Hold(&pool, 100 * 1024);
  WritableSlot held = Hold(&pool, 100 * 1024);
  std::thread user([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Free(held);  // the last view of a batch died
  });
  WritableSlot s;
  Status st = pool.Acquire(100 * 1024, &s);
  user.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(s.slot_id, held.slot_id);
  EXPECT_EQ(pool.slot_count(), 2u);
}

TEST_F(SlotPoolTest, CapRetiresFreeSlotsThatAreTooSmallToMakeRoom) {
  SlotPool pool(fds_[0], 1);
  const uint64_t small = SlotBytesFor(100 * 1024);
  const uint64_t big = SlotBytesFor(600 * 1024);
  ASSERT_TRUE(pool.SetLimit(big + small / 2, 200).ok());
  WritableSlot a = Hold(&pool, 100 * 1024);
  WritableSlot b = Hold(&pool, 100 * 1024);  // two small slots fit under the cap
  Free(a);
  Free(b);
  EXPECT_EQ(Count(MessageType::kSlotNew), 2);
  WritableSlot c = Hold(&pool, 600 * 1024);
  EXPECT_GE(c.capacity, 600u * 1024);
  EXPECT_EQ(pool.slot_count(), 1u);  // both small ones had to go: one would not leave room
  EXPECT_EQ(pool.mapped_bytes(), big);
  EXPECT_EQ(Count(MessageType::kSlotRetire), 2);
}

TEST_F(SlotPoolTest, LoweringTheCapRetiresFreeSlotsAtOnceAndKeepsThoseInUse) {
  SlotPool pool(fds_[0], 1);
  const uint64_t slot = SlotBytesFor(100 * 1024);
  WritableSlot a = Hold(&pool, 100 * 1024);
  WritableSlot b = Hold(&pool, 100 * 1024);
  WritableSlot c = Hold(&pool, 100 * 1024);
  Free(a);
  Free(b);  // c is still held by the user
  ASSERT_TRUE(pool.SetLimit(2 * slot, 200).ok());
  EXPECT_EQ(pool.slot_count(), 2u);  // one free slot went, the held one stays
  EXPECT_EQ(Count(MessageType::kSlotRetire), 1);
  ASSERT_TRUE(pool.SetLimit(slot / 2, 200).ok());
  EXPECT_EQ(pool.slot_count(), 1u);  // only the held slot is left: it goes once it is back
  EXPECT_EQ(pool.mapped_bytes(), slot);
  EXPECT_EQ(Count(MessageType::kSlotRetire), 1);  // (Count reads what came since the last)
  // no cap: nothing retired
  ASSERT_TRUE(pool.SetLimit(0, 200).ok());
  EXPECT_EQ(pool.slot_count(), 1u);
  (void)c;
}

TEST_F(SlotPoolTest, WithoutCapGrowingRetiresOnlyOneFreeSlot) {
  SlotPool pool(fds_[0], 1);
  WritableSlot a = Hold(&pool, 100 * 1024);
  WritableSlot b = Hold(&pool, 100 * 1024);
  Free(a);
  Free(b);
  Hold(&pool, 600 * 1024);
  EXPECT_EQ(pool.slot_count(), 2u);
}

}  // namespace
}  // namespace stoker
