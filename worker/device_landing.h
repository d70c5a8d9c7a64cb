// DeviceLanding: pipelined landing of staged CUDA tensors (issue #32). A
// streamed message whose device header places tensors on this worker's
// devices arrives in pinned host memory, and each tensor's copy to its
// device is queued in chunks of kChunkBytes as soon as a chunk's bytes are
// in: the host-to-device copy overlaps receiving instead of following it.
// It is the device layer's rpc::ReceiveObserver (rpc/receive_observer.h);
// DeviceStage::LandIn adopts the device copy (Adopt) instead of copying the
// landed host bytes again. Messages not observed land the old way.
//
// Contract: Observe trusts nothing. A header that does not decode, a target
// this worker does not use, a payload whose metadata does not parse, or an
// extent that is not the tensor LandIn finds there: that tensor (or the
// whole message) is simply not pipelined, and LandIn, which checks
// everything, reports the error. A device allocation or copy that fails
// drops that tensor's early copy (LandIn copies it again and reports what
// fails then). Device blocks are allocated and copied on kStream, the pinned
// buffer is recorded as used there: a message dropped mid-stream (sender
// died, stream cut) gives both back, stream-ordered, with no wait.
// Thread safety: any thread; one mutex per message, one for the registry
// of messages in flight.
// Design: docs/design/cuda_rpc.md ("Pipelined landing").
#ifndef FERRY_WORKER_DEVICE_LANDING_H_
#define FERRY_WORKER_DEVICE_LANDING_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/device_map.h"
#include "ferry/rpc/receive_observer.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/pinned_allocator.h"
#include "ferry/tensor/tensor.h"

namespace ferry {

class LandingProgress;

/// A device copy Adopt hands over: every chunk queued on kStream.
struct AdoptedLanding {
  Storage storage;         ///< On the tensor's target device.
  uint64_t early_chunks;   ///< Chunks queued before the message was whole.
};

/// The observer of one worker's stage (see the top of the file).
class DeviceLanding final
    : public rpc::ReceiveObserver,
      public std::enable_shared_from_this<DeviceLanding> {
 public:
  /// Messages with at least this many payload bytes are observed.
  static constexpr uint64_t kMinBytes = uint64_t{2} << 20;
  /// Chunk of a tensor's copy to its device.
  static constexpr uint64_t kChunkBytes = uint64_t{1} << 20;

  /// For worker `me` using `devices` with `maps`; the allocators must not
  /// be null. Make it with std::make_shared (Observe shares it).
  DeviceLanding(std::string me, std::vector<Device> devices,
                rpc::DeviceMaps maps,
                std::shared_ptr<cuda::CachingDeviceAllocator> allocator,
                std::shared_ptr<cuda::CachingHostAllocator> pinned);

  uint32_t layer() const override;
  std::shared_ptr<rpc::ReceiveProgress> Observe(
      const rpc::ReceiveStart& start) override;

  /// The device copy of `host` (a tensor decoded from an observed payload,
  /// in place) on `device`, its remaining chunks queued now; nullopt when
  /// it was not pipelined there (land it the old way).
  std::optional<AdoptedLanding> Adopt(const Tensor& host, int device);

 private:
  friend class LandingProgress;
  void Register(uintptr_t base, std::weak_ptr<LandingProgress> progress);
  void Unregister(uintptr_t base);

  const std::string me_;
  const std::vector<Device> devices_;
  const rpc::DeviceMaps maps_;
  const std::shared_ptr<cuda::CachingDeviceAllocator> allocator_;
  const std::shared_ptr<cuda::CachingHostAllocator> pinned_;
  Mutex mu_;
  // Observed payload buffers by their first byte's address.
  std::map<uintptr_t, std::weak_ptr<LandingProgress>> in_flight_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_WORKER_DEVICE_LANDING_H_
