// Spoofed callers (issue #38; docs/security.md): raw gRPC clients built from
// proto/rpc.proto's generated stub, which are not workers, send requests
// declaring a real worker as their caller. Workers run in this process, so
// "a peer's memory" is memory of this test.
#include "ferry/rpc/grpc/identity.h"

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ferry/common/sync.h"
#include "ferry/proto/admin.grpc.pb.h"
#include "ferry/proto/rpc.grpc.pb.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rpc/layer.h"
#include "ferry/rpc/testing/grpc_cluster.h"
#include "ferry/store/hash_store.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tests/util/raw_worker_client.h"
#include "ferry/tests/util/test_pki.h"

namespace ferry::rpc {
namespace {

namespace v1 = ::ferry::rpc::v1;
using grpc_agent::CallerVerifier;
using grpc_agent::kProofMetadata;

// A toy layer's protocol messages, in the manner of rref/ and autograd/.
constexpr MessageType kToyFetch = static_cast<MessageType>(2010);
constexpr MessageType kToyDelete = static_cast<MessageType>(2011);
constexpr MessageType kToyBackward = static_cast<MessageType>(2020);
constexpr MessageType kToyCleanup = static_cast<MessageType>(2021);
const bool kToyClaimed = ClaimLayer(LayerClaim{"test.identity",
                                               0,
                                               {{2010, 2021}},
                                               {{2010, "TOY_FETCH"},
                                                {2011, "TOY_DELETE"},
                                                {2020, "TOY_BACKWARD"},
                                                {2021, "TOY_CLEANUP"}}})
                             .ok();
constexpr MessageType kProtocol[] = {kToyDelete, kToyCleanup, kToyBackward};

// Counts the protocol messages a worker's handlers were given: the state a
// real layer would change.
struct Served {
  Mutex mu;
  std::vector<std::string> seen ABSL_GUARDED_BY(mu);  // "TYPE from caller"
  size_t size() {
    MutexLock lock(&mu);
    return seen.size();
  }
};

std::shared_ptr<FunctionRegistry> Registry() {
  auto registry = std::make_shared<FunctionRegistry>();
  EXPECT_TRUE(registry
                  ->Register("whoami",
                             [](const CallContext& ctx) {
                               return ctx.caller_name;
                             })
                  .ok());
  EXPECT_TRUE(
      registry->Register("twice", [](Tensor t) { return t.add(t); }).ok());
  return registry;
}

// Starts workers `names` (rank = index) with `options[i]`; each records
// the protocol messages it serves in `served[i]`.
std::vector<std::unique_ptr<GrpcAgent>> StartGroup(
    const std::vector<std::string>& names,
    std::vector<GrpcAgentOptions> options, std::vector<Served>& served) {
  std::vector<std::unique_ptr<GrpcAgent>> agents;
  for (auto& agent : testing::StartGrpcAgents(
           {.names = names,
            .registry = Registry(),
            .options = [&](int i) {
              GrpcAgentOptions o = options[i];
              o.join_timeout = absl::Seconds(30);
              o.before_serving = [&served, i](Agent& agent) -> absl::Status {
                for (MessageType type : kProtocol) {
                  absl::Status s = agent.RegisterHandler(
                      type, [&served, i](Message m) {
                        MutexLock lock(&served[i].mu);
                        served[i].seen.push_back(absl::StrCat(
                            MessageTypeName(m.type), " from ", m.caller_name));
                        Message reply;
                        reply.type = m.type;
                        return MakeReadyFuture<Message>(std::move(reply));
                      });
                  if (!s.ok()) return s;
                }
                return absl::OkStatus();
              };
              return o;
            },
            .store = nullptr})) {
    EXPECT_TRUE(agent.ok()) << agent.status();
    agents.push_back(agent.ok() ? *std::move(agent) : nullptr);
  }
  return agents;
}

// A raw client of `to` (not a worker).
std::unique_ptr<v1::Worker::Stub> RawClient(
    const GrpcAgent& to, std::shared_ptr<grpc::ChannelCredentials> credentials =
                             grpc::InsecureChannelCredentials()) {
  return testutil::RawWorkerStub(to.address(), std::move(credentials));
}

v1::RpcRequest Claiming(MessageType type, const std::string& name, int id) {
  v1::RpcRequest r;
  r.set_type(static_cast<v1::MessageType>(type));
  r.set_caller_name(name);
  r.set_caller_id(static_cast<uint32_t>(id));
  r.set_request_id(42);
  v1::LayerHeader* h = r.add_headers();
  h->set_layer(1);
  h->set_bytes("\x08\x09");
  return r;
}

// Sends `request`, with a store-secret proof when one is given.
absl::Status Send(v1::Worker::Stub& stub, const v1::RpcRequest& request,
                  const std::string& proof = "") {
  if (proof.empty()) return testutil::RawWorkerCall(stub, request);
  return testutil::RawWorkerCall(stub, request, {{kProofMetadata, proof}});
}

uint64_t IdentityRefusals(const GrpcAgent& agent) {
  auto admin = ferry::admin::v1::Admin::NewStub(
      grpc::CreateChannel(agent.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  ferry::admin::v1::GetStatsResponse stats;
  grpc::Status s = admin->GetStats(&context, {}, &stats);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return stats.identity_refusals();
}

void ExpectRefused(const absl::Status& s, const std::string& claimed,
                   const std::string& proven) {
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "'" + claimed + "'")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), proven)) << s;
}

