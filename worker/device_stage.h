// DeviceStage: CUDA tensors through RPC over the staged path (issue #32),
// through rpc/'s interceptor seam and the device layer's typed header
// (worker/device_header.h), so rpc/ and its transports see no device.
// Sending (a request or a reply), each CUDA tensor is copied into pinned
// host memory (the stage's CachingHostAllocator) and replaced by it; the
// copies are queued, then each device waited for once (a large tensor's
// copy goes on in chunks the transport waits for: pipelined). A request's
// tensor goes where this worker's map to the peer says (DeviceMaps::Target:
// an unmapped device is InvalidArgument naming the worker, the peer, the
// tensor's position and the device, unless staging to CPU is allowed, then
// it stays a CPU tensor); the header records each placement. A reply's
// tensor records only its device: the caller applies the reverse of its own
// map (rpc::DeviceMaps::ReplyTarget) on arrival, so the maps and staging
// option governing a pair are always the caller's; so do a request's
// marked autograd::dist::kReturningEntry (gradients going back). Receiving,
// each placement's copy onto its device (this worker's allocator, from
// pinned memory; chunks of large streamed ones queued while they arrive,
// worker/device_landing.h) is queued, each device waited for once, before
// the handler or the caller's future sees the message; on any failure the
// message fails and the landed tensors go back to the allocator. IPC pairs
// carry handles instead.
// Errors name this worker, the peer, the tensor's position and the device:
// a tensor on a device this worker does not use (FailedPrecondition), a
// header naming a device the receiver lacks (InvalidArgument; a receiver
// without CUDA devices: FailedPrecondition), malformed header
// (InvalidArgument), out of device memory (ResourceExhausted, the
// allocator's text with the device and size).
// Thread safety: any thread. The agent holds the interceptors, they the stage.
// Design: docs/design/cuda_rpc.md.
#ifndef FERRY_WORKER_DEVICE_STAGE_H_
#define FERRY_WORKER_DEVICE_STAGE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/agent.h"
#include "ferry/rpc/inspect.h"
#include "ferry/rpc/message.h"
#include "ferry/tensor/storage.h"
#include "ferry/worker/device_ipc.h"
#include "ferry/worker/device_landing.h"
#include "ferry/worker/device_plan.h"

namespace ferry {

namespace cuda {
class CachingDeviceAllocator;
class CachingHostAllocator;
class DeviceMemoryApi;
}  // namespace cuda

/// Counters of the tensors staged with one peer (monotonic).
struct StagedTraffic {
  uint64_t tensors_out = 0;  ///< CUDA tensors sent to it through host memory.
  uint64_t bytes_out = 0;    ///< Their bytes.
  uint64_t to_cpu_out = 0;   ///< Of tensors_out, those sent to land on its CPU.
  uint64_t tensors_in = 0;   ///< Its tensors landed on a device here.
  uint64_t bytes_in = 0;     ///< Their bytes.
  /// Of tensors_in, those whose copy to the device was queued while their
  /// message was arriving (pipelined landing, worker/device_landing.h).
  uint64_t pipelined_in = 0;
  /// Chunks of those copies queued before their message was whole.
  uint64_t early_chunks = 0;
  uint64_t refused = 0;      ///< Messages to or from it that this stage failed.
};

/// The staged path of one worker (see the top of the file).
class DeviceStage {
 public:
  /// A CUDA tensor of at least this many bytes (contiguous, not by IPC) is
  /// staged pipelined: its copy is queued in chunks of kPipelineChunkBytes
  /// and the message goes on at once; the transport sends each piece once
  /// the chunks it covers ran (docs/design/cuda_rpc.md).
  static constexpr uint64_t kPipelineMinBytes = uint64_t{2} << 20;
  /// See kPipelineMinBytes.
  static constexpr uint64_t kPipelineChunkBytes = uint64_t{1} << 20;

  /// The stage of worker `me` with `options` (parsed and checked) over
  /// `api` (null when the worker has no devices; then a CUDA tensor sent or
  /// a placement received is refused). Landed tensors record `compute`
  /// (may be null) as their storage's backend, so autograd computes on them.
  static absl::StatusOr<std::shared_ptr<DeviceStage>> Create(
      std::string me, const DeviceOptions& options,
      std::shared_ptr<cuda::DeviceMemoryApi> api,
      std::shared_ptr<DeviceComputeInterface> compute = nullptr);
  ~DeviceStage();

  /// Lands the placements of a received request or reply (kReceive*
  /// points); other points pass. Add it before the layers' interceptors.
  static rpc::Interceptor ReceiveInterceptor(std::weak_ptr<DeviceStage> stage);
  /// Stages the CUDA tensors of an outgoing request or reply (kSend*
  /// points); other points pass. Add it after the layers' interceptors.
  static rpc::Interceptor SendInterceptor(std::weak_ptr<DeviceStage> stage);

  /// Stages `message`'s CUDA tensors for `peer` (`request`: a request).
  absl::Status StageOut(const rpc::WorkerInfo& peer, rpc::Message& message,
                        bool request);
  /// `t` with this worker's compute backend attached (when it has one), so
  /// autograd can compute on a landed tensor.
  absl::StatusOr<Tensor> WithCompute(Tensor t) const;
  /// Lands `message`'s placements from `peer` (`request`: a request).
  absl::Status LandIn(const rpc::WorkerInfo& peer, rpc::Message& message,
                      bool request);

  /// The allocator landed tensors come from; null without devices.
  cuda::CachingDeviceAllocator* allocator() const { return allocator_.get(); }
  /// The pinned host memory staged copies go through; null without devices.
  cuda::CachingHostAllocator* pinned() const { return pinned_.get(); }
  /// The IPC path (worker/device_ipc.h); null when the API has none.
  const std::shared_ptr<DeviceIpc>& ipc() const { return ipc_; }
  /// The streamed-payload observer that lands tensors as they arrive
  /// (worker/device_landing.h); null without devices.
  const std::shared_ptr<DeviceLanding>& landing() const { return landing_; }
  /// The counters of `peer` (zeros when none moved).
  StagedTraffic Traffic(const std::string& peer) const;
  /// Rows for the Admin inspector "devices": one "staged" row per peer and
  /// a "pinned" row (the pinned allocator's counters) when it has devices.
  std::vector<rpc::InspectionRow> Inspect() const;

 private:
  DeviceStage(std::string me, const DeviceOptions& options,
              std::shared_ptr<cuda::DeviceMemoryApi> api,
              std::shared_ptr<cuda::CachingDeviceAllocator> allocator,
              std::shared_ptr<cuda::CachingHostAllocator> pinned,
              std::shared_ptr<DeviceComputeInterface> compute);
  bool Uses(const Device& device) const;
  std::string DeviceListText() const;
  void Count(const std::string& peer, const StagedTraffic& delta);

  const std::string me_;
  const std::vector<Device> devices_;
  const rpc::DeviceMaps maps_;
  const std::shared_ptr<cuda::DeviceMemoryApi> api_;
  const std::shared_ptr<cuda::CachingDeviceAllocator> allocator_;
  const std::shared_ptr<cuda::CachingHostAllocator> pinned_;
  const std::shared_ptr<DeviceComputeInterface> compute_;
  const std::shared_ptr<DeviceIpc> ipc_;  // After allocator_: goes first.
  const std::shared_ptr<DeviceLanding> landing_;
  mutable Mutex mu_;
  std::map<std::string, StagedTraffic> traffic_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_WORKER_DEVICE_STAGE_H_
