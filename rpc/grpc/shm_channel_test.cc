#include "ferry/rpc/grpc/shm_channel.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rpc/testing/grpc_cluster.h"
#include "ferry/store/hash_store.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tensor/wire.h"

namespace ferry::rpc::grpc_agent {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

std::vector<WorkerInfo> Group(int n) {
  std::vector<WorkerInfo> g;
  for (int i = 0; i < n; ++i)
    g.push_back(WorkerInfo{absl::StrCat("w", i), i, ""});
  return g;
}

// Two channels of one process negotiated through a HashStore, as two agents
// would (rank 0 and rank 1).
struct Pair {
  explicit Pair(SameHostOptions o0 = {}, SameHostOptions o1 = {}) {
    c[0] = std::make_shared<SameHostChannel>(o0, "w0");
    c[1] = std::make_shared<SameHostChannel>(o1, "w1");
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(c[i]->Publish(*store, i).ok());
    std::vector<std::thread> ts;
    for (int i = 0; i < 2; ++i) {
      ts.emplace_back([this, i] {
        status[i] = c[i]->Negotiate(*store, Group(2), i, absl::Seconds(30));
      });
    }
    for (auto& t : ts) t.join();
  }
  std::shared_ptr<HashStore> store = std::make_shared<HashStore>();
  std::shared_ptr<SameHostChannel> c[2];
  absl::Status status[2];
};

EncodedValue Encode(const Value& v) {
  absl::StatusOr<EncodedValue> e = EncodeValue(v);
  EXPECT_TRUE(e.ok()) << e.status();
  return *std::move(e);
}

TEST(SameHostChannel, SendsInPlaceAndReceivesWithOneCopy) {
  Pair p;
  ASSERT_TRUE(p.status[0].ok() && p.status[1].ok());
  ASSERT_TRUE(p.c[0]->UsableTo(1)) << "cross-memory attach refused here";
  Tensor a = arange(0.0, double(kMiB), 1.0, DType::kFloat32);
  Tensor b = full({3, 5}, 2.5);
  Value v = Value::FromList(
      {Value::FromTensor(a), Value::Int(7), Value::FromTensor(b)});
  EncodedValue e = Encode(v);
  v1::SameHostPayload d;
  std::shared_ptr<void> lease;
  ASSERT_TRUE(p.c[0]->Offer(1, e, &d, &lease));
  // Sent in place: the descriptor points at the tensors' own memory.
  ASSERT_EQ(d.regions_size(), 2);
  EXPECT_EQ(d.regions(0).address(), reinterpret_cast<uintptr_t>(a.data_ptr()));
  EXPECT_EQ(d.regions(0).size(), a.nbytes());
  EXPECT_EQ(p.c[0]->stats().bytes_sent.load(), a.nbytes() + b.nbytes());

  absl::StatusOr<WireChunk> whole = p.c[1]->Fetch(0, d, WireLimits{});
  ASSERT_TRUE(whole.ok()) << whole.status();
  WireStats stats;
  absl::StatusOr<Value> got =
      DecodeValue(absl::MakeConstSpan(&*whole, 1), WireLimits{}, &stats);
  ASSERT_TRUE(got.ok()) << got.status();
  // The kernel's copy is the only one: the decoder adopts the fetched bytes.
  EXPECT_EQ(stats.payload_bytes_copied, 0u);
  EXPECT_EQ(stats.payload_bytes_adopted, a.nbytes() + b.nbytes());
  EXPECT_EQ(p.c[1]->stats().bytes_received.load(), a.nbytes() + b.nbytes());
  const Value::List* list = got->if_list();
  ASSERT_TRUE(list != nullptr && list->size() == 3u);
  ASSERT_TRUE((*list)[0].if_tensor() && (*list)[2].if_tensor());
  EXPECT_TRUE((*list)[0].if_tensor()->equal(a));
  EXPECT_NE((*list)[0].if_tensor()->data_ptr(), a.data_ptr());
  ASSERT_TRUE((*list)[1].if_int());
  EXPECT_EQ(*(*list)[1].if_int(), 7);
  EXPECT_TRUE((*list)[2].if_tensor()->equal(b));
  EXPECT_EQ(p.c[0]->live_leases(), 1);
  lease.reset();
  EXPECT_EQ(p.c[0]->live_leases(), 0);
}

TEST(SameHostChannel, ReplyLeaseEndsOnAcknowledgementOrTimeout) {
  SameHostOptions quick;
  quick.lease_timeout = absl::ZeroDuration();
  Pair p({}, quick);
  ASSERT_TRUE(p.c[0]->UsableTo(1));
  Tensor t = full({kMiB / 4}, 1.0);
  // Acknowledged: the reader's ack ends the sender's lease.
  EncodedValue e = Encode(Value::FromTensor(t));
  v1::SameHostPayload d;
  ASSERT_TRUE(p.c[0]->Offer(1, e, &d, nullptr));
  EXPECT_EQ(p.c[0]->live_leases(), 1);
  ASSERT_TRUE(p.c[1]->Fetch(0, d, WireLimits{}).ok());
  EXPECT_EQ(p.c[0]->live_leases(), 0);
  // Never read: ends at lease_timeout (0 here), and a late reader is told.
  EncodedValue e2 = Encode(Value::FromTensor(t));
  v1::SameHostPayload d2;
  ASSERT_TRUE(p.c[1]->Offer(0, e2, &d2, nullptr));
  EXPECT_EQ(p.c[1]->live_leases(), 0);
  absl::StatusOr<WireChunk> late = p.c[0]->Fetch(1, d2, WireLimits{});
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted) << late.status();
  EXPECT_NE(late.status().message().find("worker 'w1'"), std::string::npos)
      << late.status();
}

