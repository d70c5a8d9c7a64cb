// Streamed calls (rpc/grpc/stream.h): values and errors over CallStream, the
// receive copy and its place, flow control with a slow receiver, the switch.
// (The whole agent conformance suite also runs streamed: GrpcStreamed in
// //rpc:agent_conformance_test.)
#include "ferry/rpc/grpc/stream.h"

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "ferry/common/poll.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rpc/receive_observer.h"
#include "ferry/rpc/testing/grpc_cluster.h"
#include "ferry/store/hash_store.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tensor/wire_grpc.h"

namespace ferry::rpc {
namespace {

using grpc_agent::EncodedParts;
using grpc_agent::PieceAssembler;
using grpc_agent::PieceWriter;

constexpr uint64_t kThreshold = 64 << 10;
constexpr size_t kPiece = 16 << 10;

GrpcAgentOptions Streamed() {
  GrpcAgentOptions o;
  // In one process the same-host channel would take these payloads first.
  o.same_host.enabled = false;
  o.stream.threshold_bytes = kThreshold;
  o.stream.piece_bytes = kPiece;
  return o;
}

// Agents "a" and "b" sharing `registry`, with per-worker options.
std::vector<std::unique_ptr<GrpcAgent>> StartPair(
    std::shared_ptr<FunctionRegistry> registry, GrpcAgentOptions a,
    GrpcAgentOptions b) {
  const GrpcAgentOptions options[2] = {std::move(a), std::move(b)};
  std::vector<std::unique_ptr<GrpcAgent>> agents;
  for (auto& s : testing::StartGrpcAgents(
           {.names = {"a", "b"},
            .registry = std::move(registry),
            .options = [&](int i) { return options[i]; },
            .store = nullptr})) {
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) agents.push_back(*std::move(s));
  }
  return agents;
}

void ShutdownPair(std::vector<std::unique_ptr<GrpcAgent>>& agents) {
  std::thread down([&] { EXPECT_TRUE(agents[1]->Shutdown().ok()); });
  EXPECT_TRUE(agents[0]->Shutdown().ok());
  down.join();
}

std::shared_ptr<FunctionRegistry> Registry() {
  auto r = std::make_shared<FunctionRegistry>();
  EXPECT_TRUE(r->Register("echo", [](Value v) { return v; }).ok());
  EXPECT_TRUE(r->Register("thrice", [](Tensor t) {
                 return Value::FromList({Value::FromTensor(t),
                                         Value::FromTensor(t),
                                         Value::FromTensor(t)});
               }).ok());
  EXPECT_TRUE(r->Register("sum", [](Tensor t) { return t.sum(); }).ok());
  EXPECT_TRUE(r->Register("ones", [](int64_t n) {
                 return ones({n}, DType::kUInt8);
               }).ok());
  EXPECT_TRUE(r->Register("fail", [](Tensor) -> absl::StatusOr<int64_t> {
                 return absl::FailedPreconditionError("no thanks");
               }).ok());
  return r;
}

TEST(PieceWriter, PiecesAreEvenAndReassembleToTheSameBytes) {
  Tensor t = arange(0.0, 100000.0, 1.0, DType::kFloat32);  // 400 kB
  auto encoded = EncodeValue(Value::FromTensor(t));
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  const std::string flat = encoded->Flatten();
  PieceWriter writer(EncodedParts{"", *std::move(encoded)}, 64 << 10);
  PieceAssembler assembler;
  ASSERT_TRUE(assembler.Start(flat.size(), nullptr).ok());
  StreamStats stats;
  grpc::ByteBuffer message;
  uint64_t bytes = 0;
  int messages = 0;
  while (writer.Next(&message, &bytes)) {
    ++messages;
    EXPECT_GE(bytes, uint64_t{64} << 10);
    EXPECT_LT(bytes, uint64_t{128} << 10);
    auto parts = SplitEnvelope(message);
    ASSERT_TRUE(parts.ok()) << parts.status();
    EXPECT_EQ(parts->payload_bytes, bytes);
    ASSERT_TRUE(assembler.Add(parts->payload, &stats).ok());
  }
  EXPECT_EQ(messages, static_cast<int>(flat.size() / (64 << 10)));
  ASSERT_TRUE(assembler.complete());
  EXPECT_EQ(stats.bytes_received.load(), flat.size());
  EnvelopeParts whole = assembler.Take("");
  ASSERT_EQ(whole.payload.size(), 1u);
  EXPECT_EQ(std::string(whole.payload[0].data, whole.payload[0].size), flat);
  // Decoding copies nothing more: the tensor lives in the assembled buffer.
  WireStats wire;
  auto decoded = DecodeValue(absl::MakeConstSpan(whole.payload), {}, &wire);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(wire.payload_bytes_copied, 0u);
  EXPECT_EQ(wire.payload_bytes_adopted, 400000u);
  EXPECT_TRUE(decoded->if_tensor()->equal(t));
}

TEST(PieceAssembler, RefusesPiecesPastTheDeclaredLength) {
  PieceAssembler assembler;
  ASSERT_TRUE(assembler.Start(8, nullptr).ok());
  StreamStats stats;
  const char bytes[12] = {};
  auto s = assembler.Add({WireChunk{bytes, sizeof bytes, nullptr}}, &stats);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(StreamedCalls, CarryTheSameValuesBothWays) {
  auto agents = StartPair(Registry(), Streamed(), Streamed());
  ASSERT_EQ(agents.size(), 2u);
  GrpcAgent& a = *agents[0];
  const StreamStats& sa = a.stream_stats();
  const StreamStats& sb = agents[1]->stream_stats();
  Tensor f = arange(0.0, 50000.0, 1.0, DType::kFloat32);
  Tensor d = full({3, 7000}, 2.5, DType::kFloat64);
  Tensor i = arange(0.0, 30000.0, 1.0, DType::kInt64);
  Value::Dict dict{{"f", Value::FromTensor(f)}, {"x", Value::Int(7)}};
  Value nested = Value::FromList(
      {Value::FromTensor(d), Value::String("hello"), Value::FromDict(dict),
       Value::FromTensor(i),
       Value::FromList(
           {Value::FromTensor(f.slice(0, 100, 40000)), Value::None()})});
  auto echoed = a.rpc_sync<Value>("b", "echo", nested);
  ASSERT_TRUE(echoed.ok()) << echoed.status();
  EXPECT_EQ(*echoed, nested);  // Tensors compared element by element.
  EXPECT_EQ(echoed->DebugString(), nested.DebugString());
  // Both ways streamed, and every payload byte received was copied once.
  EXPECT_EQ(sa.requests_sent.load(), 1u);
  EXPECT_EQ(sb.requests_received.load(), 1u);
  EXPECT_EQ(sb.replies_sent.load(), 1u);
  EXPECT_EQ(sa.replies_received.load(), 1u);
  EXPECT_EQ(sa.bytes_sent.load(), sb.bytes_received.load());
  EXPECT_EQ(sb.bytes_sent.load(), sa.bytes_received.load());
  EXPECT_GT(sa.bytes_received.load(), 4 * kThreshold);
  EXPECT_LE(sb.max_piece_bytes.load(), 2 * kPiece);

  // A large request with a small result: the reply comes in one message.
  auto sum = a.rpc_sync<Tensor>("b", "sum", ones({100000}));
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(sum->item<float>(), 100000.0f);
  EXPECT_EQ(sa.requests_sent.load(), 2u);
  EXPECT_EQ(sb.replies_sent.load(), 1u);
  // Small calls stay unary, even with a large result.
  auto big = a.rpc_sync<Tensor>("b", "ones", int64_t{200000});
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->numel(), 200000);
  EXPECT_EQ(sa.requests_sent.load(), 2u);
  ShutdownPair(agents);
}

TEST(StreamedCalls, CarryTheSameErrors) {
  GrpcAgentOptions small = Streamed();
  small.max_message_bytes = 1 << 20;  // b refuses more; a sends anything
  auto agents = StartPair(Registry(), Streamed(), small);
  ASSERT_EQ(agents.size(), 2u);
  GrpcAgent& a = *agents[0];
  Tensor t = ones({100000});  // 400 kB: streamed, under b's limit
  // A handler's error, as the unary path gives it.
  auto failed = a.rpc_sync<int64_t>("b", "fail", t);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition)
      << failed.status();
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "no thanks"))
      << failed.status();
  // An unregistered function is refused, naming the worker.
  auto missing = a.rpc_sync<int64_t>("b", "nope", t);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound)
      << missing.status();
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "'b'"))
      << missing.status();
  // Over b's limit: refused from the declared length, naming the worker,
  // function and limit; b allocates nothing for it.
  const uint64_t received_before = agents[1]->stream_stats().bytes_received;
  auto over = a.rpc_sync<Tensor>("b", "sum", ones({1 << 19}));  // 2 MiB
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted)
      << over.status();
  for (const char* part :
       {"worker 'b'", "'sum'", "1048576", "max_message_bytes"})
    EXPECT_TRUE(absl::StrContains(over.status().message(), part))
        << over.status() << " lacks " << part;
  EXPECT_EQ(agents[1]->stream_stats().bytes_received.load(), received_before);
  // b sends nothing over its own limit either.
  auto reply_over = agents[1]->rpc_sync<Tensor>("a", "echo", ones({1 << 19}));
  EXPECT_EQ(reply_over.status().code(), absl::StatusCode::kResourceExhausted)
      << reply_over.status();
  for (const char* part : {"'echo'", "worker 'a'", "max_message_bytes"})
    EXPECT_TRUE(absl::StrContains(reply_over.status().message(), part))
        << reply_over.status() << " lacks " << part;
  // A result over b's limit (b refuses to send it), naming the function.
  auto result_over = a.rpc_sync<Value>("b", "thrice", ones({100000}));
  EXPECT_EQ(result_over.status().code(), absl::StatusCode::kResourceExhausted)
      << result_over.status();
  for (const char* part : {"worker 'b'", "max_message_bytes"})
    EXPECT_TRUE(absl::StrContains(result_over.status().message(), part))
        << result_over.status() << " lacks " << part;
  // Still serving.
  auto ok = a.rpc_sync<Tensor>("b", "sum", t);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ShutdownPair(agents);
}

