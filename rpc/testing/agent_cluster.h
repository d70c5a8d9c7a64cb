// AgentCluster: a group of started Agents of one implementation, for the
// agent conformance suite (rpc/agent_conformance_test.cc), which runs the same
// tests against every implementation of the Agent interface.
#ifndef FERRY_RPC_TESTING_AGENT_CLUSTER_H_
#define FERRY_RPC_TESTING_AGENT_CLUSTER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/rpc/agent.h"

namespace ferry::rpc::testing {

class AgentCluster {
 public:
  virtual ~AgentCluster() = default;
  virtual Agent& agent(int i) = 0;
  // Makes worker `i` die abruptly (its peers' calls must fail, not hang).
  virtual void Kill(int i) = 0;
  // A new worker named `name` joins the running group (rpc/agent.h,
  // Membership); the cluster owns it, and agent(i) reaches it at the next
  // index. Safe from several threads at once.
  virtual absl::StatusOr<Agent*> Join(const std::string& name) = 0;
  // Workers that reached the shutdown barrier so far (a graceful Shutdown
  // waiting for the others, or past it).
  virtual int ArrivedAtShutdownBarrier() = 0;
  // Graceful, collective shutdown of every live agent, each on its own
  // thread; returns the first error.
  absl::Status ShutdownAll();

 protected:
  virtual int size() const = 0;
  virtual bool alive(int i) const = 0;
};

struct ClusterSpec {
  std::vector<std::string> names;
  std::shared_ptr<FunctionRegistry> registry;  // Shared by every worker.
  Agent::Options options;
};

using ClusterFactory =
    std::function<absl::StatusOr<std::unique_ptr<AgentCluster>>(
        const ClusterSpec&)>;

// The in-process implementation, in auto-deliver mode.
absl::StatusOr<std::unique_ptr<AgentCluster>> StartInProcessCluster(
    const ClusterSpec& spec);

}  // namespace ferry::rpc::testing

#endif  // FERRY_RPC_TESTING_AGENT_CLUSTER_H_