TEST(SameHostChannel, ReleasedRequestIsNotReadAsData) {
  Pair p;
  ASSERT_TRUE(p.c[0]->UsableTo(1));
  EncodedValue e = Encode(Value::FromTensor(full({kMiB}, 3.0)));
  v1::SameHostPayload d;
  std::shared_ptr<void> lease;
  ASSERT_TRUE(p.c[0]->Offer(1, e, &d, &lease));
  lease.reset();  // The call ended (e.g. timed out) before the peer read.
  absl::StatusOr<WireChunk> r = p.c[1]->Fetch(0, d, WireLimits{});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
}

TEST(SameHostChannel, SmallPayloadsAndDisabledSidesUseGrpc) {
  {
    SameHostOptions off;
    off.enabled = false;
    Pair p(off, {});
    EXPECT_FALSE(p.c[0]->UsableTo(1));
    EXPECT_FALSE(p.c[1]->UsableTo(0));     // The peer of a disabled side too.
    EXPECT_EQ(p.c[1]->usable_peers(), 1);  // Itself only.
    EncodedValue e = Encode(Value::FromTensor(full({kMiB}, 1.0)));
    v1::SameHostPayload d;
    EXPECT_FALSE(p.c[1]->Offer(0, e, &d, nullptr));
    EXPECT_EQ(e.payloads.size(), 1u);  // Untouched: it goes over gRPC.
  }
  Pair p;
  EncodedValue small = Encode(Value::FromTensor(full({16}, 1.0)));
  v1::SameHostPayload d;
  EXPECT_FALSE(p.c[0]->Offer(1, small, &d, nullptr));
}

TEST(SameHostChannel, EnvironmentTurnsItOff) {
  setenv("FERRY_RPC_SAME_HOST", "0", 1);
  SameHostChannel c({}, "w0");
  unsetenv("FERRY_RPC_SAME_HOST");
  EXPECT_FALSE(c.enabled());
}

