#include "ferry/rpc/testing/grpc_cluster.h"

#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/common/status.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rpc/grpc/rendezvous.h"
#include "ferry/store/hash_store.h"

namespace ferry::rpc::testing {
namespace {

class GrpcCluster final : public AgentCluster {
 public:
  GrpcCluster(std::vector<std::unique_ptr<GrpcAgent>> agents,
              std::shared_ptr<Store> store, GrpcAgentOptions options,
              std::shared_ptr<FunctionRegistry> registry)
      : store_(std::move(store)),
        options_(std::move(options)),
        registry_(std::move(registry)),
        agents_(std::move(agents)) {}
  ~GrpcCluster() override {
    for (auto& a : agents_) {
      if (a) a->Shutdown(/*graceful=*/false).IgnoreError();
    }
  }
  Agent& agent(int i) override {
    MutexLock lock(&mu_);
    return *agents_[i];
  }
  // A dead process: its server is gone.
  void Kill(int i) override {
    GrpcAgent* a;
    {
      MutexLock lock(&mu_);
      a = agents_[i].get();
    }
    a->Shutdown(/*graceful=*/false).IgnoreError();
    MutexLock lock(&mu_);
    agents_[i].reset();
  }
  int ArrivedAtShutdownBarrier() override {
    absl::StatusOr<int64_t> n = grpc_agent::ShutdownBarrierArrivals(store_);
    return n.ok() ? static_cast<int>(*n) : -1;
  }
  absl::StatusOr<Agent*> Join(const std::string& name) override {
    absl::StatusOr<std::unique_ptr<GrpcAgent>> a =
        GrpcAgent::Join(name, store_, options_, registry_);
    if (!a.ok()) return a.status();
    MutexLock lock(&mu_);
    agents_.push_back(*std::move(a));
    return agents_.back().get();
  }

 private:
  int size() const override {
    MutexLock lock(&mu_);
    return static_cast<int>(agents_.size());
  }
  bool alive(int i) const override {
    MutexLock lock(&mu_);
    return agents_[i] != nullptr;
  }
  const std::shared_ptr<Store> store_;
  const GrpcAgentOptions options_;
  const std::shared_ptr<FunctionRegistry> registry_;
  mutable Mutex mu_;
  std::vector<std::unique_ptr<GrpcAgent>> agents_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<AgentCluster>> Start(
    const ClusterSpec& spec, GrpcAgentOptions options) {
  auto store = std::make_shared<HashStore>();
  static_cast<Agent::Options&>(options) = spec.options;
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<GrpcAgent>> agents,
                   StartGrpcGroup(spec.names, spec.registry, options, store));
  return std::make_unique<GrpcCluster>(std::move(agents), store, options,
                                       spec.registry);
}

}  // namespace

std::vector<absl::StatusOr<std::unique_ptr<GrpcAgent>>> StartGrpcAgents(
    const GrpcGroupSpec& spec) {
  std::shared_ptr<Store> store = spec.store;
  if (store == nullptr) store = std::make_shared<HashStore>();
  return StartGrpcAgents(spec, [&](int) { return store; });
}

std::vector<absl::StatusOr<std::unique_ptr<GrpcAgent>>> StartGrpcAgents(
    const GrpcGroupSpec& spec,
    const std::function<std::shared_ptr<Store>(int rank)>& store_for) {
  const int n = static_cast<int>(spec.names.size());
  std::vector<absl::StatusOr<std::unique_ptr<GrpcAgent>>> results(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      results[i] = GrpcAgent::Start(
          spec.names[i], i, n, store_for(i),
          spec.options ? spec.options(i) : GrpcAgentOptions{}, spec.registry);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

absl::StatusOr<std::vector<std::unique_ptr<GrpcAgent>>> StartGrpcGroup(
    const GrpcGroupSpec& spec) {
  std::vector<std::unique_ptr<GrpcAgent>> agents;
  for (auto& r : StartGrpcAgents(spec)) {
    if (!r.ok()) return r.status();
    agents.push_back(*std::move(r));
  }
  return agents;
}

absl::StatusOr<std::vector<std::unique_ptr<GrpcAgent>>> StartGrpcGroup(
    const std::vector<std::string>& names,
    std::shared_ptr<FunctionRegistry> registry, GrpcAgentOptions options,
    std::shared_ptr<Store> store) {
  return StartGrpcGroup({.names = names,
                         .registry = std::move(registry),
                         .options = EveryRank(std::move(options)),
                         .store = std::move(store)});
}

std::function<GrpcAgentOptions(int rank)> EveryRank(GrpcAgentOptions options) {
  return [options = std::move(options)](int) { return options; };
}

absl::Status ShutdownGrpcGroup(std::vector<std::unique_ptr<GrpcAgent>>& agents) {
  std::vector<absl::Status> status(agents.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < agents.size(); ++i) {
    if (agents[i] == nullptr) continue;
    threads.emplace_back([&, i] {
      absl::Status s = agents[i]->Shutdown();
      if (!s.ok()) {
        status[i] = absl::Status(
            s.code(), absl::StrCat("shutting down worker '",
                                   agents[i]->self().name, "': ", s.message()));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::Status StopGrpcGroup(std::vector<std::unique_ptr<GrpcAgent>>& agents) {
  absl::Status first;
  for (std::unique_ptr<GrpcAgent>& agent : agents) {
    if (agent == nullptr) continue;
    absl::Status s = agent->Shutdown(/*graceful=*/false);
    if (!s.ok() && first.ok()) {
      first = absl::Status(s.code(), absl::StrCat("stopping worker '",
                                                  agent->self().name,
                                                  "': ", s.message()));
    }
  }
  return first;
}

absl::StatusOr<std::unique_ptr<AgentCluster>> StartGrpcCluster(
    const ClusterSpec& spec) {
  GrpcAgentOptions options;
  options.same_host.enabled = false;
  return Start(spec, std::move(options));
}

absl::StatusOr<std::unique_ptr<AgentCluster>> StartGrpcSameHostCluster(
    const ClusterSpec& spec) {
  GrpcAgentOptions options;
  options.same_host.min_bytes = 1;
  return Start(spec, std::move(options));
}

absl::StatusOr<std::unique_ptr<AgentCluster>> StartGrpcStreamedCluster(
    const ClusterSpec& spec) {
  GrpcAgentOptions options;
  options.same_host.enabled = false;
  options.stream.threshold_bytes = 0;
  options.stream.piece_bytes = 256;
  return Start(spec, std::move(options));
}

}  // namespace ferry::rpc::testing
