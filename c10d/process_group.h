// ProcessGroup: a group of ranks with one backend per device type.
//
//   ASSIGN_OR_RETURN(auto pg, ProcessGroup::Create(store, rank, size,
//                                                  registry, {"cpu:gloo"}));
//   RETURN_IF_ERROR(pg->Allreduce(t)->Wait());
//   ASSIGN_OR_RETURN(auto sub, pg->NewGroup({0, 2}));  // null off-group
//
// Backend spec: "cpu:gloo,cuda:nccl" maps device types to registered
// backend names; a single name ("gloo") serves every device type that
// backend registered. A backend named for several device types is created
// once and shared. A call dispatches on its tensors' device type (all the
// tensors of one call must share it); Barrier uses the CPU backend when
// there is one.
//
// Rendezvous: every rank must create the group (and its subgroups) with the
// same spec, in the same order. Each backend instance gets a private store
// namespace "<group name>/<backend name>/", so groups and subgroups can share
// one store.
//
// Errors: Create returns the backend's rendezvous error (DeadlineExceeded
// when a rank does not arrive within the timeout), NotFound for an unknown
// backend (listing the registered ones), InvalidArgument for a malformed
// spec. A call for a device type without a backend, or mixing device types,
// returns a failed Work (InvalidArgument).
//
// Thread safety: calls may come from any thread (ordering as in backend.h).
// NewGroup must be called by every rank of this group in the same order.
#ifndef FERRY_C10D_PROCESS_GROUP_H_
#define FERRY_C10D_PROCESS_GROUP_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/c10d/backend.h"
#include "ferry/c10d/registry.h"
#include "ferry/common/sync.h"
#include "ferry/store/store.h"

namespace ferry {
namespace c10d {

// How ProcessGroup::Create builds the group.
struct ProcessGroupOptions {
  // Backend spec (see above).
  // "auto" (default_registry.h): shared memory on one host, else Gloo.
  std::string backend = "auto";
  // Rendezvous and default operation timeout (PyTorch's default: 30 min).
  absl::Duration timeout = absl::Minutes(30);
  // Passed to every backend factory as BackendConfig::options.
  std::map<std::string, std::string> backend_options;
  // Store namespace of this group.
  std::string name = "default_pg";
  // The host the group's store was reached at (InitProcessGroup sets it from
  // tcp:// or env://); passed as BackendConfig::rendezvous_host. Empty:
  // unknown.
  std::string rendezvous_host;
};

// Parses a backend spec against `registry`: device type -> backend name.
// InvalidArgument for an empty or malformed spec, an unknown device type or
// a device type given twice; NotFound for an unregistered backend.
absl::StatusOr<std::map<DeviceType, std::string>> ParseBackendSpec(
    absl::string_view spec, const BackendRegistry& registry);

// A group of ranks and its backends (see the top of this file).
class ProcessGroup {
 public:
  // `store` is shared by the group's backends (through prefixes); `registry`
  // must stay alive as long as the group (subgroups use it).
  static absl::StatusOr<std::shared_ptr<ProcessGroup>> Create(
      std::shared_ptr<Store> store, int rank, int size,
      std::shared_ptr<const BackendRegistry> registry,
      ProcessGroupOptions options = {});

  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }  // This process's rank in the group.
  int size() const { return size_; }  // The number of ranks.
  // The group's store namespace (ProcessGroupOptions::name).
  const std::string& name() const { return options_.name; }
  // "cpu:gloo,cuda:nccl".
  std::string BackendSpec() const;
  // For each rank of this group, its rank in the group it was made from
  // (identity for a top-level group).
  const std::vector<int>& parent_ranks() const { return parent_ranks_; }

  // The backend serving `device`; InvalidArgument naming the group's spec
  // when there is none.
  absl::StatusOr<Backend*> GetBackend(DeviceType device) const;