// Appends varint field `number` = `value` to `out` (fields the schema no
// longer names, as an old or hostile client sends them).
void AppendVarintField(std::string* out, int number, uint64_t value) {
  uint64_t tag = static_cast<uint64_t>(number) << 3;
  for (uint64_t v : {tag, value}) {
    while (v >= 0x80) {
      out->push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out->push_back(static_cast<char>(v));
  }
}

// The reported attack: a stranger declares trainer0 and hands ps0 a
// same-host descriptor of its own making, aimed at trainer0's memory (a
// region, a token word holding the nonce and an ack word after it, in the
// fields the old channel trusted). Nothing of trainer0's memory changes,
// nothing is read into ps0, and the call fails with PermissionDenied naming
// trainer0.
TEST(Spoof, CraftedSameHostDescriptorTouchesNoMemory) {
  std::vector<Served> served(2);
  auto agents = StartGroup({"ps0", "trainer0"}, {{}, {}}, served);
  ASSERT_TRUE(agents[0] && agents[1]);
  GrpcAgent& ps0 = *agents[0];
  ASSERT_TRUE(ps0.same_host().UsableTo(1)) << "cross-memory attach refused";
  // "trainer0's heap": its words, with a payload region before them.
  auto victim = std::make_unique<uint64_t[]>(4);
  victim[0] = 0x1122334455667788;  // the "region"
  victim[1] = 0xdeadbeefcafef00d;  // the "token", = the nonce
  victim[2] = 0;                   // the "ack"
  const std::vector<uint64_t> before(victim.get(), victim.get() + 4);
  const uint64_t base = reinterpret_cast<uintptr_t>(victim.get());

  // A tensor argument's head as a real caller would encode it.
  absl::StatusOr<EncodedValue> e = EncodeValue(
      Value::FromList({Value::FromTensor(full({2}, 1.0, DType::kFloat32))}));
  ASSERT_TRUE(e.ok()) << e.status();
  v1::SameHostPayload crafted;
  crafted.set_head(e->head);
  v1::SameHostPayload::Region* r = crafted.add_regions();
  r->set_address(base);
  r->set_size(8);
  crafted.set_nonce(victim[1]);
  for (const std::string& mac : {std::string(), std::string(32, 'm')}) {
    crafted.set_mac(mac);
    std::string bytes = crafted.SerializeAsString();
    AppendVarintField(&bytes, 3, base + 8);   // token_address
    AppendVarintField(&bytes, 4, base + 16);  // ack_address
    v1::RpcRequest request = Claiming(MessageType::kCall, "trainer0", 1);
    request.set_function("twice");
    ASSERT_TRUE(request.mutable_same_host()->ParseFromString(bytes));
    auto stub = RawClient(ps0);
    ExpectRefused(Send(*stub, request), "trainer0", "MAC");
  }
  EXPECT_EQ(std::vector<uint64_t>(victim.get(), victim.get() + 4), before);
  EXPECT_EQ(ps0.same_host().stats().payloads_received.load(), 0u);
  EXPECT_EQ(ps0.same_host().stats().bytes_received.load(), 0u);
  EXPECT_EQ(ps0.same_host().stats().refused.load(), 2u);
  EXPECT_EQ(IdentityRefusals(ps0), 2u);
  // The real trainer0 still uses the channel.
  auto real = agents[1]->rpc_sync<Tensor>("ps0", "twice",
                                          full({1 << 16}, 1.5));
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_TRUE(real->equal(full({1 << 16}, 3.0)));
  EXPECT_EQ(ps0.same_host().stats().payloads_received.load(), 1u);
  EXPECT_TRUE(testing::StopGrpcGroup(agents).ok());
}

// Plaintext without a secret proves nothing: a stranger's protocol message
// is served as the worker it declares (docs/security.md states this).
TEST(Spoof, PlaintextWithoutSecretServesWhatItCannotCheck) {
  std::vector<Served> served(2);
  auto agents = StartGroup({"ps0", "trainer0"}, {{}, {}}, served);
  ASSERT_TRUE(agents[0] && agents[1]);
  auto stub = RawClient(*agents[0]);
  EXPECT_TRUE(
      Send(*stub, Claiming(kToyBackward, "trainer0", 1)).ok());
  EXPECT_EQ(served[0].size(), 1u);
  EXPECT_EQ(IdentityRefusals(*agents[0]), 0u);
  EXPECT_TRUE(testing::StopGrpcGroup(agents).ok());
}

// With a store secret: a stranger (no proof, a proof under another secret,
// a proof addressed to another worker) cannot send protocol messages as
// trainer0; its plain CALLs still run; a worker's proof proves only its
// own name; the workers themselves are served.
TEST(Spoof, StoreSecretBindsTheCallerToItsProof) {
  std::vector<Served> served(3);
  GrpcAgentOptions o;
  o.secret = "shared-by-the-job";
  o.same_host.enabled = false;
  auto agents = StartGroup({"ps0", "trainer0", "trainer1"}, {o, o, o}, served);
  ASSERT_TRUE(agents[0] && agents[1] && agents[2]);
  GrpcAgent& ps0 = *agents[0];
  auto stub = RawClient(ps0);
  const CallerVerifier stranger("ps0", "guessed", false);
  const CallerVerifier job("ps0", "shared-by-the-job", false);
  for (MessageType type : kProtocol) {
    const v1::RpcRequest spoof = Claiming(type, "trainer0", 1);
    ExpectRefused(Send(*stub, spoof), "trainer0", "no worker's identity");
    ExpectRefused(Send(*stub, spoof, stranger.MakeProof("trainer0", "ps0")),
                  "trainer0", "invalid store-secret proof");
    ExpectRefused(Send(*stub, spoof, job.MakeProof("trainer0", "trainer1")),
                  "trainer0", "invalid store-secret proof");
    // trainer1's own proof does not make it trainer0.
    ExpectRefused(Send(*stub, spoof, job.MakeProof("trainer1", "ps0")),
                  "trainer0", "authenticated as 'trainer1'");
  }
  EXPECT_EQ(served[0].size(), 0u);
  EXPECT_EQ(IdentityRefusals(ps0), 12u);
  // A worker's proof for its own name: served, with the id it declares.
  EXPECT_TRUE(Send(*stub, Claiming(kToyBackward, "trainer1", 2),
                   job.MakeProof("trainer1", "ps0"))
                  .ok());
  ExpectRefused(Send(*stub, Claiming(kToyBackward, "trainer1", 1),
                     job.MakeProof("trainer1", "ps0")),
                "trainer1", "'trainer0''s");
  // A stranger's plain CALL runs; a proven worker cannot CALL as another.
  v1::RpcRequest call = Claiming(MessageType::kCall, "trainer0", 1);
  call.set_function("whoami");
  EXPECT_TRUE(Send(*stub, call).ok());
  ExpectRefused(Send(*stub, call, job.MakeProof("trainer1", "ps0")),
                "trainer0", "'trainer1'");
  // Workers prove themselves on every channel, unary and streamed alike.
  Message m;
  m.type = kToyCleanup;
  for (int i : {1, 2}) {
    auto sent = agents[i]->Send("ps0", m).Get(absl::Seconds(20));
    EXPECT_TRUE(sent.ok()) << sent.status();
  }
  auto whoami = agents[2]->rpc_sync<std::string>("ps0", "whoami");
  ASSERT_TRUE(whoami.ok()) << whoami.status();
  EXPECT_EQ(*whoami, "trainer1");
  {
    MutexLock lock(&served[0].mu);
    EXPECT_EQ(served[0].seen,
              (std::vector<std::string>{"TOY_BACKWARD from trainer1",
                                        "TOY_CLEANUP from trainer0",
                                        "TOY_CLEANUP from trainer1"}));
  }
  EXPECT_TRUE(testing::StopGrpcGroup(agents).ok());
}

// A stranger's plain CALL runs, but its layer headers reach no layer: a
// layer would otherwise act on RRef, autograd or device fields under the
// worker name the stranger claims. A proven worker's headers arrive.
TEST(Spoof, AStrangersCallCarriesNoLayerHeaders) {
  std::vector<Served> served(2);
  GrpcAgentOptions o;
  o.secret = "shared-by-the-job";
  o.same_host.enabled = false;
  auto agents = StartGroup({"ps0", "trainer0"}, {o, o}, served);
  ASSERT_TRUE(agents[0] && agents[1]);
  GrpcAgent& ps0 = *agents[0];
  Mutex mu;
  std::vector<bool> had_header;  // Per CALL of "whoami" received.
  ps0.AddInterceptor([&](InterceptPoint point, const WorkerInfo&,
                         Message& m) -> absl::Status {
    if (point == InterceptPoint::kReceiveRequest &&
        m.type == MessageType::kCall && m.function == "whoami") {
      MutexLock lock(&mu);
      had_header.push_back(m.FindHeader(1) != nullptr);
    }
    return absl::OkStatus();
  });
  auto stub = RawClient(ps0);
  const CallerVerifier job("ps0", "shared-by-the-job", false);
  v1::RpcRequest call = Claiming(MessageType::kCall, "trainer0", 1);
  call.set_function("whoami");
  EXPECT_TRUE(Send(*stub, call).ok());  // No proof: a stranger.
  EXPECT_TRUE(Send(*stub, call, job.MakeProof("trainer0", "ps0")).ok());
  {
    MutexLock lock(&mu);
    EXPECT_EQ(had_header, (std::vector<bool>{false, true}));
  }
  EXPECT_TRUE(testing::StopGrpcGroup(agents).ok());
}

class TlsSpoof : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/identity_pki");
    auto pki = testutil::MakeTestPki(*dir_);
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = new testutil::TestPki(*std::move(pki));
  }
  static void TearDownTestSuite() {
    delete pki_;
    delete dir_;
  }
  static TlsOptions Tls(const testutil::TestIdentity& id) {
    TlsOptions tls;
    tls.ca_file = pki_->ca;
    tls.cert_file = id.cert;
    tls.key_file = id.key;
    tls.require_client_cert = true;
    return tls;
  }
  static std::shared_ptr<grpc::ChannelCredentials> Credentials(
      const testutil::TestIdentity& id) {
    return testutil::ClientTlsCredentials(pki_->ca, id.cert, id.key);
  }
  static std::string* dir_;
  static testutil::TestPki* pki_;
};
std::string* TlsSpoof::dir_ = nullptr;
testutil::TestPki* TlsSpoof::pki_ = nullptr;

