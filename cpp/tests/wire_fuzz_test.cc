// A seeded mutation fuzzer for DecodeBatch: valid batches from WireEncoder are damaged (flipped
// bits, random bytes, truncation, extension, header/node/dim fields set to boundary values,
// random 64-bit words) and decoded. DecodeBatch must never crash, and whenever it accepts a
// buffer every decoded node must be consistent and its data must lie inside the buffer.
//
// Runs for about 3 s; STOKER_FUZZ_SECONDS=<s> runs longer, STOKER_FUZZ_SEED=<n> changes the
// seed. Iteration i uses its own generator seeded from (seed, i), so a failure names the seed
// and iteration that reproduce it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "stoker/wire_decoder.h"
#include "stoker/wire_encoder.h"
#include "stoker/wire_format.h"

namespace stoker {
namespace {

// splitmix64: small, fast and fully determined by its seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }

 private:
  uint64_t s_;
};

std::vector<uint8_t> Finish(WireEncoder& enc) {
  // Written with slack, then trimmed: a seed must not depend on Write() staying inside the batch
  // (wire_test's StridedArrayWritesOnlyItsExtent checks that); the fuzzer tests the decoder.
  const uint64_t total = enc.Layout();
  std::vector<uint8_t> out(total * 16 + 4096);
  Status st = enc.Write(out.data(), total);
  out.resize(total);
  EXPECT_TRUE(st.ok()) << st.ToString();
  DecodedBatch b;
  st = DecodeBatch(out.data(), out.size(), &b);
  EXPECT_TRUE(st.ok()) << "a seed batch must be valid: " << st.ToString();
  return out;
}

// The seed corpus: every node kind, every dtype, zero-size and 0-d arrays, deep nesting,
// stacked non-contiguous sources, and strided (layout-keeping) arrays.
std::vector<std::vector<uint8_t>> SeedBatches() {
  std::vector<std::vector<uint8_t>> seeds;
  {
    WireEncoder enc;
    enc.AddContainer(NodeKind::kDict, 3);
    enc.AddStr("x", 1);
    enc.AddContainer(NodeKind::kList, 6);
    enc.AddNone();
    enc.AddBool(true);
    enc.AddInt(-3);
    enc.AddFloat(0.5);
    enc.AddBytes("\x00\x01\x02", 3);
    enc.AddBigInt("98765432109876543210");
    enc.AddStr("y", 1);
    enc.AddNamedTuple(2, "namedtuple-type");
    enc.AddPickled("pickle");
    enc.AddContainer(NodeKind::kTuple, 0);
    enc.AddInt(7);
    enc.AddStr("tail", 4);
    seeds.push_back(Finish(enc));
  }
  {
    static uint8_t data[16 * 6];
    for (size_t i = 0; i < sizeof(data); ++i) data[i] = static_cast<uint8_t>(i * 37);
    WireEncoder enc;
    enc.AddContainer(NodeKind::kList, kDTypeCount + 2);
    static int64_t shape[2] = {2, 3};
    for (uint8_t d = 0; d < kDTypeCount; ++d) {
      ArraySource src{data, shape, nullptr, 2};
      EXPECT_TRUE(enc.AddArray(static_cast<DType>(d), d & 1, shape, 2, &src, 1).ok());
    }
    static int64_t empty[3] = {4, 0, 2};
    EXPECT_TRUE(enc.AddArray(DType::kFloat32, 0, empty, 3, nullptr, 0).ok());
    ArraySource scalar{data, nullptr, nullptr, 0};
    EXPECT_TRUE(enc.AddArray(DType::kFloat64, 0, nullptr, 0, &scalar, 1).ok());
    seeds.push_back(Finish(enc));
  }
  {
    WireEncoder enc;
    for (int i = 0; i < kMaxNesting; ++i) enc.AddContainer(NodeKind::kTuple, 1);
    enc.AddStr("deep", 4);
    seeds.push_back(Finish(enc));
  }
  {
    static const float f[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    static int64_t row[1] = {3};
    static int64_t strided_shape[2] = {3, 2};
    static int64_t strided_strides[2] = {4, 12};  // a transposed 2x3 block of f
    static int64_t shape[2] = {4, 3};
    ArraySource src[3] = {
        {reinterpret_cast<const uint8_t*>(f), row, nullptr, 1},
        {reinterpret_cast<const uint8_t*>(f + 3), strided_shape, strided_strides, 2},
        {reinterpret_cast<const uint8_t*>(f + 9), row, nullptr, 1}};
    WireEncoder enc;
    enc.AddContainer(NodeKind::kTuple, 3);
    EXPECT_TRUE(enc.AddArray(DType::kFloat32, 0, shape, 2, src, 3).ok());
    enc.AddContainer(NodeKind::kDict, 1);
    enc.AddInt(1);
    enc.AddStr("one", 3);
    enc.AddFloat(-1.0);
    seeds.push_back(Finish(enc));
  }
  {
    // Strided arrays: channels-last, expanded and empty.
    static const float block[24 * 16] = {};  // 16x the extent: see Finish()
    static const int64_t shape[3] = {2, 3, 4};
    static const int64_t strides[3] = {12, 1, 3};
    static const int64_t wide[2] = {5, 4};
    static const int64_t expand[2] = {0, 1};
    static const int64_t empty[2] = {3, 0};
    static const int64_t empty_strides[2] = {2, 9};
    const uint8_t* data = reinterpret_cast<const uint8_t*>(block);
    WireEncoder enc;
    enc.AddContainer(NodeKind::kList, 4);
    EXPECT_TRUE(enc.AddStridedArray(DType::kFloat32, 0, shape, strides, 3, data, 96).ok());
    EXPECT_TRUE(enc.AddStridedArray(DType::kInt16, 1, wide, expand, 2, data, 8).ok());
    EXPECT_TRUE(enc.AddStridedArray(DType::kFloat64, 0, empty, empty_strides, 2, data, 0).ok());
    enc.AddStr("after", 5);
    seeds.push_back(Finish(enc));
  }
  return seeds;
}

uint64_t Interesting(Rng& rng, uint64_t size, uint64_t current) {
  switch (rng.Below(12)) {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return size;
    case 3:
      return size + 1;
    case 4:
      return size - 1;
    case 5:
      return UINT32_MAX;
    case 6:
      return UINT64_MAX;
    case 7:
      return uint64_t{1} << 63;
    case 8:
      return current + 1 + rng.Below(128);
    case 9:
      return current - 1 - rng.Below(128);
    case 10:
      return current ^ (uint64_t{1} << rng.Below(64));
    default:
      return rng.Next();
  }
}

void WriteField(std::vector<uint8_t>& buf, uint64_t off, uint64_t value, int width) {
  if (off > buf.size() || static_cast<uint64_t>(width) > buf.size() - off) return;
  std::memcpy(buf.data() + off, &value, static_cast<size_t>(width));  // little endian
}

uint64_t ReadField(const std::vector<uint8_t>& buf, uint64_t off, int width) {
  uint64_t v = 0;
  if (off <= buf.size() && static_cast<uint64_t>(width) <= buf.size() - off) {
    std::memcpy(&v, buf.data() + off, static_cast<size_t>(width));
  }
  return v;
}

void Mutate(std::vector<uint8_t>& buf, Rng& rng) {
  struct Field {
    uint64_t offset;
    int width;
  };
  static const Field kHeaderFields[] = {{0, 4},  {4, 4},  {8, 4},  {12, 4}, {16, 8},
                                        {24, 8}, {32, 8}, {40, 8}, {48, 8}};
  static const Field kNodeFields[] = {{0, 1}, {1, 1}, {2, 1},  {3, 1},
                                      {4, 4}, {8, 8}, {16, 8}, {24, 4}};
  const int rounds = 1 + static_cast<int>(rng.Below(4));
  for (int r = 0; r < rounds; ++r) {
    if (buf.empty()) return;
    const uint64_t size = buf.size();
    switch (rng.Below(9)) {
      case 0:  // flip bits
        buf[rng.Below(size)] ^= static_cast<uint8_t>(1u << rng.Below(8));
        break;
      case 1:  // a random byte
        buf[rng.Below(size)] = static_cast<uint8_t>(rng.Next());
        break;
      case 2:  // truncate
        buf.resize(rng.Below(size + 1));
        break;
      case 3:  // extend with junk
        for (uint64_t i = 0, n = 1 + rng.Below(256); i < n; ++i) {
          buf.push_back(static_cast<uint8_t>(rng.Next()));
        }
        break;
      case 4: {  // a header field
        const Field f = kHeaderFields[rng.Below(9)];
        WriteField(buf, f.offset, Interesting(rng, size, ReadField(buf, f.offset, f.width)),
                   f.width);
        break;
      }
      case 5: {  // a field of a node the header names
        const uint64_t nodes = ReadField(buf, 24, 8);
        const uint64_t count = ReadField(buf, 8, 4);
        const Field f = kNodeFields[rng.Below(8)];
        const uint64_t off = nodes + rng.Below(count + 1) * sizeof(WireNode) + f.offset;
        WriteField(buf, off, Interesting(rng, size, ReadField(buf, off, f.width)), f.width);
        break;
      }
      case 6: {  // a dimension
        const uint64_t dims = ReadField(buf, 32, 8);
        const uint64_t count = ReadField(buf, 12, 4);
        const uint64_t off = dims + rng.Below(count + 1) * 8;
        const int64_t values[] = {-1,
                                  0,
                                  1,
                                  INT64_MIN,
                                  INT64_MAX,
                                  int64_t{1} << 32,
                                  int64_t{1} << 62,
                                  static_cast<int64_t>(rng.Below(64))};
        WriteField(buf, off, static_cast<uint64_t>(values[rng.Below(8)]), 8);
        break;
      }
      case 7:  // a random 64-bit value at a random, possibly unaligned, offset
        WriteField(buf, rng.Below(size), rng.Next(), 8);
        break;
      default:  // a random 64-bit value at an aligned offset
        WriteField(buf, rng.Below(size) & ~uint64_t{7}, Interesting(rng, size, 0), 8);
        break;
    }
  }
}

// Everything a caller of an accepted batch relies on.
::testing::AssertionResult Consistent(const uint8_t* buf, size_t size, const DecodedBatch& b) {
  if (b.nodes.empty()) return ::testing::AssertionFailure() << "accepted with no nodes";
  for (size_t i = 0; i < b.nodes.size(); ++i) {
    const DecodedNode& n = b.nodes[i];
    if (static_cast<uint8_t>(n.kind) >= kNodeKindCount) {
      return ::testing::AssertionFailure() << "node " << i << " has kind " << int(n.kind);
    }
    const bool heap = n.kind == NodeKind::kArray || n.kind == NodeKind::kStr ||
                      n.kind == NodeKind::kBytes || n.kind == NodeKind::kPickled ||
                      n.kind == NodeKind::kNamedTuple || n.kind == NodeKind::kBigInt;
    if (heap && n.data == nullptr) {
      return ::testing::AssertionFailure() << "heap node " << i << " without data";
    }
    if (n.data != nullptr) {
      if (n.data < buf || n.data > buf + size ||
          n.nbytes > static_cast<uint64_t>(buf + size - n.data)) {
        return ::testing::AssertionFailure() << "node " << i << " data [" << (n.data - buf) << ", +"
                                             << n.nbytes << ") outside a buffer of " << size;
      }
    }
    if (n.kind == NodeKind::kArray) {
      if (static_cast<uint8_t>(n.dtype) >= kDTypeCount || n.ndim < 0 || n.ndim > kMaxDims ||
          uint64_t{n.shape_index} + n.ndim > b.dims.size()) {
        return ::testing::AssertionFailure() << "array node " << i << " malformed";
      }
      const uint64_t itemsize = DTypeSize(n.dtype);
      uint64_t bytes = itemsize;
      for (int k = 0; k < n.ndim; ++k) {
        const int64_t d = b.shape(n)[k];
        if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
          return ::testing::AssertionFailure() << "array node " << i << " bad shape";
        }
      }
      if (!n.strided) {
        if (bytes != n.nbytes) {
          return ::testing::AssertionFailure() << "array node " << i << " size mismatch";
        }
      } else {
        // Every element the strides reach must lie inside the node's bytes.
        if (uint64_t{n.shape_index} + 2ull * n.ndim > b.dims.size()) {
          return ::testing::AssertionFailure() << "strided node " << i << " lacks strides";
        }
        uint64_t last = 0;
        for (int k = 0; k < n.ndim; ++k) {
          const int64_t stride = b.strides(n)[k];
          uint64_t step;
          if (stride < 0 ||
              (bytes != 0 && (__builtin_mul_overflow(static_cast<uint64_t>(b.shape(n)[k] - 1),
                                                     static_cast<uint64_t>(stride), &step) ||
                              __builtin_add_overflow(last, step, &last)))) {
            return ::testing::AssertionFailure() << "strided node " << i << " bad strides";
          }
        }
        uint64_t end;
        if (bytes != 0 && (__builtin_add_overflow(last, 1, &end) ||
                           __builtin_mul_overflow(end, itemsize, &end) || end > n.nbytes)) {
          return ::testing::AssertionFailure() << "strided node " << i << " reaches element "
                                               << last << " of " << n.nbytes / itemsize;
        }
      }
    }
  }
  // Walk the tree iteratively: it must consume every node exactly, within the nesting limit.
  std::vector<uint64_t> pending;  // children still owed by each open container
  size_t pos = 0;
  pending.push_back(1);
  while (!pending.empty()) {
    if (pending.back() == 0) {
      pending.pop_back();
      continue;
    }
    --pending.back();
    if (pos >= b.nodes.size()) return ::testing::AssertionFailure() << "tree runs past nodes";
    const DecodedNode& n = b.nodes[pos++];
    uint64_t children = 0;
    if (n.kind == NodeKind::kList || n.kind == NodeKind::kTuple ||
        n.kind == NodeKind::kNamedTuple) {
      children = n.count;
    } else if (n.kind == NodeKind::kDict) {
      children = 2ull * n.count;
    }
    if (children > 0) {
      if (pending.size() > static_cast<size_t>(kMaxNesting)) {
        return ::testing::AssertionFailure() << "nesting beyond the limit";
      }
      pending.push_back(children);
    }
  }
  if (pos != b.nodes.size()) return ::testing::AssertionFailure() << "trailing nodes accepted";
  return ::testing::AssertionSuccess();
}

double FuzzSeconds() {
  const char* env = std::getenv("STOKER_FUZZ_SECONDS");
  if (env != nullptr && *env != '\0') {
    const double s = std::strtod(env, nullptr);
    if (s > 0) return s;
  }
  return 3.0;
}

volatile uint64_t g_sink = 0;  // keeps the reads of accepted data from being optimized out

uint64_t FuzzSeed() {
  const char* env = std::getenv("STOKER_FUZZ_SEED");
  if (env != nullptr && *env != '\0') return std::strtoull(env, nullptr, 0);
  return 0x5707e12ull;
}

// Mutated batches never crash the decoder, and every accepted one is consistent and in bounds.
TEST(WireFuzzTest, MutatedBatchesAreRejectedOrSafe) {
  const std::vector<std::vector<uint8_t>> seeds = SeedBatches();
  ASSERT_EQ(seeds.size(), 5u);
  const double seconds = FuzzSeconds();
  const uint64_t seed = FuzzSeed();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(seconds));
  uint64_t iterations = 0, accepted = 0, rejected = 0, other = 0;
  DecodedBatch out;
  std::vector<uint8_t> work;
  for (;; ++iterations) {
    if ((iterations & 255) == 0 && std::chrono::steady_clock::now() >= deadline) break;
    Rng rng(seed ^ (iterations * 0xd1342543de82ef95ull));
    const std::vector<uint8_t>& base = seeds[rng.Below(seeds.size())];
    work = base;
    Mutate(work, rng);
    // An exact-size heap copy, so that a read past the end is a read past an allocation.
    const size_t size = work.size();
    std::unique_ptr<uint8_t[]> exact(new uint8_t[size == 0 ? 1 : size]);
    if (size) std::memcpy(exact.get(), work.data(), size);
    Status st = DecodeBatch(exact.get(), size, &out);
    if (st.ok()) {
      ++accepted;
      ::testing::AssertionResult r = Consistent(exact.get(), size, out);
      ASSERT_TRUE(r) << "seed " << seed << " iteration " << iterations;
      // Read inside every accepted range, its last byte included: under a sanitizer a bad range
      // faults here rather than going unnoticed.
      uint64_t sum = 0;
      for (const DecodedNode& n : out.nodes) {
        if (n.data == nullptr || n.nbytes == 0) continue;
        for (uint64_t k = 0; k < n.nbytes; k += 61) sum += n.data[k];
        sum += n.data[n.nbytes - 1];
      }
      g_sink = g_sink + sum;
    } else if (st.code() == Code::kCorrupt) {
      ++rejected;
    } else {
      ++other;
    }
  }
  std::printf("wire fuzz: seed %#llx, %.1f s, %llu iterations, %llu accepted, %llu rejected\n",
              static_cast<unsigned long long>(seed), seconds,
              static_cast<unsigned long long>(iterations),
              static_cast<unsigned long long>(accepted), static_cast<unsigned long long>(rejected));
  RecordProperty("iterations", std::to_string(iterations));
  EXPECT_EQ(other, 0u) << "DecodeBatch must report damage as kCorrupt";
  EXPECT_GT(iterations, 1000u);
  // Both outcomes occur: the mutations are neither all harmless nor all fatal.
  EXPECT_GT(accepted, iterations / 100);
  EXPECT_GT(rejected, iterations / 4);
}

}  // namespace
}  // namespace stoker