TEST(StreamedCalls, ResultOverTheCallersLimitIsRefusedNamingIt) {
  GrpcAgentOptions small = Streamed();
  small.max_message_bytes = 1 << 20;
  auto agents = StartPair(Registry(), small, Streamed());
  ASSERT_EQ(agents.size(), 2u);
  // A streamed request (under the limit) whose streamed result is over it.
  Tensor t = ones({200000});  // 800 kB
  auto over = agents[0]->rpc_sync<Value>("b", "thrice", t);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted)
      << over.status();
  for (const char* part : {"reply from worker 'b'", "max_message_bytes"})
    EXPECT_TRUE(absl::StrContains(over.status().message(), part))
        << over.status() << " lacks " << part;
  ShutdownPair(agents);
}

// A 1 MiB tensor echoed by worker "b" comes back equal.
void ExpectEchoed(GrpcAgent& from) {
  auto echoed = from.rpc_sync<Tensor>("b", "echo", ones({1 << 18}));
  ASSERT_TRUE(echoed.ok()) << echoed.status();
  EXPECT_TRUE(echoed->equal(ones({1 << 18})));
}

// A receiver slower than its sender: the sender gets ahead of it by at most
// the receiver's HTTP/2 window (GrpcAgentOptions::http2_window_bytes) and
// the piece in hand, not by the whole payload; Ferry holds one piece at a
// time on receive.
TEST(StreamedCalls, SlowReceiverBoundsWhatTheSenderHasAhead) {
  constexpr uint64_t kBytes = uint64_t{256} << 20;
  constexpr size_t kBigPiece = 1 << 20;
  // Filled before any call: the receiver's hook reads the sender's stats.
  auto sender = std::make_shared<std::atomic<const StreamStats*>>(nullptr);
  auto max_ahead = std::make_shared<std::atomic<uint64_t>>(0);
  auto pieces = std::make_shared<std::atomic<int>>(0);
  constexpr int64_t kWindow = int64_t{4} << 20;
  GrpcAgentOptions slow;
  slow.same_host.enabled = false;  // As in Streamed().
  slow.http2_window_bytes = kWindow;
  slow.stream.piece_bytes = kBigPiece;
  slow.stream.after_piece_received = [=](uint64_t received, uint64_t total) {
    if (total < kBytes) return;
    pieces->fetch_add(1);
    const uint64_t sent = (*sender).load()->bytes_sent.load();
    const uint64_t ahead = sent > received ? sent - received : 0;
    if (ahead > max_ahead->load()) max_ahead->store(ahead);
    absl::SleepFor(absl::Milliseconds(3));  // the slow part
  };
  slow.stream.threshold_bytes = kThreshold;
  GrpcAgentOptions fast;
  fast.stream.threshold_bytes = kThreshold;
  fast.stream.piece_bytes = kBigPiece;
  auto agents = StartPair(Registry(), fast, slow);
  ASSERT_EQ(agents.size(), 2u);
  sender->store(&agents[0]->stream_stats());
  auto sum = agents[0]->rpc_sync_for<Tensor>(absl::Minutes(2), "b", "sum",
                                             ones({int64_t{kBytes} / 4}));
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(sum->item<float>(), static_cast<float>(kBytes / 4));
  EXPECT_GE(pieces->load(), 100);
  // With gRPC's automatic window (its BDP probe) this was 31 MiB ahead of
  // 128 MiB and 40 of 512 on loopback; with a fixed one it is the window.
  EXPECT_LE(max_ahead->load(), kWindow + 2 * kBigPiece) << "sender ran ahead";
  EXPECT_LE(agents[1]->stream_stats().max_piece_bytes.load(), 2 * kBigPiece);
  std::printf("slow receiver: sender at most %llu bytes ahead of %llu\n",
              static_cast<unsigned long long>(max_ahead->load()),
              static_cast<unsigned long long>(kBytes));
  ShutdownPair(agents);
}