TEST(SameHostChannel, RefusedProbeFallsBackForThatPair) {
  // Rank 1's record names a secret whose commitment is not what it claims,
  // as when the kernel refuses or a different process answers.
  auto store = std::make_shared<HashStore>();
  auto c0 = std::make_shared<SameHostChannel>(SameHostOptions{}, "w0");
  ASSERT_TRUE(c0->Publish(*store, 0).ok());
  char secret[32] = {1};
  std::string mine = *store->Get("rpc/same_host/0");
  std::vector<std::string> f = absl::StrSplit(mine, '\n');
  ASSERT_EQ(f.size(), 7u);
  // The store holds a commitment, never the secret itself.
  EXPECT_EQ(f[4].size(), 64u);
  f[3] = absl::StrCat(reinterpret_cast<uintptr_t>(secret));
  ASSERT_TRUE(store->Set("rpc/same_host/1", absl::StrJoin(f, "\n")).ok());
  ASSERT_TRUE(store->Set("rpc/same_host/readable/1", "0=8,1=8").ok());
  ASSERT_TRUE(c0->Negotiate(*store, Group(2), 0, absl::Seconds(10)).ok());
  EXPECT_FALSE(c0->UsableTo(1));
  EXPECT_TRUE(c0->UsableTo(0));
  std::string readable = *store->Get("rpc/same_host/readable/0");
  EXPECT_TRUE(absl::StartsWith(readable, "0=")) << readable;
  EXPECT_FALSE(absl::StrContains(readable, "1=")) << readable;
  // And a payload claiming to come from rank 1 is refused, not read.
  v1::SameHostPayload d;
  d.set_nonce(1);
  absl::StatusOr<WireChunk> r = c0->Fetch(1, d, WireLimits{});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied)
      << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "'w1'")) << r.status();
  EXPECT_EQ(c0->stats().refused.load(), 1u);
}

TEST(SameHostChannel, MalformedDescriptorsAreRefused) {
  Pair p;
  ASSERT_TRUE(p.c[1]->UsableTo(0));
  v1::SameHostPayload d;
  d.set_nonce(5);
  d.add_regions()->set_padding(64);
  EXPECT_EQ(p.c[1]->Fetch(0, d, WireLimits{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  d.mutable_regions(0)->set_padding(0);
  d.mutable_regions(0)->set_size(uint64_t{1} << 40);
  WireLimits small;
  small.max_total_bytes = kMiB;
  absl::StatusOr<WireChunk> over = p.c[1]->Fetch(0, d, small);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("limit"), std::string::npos);
  // Well formed but not made by the sender (no MAC): nothing is trusted.
  d.mutable_regions(0)->set_size(64);
  EXPECT_EQ(p.c[1]->Fetch(0, d, WireLimits{}).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(p.c[1]->Fetch(7, d, WireLimits{}).status().code(),
            absl::StatusCode::kPermissionDenied);
}

// A descriptor changed in any field after its sender signed it is refused
// before anything is read from the sender, naming the sender; the real one
// still reads.
TEST(SameHostChannel, TamperedDescriptorsAreRefusedBeforeAnyRead) {
  Pair p;
  ASSERT_TRUE(p.c[0]->UsableTo(1));
  Tensor t = full({kMiB / 4}, 4.0);
  std::string elsewhere(kMiB, 'x');  // What a forger would aim at.
  EncodedValue e = Encode(Value::FromTensor(t));
  v1::SameHostPayload real;
  std::shared_ptr<void> lease;
  ASSERT_TRUE(p.c[0]->Offer(1, e, &real, &lease));
  EXPECT_EQ(real.mac().size(), 32u);
  std::vector<v1::SameHostPayload> forged(6, real);
  forged[0].mutable_regions(0)->set_address(
      reinterpret_cast<uintptr_t>(elsewhere.data()));
  forged[1].set_nonce(real.nonce() + 1);
  forged[2].set_slot(real.slot() + 1);
  forged[3].mutable_head()->push_back('\0');
  forged[4].clear_mac();
  forged[5].mutable_regions(0)->set_size(real.regions(0).size() / 2);
  for (size_t i = 0; i < forged.size(); ++i) {
    absl::StatusOr<WireChunk> r = p.c[1]->Fetch(0, forged[i], WireLimits{});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied)
        << i << ": " << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "'w0'"))
        << r.status();
  }
  EXPECT_EQ(p.c[1]->stats().refused.load(), forged.size());
  EXPECT_EQ(p.c[1]->stats().payloads_received.load(), 0u);
  // Signed for another receiver (w0 to itself): refused by w1.
  EncodedValue e2 = Encode(Value::FromTensor(t));
  v1::SameHostPayload to_self;
  std::shared_ptr<void> lease2;
  ASSERT_TRUE(p.c[0]->Offer(0, e2, &to_self, &lease2));
  EXPECT_EQ(p.c[1]->Fetch(0, to_self, WireLimits{}).status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<WireChunk> good = p.c[1]->Fetch(0, real, WireLimits{});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(p.c[1]->stats().payloads_received.load(), 1u);
}

// Signed by the sender but listing regions its lease does not (a sender's
// bug, or a key shared further than the pair): refused from the table.
TEST(SameHostChannel, RegionsOutsideTheLeaseAreRefused) {
  Pair p;
  ASSERT_TRUE(p.c[0]->UsableTo(1));
  Tensor t = full({kMiB / 4}, 4.0);
  std::string elsewhere(kMiB, 'x');
  EncodedValue e = Encode(Value::FromTensor(t));
  v1::SameHostPayload d;
  std::shared_ptr<void> lease;
  ASSERT_TRUE(p.c[0]->Offer(1, e, &d, &lease));
  d.mutable_regions(0)->set_address(
      reinterpret_cast<uintptr_t>(elsewhere.data()));
  p.c[0]->SignForTesting(1, &d);
  absl::StatusOr<WireChunk> r = p.c[1]->Fetch(0, d, WireLimits{});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied)
      << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "lease lists"))
      << r.status();
  EXPECT_EQ(p.c[1]->stats().payloads_received.load(), 0u);
}

