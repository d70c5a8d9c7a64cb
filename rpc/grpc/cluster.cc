#include "rpc/grpc/cluster.h"

#include <thread>
#include <utility>
#include <vector>

#include "rpc/grpc/agent.h"
#include "store/hash_store.h"

namespace ferry::rpc::grpc_agent {
namespace {

class GrpcCluster final : public testing::AgentCluster {
 public:
  explicit GrpcCluster(std::vector<std::unique_ptr<GrpcAgent>> agents)
      : agents_(std::move(agents)) {}
  ~GrpcCluster() override {
    for (auto& a : agents_) {
      if (a) a->Shutdown(/*graceful=*/false).IgnoreError();
    }
  }
  Agent& agent(int i) override { return *agents_[i]; }
  // A dead process: its server is gone.
  void Kill(int i) override {
    agents_[i]->Shutdown(/*graceful=*/false).IgnoreError();
    agents_[i].reset();
  }

 private:
  int size() const override { return static_cast<int>(agents_.size()); }
  bool alive(int i) const override { return agents_[i] != nullptr; }
  std::vector<std::unique_ptr<GrpcAgent>> agents_;
};

absl::StatusOr<std::unique_ptr<testing::AgentCluster>> Start(
    const testing::ClusterSpec& spec, GrpcAgentOptions options) {
  auto store = std::make_shared<HashStore>();
  const int n = static_cast<int>(spec.names.size());
  static_cast<Agent::Options&>(options) = spec.options;
  std::vector<absl::StatusOr<std::unique_ptr<GrpcAgent>>> results(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      results[i] =
          GrpcAgent::Start(spec.names[i], i, n, store, options, spec.registry);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<GrpcAgent>> agents;
  for (auto& r : results) {
    if (!r.ok()) return r.status();
    agents.push_back(*std::move(r));
  }
  return std::make_unique<GrpcCluster>(std::move(agents));
}

}  // namespace

absl::StatusOr<std::unique_ptr<testing::AgentCluster>> StartGrpcCluster(
    const testing::ClusterSpec& spec) {
  return Start(spec, {});
}

absl::StatusOr<std::unique_ptr<testing::AgentCluster>> StartGrpcStreamedCluster(
    const testing::ClusterSpec& spec) {
  GrpcAgentOptions options;
  options.stream.threshold_bytes = 0;
  options.stream.piece_bytes = 256;
  return Start(spec, std::move(options));
}

}  // namespace ferry::rpc::grpc_agent
