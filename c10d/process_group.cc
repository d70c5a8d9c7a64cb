#include "ferry/c10d/process_group.h"

#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ferry/common/status.h"
#include "ferry/store/prefix_store.h"

namespace ferry {
namespace c10d {

absl::StatusOr<std::map<DeviceType, std::string>> ParseBackendSpec(
    absl::string_view spec, const BackendRegistry& registry) {
  std::map<DeviceType, std::string> out;
  absl::string_view trimmed = absl::StripAsciiWhitespace(spec);
  if (trimmed.empty()) {
    return absl::InvalidArgumentError("backend spec is empty");
  }
  if (trimmed.find(':') == absl::string_view::npos) {
    if (trimmed.find(',') != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "backend spec '", spec,
          "': list entries must be device:backend (e.g. cpu:gloo,cuda:nccl)"));
    }
    std::string name(trimmed);
    ASSIGN_OR_RETURN(std::vector<DeviceType> devices, registry.Devices(name));
    for (DeviceType d : devices) out[d] = name;
    return out;
  }
  for (absl::string_view entry : absl::StrSplit(trimmed, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(entry, ':');
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("backend spec '", spec, "': entry '", entry,
                       "' is not device:backend"));
    }
    std::string device =
        absl::AsciiStrToLower(absl::StripAsciiWhitespace(parts[0]));
    std::string name(absl::StripAsciiWhitespace(parts[1]));
    DeviceType type;
    if (device == "cpu") {
      type = DeviceType::kCPU;
    } else if (device == "cuda") {
      type = DeviceType::kCUDA;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("backend spec '", spec, "': unknown device type '",
                       device, "' (known: cpu, cuda)"));
    }
    if (out.count(type) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("backend spec '", spec,
                                                     "': device type '", device,
                                                     "' is given twice"));
    }
    if (!registry.IsRegistered(name)) {
      return registry.Devices(name).status();  // NotFound listing names.
    }
    out[type] = name;
  }
  return out;
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> ProcessGroup::Create(
    std::shared_ptr<Store> store, int rank, int size,
    std::shared_ptr<const BackendRegistry> registry,
    ProcessGroupOptions options) {
  if (store == nullptr || registry == nullptr) {
    return absl::InvalidArgumentError(
        "ProcessGroup::Create: store and registry must not be null");
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ProcessGroup::Create: rank ", rank, " is not in [0, ", size, ")"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ProcessGroup::Create: timeout must be positive");
  }
  std::vector<int> identity(size);
  for (int i = 0; i < size; ++i) identity[i] = i;
  std::shared_ptr<ProcessGroup> pg(
      new ProcessGroup(std::move(store), rank, size, std::move(registry),
                       std::move(options), std::move(identity)));
  RETURN_IF_ERROR(pg->Init());
  return pg;
}

ProcessGroup::ProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                           std::shared_ptr<const BackendRegistry> registry,
                           ProcessGroupOptions options,
                           std::vector<int> parent_ranks)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      registry_(std::move(registry)),
      options_(std::move(options)),
      parent_ranks_(std::move(parent_ranks)) {}

ProcessGroup::~ProcessGroup() = default;

absl::Status ProcessGroup::Init() {
  ASSIGN_OR_RETURN(spec_, ParseBackendSpec(options_.backend, *registry_));
  // Create each distinct backend once, in name order on every rank.
  std::set<std::string> names;
  for (const auto& [device, name] : spec_) names.insert(name);
  for (const std::string& name : names) {
    BackendConfig config;
    config.store = std::make_shared<PrefixStore>(
        absl::StrCat(options_.name, "/", name), store_);
    config.store->SetTimeout(options_.timeout);
    config.rank = rank_;
    config.size = size_;
    config.timeout = options_.timeout;
    config.options = options_.backend_options;
    config.rendezvous_host = options_.rendezvous_host;
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        registry_->Create(name, config);
    if (!backend.ok()) {
      return Annotate(backend.status(),
                      absl::StrCat("process group '", options_.name, "'"));
    }
    backends_[name] = std::move(*backend);
  }
  for (const auto& [device, name] : spec_) {
    by_device_[device] = backends_[name].get();
  }
  return absl::OkStatus();
}

std::string ProcessGroup::BackendSpec() const {
  std::vector<std::string> parts;
  for (const auto& [device, name] : spec_) {
    parts.push_back(absl::StrCat(DeviceTypeName(device), ":", name));
  }
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<Backend*> ProcessGroup::GetBackend(DeviceType device) const {
  auto it = by_device_.find(device);
  if (it == by_device_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "process group '", options_.name, "' has no backend for ",
        DeviceTypeName(device), " tensors (backends: ", BackendSpec(), ")"));
  }
  return it->second;
}