// A registry serving "twice" (t + t).
std::shared_ptr<FunctionRegistry> Twice() {
  auto registry = std::make_shared<FunctionRegistry>();
  EXPECT_TRUE(
      registry->Register("twice", [](Tensor t) { return t.add(t); }).ok());
  return registry;
}

// Workers w0 and w1 of a static group over `store`, w1's channel on only
// when `second_on`.
std::vector<absl::StatusOr<std::unique_ptr<GrpcAgent>>> StartTwo(
    std::shared_ptr<Store> store, std::shared_ptr<FunctionRegistry> registry,
    bool second_on) {
  return testing::StartGrpcAgents(
      {.names = {"w0", "w1"},
       .registry = std::move(registry),
       .options =
           [&](int i) {
             GrpcAgentOptions o;
             o.same_host.enabled = i == 0 || second_on;
             return o;
           },
       .store = std::move(store)});
}

// Through two agents: calls carry tensors over the channel both ways, and an
// agent with the channel off talks to the same peer over gRPC.
TEST(SameHostAgents, CallsUseTheChannelUnlessAWorkerTurnsItOff) {
  for (bool second_on : {true, false}) {
    auto store = std::make_shared<HashStore>();
    std::vector<absl::StatusOr<std::unique_ptr<GrpcAgent>>> agents =
        StartTwo(store, Twice(), second_on);
    ASSERT_TRUE(agents[0].ok()) << agents[0].status();
    ASSERT_TRUE(agents[1].ok()) << agents[1].status();
    Tensor x = full({kMiB / 4}, 1.5);
    auto r = (*agents[0])->rpc_sync<Tensor>("w1", "twice", x);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->equal(full({kMiB / 4}, 3.0)));
    const SameHostStats& s0 = (*agents[0])->same_host().stats();
    const SameHostStats& s1 = (*agents[1])->same_host().stats();
    EXPECT_EQ(s0.payloads_sent.load(), second_on ? 1u : 0u);
    EXPECT_EQ(s1.payloads_received.load(), second_on ? 1u : 0u);
    EXPECT_EQ(s1.payloads_sent.load(), second_on ? 1u : 0u);
    EXPECT_EQ(s0.payloads_received.load(), second_on ? 1u : 0u);
    // The request's lease ended with the call, the reply's on the ack.
    EXPECT_EQ((*agents[0])->same_host().live_leases(), 0);
    EXPECT_EQ((*agents[1])->same_host().live_leases(), 0);
    std::thread down([&] { EXPECT_TRUE((*agents[1])->Shutdown().ok()); });
    EXPECT_TRUE((*agents[0])->Shutdown().ok());
    down.join();
  }
}

