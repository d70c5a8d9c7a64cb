#include "ferry/tensor/cuda/caching_allocator.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "ferry/common/logging.h"
#include "ferry/tensor/cuda/stream_uses.h"

namespace ferry {
namespace cuda {
namespace {

constexpr size_t kMinBlock = 512;
constexpr size_t kSmallLimit = size_t{1} << 20;
// Larger requests are refused before rounding (no device has 256 TiB).
constexpr size_t kMaxRequest = size_t{1} << 48;

}  // namespace

std::string DescribeHeldBytes(const AllocatorStats& stats, uint64_t limit) {
  return absl::StrFormat(
      "%d bytes in use, %d cached, %d pending, limit %s",
      stats.allocated_bytes, stats.cached_bytes, stats.pending_bytes,
      limit == 0 ? std::string("none") : absl::StrCat(limit));
}

size_t CachingDeviceAllocator::RoundSize(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  if (nbytes <= kSmallLimit) {
    return (nbytes + kMinBlock - 1) / kMinBlock * kMinBlock;
  }
  const int top = 63 - __builtin_clzll(static_cast<unsigned long long>(nbytes));
  const size_t step = (size_t{1} << top) / 4;
  return (nbytes + step - 1) / step * step;
}

class CachingDeviceAllocator::State
    : public std::enable_shared_from_this<State> {
 public:
  State(std::shared_ptr<DeviceMemoryApi> api, Options options)
      : api_(std::move(api)),
        options_(options),
        stats_(static_cast<size_t>(api_->DeviceCount())) {}

  ~State() {
    absl::MutexLock lock(&mu_);
    for (void* ptr : pending_) {
      Block& b = blocks_.at(ptr);
      b.uses.DestroyEvents(*api_);
      FreeToDevice(ptr, b).IgnoreError();
    }
    pending_.clear();
    for (int d = 0; d < static_cast<int>(stats_.size()); ++d) {
      ReleaseCached(d).IgnoreError();
    }
  }

  std::string DeviceName(int device) const {
    return absl::StrCat(api_->name(), ":", device);
  }

  absl::StatusOr<Storage> Allocate(int device, size_t nbytes,
                                   StreamHandle stream) {
    absl::Status valid = CheckDevice(*api_, device);
    if (!valid.ok()) return valid;
    if (nbytes > kMaxRequest) {
      absl::MutexLock lock(&mu_);
      ++stats_[device].out_of_memory;
      return OutOfMemory(device, nbytes, 0, "larger than any device");
    }
    const size_t size = RoundSize(nbytes);
    void* ptr = nullptr;
    {
      absl::MutexLock lock(&mu_);
      CollectPending();
      AllocatorStats& st = stats_[device];
      auto it = free_.find(FreeKey{device, stream, size});
      if (it != free_.end() && !it->second.empty()) {
        ptr = it->second.back();
        it->second.pop_back();
        if (it->second.empty()) free_.erase(it);
        st.cached_bytes -= size;
        ++st.cache_hits;
      } else {
        absl::StatusOr<void*> fresh = FromDevice(device, nbytes, size);
        if (!fresh.ok()) return fresh.status();
        ptr = *fresh;
        blocks_[ptr] = Block{device, size, stream, {}};
      }
      st.allocated_bytes += size;
      st.peak_allocated_bytes =
          std::max(st.peak_allocated_bytes, st.allocated_bytes);
      ++st.allocations;
    }
    std::shared_ptr<State> self = shared_from_this();
    std::shared_ptr<const void> owner(
        ptr, [self](const void* p) { self->Release(const_cast<void*>(p)); });
    return Storage::Wrap(ptr, nbytes, Device::CUDA(device), std::move(owner));
  }

  absl::Status RecordStream(void* ptr, StreamHandle stream) {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "RecordStream: storage at %p is not from this %s allocator", ptr,
          api_->name()));
    }
    Block& b = it->second;
    if (stream != b.stream) b.uses.Add(b.device, stream);
    return absl::OkStatus();
  }

  absl::Status EmptyCache() {
    absl::MutexLock lock(&mu_);
    CollectPending();
    absl::Status first;
    for (int d = 0; d < static_cast<int>(stats_.size()); ++d) {
      first.Update(ReleaseCached(d));
    }
    return first;
  }

  AllocatorStats Stats(int device) {
    absl::MutexLock lock(&mu_);
    if (device < 0 || device >= static_cast<int>(stats_.size())) return {};
    CollectPending();
    AllocatorStats st = stats_[device];
    st.reserved_bytes = st.allocated_bytes + st.cached_bytes + st.pending_bytes;
    return st;
  }

  absl::StatusOr<Allocator*> ForStream(int device, StreamHandle stream) {
    absl::Status valid = CheckDevice(*api_, device);
    if (!valid.ok()) return valid;
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Allocator>& slot = adapters_[{device, stream}];
    if (slot == nullptr) {
      slot = std::make_unique<StreamAllocator>(this, device, stream);
    }
    return slot.get();
  }

 private:
  struct Block {
    int device;
    size_t size;
    StreamHandle stream;  // Allocated for.
    StreamUses uses;      // Other streams (RecordStream), events once freed.
  };
  struct FreeKey {
    int device;
    StreamHandle stream;
    size_t size;
    friend bool operator<(const FreeKey& a, const FreeKey& b) {
      return std::tie(a.device, a.stream, a.size) <
             std::tie(b.device, b.stream, b.size);
    }
  };
  // Allocator (tensor/storage.h) for one device and stream.
  class StreamAllocator : public Allocator {
   public:
    StreamAllocator(State* state, int device, StreamHandle stream)
        : state_(state), device_(device), stream_(stream) {}
    Device device() const override { return Device::CUDA(device_); }
    absl::StatusOr<Storage> Allocate(size_t nbytes) override {
      return state_->Allocate(device_, nbytes, stream_);
    }

   private:
    State* const state_;
    const int device_;
    const StreamHandle stream_;
  };

  // The last Storage of `ptr` went away.
  void Release(void* ptr) {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) {
      FERRY_LOG(ERROR) << "caching allocator: release of unknown block " << ptr;
      return;
    }
    Block& b = it->second;
    AllocatorStats& st = stats_[b.device];
    st.allocated_bytes -= b.size;
    if (!b.uses.has_uses()) {
      ToFreeList(ptr, b);
      return;
    }
    absl::Status recorded = b.uses.RecordEvents(*api_);
    if (!recorded.ok()) {
      // Cannot order the reuse: give the block back to the device, whose
      // free waits for its work, rather than risk reusing it early.
      FERRY_LOG(WARNING) << DeviceName(b.device)
                         << ": caching allocator: block of " << b.size
                         << " bytes returned to the device: " << recorded;
      FreeToDevice(ptr, b).IgnoreError();
      return;
    }
    st.pending_bytes += b.size;
    pending_.push_back(ptr);
  }

  void ToFreeList(void* ptr, const Block& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    free_[FreeKey{b.device, b.stream, b.size}].push_back(ptr);
    stats_[b.device].cached_bytes += b.size;
  }

  // Moves the pending blocks whose events are all done to the free lists.
  void CollectPending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<void*> still;
    for (void* ptr : pending_) {
      Block& b = blocks_.at(ptr);
      absl::StatusOr<bool> done = b.uses.EventsDone(*api_);
      if (!done.ok()) {
        FERRY_LOG(WARNING) << DeviceName(b.device)
                           << ": caching allocator: event query failed ("
                           << done.status() << "); block of " << b.size
                           << " bytes returned to the device";
        stats_[b.device].pending_bytes -= b.size;
        b.uses.DestroyEvents(*api_);
        FreeToDevice(ptr, b).IgnoreError();
        continue;
      }
      if (!*done) {
        still.push_back(ptr);
        continue;
      }
      b.uses.DestroyEvents(*api_);
      stats_[b.device].pending_bytes -= b.size;
      ToFreeList(ptr, b);
    }
    pending_ = std::move(still);
  }

  // Frees `ptr` (not in any list any more) and forgets it.
  absl::Status FreeToDevice(void* ptr, const Block& b)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int device = b.device;
    absl::Status s = api_->Free(device, ptr);
    ++stats_[device].device_frees;
    blocks_.erase(ptr);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(DeviceName(device), ": ",
                                                 s.message()));
    }
    return s;
  }

  // Returns every cached block of `device` to the device.
  absl::Status ReleaseCached(int device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status first;
    auto it = free_.lower_bound(FreeKey{device, 0, 0});
    while (it != free_.end() && it->first.device == device) {
      for (void* ptr : it->second) {
        const size_t size = it->first.size;
        stats_[device].cached_bytes -= size;
        first.Update(FreeToDevice(ptr, blocks_.at(ptr)));
      }
      it = free_.erase(it);
    }
    return first;
  }

  uint64_t Reserved(int device) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    const AllocatorStats& st = stats_[device];
    return st.allocated_bytes + st.cached_bytes + st.pending_bytes;
  }

  // A new block of `size` from the device, within the limit.
  absl::StatusOr<void*> FromDevice(int device, size_t nbytes, size_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    AllocatorStats& st = stats_[device];
    const uint64_t limit = options_.limit_bytes;
    if (limit != 0 && Reserved(device) + size > limit) {
      ReleaseCached(device).IgnoreError();
      if (Reserved(device) + size > limit) {
        ++st.out_of_memory;
        return OutOfMemory(device, nbytes, size, "over the limit");
      }
    }
    absl::StatusOr<void*> p = api_->Malloc(device, size);
    ++st.device_mallocs;
    if (absl::IsResourceExhausted(p.status()) && st.cached_bytes > 0) {
      ReleaseCached(device).IgnoreError();
      p = api_->Malloc(device, size);
      ++st.device_mallocs;
    }
    if (absl::IsResourceExhausted(p.status())) {
      ++st.out_of_memory;
      return OutOfMemory(device, nbytes, size, p.status().message());
    }
    if (!p.ok()) {
      return absl::Status(p.status().code(),
                          absl::StrCat(DeviceName(device), ": allocating ",
                                       nbytes, " bytes: ", p.status().message()));
    }
    return *p;
  }

  absl::Status OutOfMemory(int device, size_t nbytes, size_t size,
                           absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: out of memory: requested %d bytes (block of %d): %s; %s",
        DeviceName(device), nbytes, size, why,
        DescribeHeldBytes(stats_[device], options_.limit_bytes)));
  }

  const std::shared_ptr<DeviceMemoryApi> api_;
  const Options options_;
  absl::Mutex mu_;
  absl::flat_hash_map<void*, Block> blocks_ ABSL_GUARDED_BY(mu_);
  std::map<FreeKey, std::vector<void*>> free_ ABSL_GUARDED_BY(mu_);
  std::vector<void*> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<AllocatorStats> stats_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, StreamHandle>, std::unique_ptr<Allocator>> adapters_
      ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<CachingDeviceAllocator>>