absl::StatusOr<Backend*> ProcessGroup::Dispatch(
    OpType op, const std::vector<const Tensor*>& tensors) const {
  std::optional<DeviceType> device;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;  // The backend reports undefined tensors.
    DeviceType d = t->device().type;
    if (device.has_value() && *device != d) {
      return absl::InvalidArgumentError(
          absl::StrCat(OpTypeName(op), ": tensors on both ",
                       DeviceTypeName(*device), " and ", DeviceTypeName(d),
                       "; the tensors of one call must share a device type"));
    }
    device = d;
  }
  if (!device.has_value()) {
    // Nothing to dispatch on (a Barrier, or only undefined tensors).
    device = by_device_.count(DeviceType::kCPU) ? DeviceType::kCPU
                                                : by_device_.begin()->first;
  }
  return GetBackend(*device);
}

std::shared_ptr<Work> ProcessGroup::Fail(OpType op,
                                         const absl::Status& status) const {
  std::string description =
      absl::StrCat("process group '", options_.name, "' ", OpTypeName(op));
  return Work::Completed(description, Annotate(status, description));
}

namespace {

std::vector<const Tensor*> Ptrs(const std::vector<Tensor>& a,
                                const std::vector<Tensor>& b = {}) {
  std::vector<const Tensor*> out;
  for (const Tensor& t : a) out.push_back(&t);
  for (const Tensor& t : b) out.push_back(&t);
  return out;
}

}  // namespace

#define FERRY_PG_DISPATCH(op, tensors, call)                  \
  do {                                                        \
    absl::StatusOr<Backend*> backend = Dispatch(op, tensors); \
    if (!backend.ok()) return Fail(op, backend.status());     \
    return (*backend)->call;                                  \
  } while (0)

std::shared_ptr<Work> ProcessGroup::Allreduce(Tensor tensor,
                                              const AllreduceOptions& options) {
  FERRY_PG_DISPATCH(OpType::kAllreduce, {&tensor},
                    Allreduce(std::move(tensor), options));
}

std::shared_ptr<Work> ProcessGroup::Broadcast(Tensor tensor,
                                              const BroadcastOptions& options) {
  FERRY_PG_DISPATCH(OpType::kBroadcast, {&tensor},
                    Broadcast(std::move(tensor), options));
}

std::shared_ptr<Work> ProcessGroup::Reduce(Tensor tensor,
                                           const ReduceOptions& options) {
  FERRY_PG_DISPATCH(OpType::kReduce, {&tensor},
                    Reduce(std::move(tensor), options));
}

std::shared_ptr<Work> ProcessGroup::Allgather(std::vector<Tensor> outputs,
                                              Tensor input,
                                              const AllgatherOptions& options) {
  std::vector<const Tensor*> all = Ptrs(outputs);
  all.push_back(&input);
  FERRY_PG_DISPATCH(OpType::kAllgather, all,
                    Allgather(std::move(outputs), std::move(input), options));
}

std::shared_ptr<Work> ProcessGroup::Gather(std::vector<Tensor> outputs,
                                           Tensor input,
                                           const GatherOptions& options) {
  std::vector<const Tensor*> all = Ptrs(outputs);
  all.push_back(&input);
  FERRY_PG_DISPATCH(OpType::kGather, all,
                    Gather(std::move(outputs), std::move(input), options));
}

std::shared_ptr<Work> ProcessGroup::Scatter(Tensor output,
                                            std::vector<Tensor> inputs,
                                            const ScatterOptions& options) {
  std::vector<const Tensor*> all = Ptrs(inputs);
  all.push_back(&output);
  FERRY_PG_DISPATCH(OpType::kScatter, all,
                    Scatter(std::move(output), std::move(inputs), options));
}

std::shared_ptr<Work> ProcessGroup::ReduceScatter(
    Tensor output, std::vector<Tensor> inputs,
    const ReduceScatterOptions& options) {
  std::vector<const Tensor*> all = Ptrs(inputs);
  all.push_back(&output);
  FERRY_PG_DISPATCH(
      OpType::kReduceScatter, all,
      ReduceScatter(std::move(output), std::move(inputs), options));
}

std::shared_ptr<Work> ProcessGroup::Alltoall(std::vector<Tensor> outputs,
                                             std::vector<Tensor> inputs,
                                             const AlltoallOptions& options) {
  FERRY_PG_DISPATCH(OpType::kAlltoall, Ptrs(outputs, inputs),
                    Alltoall(std::move(outputs), std::move(inputs), options));
}

std::shared_ptr<Work> ProcessGroup::Barrier(const BarrierOptions& options) {
  FERRY_PG_DISPATCH(OpType::kBarrier, {}, Barrier(options));
}