// A worker that joins the running group settles the channel with each
// member as the static workers did (both ways, or gRPC when it has the
// channel off), and a member drops its channel to it when it leaves.
TEST(SameHostAgents, AJoinerUsesTheChannelUnlessItTurnsItOff) {
  for (bool joiner_on : {true, false}) {
    auto store = std::make_shared<HashStore>();
    std::shared_ptr<FunctionRegistry> registry = Twice();
    std::vector<absl::StatusOr<std::unique_ptr<GrpcAgent>>> agents =
        StartTwo(store, registry, /*second_on=*/true);
    ASSERT_TRUE(agents[0].ok()) << agents[0].status();
    ASSERT_TRUE(agents[1].ok()) << agents[1].status();
    GrpcAgent& w0 = **agents[0];
    // w1 (and w0 itself: a static worker probes its own record too).
    const int before = w0.same_host().usable_peers();
    EXPECT_EQ(before, 2);
    GrpcAgentOptions o;
    o.same_host.enabled = joiner_on;
    absl::StatusOr<std::unique_ptr<GrpcAgent>> joined =
        GrpcAgent::Join("j", store, o, registry);
    ASSERT_TRUE(joined.ok()) << joined.status();
    GrpcAgent& j = **joined;
    EXPECT_EQ(w0.same_host().usable_peers(), before + (joiner_on ? 1 : 0));
    EXPECT_EQ(j.same_host().usable_peers(), joiner_on ? 2 : 0);
    Tensor x = full({kMiB / 4}, 1.5);
    auto from_joiner = j.rpc_sync<Tensor>("w0", "twice", x);
    ASSERT_TRUE(from_joiner.ok()) << from_joiner.status();
    EXPECT_TRUE(from_joiner->equal(full({kMiB / 4}, 3.0)));
    auto to_joiner = w0.rpc_sync<Tensor>("j", "twice", x);
    ASSERT_TRUE(to_joiner.ok()) << to_joiner.status();
    EXPECT_TRUE(to_joiner->equal(full({kMiB / 4}, 3.0)));
    const SameHostStats& sj = j.same_host().stats();
    const SameHostStats& s0 = w0.same_host().stats();
    const uint64_t each = joiner_on ? 2u : 0u;  // A request and a reply.
    EXPECT_EQ(sj.payloads_sent.load(), each);
    EXPECT_EQ(sj.payloads_received.load(), each);
    EXPECT_EQ(s0.payloads_sent.load(), each);
    EXPECT_EQ(s0.payloads_received.load(), each);
    EXPECT_EQ(j.same_host().live_leases(), 0);
    EXPECT_EQ(w0.same_host().live_leases(), 0);
    ASSERT_TRUE(j.Leave().ok());
    EXPECT_EQ(w0.same_host().usable_peers(), before);
    std::thread down([&] { EXPECT_TRUE((*agents[1])->Shutdown().ok()); });
    EXPECT_TRUE(w0.Shutdown().ok());
    down.join();
  }
}

}  // namespace
}  // namespace ferry::rpc::grpc_agent
