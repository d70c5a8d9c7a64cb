#include "ferry/tensor/wire_grpc.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
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

// A real gRPC server on loopback that decodes each request and sends back
// {"echo": request, "sum": sum of the request's tensor}.
class EchoService final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext*) override {
    return new Reactor(this);
  }

  WireStats stats() {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

 private:
  class Reactor final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Reactor(EchoService* service) : service_(service) {
      StartRead(&request_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request"));
        return;
      }
      WireStats stats;
      WireLimits limits;
      absl::StatusOr<Value> v = DecodeFromByteBuffer(request_, limits, &stats);
      {
        absl::MutexLock lock(&service_->mu_);
        service_->stats_.payload_bytes += stats.payload_bytes;
        service_->stats_.payload_bytes_copied += stats.payload_bytes_copied;
        service_->stats_.payload_bytes_adopted += stats.payload_bytes_adopted;
      }
      if (!v.ok()) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            std::string(v.status().message())));
        return;
      }
      Value::Dict reply;
      if (const Tensor* t = v->if_tensor())
        reply["sum"] = Value::FromTensor(t->sum());
      reply["echo"] = *std::move(v);
      response_ = *EncodeToByteBuffer(Value::FromDict(std::move(reply)));
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    }
    void OnDone() override { delete this; }

   private:
    EchoService* service_;
    grpc::ByteBuffer request_, response_;
  };

  absl::Mutex mu_;
  WireStats stats_ ABSL_GUARDED_BY(mu_);
};

TEST(WireGrpcTest, LoopbackCallCarriesTensorsBothWays) {
  EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.SetMaxReceiveMessageSize(-1);  // gRPC's own default is 4 MiB.
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel =
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                grpc::InsecureChannelCredentials(), args);
  grpc::GenericStub stub(channel);
  const Tensor t = randn({4 << 20}, 17);  // 16 MiB: over gRPC's default limit.
  WireStats send_stats;
  grpc::ByteBuffer request =
      *EncodeToByteBuffer(Value::FromTensor(t), {}, &send_stats);
  EXPECT_EQ(send_stats.payload_bytes_copied, 0u);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/ferry.test.Echo/Echo", grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(status.ok()) << status.error_message();

  WireStats recv_stats;
  absl::StatusOr<Value> reply = DecodeFromByteBuffer(response, {}, &recv_stats);
  ASSERT_TRUE(reply.ok()) << reply.status();
  const Value::Dict& d = *reply->if_dict();
  EXPECT_TRUE(d.at("echo").if_tensor()->equal(t));
  EXPECT_NEAR(d.at("sum").if_tensor()->item(), t.sum().item(), 1e-3);
  // At most one copy of the tensor bytes on each receive.
  EXPECT_LE(recv_stats.payload_bytes_copied, recv_stats.payload_bytes);
  const WireStats server_stats = service.stats();
  EXPECT_EQ(server_stats.payload_bytes, t.nbytes());
  EXPECT_LE(server_stats.payload_bytes_copied, t.nbytes());
  server->Shutdown();
}

}  // namespace
}  // namespace ferry
