#include "tensor/wire_grpc.h"

#include <grpcpp/support/slice.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

std::vector<grpc::Slice> Slices(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> s;
  EXPECT_TRUE(b.Dump(&s).ok());
  return s;
}

TEST(WireGrpcTest, PayloadSlicesPointAtTensorStorage) {
  Tensor a = rand({1000}, 1), b = arange(10);
  WireStats stats;
  absl::StatusOr<grpc::ByteBuffer> buf = EncodeToByteBuffer(
      Value::FromList({Value::FromTensor(a), Value::FromTensor(b)}), {},
      &stats);
  ASSERT_TRUE(buf.ok()) << buf.status();
  std::vector<grpc::Slice> slices = Slices(*buf);
  // head, a, pad(a), b, pad(b).
  ASSERT_EQ(slices.size(), 5u);
  EXPECT_EQ(static_cast<const void*>(slices[1].begin()), a.data_ptr());
  EXPECT_EQ(slices[1].size(), a.nbytes());
  EXPECT_EQ(static_cast<const void*>(slices[3].begin()), b.data_ptr());
  EXPECT_EQ(stats.payload_bytes_copied, 0u);
  EXPECT_EQ(buf->Length() % kWireAlignment, 0u);
}

TEST(WireGrpcTest, SlicesKeepTensorAliveUntilReleased) {
  auto owner = std::make_shared<std::vector<float>>(64, 1.0f);
  std::weak_ptr<std::vector<float>> watch = owner;
  Storage s =
      Storage::Wrap(owner->data(), 64 * sizeof(float), Device::CPU(), owner);
  owner.reset();
  auto buf = std::make_unique<grpc::ByteBuffer>();
  {
    Tensor t = *Tensor::FromStorage(s, DType::kFloat32, {64}, {1});
    s = Storage();
    *buf = *EncodeToByteBuffer(Value::FromTensor(t));
  }
  EXPECT_FALSE(watch.expired());  // Only the ByteBuffer holds it now.
  absl::StatusOr<Value> back = DecodeFromByteBuffer(*buf);
  ASSERT_TRUE(back.ok());
  buf.reset();
  EXPECT_FALSE(watch.expired());  // The decoded tensor adopted the slice.
  EXPECT_EQ(back->if_tensor()->sum().item(), 64.0);
  *back = Value();
  EXPECT_TRUE(watch.expired());
}

TEST(WireGrpcTest, InProcessRoundTripIsZeroCopy) {
  Tensor t = randn({128, 64}, 9);
  WireStats stats;
  absl::StatusOr<grpc::ByteBuffer> buf =
      EncodeToByteBuffer(Value::FromTensor(t), {}, &stats);
  ASSERT_TRUE(buf.ok());
  absl::StatusOr<Value> back = DecodeFromByteBuffer(*buf, {}, &stats);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->if_tensor()->data_ptr(), t.data_ptr());
  EXPECT_EQ(stats.payload_bytes_copied, 0u);
  EXPECT_EQ(stats.payload_bytes_adopted, t.nbytes());
}

// What a transport delivers: the same bytes in its own (copied) chunks.
grpc::ByteBuffer Rechunk(const grpc::ByteBuffer& in, size_t chunk) {
  std::string flat;
  for (const grpc::Slice& s : Slices(in))
    flat.append(reinterpret_cast<const char*>(s.begin()), s.size());
  std::vector<grpc::Slice> out;
  for (size_t pos = 0; pos < flat.size(); pos += chunk) {
    out.emplace_back(flat.data() + pos, std::min(chunk, flat.size() - pos));
  }
  return grpc::ByteBuffer(out.data(), out.size());
}

TEST(WireGrpcTest, ReceivedChunksCopyAtMostOnce) {
  Value v = Value::FromDict({{"w", Value::FromTensor(randn({1000, 33}, 2))},
                             {"b", Value::FromTensor(arange(7, DType::kInt8))},
                             {"step", Value::Int(12)}});
  absl::StatusOr<grpc::ByteBuffer> buf = EncodeToByteBuffer(v);
  ASSERT_TRUE(buf.ok());
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{4096}, size_t{1} << 20}) {
    WireStats stats;
    absl::StatusOr<Value> back =
        DecodeFromByteBuffer(Rechunk(*buf, chunk), {}, &stats);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, v) << chunk;
    EXPECT_LE(stats.payload_bytes_copied, stats.payload_bytes) << chunk;
    if (chunk == (size_t{1} << 20)) {
      EXPECT_EQ(stats.payload_bytes_copied,
                0u);  // Payloads fit in one slice each.
    }
  }
}

TEST(WireGrpcTest, HostileByteBufferIsAnError) {
  grpc::Slice junk("not a ferry stream", 18);
  grpc::ByteBuffer b(&junk, 1);
  absl::StatusOr<Value> v = DecodeFromByteBuffer(b);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.status().message()),
              ::testing::HasSubstr("bad magic"));
}

TEST(WireGrpcTest, OneGiBTensorThroughByteBuffer) {
  Tensor big =
      empty({int64_t{1} << 28}, DType::kFloat32);  // 1 GiB, pages untouched.
  WireStats stats;
  absl::StatusOr<grpc::ByteBuffer> buf =
      EncodeToByteBuffer(Value::FromTensor(big), {}, &stats);
  ASSERT_TRUE(buf.ok()) << buf.status();
  EXPECT_GT(buf->Length(), size_t{1} << 30);
  absl::StatusOr<Value> back = DecodeFromByteBuffer(*buf, {}, &stats);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->if_tensor()->nbytes(), size_t{1} << 30);
  EXPECT_EQ(back->if_tensor()->data_ptr(), big.data_ptr());
  EXPECT_EQ(stats.payload_bytes_copied, 0u);
}

}  // namespace
}  // namespace ferry
