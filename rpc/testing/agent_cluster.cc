#include "ferry/rpc/testing/agent_cluster.h"

#include <thread>

#include "ferry/rpc/testing/in_process.h"

namespace ferry::rpc::testing {

absl::Status AgentCluster::ShutdownAll() {
  std::vector<absl::Status> results(size());
  std::vector<std::thread> threads;
  for (int i = 0; i < size(); ++i) {
    if (!alive(i)) continue;
    threads.emplace_back([&, i] { results[i] = agent(i).Shutdown(); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

namespace {

class InProcessCluster final : public AgentCluster {
 public:
  explicit InProcessCluster(const ClusterSpec& spec)
      : network_(spec.names, InProcessOptions{.auto_deliver = true,
                                              .agent = spec.options,
                                              .registry = spec.registry}) {}
  Agent& agent(int i) override { return network_.agent(i); }
  void Kill(int i) override {
    network_.Kill(network_.agent(i).self().name).IgnoreError();
  }
  int ArrivedAtShutdownBarrier() override {
    return network_.ArrivedAtShutdownBarrier();
  }
  absl::StatusOr<Agent*> Join(const std::string& name) override {
    absl::StatusOr<InProcessAgent*> a = network_.Join(name);
    if (!a.ok()) return a.status();
    return *a;
  }

 private:
  int size() const override { return network_.size(); }
  bool alive(int i) const override {
    return !network_.IsKilled(network_.agent(i).self().name);
  }
  mutable InProcessNetwork network_;  // alive() looks up names.
};

}  // namespace

absl::StatusOr<std::unique_ptr<AgentCluster>> StartInProcessCluster(
    const ClusterSpec& spec) {
  return std::make_unique<InProcessCluster>(spec);
}

}  // namespace ferry::rpc::testing
