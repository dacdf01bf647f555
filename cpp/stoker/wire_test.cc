// Tests of the wire format: WireEncoder -> DecodeBatch round trips, the decoder's validation of
// hostile input, and CopyToContiguous against a naive reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "stoker/strided_copy.h"
#include "stoker/wire_decoder.h"
#include "stoker/wire_encoder.h"
#include "stoker/wire_format.h"

namespace stoker {
namespace {

// A 64-byte aligned buffer, as a slot payload is.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t size) : size_(size) {
    data_ = static_cast<uint8_t*>(std::aligned_alloc(64, (size + 64) / 64 * 64));
    std::memset(data_, 0xcd, (size + 64) / 64 * 64);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_;
  size_t size_;
};

// Lays out and writes `enc` into a buffer of exactly the size it asks for.
std::unique_ptr<AlignedBuffer> Encode(WireEncoder& enc) {
  const uint64_t total = enc.Layout();
  auto buf = std::make_unique<AlignedBuffer>(total);
  Status st = enc.Write(buf->data(), buf->size());
  EXPECT_TRUE(st.ok()) << st.ToString();
  return buf;
}

BatchHeader ReadHeader(const uint8_t* buf) {
  BatchHeader h;
  std::memcpy(&h, buf, sizeof(h));
  return h;
}

std::string AsString(const DecodedNode& n) {
  return std::string(reinterpret_cast<const char*>(n.data), n.nbytes);
}

std::vector<int64_t> Shape(const DecodedBatch& b, const DecodedNode& n) {
  return std::vector<int64_t>(b.shape(n), b.shape(n) + n.ndim);
}

// The table of dtype sizes and names.
TEST(WireFormatTest, DTypeSizesAndNames) {
  const size_t sizes[kDTypeCount] = {1, 1, 1, 2, 4, 8, 2, 4, 8, 2, 2, 4, 8, 8, 16};
  const char* names[kDTypeCount] = {"bool",     "uint8",   "int8",    "int16",     "int32",
                                    "int64",    "uint16",  "uint32",  "uint64",    "float16",
                                    "bfloat16", "float32", "float64", "complex64", "complex128"};
  for (uint8_t d = 0; d < kDTypeCount; ++d) {
    EXPECT_EQ(DTypeSize(static_cast<DType>(d)), sizes[d]) << int{d};
    EXPECT_STREQ(DTypeName(static_cast<DType>(d)), names[d]);
  }
  EXPECT_EQ(DTypeSize(static_cast<DType>(kDTypeCount)), 0u);
  EXPECT_STREQ(DTypeName(static_cast<DType>(kDTypeCount)), "invalid");
}

// Every dtype round trips: kind, dtype, flags, shape, byte count, bytes, 64-byte alignment.
TEST(WireRoundTripTest, EveryDType) {
  for (uint8_t d = 0; d < kDTypeCount; ++d) {
    const DType dtype = static_cast<DType>(d);
    const size_t itemsize = DTypeSize(dtype);
    const int64_t shape[2] = {2, 3};
    std::vector<uint8_t> bytes(6 * itemsize);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 13 + d);
    ArraySource src{bytes.data(), shape, nullptr, 2};
    WireEncoder enc;
    const uint8_t flags = (d % 2) ? kArrayAsNumpy : 0;
    ASSERT_TRUE(enc.AddArray(dtype, flags, shape, 2, &src, 1).ok());
    auto buf = Encode(enc);
    DecodedBatch out;
    Status st = DecodeBatch(buf->data(), buf->size(), &out);
    ASSERT_TRUE(st.ok()) << DTypeName(dtype) << ": " << st.ToString();
    ASSERT_EQ(out.nodes.size(), 1u);
    const DecodedNode& n = out.nodes[0];
    EXPECT_EQ(n.kind, NodeKind::kArray);
    EXPECT_EQ(n.dtype, dtype);
    EXPECT_EQ(n.flags, flags);
    EXPECT_EQ(Shape(out, n), (std::vector<int64_t>{2, 3}));
    ASSERT_EQ(n.nbytes, bytes.size());
    EXPECT_EQ(std::memcmp(n.data, bytes.data(), bytes.size()), 0) << DTypeName(dtype);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(n.data) % kArrayAlignment, 0u);
  }
}

