#include "ferry/worker/device_landing.h"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ferry/tensor/wire.h"
#include "ferry/worker/device_header.h"

namespace ferry {
namespace {

// The stream the stage lands on (device_stage.cc's kStream): LandIn's one
// wait per device covers the chunks queued here.
constexpr cuda::StreamHandle kStream = 0;

}  // namespace

// One observed message: its pinned payload buffer and, per tensor placed
// on a device here, the device copy its chunks are queued into.
class LandingProgress final
    : public rpc::ReceiveProgress,
      public std::enable_shared_from_this<LandingProgress> {
 public:
  struct Planned {
    uint32_t position;  // Among the payload's tensors (the header's).
    int device;         // Where it lands.
  };

  LandingProgress(std::shared_ptr<DeviceLanding> landing,
                  std::vector<Planned> planned)
      : landing_(std::move(landing)) {
    for (const Planned& p : planned) tensors_.push_back({p});
  }

  ~LandingProgress() override {
    if (registered_) {
      landing_->Unregister(reinterpret_cast<uintptr_t>(buffer_.data()));
    }
    // The device copies (if not adopted) go back to their allocator, and
    // the buffer to its pinned cache: both stream-ordered behind the
    // chunks queued on kStream, so nothing waits here.
  }

  Allocator* allocator() override { return landing_->pinned_->allocator(); }

  void Started(const Storage& buffer) override {
    MutexLock lock(&mu_);
    buffer_ = buffer;
    registered_ = true;
    landing_->Register(reinterpret_cast<uintptr_t>(buffer_.data()),
                       weak_from_this());
  }

  void Received(uint64_t received) override {
    MutexLock lock(&mu_);
    received_ = received;
    QueueLocked(/*early=*/received < buffer_.nbytes());
  }

  std::optional<AdoptedLanding> Adopt(const Tensor& host, int device) {
    MutexLock lock(&mu_);
    const char* base = static_cast<const char*>(buffer_.data());
    for (Tensor_& t : tensors_) {
      if (!t.extent.has_value() || t.adopted || t.dropped ||
          t.planned.device != device || t.extent->size != host.nbytes() ||
          base + t.extent->offset != host.data_ptr()) {
        continue;
      }
      // The whole payload is in: queue the rest.
      QueueLocked(/*early=*/false);
      if (t.dropped || t.queued < t.extent->size) return std::nullopt;
      t.adopted = true;
      return AdoptedLanding{std::move(t.storage), t.early_chunks};
    }
    return std::nullopt;
  }

 private:
  struct Tensor_ {
    Planned planned;
    std::optional<WirePayloadExtent> extent = std::nullopt;
    Storage storage = {};  // The device copy, from its first chunk.
    uint64_t queued = 0;   // Bytes whose copy is queued.
    uint64_t early_chunks = 0;
    bool dropped = false;  // Not pipelined (LandIn copies it).
    bool adopted = false;
  };

  // Reads the extents once the metadata is in, then queues every chunk
  // whose bytes are.
  void QueueLocked(bool early) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (failed_) return;
    const char* base = static_cast<const char*>(buffer_.data());
    if (!extents_read_) {
      absl::StatusOr<std::optional<std::vector<WirePayloadExtent>>> read =
          ReadPayloadExtents(absl::string_view(base, received_));
      if (!read.ok()) {
        failed_ = true;  // LandIn's decoding reports it.
        return;
      }
      if (!read->has_value()) return;  // The metadata is still arriving.
      extents_read_ = true;
      const std::vector<WirePayloadExtent>& extents = **read;
      for (Tensor_& t : tensors_) {
        const WirePayloadExtent* e = t.planned.position < extents.size()
                                         ? &extents[t.planned.position]
                                         : nullptr;
        if (e != nullptr && e->size > 0 &&
            e->offset + e->size <= buffer_.nbytes()) {
          t.extent = *e;
        } else {
          t.dropped = true;
        }
      }
    }
    cuda::DeviceMemoryApi& api = *landing_->pinned_->api();
    for (Tensor_& t : tensors_) {
      if (t.dropped || t.adopted || !t.extent.has_value()) continue;
      const WirePayloadExtent& e = *t.extent;
      while (t.queued < e.size) {
        const uint64_t n = std::min(DeviceLanding::kChunkBytes,
                                    e.size - t.queued);
        if (e.offset + t.queued + n > received_) break;
        if (!t.storage.defined()) {
          absl::StatusOr<Storage> block = landing_->allocator_->Allocate(
              t.planned.device, e.size, kStream);
          if (!block.ok()) {  // LandIn allocates again and reports it.
            t.dropped = true;
            break;
          }
          t.storage = *std::move(block);
        }
        if (recorded_.insert(t.planned.device).second &&
            !landing_->pinned_
                 ->RecordStream(buffer_, t.planned.device, kStream)
                 .ok()) {
          recorded_.erase(t.planned.device);
          t.dropped = true;
          t.storage = Storage();
          break;
        }
        if (!api.MemcpyAsync(t.planned.device,
                             static_cast<char*>(t.storage.data()) + t.queued,
                             base + e.offset + t.queued, n, kStream)
                 .ok()) {
          t.dropped = true;  // Stream-ordered: the block may go now.
          t.storage = Storage();
          break;
        }
        t.queued += n;
        if (early) ++t.early_chunks;
      }
    }
  }