// Large streamed payloads land in warm buffers: each side's receive pool
// serves every echo after the first from a buffer it already faulted in
// (one more may be allocated when a request arrives before the previous
// reply released its buffer), so nothing is evicted or faulted in anew per
// call.
TEST(StreamedCalls, LargeEchoesReuseTheReceiveBuffers) {
  constexpr int64_t kFloats = int64_t{8} << 20;  // 32 MiB.
  constexpr int kCalls = 6;
  GrpcAgentOptions o;
  o.same_host.enabled = false;  // As in Streamed(), with default pieces.
  auto agents = StartPair(Registry(), o, o);
  ASSERT_EQ(agents.size(), 2u);
  const Tensor sent = full({kFloats}, 3.0);
  for (int i = 0; i < kCalls; ++i) {
    auto echoed = agents[0]->rpc_sync<Tensor>("b", "echo", sent);
    ASSERT_TRUE(echoed.ok()) << echoed.status();
    ASSERT_EQ(echoed->numel(), kFloats);
    EXPECT_EQ(echoed->data<float>()[kFloats - 1], 3.0f);
  }  // Each reply's buffer goes back to the caller's pool here.
  EXPECT_EQ(agents[0]->stream_stats().replies_received.load(),
            static_cast<uint64_t>(kCalls));
  for (const auto& agent : agents) {
    const auto stats = agent->receive_pool_stats();
    EXPECT_GE(stats.allocated, 1u) << agent->self().name;
    EXPECT_LE(stats.allocated, 2u) << agent->self().name;
    EXPECT_EQ(stats.reused + stats.allocated, static_cast<uint64_t>(kCalls))
        << agent->self().name;
  }
  ShutdownPair(agents);
}