std::shared_ptr<Work> ProcessGroup::Send(Tensor tensor, int dst_rank,
                                         const SendOptions& options) {
  FERRY_PG_DISPATCH(OpType::kSend, {&tensor},
                    Send(std::move(tensor), dst_rank, options));
}

std::shared_ptr<Work> ProcessGroup::Recv(Tensor tensor, int src_rank,
                                         const RecvOptions& options) {
  FERRY_PG_DISPATCH(OpType::kRecv, {&tensor},
                    Recv(std::move(tensor), src_rank, options));
}

std::shared_ptr<Work> ProcessGroup::AllgatherIntoTensor(
    Tensor output, Tensor input, const AllgatherOptions& options) {
  FERRY_PG_DISPATCH(
      OpType::kAllgatherIntoTensor,
      (std::vector<const Tensor*>{&output, &input}),
      AllgatherIntoTensor(std::move(output), std::move(input), options));
}

std::shared_ptr<Work> ProcessGroup::ReduceScatterTensor(
    Tensor output, Tensor input, const ReduceScatterOptions& options) {
  FERRY_PG_DISPATCH(
      OpType::kReduceScatterTensor,
      (std::vector<const Tensor*>{&output, &input}),
      ReduceScatterTensor(std::move(output), std::move(input), options));
}

std::shared_ptr<Work> ProcessGroup::AlltoallSingle(
    Tensor output, Tensor input, const AlltoallSingleOptions& options) {
  FERRY_PG_DISPATCH(
      OpType::kAlltoallSingle, (std::vector<const Tensor*>{&output, &input}),
      AlltoallSingle(std::move(output), std::move(input), options));
}

std::shared_ptr<Work> ProcessGroup::RecvAnysource(Tensor tensor,
                                                  const RecvOptions& options) {
  FERRY_PG_DISPATCH(OpType::kRecvAnysource, {&tensor},
                    RecvAnysource(std::move(tensor), options));
}

#undef FERRY_PG_DISPATCH

std::vector<std::shared_ptr<Work>> ProcessGroup::BatchIsendIrecv(
    std::vector<P2POp> ops) {
  if (ops.empty()) return {};
  std::vector<const Tensor*> tensors;
  for (const P2POp& op : ops) tensors.push_back(&op.tensor);
  // The batch's device type decides the backend; a batch mixing device
  // types fails every entry.
  const OpType kind =
      ops[0].kind == P2POp::Kind::kSend ? OpType::kSend : OpType::kRecv;
  absl::StatusOr<Backend*> backend = Dispatch(kind, tensors);
  if (!backend.ok()) {
    std::vector<std::shared_ptr<Work>> failed;
    for (const P2POp& op : ops) {
      failed.push_back(
          Fail(op.kind == P2POp::Kind::kSend ? OpType::kSend : OpType::kRecv,
               backend.status()));
    }
    return failed;
  }
  return (*backend)->BatchIsendIrecv(std::move(ops));
}

absl::Status ProcessGroup::MonitoredBarrier(
    const MonitoredBarrierOptions& options) {
  ASSIGN_OR_RETURN(Backend * backend, Dispatch(OpType::kMonitoredBarrier, {}));
  return backend->MonitoredBarrier(options);
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> ProcessGroup::NewGroup(
    std::vector<int> ranks, std::optional<std::string> backend,
    std::optional<absl::Duration> timeout) {
  if (ranks.empty()) {
    return absl::InvalidArgumentError("NewGroup: ranks is empty");
  }
  std::set<int> seen;
  int my_index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    int r = ranks[i];
    if (r < 0 || r >= size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("NewGroup: rank ", r, " is not in [0, ", size_, ")"));
    }
    if (!seen.insert(r).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("NewGroup: rank ", r, " is listed twice"));
    }
    if (r == rank_) my_index = static_cast<int>(i);
  }
  int index;
  {
    MutexLock lock(&mu_);
    index = next_subgroup_++;
  }
  if (my_index < 0) return std::shared_ptr<ProcessGroup>(nullptr);
  ProcessGroupOptions options = options_;
  options.name = absl::StrCat(options_.name, "/sub", index);
  if (backend.has_value()) options.backend = *backend;
  if (timeout.has_value()) options.timeout = *timeout;
  const int new_size = static_cast<int>(ranks.size());
  std::shared_ptr<ProcessGroup> pg(
      new ProcessGroup(store_, my_index, new_size, registry_,
                       std::move(options), std::move(ranks)));
  RETURN_IF_ERROR(pg->Init());
  return pg;
}

}  // namespace c10d
}  // namespace ferry