  const std::shared_ptr<DeviceLanding> landing_;
  Mutex mu_;
  Storage buffer_ ABSL_GUARDED_BY(mu_);
  bool registered_ = false;  // Set once in Started, read in the destructor.
  uint64_t received_ ABSL_GUARDED_BY(mu_) = 0;
  bool extents_read_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::set<int> recorded_ ABSL_GUARDED_BY(mu_);  // RecordStream done.
  std::vector<Tensor_> tensors_ ABSL_GUARDED_BY(mu_);
};

DeviceLanding::DeviceLanding(
    std::string me, std::vector<Device> devices, rpc::DeviceMaps maps,
    std::shared_ptr<cuda::CachingDeviceAllocator> allocator,
    std::shared_ptr<cuda::CachingHostAllocator> pinned)
    : me_(std::move(me)),
      devices_(std::move(devices)),
      maps_(std::move(maps)),
      allocator_(std::move(allocator)),
      pinned_(std::move(pinned)) {}

uint32_t DeviceLanding::layer() const { return kDeviceHeaderLayer; }

std::shared_ptr<rpc::ReceiveProgress> DeviceLanding::Observe(
    const rpc::ReceiveStart& start) {
  if (start.payload_bytes < kMinBytes || start.header == nullptr) {
    return nullptr;
  }
  // Positions are checked against the payload once its metadata is in.
  absl::StatusOr<DeviceHeader> header = DecodeDeviceHeader(
      *start.header, std::numeric_limits<uint32_t>::max(), start.request,
      absl::StrCat("worker '", me_, "'"));
  if (!header.ok()) return nullptr;  // LandIn reports it.
  const std::string peer(start.peer);
  std::vector<LandingProgress::Planned> planned;
  for (const DevicePlacement& p : header->placements) {
    if (p.ipc.has_value()) continue;
    Device target;
    if (start.request && !header->returning) {
      if (!p.target.has_value()) continue;
      target = Device::CUDA(*p.target);
    } else {
      absl::StatusOr<Device> back =
          maps_.ReplyTarget(me_, peer, Device::CUDA(p.source),
                            static_cast<int>(p.position));
      if (!back.ok()) continue;
      target = *back;
    }
    if (!target.is_cuda() ||
        std::find(devices_.begin(), devices_.end(), target) == devices_.end()) {
      continue;  // Staged to the CPU, or refused by LandIn.
    }
    planned.push_back({p.position, target.index});
  }
  if (planned.empty()) return nullptr;
  return std::make_shared<LandingProgress>(shared_from_this(),
                                           std::move(planned));
}

std::optional<AdoptedLanding> DeviceLanding::Adopt(const Tensor& host,
                                                   int device) {
  if (!host.defined() || host.nbytes() == 0) return std::nullopt;
  const auto at = reinterpret_cast<uintptr_t>(host.data_ptr());
  std::shared_ptr<LandingProgress> progress;
  {
    MutexLock lock(&mu_);
    auto it = in_flight_.upper_bound(at);
    if (it == in_flight_.begin()) return std::nullopt;
    progress = std::prev(it)->second.lock();
  }
  // Adopt checks the address against the buffer's extents.
  return progress != nullptr ? progress->Adopt(host, device) : std::nullopt;
}

void DeviceLanding::Register(uintptr_t base,
                             std::weak_ptr<LandingProgress> progress) {
  MutexLock lock(&mu_);
  in_flight_[base] = std::move(progress);
}

void DeviceLanding::Unregister(uintptr_t base) {
  MutexLock lock(&mu_);
  auto it = in_flight_.find(base);
  // A buffer freed and reused has already been registered again by its new
  // message only after this one's destructor ran (the block is live until
  // then), so the entry is this message's.
  if (it != in_flight_.end() && it->second.expired()) in_flight_.erase(it);
}

}  // namespace ferry
