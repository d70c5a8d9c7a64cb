// The Admin service's Inspect over real gRPC agents shows the RRef layer's
// owned and user RRefs and distributed autograd's live contexts, as grpcurl
// would (rpc/inspect.h; the layers register, rpc/grpc serves).
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/autograd/dist/dist_autograd.h"
#include "ferry/common/status.h"
#include "gtest/gtest.h"
#include "ferry/proto/admin.grpc.pb.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rref/rref.h"
#include "ferry/store/hash_store.h"
#include "ferry/tests/rref/layered_worker.h"

namespace ferry {
namespace {

using admin::v1::InspectionRow;
using admin::v1::InspectRequest;
using admin::v1::InspectResponse;

constexpr absl::Duration kWait = absl::Seconds(30);

using Worker = testutil::LayeredWorker;

absl::StatusOr<std::vector<Worker>> StartWorkers() {
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  if (auto s = registry->Register("seven", [] { return int64_t{7}; });
      !s.ok()) {
    return s;
  }
  std::vector<Worker> workers;
  RETURN_IF_ERROR(
      testutil::StartLayeredWorkers({"a", "b"}, registry, nullptr, workers));
  return workers;
}

// The rows of `kind` that inspector `name` shows on `worker` via gRPC.
std::vector<InspectionRow> Rows(const Worker& worker, const std::string& name,
                                const std::string& kind) {
  auto channel = grpc::CreateChannel(worker.agent->address(),
                                     grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  InspectRequest req;
  req.set_inspector(name);
  InspectResponse resp;
  grpc::Status s =
      admin::v1::Admin::NewStub(channel)->Inspect(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::vector<InspectionRow> out;
  for (const auto& in : resp.inspections()) {
    EXPECT_EQ(in.inspector(), name);
    for (const InspectionRow& row : in.rows()) {
      if (row.kind() == kind) out.push_back(row);
    }
  }
  return out;
}

void ShutdownAll(std::vector<Worker>& workers) {
  std::vector<std::thread> ts;
  for (Worker& w : workers) {
    ts.emplace_back([&w] { EXPECT_TRUE(w.rrefs->Shutdown(kWait).ok()); });
  }
  for (auto& t : ts) t.join();
}

TEST(AdminInspect, ListsOwnedAndUserRRefs) {
  auto workers = StartWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  Worker& a = (*workers)[0];
  Worker& b = (*workers)[1];
  EXPECT_TRUE(Rows(b, "rref", "owned_rref").empty());
  {
    rref::RRef<int64_t> r = rref::remote<int64_t>(*a.rrefs, "b", "seven");
    ASSERT_TRUE(r.creation().Get(kWait).ok());
    std::vector<InspectionRow> owned = Rows(b, "rref", "owned_rref");
    ASSERT_EQ(owned.size(), 1u);
    EXPECT_EQ(owned[0].fields().at("id"), r.rref_id().ToString());
    EXPECT_EQ(owned[0].fields().at("created"), "true");
    // Holders are "worker/fork id": a's fork.
    EXPECT_EQ(owned[0].fields().at("holders").rfind("a/", 0), 0u)
        << owned[0].fields().at("holders");
    std::vector<InspectionRow> users = Rows(a, "rref", "user_rref");
    ASSERT_EQ(users.size(), 1u);
    EXPECT_EQ(users[0].fields().at("id"), r.rref_id().ToString());
    EXPECT_EQ(users[0].fields().at("owner"), "b");
    EXPECT_EQ(users[0].fields().at("confirmed"), "true");
    EXPECT_EQ(users[0].fields().at("pending_forks"), "0");
  }
  ASSERT_TRUE(a.rrefs->AwaitSettled(kWait).ok());
  EXPECT_TRUE(Rows(b, "rref", "owned_rref").empty());
  EXPECT_TRUE(Rows(a, "rref", "user_rref").empty());
  ShutdownAll(*workers);
}

TEST(AdminInspect, ListsLiveAutogradContextsPerWorker) {
  auto workers = StartWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  Worker& a = (*workers)[0];
  Worker& b = (*workers)[1];
  {
    autograd::dist::ContextScope scope(*a.dist);
    ASSERT_TRUE(a.agent->rpc_sync<int64_t>("b", "seven").ok());
    for (Worker* w : {&a, &b}) {
      std::vector<InspectionRow> ctxs = Rows(*w, "dist_autograd", "context");
      ASSERT_EQ(ctxs.size(), 1u) << w->agent->self().name;
      EXPECT_EQ(ctxs[0].fields().at("id"), scope.id().ToString());
      EXPECT_EQ(ctxs[0].fields().at("workers"),
                w == &a ? std::string("b") : std::string("a"));
    }
    ASSERT_TRUE(scope.Release(kWait).ok());
  }
  EXPECT_TRUE(Rows(a, "dist_autograd", "context").empty());
  EXPECT_TRUE(Rows(b, "dist_autograd", "context").empty());
  ShutdownAll(*workers);
}

}  // namespace
}  // namespace ferry
