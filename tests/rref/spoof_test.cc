// Spoofed protocol messages against the real RRef and distributed-autograd
// layers (issue #38, docs/security.md): a raw gRPC client built from
// proto/rpc.proto's stub, not a worker, sends RREF_USER_DELETE,
// CLEANUP_AUTOGRAD_CONTEXT and BACKWARD to the owner declaring the worker
// that holds the RRef and the context. Under a store secret and under mutual
// TLS with certificates naming the workers, each is refused with
// PermissionDenied naming the claimed worker, and the owner's RRef table and
// autograd contexts are unchanged.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "ferry/autograd/dist/dist_autograd.h"
#include "gtest/gtest.h"
#include "ferry/proto/rpc.grpc.pb.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rref/rref.h"
#include "ferry/store/hash_store.h"
#include "ferry/tests/rref/layered_worker.h"
#include "ferry/tests/util/raw_worker_client.h"
#include "ferry/tests/util/test_pki.h"

namespace ferry {
namespace {

namespace v1 = ::ferry::rpc::v1;
constexpr absl::Duration kWait = absl::Seconds(30);

enum class Mode { kStoreSecret, kMutualTls };

class SpoofTest : public testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    const std::string dir = testing::TempDir() + "/spoof_pki";
    if (GetParam() == Mode::kMutualTls) {
      auto pki = testutil::MakeTestPki(dir);
      ASSERT_TRUE(pki.ok()) << pki.status();
      pki_ = *pki;
    }
    auto registry = std::make_shared<rpc::FunctionRegistry>();
    ASSERT_TRUE(registry->Register("seven", [] { return int64_t{7}; }).ok());
    const std::vector<std::string> names = {"ps0", "trainer0"};
    std::vector<rpc::GrpcAgentOptions> options(2);
    for (int i = 0; i < 2; ++i) {
      if (GetParam() == Mode::kStoreSecret) {
        options[i].secret = "shared-by-the-job";
      } else {
        auto id = testutil::MakeWorkerIdentity(dir, names[i]);
        ASSERT_TRUE(id.ok()) << id.status();
        options[i].tls = {pki_.ca, id->cert, id->key, true, ""};
      }
    }
    absl::Status started = testutil::StartLayeredWorkers(
        names, registry, [&](int rank) { return options[rank]; }, workers_);
    EXPECT_TRUE(started.ok()) << started;
  }

  void TearDown() override {
    std::vector<std::thread> ts;
    for (testutil::LayeredWorker& w : workers_) {
      if (w.rrefs != nullptr && w.agent != nullptr) {
        ts.emplace_back([&w] { EXPECT_TRUE(w.rrefs->Shutdown(kWait).ok()); });
      }
    }
    for (auto& t : ts) t.join();
  }

  // A client that is not a worker: no proof; under TLS, a certificate of
  // the job's CA that names no worker.
  std::unique_ptr<v1::Worker::Stub> Stranger() {
    return testutil::RawWorkerStub(
        workers_[0].agent->address(),
        GetParam() == Mode::kMutualTls
            ? testutil::ClientTlsCredentials(pki_.ca, pki_.alice.cert,
                                             pki_.alice.key)
            : grpc::InsecureChannelCredentials());
  }

  testutil::TestPki pki_;
  std::vector<testutil::LayeredWorker> workers_;
};

TEST_P(SpoofTest, ProtocolMessagesAsAnotherWorkerChangeNothing) {
  testutil::LayeredWorker& ps0 = workers_[0];
  testutil::LayeredWorker& trainer0 = workers_[1];
  ASSERT_TRUE(ps0.agent && trainer0.agent);
  // trainer0 holds an RRef that ps0 owns, and a context that reached ps0.
  rref::RRef<int64_t> r = rref::remote<int64_t>(*trainer0.rrefs, "ps0", "seven");
  ASSERT_TRUE(r.creation().Get(kWait).ok());
  autograd::dist::ContextScope scope(*trainer0.dist);
  ASSERT_TRUE(trainer0.agent->rpc_sync<int64_t>("ps0", "seven").ok());
  const std::string owned_before = ps0.rrefs->Owned().at(0).DebugString();
  ASSERT_NE(ps0.dist->Find(scope.id()), nullptr);
  const size_t contexts_before = ps0.dist->NumContexts();

  auto stub = Stranger();
  // Typed headers as the layers write them.
  rpc::Message fields;
  rref::SetFields(fields, rref::RRefFields{r.rref_id(), r.fork_id(), 0, -1, "",
                                           {}});
  autograd::dist::SetAutogradFields(
      fields, autograd::dist::AutogradFields{scope.id(), GlobalId(), false, {}});
  for (rpc::MessageType type :
       {rref::kRRefUserDelete, autograd::dist::kCleanupAutogradContext,
        autograd::dist::kBackward}) {
    v1::RpcRequest spoof;
    spoof.set_type(static_cast<v1::MessageType>(type));
    spoof.set_caller_name("trainer0");
    spoof.set_caller_id(1);
    spoof.set_request_id(42);
    for (const rpc::LayerHeader& h : fields.headers) {
      v1::LayerHeader* out = spoof.add_headers();
      out->set_layer(h.layer);
      out->set_bytes(h.bytes);
    }
    absl::Status s = testutil::RawWorkerCall(*stub, spoof);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "'trainer0'")) << s;
  }
  ASSERT_EQ(ps0.rrefs->num_owned(), 1u);
  EXPECT_EQ(ps0.rrefs->Owned().at(0).DebugString(), owned_before);
  EXPECT_NE(ps0.dist->Find(scope.id()), nullptr);
  EXPECT_EQ(ps0.dist->NumContexts(), contexts_before);
  EXPECT_EQ(ps0.agent->identity_refusals(), 3u);
  // The real holder still uses both.
  auto fetched = r.to_here(kWait);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(*fetched, 7);
}

INSTANTIATE_TEST_SUITE_P(Modes, SpoofTest,
                         testing::Values(Mode::kStoreSecret, Mode::kMutualTls),
                         [](const testing::TestParamInfo<Mode>& info) {
                           return info.param == Mode::kStoreSecret
                                      ? "StoreSecret"
                                      : "MutualTls";
                         });

}  // namespace
}  // namespace ferry