// A layer's ReceiveObserver (rpc/receive_observer.h) on both agents: it
// sees each streamed message carrying its header, from the right peer,
// supplies the payload's buffer, sees every piece arrive in order, and its
// progress lives exactly as long as what was decoded from that payload.
class RecordingObserver final : public ReceiveObserver {
 public:
  static constexpr uint32_t kLayer = 6;
  struct Seen {
    bool request;
    std::string peer;
    std::string header;
    uint64_t payload_bytes;
    std::vector<uint64_t> received;  // Received()'s arguments.
    const char* buffer = nullptr;
    size_t buffer_bytes = 0;
  };

  class Progress final : public ReceiveProgress {
   public:
    Progress(RecordingObserver* owner, size_t index)
        : owner_(owner), index_(index) {}
    ~Progress() override { owner_->dropped_.fetch_add(1); }
    Allocator* allocator() override { return &owner_->allocator_; }
    void Started(const Storage& buffer) override {
      absl::MutexLock lock(&owner_->mu_);
      owner_->seen_[index_].buffer = static_cast<const char*>(buffer.data());
      owner_->seen_[index_].buffer_bytes = buffer.nbytes();
    }
    void Received(uint64_t received) override {
      absl::MutexLock lock(&owner_->mu_);
      owner_->seen_[index_].received.push_back(received);
    }

