// Tests of Segment: memfd creation, sealing, mapping and heap-backed private segments.
#include "stoker/segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace stoker {
namespace {

// PageSize() is the system page size and RoundUpToPage rounds to a multiple of it.
TEST(SegmentTest, PageRounding) {
  const size_t p = PageSize();
  EXPECT_EQ(p, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  EXPECT_EQ(RoundUpToPage(0), 0u);
  EXPECT_EQ(RoundUpToPage(1), p);
  EXPECT_EQ(RoundUpToPage(p), p);
  EXPECT_EQ(RoundUpToPage(p + 1), 2 * p);
}

// Create() returns a page-rounded, writable mapping and a close-on-exec memfd of that size.
TEST(SegmentTest, CreateRoundsUpAndMaps) {
  std::unique_ptr<Segment> seg;
  int fd = -1;
  ASSERT_TRUE(Segment::Create("seg-test", 1000, &seg, &fd).ok());
  ASSERT_NE(seg, nullptr);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(seg->size(), PageSize());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(seg->data()) % PageSize(), 0u);
  EXPECT_EQ(lseek(fd, 0, SEEK_END), static_cast<off_t>(PageSize()));
  EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  // Fresh memory is zeroed and writable end to end.
  EXPECT_EQ(seg->data()[0], 0);
  EXPECT_EQ(seg->data()[seg->size() - 1], 0);
  std::memset(seg->data(), 0xab, seg->size());
  EXPECT_EQ(seg->data()[seg->size() - 1], 0xab);
  close(fd);
}

// An empty segment is refused.
TEST(SegmentTest, CreateRejectsZeroSize) {
  std::unique_ptr<Segment> seg;
  int fd = -1;
  Status st = Segment::Create("seg-test", 0, &seg, &fd);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(seg, nullptr);
  EXPECT_EQ(fd, -1);
}

// The memfd is sealed against shrinking, growing and further sealing.
TEST(SegmentTest, CreateSealsTheSize) {
  std::unique_ptr<Segment> seg;
  int fd = -1;
  ASSERT_TRUE(Segment::Create("seg-test", 3 * PageSize(), &seg, &fd).ok());
  const int seals = fcntl(fd, F_GET_SEALS);
  ASSERT_GE(seals, 0);
  EXPECT_NE(seals & F_SEAL_SHRINK, 0);
  EXPECT_NE(seals & F_SEAL_GROW, 0);
  EXPECT_NE(seals & F_SEAL_SEAL, 0);
  EXPECT_NE(ftruncate(fd, 0), 0);
  EXPECT_NE(ftruncate(fd, static_cast<off_t>(10 * PageSize())), 0);
  EXPECT_EQ(lseek(fd, 0, SEEK_END), static_cast<off_t>(3 * PageSize()));
  close(fd);
}

// Bytes written through the creator's mapping are visible through a second Map() and back.
TEST(SegmentTest, MapSharesMemoryWithCreator) {
  std::unique_ptr<Segment> a;
  int fd = -1;
  ASSERT_TRUE(Segment::Create("seg-test", 2 * PageSize() + 5, &a, &fd).ok());
  std::unique_ptr<Segment> b;
  ASSERT_TRUE(Segment::Map(fd, &b).ok());
  close(fd);  // the mapping outlives the descriptor
  ASSERT_EQ(b->size(), a->size());
  EXPECT_NE(a->data(), b->data());
  for (size_t i = 0; i < a->size(); i += 97) a->data()[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t i = 0; i < a->size(); i += 97) {
    ASSERT_EQ(b->data()[i], static_cast<uint8_t>(i * 7 + 1)) << i;
  }
  b->data()[a->size() - 1] = 0x5a;
  EXPECT_EQ(a->data()[a->size() - 1], 0x5a);
}

// A memfd that the peer could still shrink must not be mapped (it could turn reads into SIGBUS).
TEST(SegmentTest, MapRejectsUnsealedMemfd) {
  int fd = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(PageSize())), 0);
  std::unique_ptr<Segment> seg;
  Status st = Segment::Map(fd, &seg);
  EXPECT_EQ(st.code(), Code::kCorrupt) << st.ToString();
  EXPECT_EQ(seg, nullptr);
  // Sealed against growing only: still refused.
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_GROW), 0);
  EXPECT_EQ(Segment::Map(fd, &seg).code(), Code::kCorrupt);
  // Once sealed against shrinking it is accepted.
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_TRUE(Segment::Map(fd, &seg).ok());
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->size(), PageSize());
  close(fd);
}

// A memfd created without MFD_ALLOW_SEALING cannot carry seals and is refused.
TEST(SegmentTest, MapRejectsMemfdWithoutSealingSupport) {
  int fd = memfd_create("nosealing", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(PageSize())), 0);
  std::unique_ptr<Segment> seg;
  EXPECT_EQ(Segment::Map(fd, &seg).code(), Code::kCorrupt);
  close(fd);
}

// A zero-length file is refused even when sealed, and a bad descriptor is a system error.
TEST(SegmentTest, MapRejectsEmptyAndBadDescriptors) {
  int fd = memfd_create("empty", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  std::unique_ptr<Segment> seg;
  EXPECT_EQ(Segment::Map(fd, &seg).code(), Code::kCorrupt);
  close(fd);
  Status st = Segment::Map(fd, &seg);  // now closed
  EXPECT_EQ(st.code(), Code::kSystem);
  EXPECT_EQ(st.errno_value(), EBADF);
}

// Private() wraps 64-byte aligned heap memory of the requested size (64 for 0).
TEST(SegmentTest, PrivateSegments) {
  auto p = Segment::Private(100);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->size(), 100u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p->data()) % 64, 0u);
  std::memset(p->data(), 7, p->size());
  EXPECT_EQ(p->data()[99], 7);

  auto z = Segment::Private(0);
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z->size(), 64u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(z->data()) % 64, 0u);
  z->data()[63] = 1;
}

// Borrowed() wraps memory it neither unmaps nor frees: the owner's buffer is intact after it.
TEST(SegmentTest, BorrowedSegmentsLeaveTheirMemoryAlone) {
  std::vector<uint8_t> owner(256, 3);
  {
    auto b = Segment::Borrowed(owner.data(), owner.size());
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->data(), owner.data());
    EXPECT_EQ(b->size(), 256u);
    b->data()[0] = 9;
  }
  EXPECT_EQ(owner[0], 9);  // written through the segment, and still ours
  EXPECT_EQ(owner[255], 3);
}

}  // namespace
}  // namespace stoker