CachingDeviceAllocator::Create(std::shared_ptr<DeviceMemoryApi> api,
                               Options options) {
  if (api == nullptr) {
    return absl::InvalidArgumentError("CachingDeviceAllocator: no device API");
  }
  if (api->DeviceCount() <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("CachingDeviceAllocator: ", api->name(), " has no device"));
  }
  auto state = std::make_shared<State>(std::move(api), options);
  return std::unique_ptr<CachingDeviceAllocator>(
      new CachingDeviceAllocator(std::move(state)));
}

CachingDeviceAllocator::CachingDeviceAllocator(std::shared_ptr<State> state)
    : state_(std::move(state)) {}

CachingDeviceAllocator::~CachingDeviceAllocator() = default;

absl::StatusOr<Storage> CachingDeviceAllocator::Allocate(int device,
                                                         size_t nbytes,
                                                         StreamHandle stream) {
  return state_->Allocate(device, nbytes, stream);
}

absl::Status CachingDeviceAllocator::RecordStream(const Storage& storage,
                                                  StreamHandle stream) {
  if (!storage.defined() || !storage.device().is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RecordStream: storage on ", storage.device().ToString(),
        " is not from a device allocator"));
  }
  return state_->RecordStream(storage.data(), stream);
}

absl::Status CachingDeviceAllocator::EmptyCache() {
  return state_->EmptyCache();
}

AllocatorStats CachingDeviceAllocator::Stats(int device) {
  return state_->Stats(device);
}

absl::StatusOr<Allocator*> CachingDeviceAllocator::ForStream(
    int device, StreamHandle stream) {
  return state_->ForStream(device, stream);
}

}  // namespace cuda
}  // namespace ferry