   private:
    RecordingObserver* const owner_;
    const size_t index_;
  };

  uint32_t layer() const override { return kLayer; }
  std::shared_ptr<ReceiveProgress> Observe(const ReceiveStart& s) override {
    absl::MutexLock lock(&mu_);
    seen_.push_back({s.request, std::string(s.peer), *s.header,
                     s.payload_bytes, {}});
    return std::make_shared<Progress>(this, seen_.size() - 1);
  }

  std::vector<Seen> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }
  int dropped() const { return dropped_.load(); }
  int allocations() const { return allocator_.count.load(); }

 private:
  struct CountingAllocator final : Allocator {
    Device device() const override { return Device::CPU(); }
    absl::StatusOr<Storage> Allocate(size_t n) override {
      count.fetch_add(1);
      return GetCpuAllocator()->Allocate(n);
    }
    std::atomic<int> count{0};
  };
  absl::Mutex mu_;
  std::vector<Seen> seen_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> dropped_{0};
  CountingAllocator allocator_;
};

TEST(StreamedCalls, AReceiveObserverSeesItsLayersStreamedPayloadsArrive) {
  constexpr auto kLayerType = static_cast<MessageType>(1031);
  auto observers = std::vector<std::shared_ptr<RecordingObserver>>{
      std::make_shared<RecordingObserver>(),
      std::make_shared<RecordingObserver>()};
  GrpcAgentOptions a = Streamed(), b = Streamed();
  a.stream.observer = observers[0];
  b.stream.observer = observers[1];
  auto agents = StartPair(Registry(), a, b);
  ASSERT_EQ(agents.size(), 2u);
  std::atomic<bool> in_buffer{false};
  ASSERT_TRUE(agents[1]
                  ->RegisterHandler(
                      kLayerType,
                      [&](Message m) -> Future<Message> {
                        // The tensor lives in the observed buffer.
                        const Tensor t = m.Tensors().at(0);
                        const auto seen = observers[1]->seen();
                        const char* p =
                            static_cast<const char*>(t.data_ptr());
                        in_buffer = !seen.empty() &&
                                    p >= seen.back().buffer &&
                                    p + t.nbytes() <= seen.back().buffer +
                                                          seen.back().buffer_bytes;
                        Message reply;
                        reply.SetHeader(RecordingObserver::kLayer, "back");
                        reply.payload = Value::FromTensor(t.add(full(
                            t.sizes(), 1.0)));
                        return MakeReadyFuture<Message>(std::move(reply));
                      })
                  .ok());
  const Tensor sent = full({64 << 10}, 2.0);  // 256 KiB, streamed.
  {
    Message m;
    m.type = kLayerType;
    m.SetHeader(RecordingObserver::kLayer, "there");
    m.payload = Value::FromTensor(sent);
    Result<Message> r = agents[0]->Send("b", m).Get(absl::Seconds(30));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->Tensors().size(), 1u);
    EXPECT_EQ(r->Tensors()[0].data<float>()[(64 << 10) - 1], 3.0f);
    EXPECT_TRUE(in_buffer.load());
    // The reply's progress lives while the reply does.
    EXPECT_EQ(observers[0]->seen().size(), 1u);
    EXPECT_EQ(observers[0]->dropped(), 0);
  }
  // The request's progress goes with the request's tensors (the handler's
  // message), the reply's with the reply above.
  EXPECT_TRUE(PollUntil(
      [&] { return observers[0]->dropped() == 1 && observers[1]->dropped() == 1; },
      absl::Seconds(30)));
  for (int i = 0; i < 2; ++i) {
    const auto seen = observers[i]->seen();
    ASSERT_EQ(seen.size(), 1u) << i;
    const RecordingObserver::Seen& s = seen[0];
    EXPECT_EQ(s.request, i == 1);
    EXPECT_EQ(s.peer, i == 1 ? "a" : "b");
    EXPECT_EQ(s.header, i == 1 ? "there" : "back");
    EXPECT_GT(s.payload_bytes, uint64_t{256} << 10);
    EXPECT_EQ(s.buffer_bytes, s.payload_bytes);
    // Piece by piece, increasing, ending at the whole payload.
    ASSERT_GE(s.received.size(), 2u) << i;
    for (size_t k = 1; k < s.received.size(); ++k) {
      EXPECT_GT(s.received[k], s.received[k - 1]);
    }
    EXPECT_EQ(s.received.back(), s.payload_bytes);
    EXPECT_EQ(observers[i]->allocations(), 1) << i;
  }
  // A streamed call without the layer's header is not observed; nor are
  // small (unary) messages with it.
  ASSERT_TRUE(agents[0]->rpc_sync<Tensor>("b", "echo", sent).ok());
  Message small;
  small.type = kLayerType;
  small.SetHeader(RecordingObserver::kLayer, "small");
  small.payload = Value::FromTensor(full({4}, 1.0));
  ASSERT_TRUE(agents[0]->Send("b", small).Get(absl::Seconds(30)).ok());
  EXPECT_EQ(observers[0]->seen().size(), 1u);
  EXPECT_EQ(observers[1]->seen().size(), 1u);
  ShutdownPair(agents);
}

