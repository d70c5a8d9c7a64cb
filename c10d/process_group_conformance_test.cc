// The Backend conformance suite run through ProcessGroup: a Backend adaptor
// forwards every call to a ProcessGroup, so each op (the flat and uneven
// forms, any-source receive, batched point-to-point, the monitored barrier
// included) is checked as users reach it, through ProcessGroup's dispatch.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ferry/c10d/default_registry.h"
#include "ferry/c10d/process_group.h"
#include "ferry/c10d/testing/backend_conformance.h"
#include "gtest/gtest.h"

namespace ferry {
namespace c10d {
namespace {

// Forwards every Backend call to `pg`; named after the backend serving CPU
// tensors so the suite's name checks apply to what the group runs.
class ProcessGroupAdaptor : public Backend {
 public:
  ProcessGroupAdaptor(std::shared_ptr<ProcessGroup> pg, std::string name,
                      absl::Duration timeout)
      : Backend(std::move(name), pg->rank(), pg->size(), timeout),
        pg_(std::move(pg)) {}

  std::shared_ptr<Work> Allreduce(Tensor t,
                                  const AllreduceOptions& o) override {
    return pg_->Allreduce(std::move(t), o);
  }
  std::shared_ptr<Work> Broadcast(Tensor t,
                                  const BroadcastOptions& o) override {
    return pg_->Broadcast(std::move(t), o);
  }
  std::shared_ptr<Work> Reduce(Tensor t, const ReduceOptions& o) override {
    return pg_->Reduce(std::move(t), o);
  }
  std::shared_ptr<Work> Allgather(std::vector<Tensor> outs, Tensor in,
                                  const AllgatherOptions& o) override {
    return pg_->Allgather(std::move(outs), std::move(in), o);
  }
  std::shared_ptr<Work> Gather(std::vector<Tensor> outs, Tensor in,
                               const GatherOptions& o) override {
    return pg_->Gather(std::move(outs), std::move(in), o);
  }
  std::shared_ptr<Work> Scatter(Tensor out, std::vector<Tensor> ins,
                                const ScatterOptions& o) override {
    return pg_->Scatter(std::move(out), std::move(ins), o);
  }
  std::shared_ptr<Work> ReduceScatter(Tensor out, std::vector<Tensor> ins,
                                      const ReduceScatterOptions& o) override {
    return pg_->ReduceScatter(std::move(out), std::move(ins), o);
  }
  std::shared_ptr<Work> Alltoall(std::vector<Tensor> outs,
                                 std::vector<Tensor> ins,
                                 const AlltoallOptions& o) override {
    return pg_->Alltoall(std::move(outs), std::move(ins), o);
  }
  std::shared_ptr<Work> Barrier(const BarrierOptions& o) override {
    return pg_->Barrier(o);
  }
  std::shared_ptr<Work> Send(Tensor t, int dst, const SendOptions& o) override {
    return pg_->Send(std::move(t), dst, o);
  }
  std::shared_ptr<Work> Recv(Tensor t, int src, const RecvOptions& o) override {
    return pg_->Recv(std::move(t), src, o);
  }
  std::shared_ptr<Work> AllgatherIntoTensor(
      Tensor out, Tensor in, const AllgatherOptions& o) override {
    return pg_->AllgatherIntoTensor(std::move(out), std::move(in), o);
  }
  std::shared_ptr<Work> ReduceScatterTensor(
      Tensor out, Tensor in, const ReduceScatterOptions& o) override {
    return pg_->ReduceScatterTensor(std::move(out), std::move(in), o);
  }
  std::shared_ptr<Work> AlltoallSingle(
      Tensor out, Tensor in, const AlltoallSingleOptions& o) override {
    return pg_->AlltoallSingle(std::move(out), std::move(in), o);
  }
  std::shared_ptr<Work> RecvAnysource(Tensor t, const RecvOptions& o) override {
    return pg_->RecvAnysource(std::move(t), o);
  }
  std::vector<std::shared_ptr<Work>> BatchIsendIrecv(
      std::vector<P2POp> ops) override {
    return pg_->BatchIsendIrecv(std::move(ops));
  }
  absl::Status MonitoredBarrier(const MonitoredBarrierOptions& o) override {
    return pg_->MonitoredBarrier(o);
  }

 private:
  std::shared_ptr<ProcessGroup> pg_;
};

BackendUnderTest ThroughProcessGroup(std::string backend, std::string label,
                                     std::map<std::string, std::string> opts,
                                     std::vector<OpType> extra_ops) {
  BackendUnderTest b;
  b.name = label;
  b.create =
      [backend, opts](
          std::shared_ptr<Store> store, int rank, int size,
          absl::Duration timeout) -> absl::StatusOr<std::unique_ptr<Backend>> {
    ProcessGroupOptions o;
    o.backend = backend;
    o.timeout = timeout;
    o.backend_options = opts;
    absl::StatusOr<std::shared_ptr<ProcessGroup>> pg = ProcessGroup::Create(
        std::move(store), rank, size, MakeDefaultBackendRegistry(), o);
    if (!pg.ok()) return pg.status();
    absl::StatusOr<Backend*> cpu = (*pg)->GetBackend(DeviceType::kCPU);
    if (!cpu.ok()) return cpu.status();
    return std::unique_ptr<Backend>(
        std::make_unique<ProcessGroupAdaptor>(*pg, (*cpu)->name(), timeout));
  };
  for (OpType op : extra_ops) b.ops.push_back(op);
  return b;
}

INSTANTIATE_TEST_SUITE_P(
    ProcessGroup, BackendConformanceTest,
    ::testing::Values(
        // Gloo alone, and the default "auto" (shared memory in front of
        // gloo, since the test's ranks share a host).
        ThroughProcessGroup("gloo", "GlooThroughProcessGroup",
                            {{"check_args", "true"}},
                            {OpType::kAllgatherIntoTensor,
                             OpType::kReduceScatterTensor,
                             OpType::kAlltoallSingle, OpType::kRecvAnysource,
                             OpType::kMonitoredBarrier}),
        ThroughProcessGroup("auto", "DefaultThroughProcessGroup", {},
                            {OpType::kAllgatherIntoTensor,
                             OpType::kReduceScatterTensor,
                             OpType::kAlltoallSingle, OpType::kRecvAnysource,
                             OpType::kMonitoredBarrier})),
    BackendUnderTestName);

}  // namespace
}  // namespace c10d
}  // namespace ferry