// Every node kind, nested: dict of list/tuple/namedtuple holding scalars, strings, bytes, pickled
// blobs and big ints. The pre-order, counts and values come back exactly.
TEST(WireRoundTripTest, NestedContainersAndScalars) {
  const std::string k_a = "a", k_b = "b", k_c = "c", hello = "h\xc3\xa9llo";
  const std::string raw("\x00\x01\xff", 3);
  WireEncoder enc;
  enc.AddContainer(NodeKind::kDict, 4);                    // 0
  enc.AddStr(k_a.data(), k_a.size());                      // 1
  enc.AddContainer(NodeKind::kList, 5);                    // 2
  enc.AddNone();                                           // 3
  enc.AddBool(true);                                       // 4
  enc.AddBool(false);                                      // 5
  enc.AddInt(std::numeric_limits<int64_t>::min());         // 6
  enc.AddFloat(-2.5);                                      // 7
  enc.AddStr(k_b.data(), k_b.size());                      // 8
  enc.AddContainer(NodeKind::kTuple, 3);                   // 9
  enc.AddStr(hello.data(), hello.size());                  // 10
  enc.AddBytes(raw.data(), raw.size());                    // 11
  enc.AddStr("", 0);                                       // 12
  enc.AddStr(k_c.data(), k_c.size());                      // 13
  enc.AddNamedTuple(2, "PICKLED-TYPE");                    // 14
  enc.AddPickled(std::string("\x80\x04pickle\x00.", 10));  // 15
  enc.AddBigInt("-123456789012345678901234567890");        // 16
  enc.AddInt(4);                                           // 17
  enc.AddContainer(NodeKind::kList, 0);                    // 18
  ASSERT_EQ(enc.node_count(), 19u);
  auto buf = Encode(enc);

  DecodedBatch out;
  Status st = DecodeBatch(buf->data(), buf->size(), &out);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(out.nodes.size(), 19u);
  const NodeKind kinds[19] = {
      NodeKind::kDict,   NodeKind::kStr,   NodeKind::kList,       NodeKind::kNone,
      NodeKind::kBool,   NodeKind::kBool,  NodeKind::kInt,        NodeKind::kFloat,
      NodeKind::kStr,    NodeKind::kTuple, NodeKind::kStr,        NodeKind::kBytes,
      NodeKind::kStr,    NodeKind::kStr,   NodeKind::kNamedTuple, NodeKind::kPickled,
      NodeKind::kBigInt, NodeKind::kInt,   NodeKind::kList};
  for (int i = 0; i < 19; ++i) EXPECT_EQ(out.nodes[i].kind, kinds[i]) << "node " << i;
  EXPECT_EQ(out.nodes[0].count, 4u);
  EXPECT_EQ(AsString(out.nodes[1]), "a");
  EXPECT_EQ(out.nodes[2].count, 5u);
  EXPECT_EQ(out.nodes[4].int_value, 1);
  EXPECT_EQ(out.nodes[5].int_value, 0);
  EXPECT_EQ(out.nodes[6].int_value, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(out.nodes[7].float_value, -2.5);
  EXPECT_EQ(out.nodes[9].count, 3u);
  EXPECT_EQ(AsString(out.nodes[10]), hello);
  EXPECT_EQ(AsString(out.nodes[11]), raw);
  EXPECT_EQ(out.nodes[12].nbytes, 0u);
  EXPECT_EQ(out.nodes[14].count, 2u);
  EXPECT_EQ(AsString(out.nodes[14]), "PICKLED-TYPE");
  EXPECT_EQ(AsString(out.nodes[15]), std::string("\x80\x04pickle\x00.", 10));
  EXPECT_EQ(AsString(out.nodes[16]), "-123456789012345678901234567890");
  EXPECT_EQ(out.nodes[17].int_value, 4);
  EXPECT_EQ(out.nodes[18].count, 0u);
  // Heap-backed nodes point inside the buffer; inline scalars carry no data pointer.
  for (const DecodedNode& n : out.nodes) {
    if (n.data == nullptr) continue;
    EXPECT_GE(n.data, buf->data());
    EXPECT_LE(n.data + n.nbytes, buf->data() + buf->size());
  }
  EXPECT_EQ(out.nodes[6].data, nullptr);
}

// Floats keep their exact bits, including NaN payloads, infinities and -0.0.
TEST(WireRoundTripTest, FloatBitsArePreserved) {
  const double values[] = {0.0,
                           -0.0,
                           std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::denorm_min(),
                           1e308};
  WireEncoder enc;
  enc.AddContainer(NodeKind::kTuple, 6);
  for (double v : values) enc.AddFloat(v);
  auto buf = Encode(enc);
  DecodedBatch out;
  ASSERT_TRUE(DecodeBatch(buf->data(), buf->size(), &out).ok());
  for (int i = 0; i < 6; ++i) {
    uint64_t a, b;
    std::memcpy(&a, &values[i], 8);
    std::memcpy(&b, &out.nodes[i + 1].float_value, 8);
    EXPECT_EQ(a, b) << i;
  }
}

// A stacked array filled from several sources: contiguous, transposed (non-contiguous), strided
// 1-d, and zero-size pieces land in order, each at its stacked position.
TEST(WireRoundTripTest, StackedArrayFromMixedSources) {
  // A: contiguous 2x3.
  const float a[6] = {0, 1, 2, 3, 4, 5};
  const int64_t a_shape[2] = {2, 3};
  // B: the transpose of a 3x2 array, a 2x3 view with byte strides {4, 8}.
  const float b_base[6] = {100, 101, 102, 103, 104, 105};  // 3x2: [[100,101],[102,103],[104,105]]
  const int64_t b_shape[2] = {2, 3};
  const int64_t b_strides[2] = {4, 8};
  // C: zero rows.
  const int64_t c_shape[2] = {0, 3};
  // D: every other element of a 1-d array.
  const float d_base[6] = {200, -1, 201, -1, 202, -1};
  const int64_t d_shape[1] = {3};
  const int64_t d_strides[1] = {8};
  const ArraySource sources[4] = {
      {reinterpret_cast<const uint8_t*>(a), a_shape, nullptr, 2},
      {reinterpret_cast<const uint8_t*>(b_base), b_shape, b_strides, 2},
      {nullptr, c_shape, nullptr, 2},
      {reinterpret_cast<const uint8_t*>(d_base), d_shape, d_strides, 1},
  };
  const int64_t shape[2] = {5, 3};
  WireEncoder enc;
  enc.AddContainer(NodeKind::kList, 2);
  enc.AddInt(-7);
  ASSERT_TRUE(enc.AddArray(DType::kFloat32, 0, shape, 2, sources, 4).ok());
  auto buf = Encode(enc);
  DecodedBatch out;
  Status st = DecodeBatch(buf->data(), buf->size(), &out);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const DecodedNode& n = out.nodes[2];
  ASSERT_EQ(n.kind, NodeKind::kArray);
  EXPECT_EQ(Shape(out, n), (std::vector<int64_t>{5, 3}));
  ASSERT_EQ(n.nbytes, 15 * sizeof(float));
  const float expected[15] = {0, 1, 2, 3, 4, 5, 100, 102, 104, 101, 103, 105, 200, 201, 202};
  float got[15];
  std::memcpy(got, n.data, sizeof(got));
  for (int i = 0; i < 15; ++i) EXPECT_EQ(got[i], expected[i]) << "element " << i;
  // Sources were borrowed, not changed.
  EXPECT_EQ(b_base[1], 101);
}

// Zero-size arrays (no sources, or only empty sources) and 0-d arrays round trip; the arrays
// that follow stay aligned and intact.
TEST(WireRoundTripTest, ZeroSizeAndScalarArrays) {
  const int64_t empty_shape[2] = {0, 5};
  const int64_t cols_shape[2] = {3, 0};
  const int64_t piece_shape[1] = {0};
  const ArraySource empty_pieces[3] = {{nullptr, piece_shape, nullptr, 1},
                                       {nullptr, piece_shape, nullptr, 1},
                                       {nullptr, piece_shape, nullptr, 1}};
  const double scalar = 3.25;
  const ArraySource scalar_src{reinterpret_cast<const uint8_t*>(&scalar), nullptr, nullptr, 0};
  const int16_t tail[3] = {-1, 2, -3};
  const int64_t tail_shape[1] = {3};
  const ArraySource tail_src{reinterpret_cast<const uint8_t*>(tail), tail_shape, nullptr, 1};

  WireEncoder enc;
  enc.AddContainer(NodeKind::kTuple, 4);
  ASSERT_TRUE(enc.AddArray(DType::kFloat32, 0, empty_shape, 2, nullptr, 0).ok());
  ASSERT_TRUE(enc.AddArray(DType::kInt64, 0, cols_shape, 2, empty_pieces, 3).ok());
  ASSERT_TRUE(enc.AddArray(DType::kFloat64, 0, nullptr, 0, &scalar_src, 1).ok());
  ASSERT_TRUE(enc.AddArray(DType::kInt16, 0, tail_shape, 1, &tail_src, 1).ok());
  auto buf = Encode(enc);
  DecodedBatch out;
  Status st = DecodeBatch(buf->data(), buf->size(), &out);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(out.nodes.size(), 5u);
  EXPECT_EQ(Shape(out, out.nodes[1]), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(out.nodes[1].nbytes, 0u);
  EXPECT_EQ(Shape(out, out.nodes[2]), (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(out.nodes[2].nbytes, 0u);
  EXPECT_EQ(out.nodes[3].ndim, 0);
  ASSERT_EQ(out.nodes[3].nbytes, 8u);
  double s;
  std::memcpy(&s, out.nodes[3].data, 8);
  EXPECT_EQ(s, 3.25);
  ASSERT_EQ(out.nodes[4].nbytes, 6u);
  EXPECT_EQ(std::memcmp(out.nodes[4].data, tail, 6), 0);
  for (int i = 1; i <= 4; ++i) {
    EXPECT_EQ((out.nodes[i].data - buf->data()) % 64, 0) << i;
  }
}

// Arrays are 64-byte aligned however many odd-sized strings and arrays come before them, both
// relative to the batch and in memory when the batch itself is aligned.
TEST(WireRoundTripTest, ArraysAreAlignedTo64Bytes) {
  std::vector<std::vector<uint8_t>> arrays;
  std::vector<std::string> strings;
  for (int i = 0; i < 10; ++i) {
    arrays.emplace_back(static_cast<size_t>(i * 7 + 1), static_cast<uint8_t>(i));
    strings.emplace_back(static_cast<size_t>(i * 3 + 1), static_cast<char>('a' + i));
  }
  std::vector<int64_t> shapes(10);
  WireEncoder enc;
  enc.AddContainer(NodeKind::kList, 20);
  for (int i = 0; i < 10; ++i) {
    enc.AddStr(strings[i].data(), strings[i].size());
    shapes[i] = static_cast<int64_t>(arrays[i].size());
    ArraySource src{arrays[i].data(), &shapes[i], nullptr, 1};
    ASSERT_TRUE(enc.AddArray(DType::kUInt8, 0, &shapes[i], 1, &src, 1).ok());
  }
  auto buf = Encode(enc);
  const BatchHeader h = ReadHeader(buf->data());
  EXPECT_EQ(h.heap_offset % 64, 0u);
  DecodedBatch out;
  ASSERT_TRUE(DecodeBatch(buf->data(), buf->size(), &out).ok());
  for (int i = 0; i < 10; ++i) {
    const DecodedNode& s = out.nodes[1 + 2 * i];
    const DecodedNode& a = out.nodes[2 + 2 * i];
    EXPECT_EQ(AsString(s), strings[i]);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 64, 0u) << "array " << i;
    EXPECT_EQ(static_cast<uint64_t>(a.data - buf->data()) % 64, 0u);
    ASSERT_EQ(a.nbytes, arrays[i].size());
    EXPECT_EQ(std::memcmp(a.data, arrays[i].data(), a.nbytes), 0);
  }
}

// Owned arrays keep their bytes inside the encoder; a wrong byte count is refused.
TEST(WireRoundTripTest, OwnedArray) {
  const int64_t values[4] = {1, -2, 3, INT64_MAX};
  const int64_t shape[2] = {2, 2};
  WireEncoder enc;
  {
    std::string bytes(reinterpret_cast<const char*>(values), sizeof(values));
    ASSERT_TRUE(enc.AddOwnedArray(DType::kInt64, 0, shape, 2, std::move(bytes)).ok());
  }
  EXPECT_EQ(enc.AddOwnedArray(DType::kInt64, 0, shape, 2, std::string(24, '\0')).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(enc.node_count(), 1u);
  auto buf = Encode(enc);
  DecodedBatch out;
  ASSERT_TRUE(DecodeBatch(buf->data(), buf->size(), &out).ok());
  ASSERT_EQ(out.nodes[0].nbytes, sizeof(values));
  EXPECT_EQ(std::memcmp(out.nodes[0].data, values, sizeof(values)), 0);
}

// AddArray refuses mismatched sources, too many dims, negative dims and overflowing shapes, and
// a refused array leaves the encoder able to encode what else it was given.
TEST(WireEncoderTest, AddArrayRejectsBadShapes) {
  const float data[4] = {1, 2, 3, 4};
  const int64_t four[1] = {4};
  const int64_t three[1] = {3};
  const ArraySource src{reinterpret_cast<const uint8_t*>(data), four, nullptr, 1};
  WireEncoder enc;
  enc.AddContainer(NodeKind::kList, 1);
  EXPECT_EQ(enc.AddArray(DType::kFloat32, 0, three, 1, &src, 1).code(), Code::kInvalidArgument);
  std::vector<int64_t> many(33, 1);
  EXPECT_EQ(enc.AddArray(DType::kFloat32, 0, many.data(), 33, &src, 1).code(), Code::kTooLarge);
  const int64_t negative[2] = {-1, -4};
  EXPECT_EQ(enc.AddArray(DType::kFloat32, 0, negative, 2, &src, 1).code(), Code::kInvalidArgument);
  const int64_t huge[2] = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_EQ(enc.AddArray(DType::kFloat32, 0, huge, 2, &src, 1).code(), Code::kTooLarge);
  const int64_t bytes_overflow[1] = {int64_t{1} << 62};
  EXPECT_EQ(enc.AddArray(DType::kFloat64, 0, bytes_overflow, 1, &src, 1).code(), Code::kTooLarge);
  EXPECT_EQ(enc.node_count(), 1u);
  // 32 dims is the maximum and is accepted.
  std::vector<int64_t> ones(32, 1);
  ones[31] = 4;
  ASSERT_TRUE(enc.AddArray(DType::kFloat32, 0, ones.data(), 32, &src, 1).ok());
  auto buf = Encode(enc);
  DecodedBatch out;
  Status st = DecodeBatch(buf->data(), buf->size(), &out);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(out.nodes.size(), 2u);
  EXPECT_EQ(out.nodes[1].ndim, 32);
  EXPECT_EQ(std::memcmp(out.nodes[1].data, data, sizeof(data)), 0);
}

// Write refuses a buffer one byte too small (kTooLarge) without touching it, and needs Layout().
TEST(WireEncoderTest, WriteChecksCapacityAndLayout) {
  WireEncoder enc;
  EXPECT_EQ(enc.Write(nullptr, 0).code(), Code::kInvalidArgument);  // no Layout() yet
  const std::string s(100, 's');
  enc.AddContainer(NodeKind::kTuple, 2);
  enc.AddStr(s.data(), s.size());
  enc.AddInt(3);
  const uint64_t total = enc.Layout();
  EXPECT_GE(total, sizeof(BatchHeader) + 3 * sizeof(WireNode) + 100);
  AlignedBuffer buf(total);
  std::vector<uint8_t> before(buf.data(), buf.data() + total);
  Status st = enc.Write(buf.data(), total - 1);
  EXPECT_EQ(st.code(), Code::kTooLarge) << st.ToString();
  EXPECT_EQ(std::memcmp(buf.data(), before.data(), total), 0);
  ASSERT_TRUE(enc.Write(buf.data(), total).ok());
  EXPECT_EQ(ReadHeader(buf.data()).total_bytes, total);
  // A node added after Layout() invalidates it.
  enc.AddNone();
  EXPECT_EQ(enc.Write(buf.data(), total).code(), Code::kInvalidArgument);
}

// Clear() forgets every node, so the encoder can be reused for the next batch.
TEST(WireEncoderTest, ClearResets) {
  WireEncoder enc;
  enc.AddContainer(NodeKind::kList, 2);
  enc.AddPickled("xyz");
  enc.AddInt(1);
  enc.Layout();
  enc.Clear();
  EXPECT_EQ(enc.node_count(), 0u);
  EXPECT_EQ(enc.Write(nullptr, 0).code(), Code::kInvalidArgument);
  enc.AddInt(99);
  auto buf = Encode(enc);
  DecodedBatch out;
  ASSERT_TRUE(DecodeBatch(buf->data(), buf->size(), &out).ok());
  ASSERT_EQ(out.nodes.size(), 1u);
  EXPECT_EQ(out.nodes[0].int_value, 99);
}

// The header describes the sections exactly.
TEST(WireEncoderTest, HeaderFields) {
  const int64_t shape[3] = {1, 2, 2};
  const uint8_t data[4] = {1, 2, 3, 4};
  const ArraySource src{data, shape, nullptr, 3};
  WireEncoder enc;
  enc.AddContainer(NodeKind::kList, 2);
  enc.AddBytes("abc", 3);
  ASSERT_TRUE(enc.AddArray(DType::kUInt8, 0, shape, 3, &src, 1).ok());
  auto buf = Encode(enc);
  const BatchHeader h = ReadHeader(buf->data());
  EXPECT_EQ(h.magic, kBatchMagic);
  EXPECT_EQ(h.version, kWireVersion);
  EXPECT_EQ(h.node_count, 3u);
  EXPECT_EQ(h.dim_count, 3u);
  EXPECT_EQ(h.nodes_offset, sizeof(BatchHeader));
  EXPECT_EQ(h.dims_offset, sizeof(BatchHeader) + 3 * sizeof(WireNode));
  EXPECT_EQ(h.heap_offset, 192u);  // 64 + 3 * 32 + 3 * 8 = 184, aligned up to 192
  EXPECT_EQ(h.heap_offset + h.heap_bytes, h.total_bytes);
  EXPECT_EQ(h.total_bytes, buf->size());
}

// Writes one strided float32[3] array (12 bytes of extent) into a buffer with 4 KB of poisoned
// slack past the batch; returns how many slack bytes Write() changed. The source is 16 times
// larger than the extent so that an overlong copy reads only memory it owns.
size_t StridedWriteOverrun(uint64_t* total_out = nullptr) {
  static const std::vector<float> source(3 * 16, 2.5f);
  const int64_t shape[1] = {3};
  const int64_t strides[1] = {1};
  WireEncoder enc;
  if (!enc.AddStridedArray(DType::kFloat32, 0, shape, strides, 1,
                           reinterpret_cast<const uint8_t*>(source.data()), 12)
           .ok()) {
    return 0;
  }
  const uint64_t total = enc.Layout();
  if (total_out != nullptr) *total_out = total;
  std::vector<uint8_t> dst(total + 4096, 0xcd);
  if (!enc.Write(dst.data(), total).ok()) return 0;
  size_t changed = 0;
  for (size_t i = total; i < dst.size(); ++i) changed += dst[i] != 0xcd;
  return changed;
}

// Write() copies exactly the extent of a strided array: not one byte past the batch it laid out.
// (A regression test: AddStridedArray stores the extent as a run of bytes; Write() once
// multiplied that count by the node's dtype size.)
TEST(WireEncoderTest, StridedArrayWritesOnlyItsExtent) {
  uint64_t total = 0;
  const size_t changed = StridedWriteOverrun(&total);
  EXPECT_EQ(changed, 0u) << "Write() wrote " << changed << " bytes past the " << total
                         << "-byte batch it laid out (a float32 extent of 12 bytes was copied "
                            "as 12 * 4 = 48 bytes)";
}

// A strided array keeps its layout: a channels-last float32 block seen as [N, C, HW] with element
// strides {12, 1, 3} travels as the 96 bytes it spans, and decodes with the same shape and
// strides, flagged as strided.
TEST(WireRoundTripTest, StridedArrayKeepsItsLayout) {
  float memory[2][4][3];  // N, HW, C in memory
  for (int n = 0; n < 2; ++n) {
    for (int hw = 0; hw < 4; ++hw) {
      for (int c = 0; c < 3; ++c) memory[n][hw][c] = static_cast<float>(n * 100 + c * 10 + hw);
    }
  }
  const int64_t shape[3] = {2, 3, 4};
  const int64_t strides[3] = {12, 1, 3};
  WireEncoder enc;
  enc.AddContainer(NodeKind::kList, 2);
  enc.AddStr("x", 1);
  ASSERT_TRUE(enc.AddStridedArray(DType::kFloat32, kArrayAsNumpy, shape, strides, 3,
                                  reinterpret_cast<const uint8_t*>(memory), sizeof(memory))
                  .ok());
  auto buf = Encode(enc);
  DecodedBatch out;
  Status st = DecodeBatch(buf->data(), buf->size(), &out);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(out.nodes.size(), 3u);
  const DecodedNode& a = out.nodes[2];
  ASSERT_EQ(a.kind, NodeKind::kArray);
  EXPECT_TRUE(a.strided);
  EXPECT_EQ(a.flags, kArrayAsNumpy | kArrayStrided);
  EXPECT_EQ(a.dtype, DType::kFloat32);
  EXPECT_EQ(Shape(out, a), (std::vector<int64_t>{2, 3, 4}));
  ASSERT_NE(out.strides(a), nullptr);
  EXPECT_EQ(std::vector<int64_t>(out.strides(a), out.strides(a) + 3),
            (std::vector<int64_t>{12, 1, 3}));
  ASSERT_EQ(a.nbytes, sizeof(memory));
  EXPECT_EQ(std::memcmp(a.data, memory, sizeof(memory)), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 64, 0u);
  // Logical element [n, c, hw] read through the decoded strides.
  const float* f = reinterpret_cast<const float*>(a.data);
  for (int n = 0; n < 2; ++n) {
    for (int c = 0; c < 3; ++c) {
      for (int hw = 0; hw < 4; ++hw) {
        EXPECT_EQ(f[n * 12 + c * 1 + hw * 3], static_cast<float>(n * 100 + c * 10 + hw));
      }
    }
  }
  // A stacked array beside it is not strided and has no strides.
  WireEncoder plain;
  const int64_t two[1] = {2};
  const ArraySource src{reinterpret_cast<const uint8_t*>(memory), two, nullptr, 1};
  ASSERT_TRUE(plain.AddArray(DType::kFloat32, 0, two, 1, &src, 1).ok());
  auto pbuf = Encode(plain);
  ASSERT_TRUE(DecodeBatch(pbuf->data(), pbuf->size(), &out).ok());
  EXPECT_FALSE(out.nodes[0].strided);
  EXPECT_EQ(out.strides(out.nodes[0]), nullptr);
}

// Expanded (zero-stride) and empty strided arrays round trip.
TEST(WireRoundTripTest, ExpandedAndEmptyStridedArrays) {
  const int32_t row[3] = {5, 6, 7};
  const int64_t shape[2] = {4, 3};
  const int64_t strides[2] = {0, 1};
  const int64_t empty_shape[2] = {0, 5};
  const int64_t empty_strides[2] = {9, 1};
  WireEncoder enc;
  enc.AddContainer(NodeKind::kTuple, 2);
  ASSERT_TRUE(enc.AddStridedArray(DType::kInt32, 0, shape, strides, 2,
                                  reinterpret_cast<const uint8_t*>(row), sizeof(row))
                  .ok());
  ASSERT_TRUE(
      enc.AddStridedArray(DType::kInt32, 0, empty_shape, empty_strides, 2, nullptr, 0).ok());
  auto buf = Encode(enc);
  DecodedBatch out;
  Status st = DecodeBatch(buf->data(), buf->size(), &out);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const DecodedNode& e = out.nodes[1];
  EXPECT_TRUE(e.strided);
  EXPECT_EQ(Shape(out, e), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(out.strides(e)[0], 0);
  ASSERT_EQ(e.nbytes, sizeof(row));
  EXPECT_EQ(std::memcmp(e.data, row, sizeof(row)), 0);
  const DecodedNode& z = out.nodes[2];
  EXPECT_TRUE(z.strided);
  EXPECT_EQ(Shape(out, z), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(z.nbytes, 0u);
}

// A single strided float32[2, 3] array with element strides {3, 1}, damaged one field at a time.
class StridedRejectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static const float data[6] = {0, 1, 2, 3, 4, 5};
    static const int64_t shape[2] = {2, 3};
    static const int64_t strides[2] = {3, 1};
    ASSERT_TRUE(enc_.AddStridedArray(DType::kFloat32, 0, shape, strides, 2,
                                     reinterpret_cast<const uint8_t*>(data), sizeof(data))
                    .ok());
    buf_ = Encode(enc_);
  }
  // dims: shape[0], shape[1], stride[0], stride[1]
  void SetDim(int i, int64_t v) {
    std::memcpy(buf_->data() + ReadHeader(buf_->data()).dims_offset + i * 8, &v, 8);
  }
  void SetNbytes(uint64_t v) {
    std::memcpy(buf_->data() + sizeof(BatchHeader) + offsetof(WireNode, nbytes), &v, 8);
  }
  void ExpectCorrupt(const std::string& what) {
    DecodedBatch out;
    Status st = DecodeBatch(buf_->data(), buf_->size(), &out);
    EXPECT_EQ(st.code(), Code::kCorrupt) << st.ToString();
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  }
  WireEncoder enc_;
  std::unique_ptr<AlignedBuffer> buf_;
};

TEST_F(StridedRejectTest, ValidBeforeDamage) {
  DecodedBatch out;
  EXPECT_TRUE(DecodeBatch(buf_->data(), buf_->size(), &out).ok());
}

TEST_F(StridedRejectTest, NegativeStride) {
  SetDim(3, -1);
  ExpectCorrupt("negative stride");
}

// The last element the strides reach, (1 * 4 + 2 * 1) = 6, is past the 6 elements that travelled.
TEST_F(StridedRejectTest, StridesReachOutsideTheBytes) {
  SetDim(2, 4);
  ExpectCorrupt("strides reach outside");
}

TEST_F(StridedRejectTest, ByteCountNotAMultipleOfItemsize) {
  SetNbytes(22);
  ExpectCorrupt("strides reach outside");
}

TEST_F(StridedRejectTest, StridesOverflow) {
  SetDim(0, 5);
  SetDim(2, int64_t{1} << 62);  // (5 - 1) * 2^62 = 2^64
  ExpectCorrupt("strides overflow");
}

// A shape that is far too large for the bytes is caught through the strides.
TEST_F(StridedRejectTest, ShapeTooLargeForTheBytes) {
  SetDim(0, 1000);
  ExpectCorrupt("strides reach outside");
}

// The decoder copies shapes out of the buffer: a later change to the buffer cannot alter them.
TEST(WireDecoderTest, ShapesAreCopiedOut) {
  const int64_t shape[2] = {2, 2};
  const uint8_t data[4] = {1, 2, 3, 4};
  const ArraySource src{data, shape, nullptr, 2};
  WireEncoder enc;
  ASSERT_TRUE(enc.AddArray(DType::kUInt8, 0, shape, 2, &src, 1).ok());
  auto buf = Encode(enc);
  DecodedBatch out;
  out.nodes.resize(5);  // stale content from a previous decode is replaced
  ASSERT_TRUE(DecodeBatch(buf->data(), buf->size(), &out).ok());
  ASSERT_EQ(out.nodes.size(), 1u);
  const BatchHeader h = ReadHeader(buf->data());
  const int64_t bogus = 1000;
  std::memcpy(buf->data() + h.dims_offset, &bogus, sizeof(bogus));
  EXPECT_EQ(Shape(out, out.nodes[0]), (std::vector<int64_t>{2, 2}));
}

// A valid batch that the rejection tests below damage one field at a time:
//   0 tuple(4)  1 float32[2,3]  2 str "hello"  3 int64[4]  4 list(1)  5 int 5
class WireDecoderRejectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static const float f[6] = {1, 2, 3, 4, 5, 6};
    static const int64_t f_shape[2] = {2, 3};
    static const int64_t i[4] = {7, 8, 9, 10};
    static const int64_t i_shape[1] = {4};
    const ArraySource fs{reinterpret_cast<const uint8_t*>(f), f_shape, nullptr, 2};
    const ArraySource is{reinterpret_cast<const uint8_t*>(i), i_shape, nullptr, 1};
    enc_.AddContainer(NodeKind::kTuple, 4);
    ASSERT_TRUE(enc_.AddArray(DType::kFloat32, 0, f_shape, 2, &fs, 1).ok());
    enc_.AddStr("hello", 5);
    ASSERT_TRUE(enc_.AddArray(DType::kInt64, 0, i_shape, 1, &is, 1).ok());
    enc_.AddContainer(NodeKind::kList, 1);
    enc_.AddInt(5);
    buf_ = Encode(enc_);
    DecodedBatch out;
    ASSERT_TRUE(DecodeBatch(buf_->data(), buf_->size(), &out).ok());  // valid before damage
  }

  BatchHeader Header() const { return ReadHeader(buf_->data()); }
  void SetHeader(const BatchHeader& h) { std::memcpy(buf_->data(), &h, sizeof(h)); }
  WireNode Node(int i) const {
    WireNode n;
    std::memcpy(&n, buf_->data() + Header().nodes_offset + i * sizeof(WireNode), sizeof(n));
    return n;
  }
  void SetNode(int i, const WireNode& n) {
    std::memcpy(buf_->data() + Header().nodes_offset + i * sizeof(WireNode), &n, sizeof(n));
  }
  void SetDim(int i, int64_t v) {
    std::memcpy(buf_->data() + Header().dims_offset + i * sizeof(int64_t), &v, sizeof(v));
  }

  // Decodes the damaged buffer; expects kCorrupt with `what` in the message.
  void ExpectCorrupt(const std::string& what, size_t size = 0) {
    DecodedBatch out;
    Status st = DecodeBatch(buf_->data(), size ? size : buf_->size(), &out);
    EXPECT_EQ(st.code(), Code::kCorrupt) << st.ToString();
    EXPECT_NE(st.message().find(what), std::string::npos)
        << "expected \"" << what << "\" in: " << st.message();
  }

  WireEncoder enc_;
  std::unique_ptr<AlignedBuffer> buf_;
};

TEST_F(WireDecoderRejectTest, BufferSmallerThanHeader) {
  ExpectCorrupt("smaller than its header", sizeof(BatchHeader) - 1);
}

TEST_F(WireDecoderRejectTest, BadMagic) {
  BatchHeader h = Header();
  h.magic ^= 0x100;
  SetHeader(h);
  ExpectCorrupt("bad magic");
}

TEST_F(WireDecoderRejectTest, WrongVersion) {
  BatchHeader h = Header();
  h.version = kWireVersion + 1;
  SetHeader(h);
  ExpectCorrupt("wire version 2");
}

// total_bytes beyond the buffer, whether the header grows or the buffer is shorter.
TEST_F(WireDecoderRejectTest, TotalBytesBeyondSize) {
  ExpectCorrupt("claims more bytes", buf_->size() - 1);
  BatchHeader h = Header();
  h.total_bytes = buf_->size() + 1;
  SetHeader(h);
  ExpectCorrupt("claims more bytes");
}

TEST_F(WireDecoderRejectTest, NoNodes) {
  BatchHeader h = Header();
  h.node_count = 0;
  SetHeader(h);
  ExpectCorrupt("no nodes");
}

TEST_F(WireDecoderRejectTest, MisalignedTables) {
  BatchHeader h = Header();
  h.nodes_offset += 4;
  SetHeader(h);
  ExpectCorrupt("misaligned tables");
}

// The node table may not run past total_bytes, including through 64-bit wrap-around.
TEST_F(WireDecoderRejectTest, NodeTableOutOfBounds) {
  BatchHeader h = Header();
  h.node_count = static_cast<uint32_t>(buf_->size() / sizeof(WireNode));
  SetHeader(h);
  ExpectCorrupt("node table out of bounds");
  h.node_count = 6;
  h.nodes_offset = UINT64_MAX - 7;
  SetHeader(h);
  ExpectCorrupt("node table out of bounds");
}

TEST_F(WireDecoderRejectTest, DimsTableOutOfBounds) {
  BatchHeader h = Header();
  h.dim_count = 0x7fffffff;
  SetHeader(h);
  ExpectCorrupt("dimension table out of bounds");
}

TEST_F(WireDecoderRejectTest, HeapOutOfBounds) {
  BatchHeader h = Header();
  h.heap_bytes = h.total_bytes;
  SetHeader(h);
  ExpectCorrupt("heap out of bounds");
  h = Header();
  h.heap_bytes = 64;
  h.heap_offset = UINT64_MAX - 31;
  SetHeader(h);
  ExpectCorrupt("heap out of bounds");
}

TEST_F(WireDecoderRejectTest, UnknownKind) {
  WireNode n = Node(5);
  n.kind = kNodeKindCount;
  SetNode(5, n);
  ExpectCorrupt("unknown node kind 13");
  n.kind = 255;
  SetNode(5, n);
  ExpectCorrupt("unknown node kind 255");
}

TEST_F(WireDecoderRejectTest, UnknownDType) {
  WireNode n = Node(1);
  n.dtype = kDTypeCount;
  SetNode(1, n);
  ExpectCorrupt("unknown dtype 15");
}

TEST_F(WireDecoderRejectTest, MoreThan32Dims) {
  WireNode n = Node(1);
  n.ndim = kMaxDims + 1;
  SetNode(1, n);
  ExpectCorrupt("more than 32 dimensions");
}

// dims_index + ndim past dim_count.
TEST_F(WireDecoderRejectTest, ShapeIndexOutOfBounds) {
  WireNode n = Node(3);
  n.dims_index = Header().dim_count;
  SetNode(3, n);
  ExpectCorrupt("shape out of bounds");
  n.dims_index = UINT32_MAX;
  SetNode(3, n);
  ExpectCorrupt("shape out of bounds");
}

// An array whose byte count does not match its shape and dtype.
TEST_F(WireDecoderRejectTest, ArrayBytesMismatchShape) {
  WireNode n = Node(1);
  n.nbytes -= 4;
  SetNode(1, n);
  ExpectCorrupt("does not match its shape");
}

// The same array claiming a wider dtype than its bytes hold.
TEST_F(WireDecoderRejectTest, ArrayDTypeMismatch) {
  WireNode n = Node(1);
  n.dtype = static_cast<uint8_t>(DType::kFloat64);
  SetNode(1, n);
  ExpectCorrupt("does not match its shape");
}

TEST_F(WireDecoderRejectTest, NegativeDimension) {
  SetDim(0, -2);
  ExpectCorrupt("negative dimension");
}

// A shape whose element count overflows 64 bits (which could otherwise wrap to a small size).
TEST_F(WireDecoderRejectTest, ShapeOverflow) {
  SetDim(0, int64_t{1} << 40);
  SetDim(1, int64_t{1} << 40);
  ExpectCorrupt("overflows");
  // 2^62 * 2^2 (float32) wraps to 0 in 64 bits; it must still be caught.
  SetDim(0, int64_t{1} << 62);
  SetDim(1, 1);
  ExpectCorrupt("overflows");
}

TEST_F(WireDecoderRejectTest, MisalignedArray) {
  WireNode n = Node(1);
  n.offset += 8;
  SetNode(1, n);
  ExpectCorrupt("misaligned array");
}

// The root claims one child too many; then a nested list does.
TEST_F(WireDecoderRejectTest, ContainerClaimsMoreChildrenThanExist) {
  WireNode root = Node(0);
  root.count = 5;
  SetNode(0, root);
  ExpectCorrupt("claims more children");
  root.count = 4;
  SetNode(0, root);
  WireNode list = Node(4);
  list.count = 2;
  SetNode(4, list);
  ExpectCorrupt("claims more children");
  list.count = UINT32_MAX;  // a dict-sized claim must not overflow the check
  list.kind = static_cast<uint8_t>(NodeKind::kDict);
  SetNode(4, list);
  ExpectCorrupt("claims more children");
}

// Nodes left over after the root's subtree.
TEST_F(WireDecoderRejectTest, TrailingNodes) {
  WireNode root = Node(0);
  root.count = 3;
  SetNode(0, root);
  ExpectCorrupt("trailing nodes");
}

// The strided flag on a plain array doubles its dims entries, which then run past the table.
TEST_F(WireDecoderRejectTest, StridedFlagWithoutStrides) {
  WireNode n = Node(3);
  n.flags |= kArrayStrided;
  SetNode(3, n);
  ExpectCorrupt("shape out of bounds");
}

// Heap data beyond the heap, before the heap, and a length that wraps around.
TEST_F(WireDecoderRejectTest, HeapOffsetOutOfBounds) {
  const WireNode orig = Node(2);
  WireNode n = orig;
  n.offset = Header().total_bytes;
  SetNode(2, n);
  ExpectCorrupt("node 2 points outside the heap");
  n.offset = 0;  // inside the buffer, but in the header
  SetNode(2, n);
  ExpectCorrupt("node 2 points outside the heap");
  n = orig;
  n.nbytes = UINT64_MAX;
  SetNode(2, n);
  ExpectCorrupt("node 2 points outside the heap");
  SetNode(2, orig);
  n = Node(3);
  n.offset = UINT64_MAX - 63;  // aligned, huge
  SetNode(3, n);
  ExpectCorrupt("node 3 points outside the heap");
}

// Builds `depth` nested lists around an int.
std::unique_ptr<AlignedBuffer> Nested(int depth) {
  WireEncoder enc;
  for (int i = 0; i < depth; ++i) enc.AddContainer(NodeKind::kList, 1);
  enc.AddInt(1);
  return Encode(enc);
}

// 64 levels of containers are accepted; 65 are rejected (no unbounded recursion).
TEST(WireDecoderTest, NestingLimit) {
  DecodedBatch out;
  auto ok = Nested(kMaxNesting);
  Status st = DecodeBatch(ok->data(), ok->size(), &out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(out.nodes.size(), static_cast<size_t>(kMaxNesting + 1));
  auto deep = Nested(kMaxNesting + 1);
  st = DecodeBatch(deep->data(), deep->size(), &out);
  EXPECT_EQ(st.code(), Code::kCorrupt);
  EXPECT_NE(st.message().find("nesting"), std::string::npos) << st.message();
  auto very_deep = Nested(100000);
  EXPECT_EQ(DecodeBatch(very_deep->data(), very_deep->size(), &out).code(), Code::kCorrupt);
}

// IsContiguous: C order, size-1 dims with any stride, zero-size arrays, and non-contiguous cases.
TEST(StridedCopyTest, IsContiguous) {
  const int64_t shape[3] = {2, 3, 4};
  const int64_t c[3] = {48, 16, 4};
  const int64_t f[3] = {4, 8, 24};
  EXPECT_TRUE(IsContiguous(shape, nullptr, 3, 4));
  EXPECT_TRUE(IsContiguous(shape, c, 3, 4));
  EXPECT_FALSE(IsContiguous(shape, c, 3, 8));
  EXPECT_FALSE(IsContiguous(shape, f, 3, 4));
  const int64_t one_shape[3] = {2, 1, 4};
  const int64_t one_strides[3] = {16, 999, 4};
  EXPECT_TRUE(IsContiguous(one_shape, one_strides, 3, 4));
  const int64_t empty_shape[2] = {4, 0};
  const int64_t odd[2] = {7, 3};
  EXPECT_TRUE(IsContiguous(empty_shape, odd, 2, 4));
  EXPECT_TRUE(IsContiguous(nullptr, nullptr, 0, 4));
}

// Element-by-element reference copy.
void NaiveCopy(uint8_t* dst, const uint8_t* src, const std::vector<int64_t>& shape,
               const std::vector<int64_t>& strides, size_t itemsize) {
  const int ndim = static_cast<int>(shape.size());
  int64_t total = 1;
  for (int64_t s : shape) total *= s;
  std::vector<int64_t> idx(ndim, 0);
  for (int64_t e = 0; e < total; ++e) {
    int64_t off = 0;
    for (int d = 0; d < ndim; ++d) off += idx[d] * strides[d];
    std::memcpy(dst + e * itemsize, src + off, itemsize);
    for (int d = ndim - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// CopyToContiguous matches the naive copy for random shapes and layouts: permuted dims
// (transposes), steps, negative strides, broadcast (zero) strides, size-1 dims with arbitrary
// strides, and partially contiguous inner dims.
TEST(StridedCopyTest, MatchesNaiveReferenceOnRandomLayouts) {
  std::mt19937_64 rng(20240607);
  const size_t itemsizes[] = {1, 2, 4, 8, 16};
  int non_contiguous = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const int ndim = static_cast<int>(rng() % 6);
    const size_t itemsize = itemsizes[rng() % 5];
    std::vector<int64_t> shape(ndim), step(ndim), extent(ndim), base_stride(ndim);
    for (int d = 0; d < ndim; ++d) {
      shape[d] = (rng() % 10 == 0) ? (rng() % 2) : static_cast<int64_t>(1 + rng() % 5);
      step[d] = (rng() % 3 == 0) ? 2 : 1;
      extent[d] = std::max<int64_t>(1, shape[d] * step[d]);
    }
    // A contiguous base array whose dims are laid out in a random order.
    std::vector<int> order(ndim);
    for (int d = 0; d < ndim; ++d) order[d] = d;
    std::shuffle(order.begin(), order.end(), rng);
    int64_t acc = static_cast<int64_t>(itemsize);
    for (int k = ndim - 1; k >= 0; --k) {
      base_stride[order[k]] = acc;
      acc *= extent[order[k]];
    }
    std::vector<uint8_t> base(static_cast<size_t>(acc) + 1);
    for (size_t i = 0; i < base.size(); ++i) base[i] = static_cast<uint8_t>(rng());
    // The view: stepped, sometimes reversed, sometimes broadcast or with a junk stride on size 1.
    std::vector<int64_t> strides(ndim);
    int64_t start = 0;
    for (int d = 0; d < ndim; ++d) {
      strides[d] = step[d] * base_stride[d];
      const uint64_t r = rng() % 8;
      if (r == 0 && shape[d] > 0) {
        start += (shape[d] - 1) * strides[d];
        strides[d] = -strides[d];
      } else if (r == 1) {
        strides[d] = 0;
      } else if (r == 2 && shape[d] == 1) {
        strides[d] = 123457;
      }
    }
    int64_t total = static_cast<int64_t>(itemsize);
    for (int64_t s : shape) total *= s;
    std::vector<uint8_t> got(static_cast<size_t>(total) + 8, 0xa5);
    std::vector<uint8_t> want(static_cast<size_t>(total) + 8, 0xa5);
    NaiveCopy(want.data(), base.data() + start, shape, strides, itemsize);
    const size_t n = CopyToContiguous(got.data(), base.data() + start, shape.data(), strides.data(),
                                      ndim, itemsize);
    if (!IsContiguous(shape.data(), strides.data(), ndim, itemsize)) ++non_contiguous;
    ASSERT_EQ(n, static_cast<size_t>(total)) << "iteration " << iter;
    ASSERT_EQ(got, want) << "iteration " << iter << " ndim " << ndim << " itemsize " << itemsize;
  }
  EXPECT_GT(non_contiguous, 1000);  // the generator does exercise the strided paths
}

// StreamCopy writes exactly the bytes memcpy would, whatever the sizes and the alignments of
// source and destination (the head up to a 16-byte boundary, whole lines, the tail), and
// nothing outside them.
TEST(StridedCopyTest, StreamCopyMatchesMemcpyAtEveryAlignment) {
  std::mt19937_64 rng(77);
  std::vector<uint8_t> src(70000);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  const size_t sizes[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 4095, 4096, 4097, 65536};
  for (size_t n : sizes) {
    for (size_t dst_off = 0; dst_off < 32; ++dst_off) {
      const size_t src_off = (dst_off * 7) % 33;
      std::vector<uint8_t> got(n + 96, 0x5a), want(n + 96, 0x5a);
      StreamCopy(got.data() + 32 + dst_off, src.data() + src_off, n);
      std::memcpy(want.data() + 32 + dst_off, src.data() + src_off, n);
      ASSERT_EQ(got, want) << "n " << n << " dst_off " << dst_off;
    }
  }
}

// A batch with more than kStreamBatchBytes of array data (written with StreamCopy) decodes to
// the same values as the samples it was stacked from, strided sources included.
TEST(WireRoundTripTest, LargeBatchesAreStreamedIntact) {
  const int64_t per = 160 * 1024;  // int32 elements per sample: 640 KiB
  const int samples = 8;           // 5 MiB in all
  std::vector<std::vector<int32_t>> data(samples);
  std::vector<ArraySource> sources;
  const int64_t shape1[1] = {per};
  const int64_t half[1] = {per};
  const int64_t step[1] = {8};  // the last sample: every other element of a larger array
  for (int k = 0; k < samples; ++k) {
    data[k].resize(k == samples - 1 ? 2 * per : per);
    for (size_t i = 0; i < data[k].size(); ++i) data[k][i] = static_cast<int32_t>(k * 1000003 + i);
    sources.push_back({reinterpret_cast<const uint8_t*>(data[k].data()),
                       k == samples - 1 ? half : shape1, k == samples - 1 ? step : nullptr, 1});
  }
  const int64_t shape[2] = {samples, per};
  WireEncoder enc;
  ASSERT_TRUE(enc.AddArray(DType::kInt32, 0, shape, 2, sources.data(), sources.size()).ok());
  auto buf = Encode(enc);
  ASSERT_GE(ReadHeader(buf->data()).heap_bytes, kStreamBatchBytes);
  DecodedBatch out;
  ASSERT_TRUE(DecodeBatch(buf->data(), buf->size(), &out).ok());
  const auto* got = reinterpret_cast<const int32_t*>(out.nodes[0].data);
  for (int k = 0; k < samples; ++k) {
    for (int64_t i = 0; i < per; ++i) {
      const int32_t want = k == samples - 1 ? data[k][2 * i] : data[k][i];
      ASSERT_EQ(got[k * per + i], want) << "sample " << k << " element " << i;
    }
  }
}

}  // namespace
}  // namespace stoker