// GrpcAgentOptions::http2_window_bytes: 0 is gRPC's automatic window and
// still streams; values gRPC cannot take are refused at Start, naming the
// worker and the option.
TEST(StreamedCalls, Http2WindowIsAutomaticOrWithinItsRange) {
  GrpcAgentOptions automatic = Streamed();
  automatic.http2_window_bytes = 0;
  auto agents = StartPair(Registry(), automatic, automatic);
  ASSERT_EQ(agents.size(), 2u);
  ExpectEchoed(*agents[0]);
  EXPECT_EQ(agents[1]->stream_stats().requests_received.load(), 1u);
  ShutdownPair(agents);
  for (int64_t bad : {int64_t{-1}, int64_t{1000}, int64_t{1} << 31}) {
    GrpcAgentOptions o = Streamed();
    o.http2_window_bytes = bad;
    auto started =
        GrpcAgent::Start("w", 0, 1, std::make_shared<HashStore>(), o);
    ASSERT_FALSE(started.ok()) << bad;
    EXPECT_EQ(started.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(started.status().message(), "worker 'w'"))
        << started.status();
    EXPECT_TRUE(
        absl::StrContains(started.status().message(), "http2_window_bytes"))
        << started.status();
  }
}

TEST(StreamedCalls, OffMeansUnary) {
  GrpcAgentOptions off = Streamed();
  off.stream.enabled = false;
  auto agents = StartPair(Registry(), off, off);
  ASSERT_EQ(agents.size(), 2u);
  ExpectEchoed(*agents[0]);
  EXPECT_EQ(agents[0]->stream_stats().requests_sent.load(), 0u);
  EXPECT_EQ(agents[1]->stream_stats().requests_received.load(), 0u);
  ShutdownPair(agents);
}

}  // namespace
}  // namespace ferry::rpc