  // The collectives: the Backend method of the same name (backend.h), on
  // the backend of the tensors' device type.
  std::shared_ptr<Work> Allreduce(Tensor tensor,
                                  const AllreduceOptions& options = {});
  // Backend::Broadcast on the tensors' backend.
  std::shared_ptr<Work> Broadcast(Tensor tensor,
                                  const BroadcastOptions& options = {});
  // Backend::Reduce on the tensors' backend.
  std::shared_ptr<Work> Reduce(Tensor tensor,
                               const ReduceOptions& options = {});
  // Backend::Allgather on the tensors' backend.
  std::shared_ptr<Work> Allgather(std::vector<Tensor> outputs, Tensor input,
                                  const AllgatherOptions& options = {});
  // Backend::Gather on the tensors' backend.
  std::shared_ptr<Work> Gather(std::vector<Tensor> outputs, Tensor input,
                               const GatherOptions& options = {});
  // Backend::Scatter on the tensors' backend.
  std::shared_ptr<Work> Scatter(Tensor output, std::vector<Tensor> inputs,
                                const ScatterOptions& options = {});
  // Backend::ReduceScatter on the tensors' backend.
  std::shared_ptr<Work> ReduceScatter(Tensor output, std::vector<Tensor> inputs,
                                      const ReduceScatterOptions& options = {});
  // Backend::Alltoall on the tensors' backend.
  std::shared_ptr<Work> Alltoall(std::vector<Tensor> outputs,
                                 std::vector<Tensor> inputs,
                                 const AlltoallOptions& options = {});
  // Backend::Barrier, on the CPU backend when there is one.
  std::shared_ptr<Work> Barrier(const BarrierOptions& options = {});
  // Backend::Send on the tensors' backend.
  std::shared_ptr<Work> Send(Tensor tensor, int dst_rank,
                             const SendOptions& options = {});
  // Backend::Recv on the tensors' backend.
  std::shared_ptr<Work> Recv(Tensor tensor, int src_rank,
                             const RecvOptions& options = {});
  // The flat and uneven forms, any-source receive, batched point-to-point
  // and the monitored barrier, as in backend.h. BatchIsendIrecv dispatches
  // on its tensors' device type (all must share it; an empty batch returns
  // no Works); MonitoredBarrier uses the CPU backend when there is one.
  //
  // Backend::AllgatherIntoTensor on the tensors' backend.
  std::shared_ptr<Work> AllgatherIntoTensor(
      Tensor output, Tensor input, const AllgatherOptions& options = {});
  // Backend::ReduceScatterTensor on the tensors' backend.
  std::shared_ptr<Work> ReduceScatterTensor(
      Tensor output, Tensor input, const ReduceScatterOptions& options = {});
  // Backend::AlltoallSingle on the tensors' backend.
  std::shared_ptr<Work> AlltoallSingle(
      Tensor output, Tensor input, const AlltoallSingleOptions& options = {});
  // Backend::RecvAnysource on the tensors' backend.
  std::shared_ptr<Work> RecvAnysource(Tensor tensor,
                                      const RecvOptions& options = {});
  // Backend::BatchIsendIrecv on the tensors' backend (see above).
  std::vector<std::shared_ptr<Work>> BatchIsendIrecv(std::vector<P2POp> ops);
  // Backend::MonitoredBarrier (see above).
  absl::Status MonitoredBarrier(const MonitoredBarrierOptions& options = {});

  // torch.distributed.new_group: a group of `ranks` (ranks of this group;
  // distinct, in range, in the order that defines the new ranks). Every rank
  // of this group must call it, in the same order relative to other
  // NewGroup calls; members get the new group, others get null (OK status).
  // `backend` / `timeout` default to this group's.
  absl::StatusOr<std::shared_ptr<ProcessGroup>> NewGroup(
      std::vector<int> ranks, std::optional<std::string> backend = std::nullopt,
      std::optional<absl::Duration> timeout = std::nullopt);

 private:
  ProcessGroup(std::shared_ptr<Store> store, int rank, int size,
               std::shared_ptr<const BackendRegistry> registry,
               ProcessGroupOptions options, std::vector<int> parent_ranks);

  absl::Status Init();
  // The backend for the tensors' device type, or an error naming `op`.
  absl::StatusOr<Backend*> Dispatch(
      OpType op, const std::vector<const Tensor*>& tensors) const;
  std::shared_ptr<Work> Fail(OpType op, const absl::Status& status) const;

  const std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const std::shared_ptr<const BackendRegistry> registry_;
  const ProcessGroupOptions options_;
  const std::vector<int> parent_ranks_;

  // Written by Init only.
  std::map<DeviceType, std::string> spec_;
  std::map<std::string, std::unique_ptr<Backend>> backends_;
  std::map<DeviceType, Backend*> by_device_;

  Mutex mu_;
  int next_subgroup_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_PROCESS_GROUP_H_