// Certificates name their workers: a client with trainer1's certificate
// (an agent, or a raw client) cannot claim to be trainer0, for protocol
// messages or calls; a certificate naming no worker makes a stranger whose
// CALLs run but whose protocol messages are refused.
TEST_F(TlsSpoof, CertificateMustNameTheClaimedWorker) {
  std::vector<testutil::TestIdentity> ids;
  for (const char* w : {"ps0", "trainer0", "trainer1"}) {
    auto id = testutil::MakeWorkerIdentity(*dir_, w);
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  std::vector<GrpcAgentOptions> options(3);
  for (int i = 0; i < 3; ++i) options[i].tls = Tls(ids[i]);
  std::vector<Served> served(3);
  auto agents = StartGroup({"ps0", "trainer0", "trainer1"}, options, served);
  ASSERT_TRUE(agents[0] && agents[1] && agents[2]);
  GrpcAgent& ps0 = *agents[0];
  auto as_trainer1 = RawClient(ps0, Credentials(ids[2]));
  for (MessageType type : kProtocol) {
    ExpectRefused(Send(*as_trainer1, Claiming(type, "trainer0", 1)),
                  "trainer0", "trainer1");
  }
  v1::RpcRequest call = Claiming(MessageType::kCall, "trainer0", 1);
  call.set_function("whoami");
  ExpectRefused(Send(*as_trainer1, call), "trainer0", "TLS certificate");
  // alice's certificate names no worker: a stranger.
  auto stranger = RawClient(ps0, Credentials(pki_->alice));
  EXPECT_TRUE(Send(*stranger, call).ok());
  ExpectRefused(Send(*stranger, Claiming(kToyBackward, "trainer0", 1)),
                "trainer0", "alice");
  EXPECT_EQ(served[0].size(), 0u);
  EXPECT_EQ(ps0.identity_refusals(), 5u);
  // The workers themselves are served under their names.
  auto whoami = agents[2]->rpc_sync<std::string>("ps0", "whoami");
  ASSERT_TRUE(whoami.ok()) << whoami.status();
  EXPECT_EQ(*whoami, "trainer1");
  Message m;
  m.type = kToyDelete;
  auto sent = agents[1]->Send("ps0", m).Get(absl::Seconds(20));
  EXPECT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(served[0].size(), 1u);
  EXPECT_TRUE(testing::StopGrpcGroup(agents).ok());
}

TEST(CallerVerifier, RulesAndProofs) {
  ASSERT_TRUE(kToyClaimed);
  CallerVerifier ps0("ps0", "s", false);
  EXPECT_TRUE(ps0.enforcing());
  EXPECT_FALSE(CallerVerifier("ps0", "", false).enforcing());
  EXPECT_EQ(CallerVerifier("ps0", "", false).MakeProof("a", "ps0"), "");
  // Two channels, two proofs.
  const std::string p1 = ps0.MakeProof("trainer0", "ps0");
  const std::string p2 = ps0.MakeProof("trainer0", "ps0");
  EXPECT_NE(p1, p2);
  auto is_worker = [](const std::string&) { return true; };
  grpc_agent::ProvenIdentity none;
  EXPECT_EQ(ps0.CheckCaller(none, MessageType::kCall, "x", is_worker).code(),
            absl::StatusCode::kOk);
  EXPECT_EQ(ps0.CheckCaller(none, kToyFetch, "x", is_worker)
                .code(),
            absl::StatusCode::kPermissionDenied);
  grpc_agent::ProvenIdentity t0{{"trainer0"}, "store-secret proof"};
  EXPECT_TRUE(
      ps0.CheckCaller(t0, kToyFetch, "trainer0", is_worker)
          .ok());
  EXPECT_EQ(ps0.CheckCaller(t0, MessageType::kCall, "ps0", is_worker).code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace ferry::rpc
