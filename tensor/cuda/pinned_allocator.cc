#include "ferry/tensor/cuda/pinned_allocator.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "ferry/common/logging.h"
#include "ferry/tensor/cuda/stream_uses.h"

namespace ferry {
namespace cuda {
namespace {

// Larger requests are refused before rounding (no host pins 256 TiB).
constexpr size_t kMaxPinnedRequest = size_t{1} << 48;

}  // namespace

class CachingHostAllocator::State
    : public std::enable_shared_from_this<State> {
 public:
  State(std::shared_ptr<DeviceMemoryApi> api, Options options)
      : api_(std::move(api)), options_(options) {}

  // Pending blocks are waited for (their copies may still run), then every
  // block left is returned.
  ~State() {
    absl::MutexLock lock(&mu_);
    for (void* ptr : pending_) {
      HostBlock& b = blocks_.at(ptr);
      absl::Status waited = b.uses.Wait(*api_);
      b.uses.DestroyEvents(*api_);
      if (!waited.ok()) {
        FERRY_LOG(ERROR) << "pinned allocator: block of " << b.size
                         << " bytes leaked, its copies could not be waited "
                            "for: "
                         << waited;
        continue;
      }
      api_->HostFree(ptr).IgnoreError();
    }
    ReturnCached().IgnoreError();
  }

  absl::StatusOr<Storage> Allocate(size_t nbytes) {
    void* ptr = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (nbytes > kMaxPinnedRequest) {
        ++stats_.out_of_memory;
        return Exhausted(nbytes, 0, "larger than any host");
      }
      const size_t size = CachingDeviceAllocator::RoundSize(nbytes);
      Poll();
      auto it = cached_.find(size);
      if (it != cached_.end()) {
        ptr = it->second.back();
        it->second.pop_back();
        if (it->second.empty()) cached_.erase(it);
        stats_.cached_bytes -= size;
        ++stats_.cache_hits;
      } else {
        absl::StatusOr<void*> fresh = Fresh(nbytes, size);
        if (!fresh.ok()) return fresh.status();
        ptr = *fresh;
        blocks_[ptr].size = size;
      }
      stats_.allocated_bytes += size;
      stats_.peak_allocated_bytes =
          std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
      ++stats_.allocations;
    }
    std::shared_ptr<State> self = shared_from_this();
    std::shared_ptr<const void> owner(
        ptr, [self](const void* p) { self->Release(const_cast<void*>(p)); });
    return Storage::Wrap(ptr, nbytes, Device::CPU(), std::move(owner));
  }

  absl::Status RecordStream(void* ptr, int device, StreamHandle stream) {
    absl::Status valid = CheckDevice(*api_, device);
    if (!valid.ok()) return valid;
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pinned RecordStream on %s:%d: storage at %p is not from this "
          "pinned allocator",
          api_->name(), device, ptr));
    }
    it->second.uses.Add(device, stream);
    return absl::OkStatus();
  }

  bool IsLive(const void* ptr) {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(const_cast<void*>(ptr));
    return it != blocks_.end() && it->second.live;
  }

  absl::Status EmptyCache() {
    absl::MutexLock lock(&mu_);
    Poll();
    return ReturnCached();
  }

  AllocatorStats Stats() {
    absl::MutexLock lock(&mu_);
    Poll();
    AllocatorStats st = stats_;
    st.reserved_bytes = Held();
    return st;
  }

 private:
  struct HostBlock {
    size_t size = 0;
    bool live = true;  // Some Storage refers to it.
    StreamUses uses;   // Streams whose queued copies use it.
  };

  // The last Storage of `ptr` went away.
  void Release(void* ptr) {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) {
      FERRY_LOG(ERROR) << "pinned allocator: release of unknown block " << ptr;
      return;
    }
    HostBlock& b = it->second;
    b.live = false;
    stats_.allocated_bytes -= b.size;
    if (b.uses.has_uses()) {
      absl::Status recorded = b.uses.RecordEvents(*api_);
      if (recorded.ok()) {
        stats_.pending_bytes += b.size;
        pending_.push_back(ptr);
        return;
      }
      // No event to poll: wait here for the streams that use the block.
      FERRY_LOG(WARNING) << "pinned allocator: waiting for the copies on a "
                         << "block of " << b.size << " bytes: " << recorded;
      absl::Status waited = b.uses.Wait(*api_);
      if (!waited.ok()) {
        FERRY_LOG(ERROR) << "pinned allocator: block of " << b.size
                         << " bytes leaked, its copies could not be waited "
                            "for: "
                         << waited;
        blocks_.erase(it);
        return;
      }
      b.uses = StreamUses();
    }
    cached_[b.size].push_back(ptr);
    stats_.cached_bytes += b.size;
  }

  // Pending blocks whose events are all done become cached.
  void Poll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<void*> waiting;
    for (void* ptr : pending_) {
      HostBlock& b = blocks_.at(ptr);
      absl::StatusOr<bool> done = b.uses.EventsDone(*api_);
      if (done.ok() && !*done) {
        waiting.push_back(ptr);
        continue;
      }
      if (!done.ok()) {
        FERRY_LOG(WARNING) << "pinned allocator: event query failed ("
                           << done.status() << "); waiting for the streams";
        absl::Status waited = b.uses.Wait(*api_);
        if (!waited.ok()) {
          FERRY_LOG(ERROR) << "pinned allocator: block of " << b.size
                           << " bytes leaked: " << waited;
          b.uses.DestroyEvents(*api_);
          stats_.pending_bytes -= b.size;
          blocks_.erase(ptr);
          continue;
        }
      }
      b.uses.DestroyEvents(*api_);
      stats_.pending_bytes -= b.size;
      cached_[b.size].push_back(ptr);
      stats_.cached_bytes += b.size;
    }
    pending_ = std::move(waiting);
  }

  absl::Status ReturnCached() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status first;
    for (auto& [size, ptrs] : cached_) {
      for (void* ptr : ptrs) {
        stats_.cached_bytes -= size;
        ++stats_.device_frees;
        blocks_.erase(ptr);
        first.Update(api_->HostFree(ptr));
      }
    }
    cached_.clear();
    return first;
  }

  uint64_t Held() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stats_.allocated_bytes + stats_.cached_bytes + stats_.pending_bytes;
  }

  // A new block of `size` from the host, within the limit.
  absl::StatusOr<void*> Fresh(size_t nbytes, size_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t limit = options_.limit_bytes;
    if (limit != 0 && Held() + size > limit) {
      ReturnCached().IgnoreError();
      if (Held() + size > limit) {
        ++stats_.out_of_memory;
        return Exhausted(nbytes, size, "over the limit");
      }
    }
    absl::StatusOr<void*> p = api_->HostAlloc(size);
    ++stats_.device_mallocs;
    if (absl::IsResourceExhausted(p.status()) && stats_.cached_bytes > 0) {
      ReturnCached().IgnoreError();
      p = api_->HostAlloc(size);
      ++stats_.device_mallocs;
    }
    if (absl::IsResourceExhausted(p.status())) {
      ++stats_.out_of_memory;
      return Exhausted(nbytes, size, p.status().message());
    }
    if (!p.ok()) {
      return absl::Status(p.status().code(),
                          absl::StrCat("pinned host memory: allocating ",
                                       nbytes, " bytes: ",
                                       p.status().message()));
    }
    return *p;
  }

  absl::Status Exhausted(size_t nbytes, size_t size, absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s pinned host memory exhausted: requested %d bytes (block of %d): "
        "%s; %s",
        api_->name(), nbytes, size, why,
        DescribeHeldBytes(stats_, options_.limit_bytes)));
  }

  const std::shared_ptr<DeviceMemoryApi> api_;
  const Options options_;
  absl::Mutex mu_;
  absl::flat_hash_map<void*, HostBlock> blocks_ ABSL_GUARDED_BY(mu_);
  std::map<size_t, std::vector<void*>> cached_ ABSL_GUARDED_BY(mu_);
  std::vector<void*> pending_ ABSL_GUARDED_BY(mu_);
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
};

// The tensor/storage.h Allocator interface over the cache.
class CachingHostAllocator::Adapter : public Allocator {
 public:
  explicit Adapter(State* state) : state_(state) {}
  Device device() const override { return Device::CPU(); }
  absl::StatusOr<Storage> Allocate(size_t nbytes) override {
    return state_->Allocate(nbytes);
  }

 private:
  State* const state_;
};

absl::StatusOr<std::unique_ptr<CachingHostAllocator>>
CachingHostAllocator::Create(std::shared_ptr<DeviceMemoryApi> api,
                             Options options) {
  if (api == nullptr) {
    return absl::InvalidArgumentError("CachingHostAllocator: no device API");
  }
  auto state = std::make_shared<State>(api, options);
  return std::unique_ptr<CachingHostAllocator>(
      new CachingHostAllocator(std::move(api), std::move(state)));
}

CachingHostAllocator::CachingHostAllocator(std::shared_ptr<DeviceMemoryApi> api,
                                           std::shared_ptr<State> state)
    : api_(std::move(api)),
      state_(std::move(state)),
      adapter_(std::make_unique<Adapter>(state_.get())) {}

CachingHostAllocator::~CachingHostAllocator() = default;

absl::StatusOr<Storage> CachingHostAllocator::Allocate(size_t nbytes) {
  return state_->Allocate(nbytes);
}

absl::Status CachingHostAllocator::RecordStream(const Storage& storage,
                                                int device,
                                                StreamHandle stream) {
  if (!storage.defined() || !storage.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pinned RecordStream: storage on ", storage.device().ToString(),
        " is not from a pinned host allocator"));
  }
  return state_->RecordStream(storage.data(), device, stream);
}

bool CachingHostAllocator::IsPinned(const Storage& storage) {
  return storage.defined() && storage.device().is_cpu() &&
         state_->IsLive(storage.data());
}

absl::Status CachingHostAllocator::EmptyCache() { return state_->EmptyCache(); }

AllocatorStats CachingHostAllocator::Stats() { return state_->Stats(); }

Allocator* CachingHostAllocator::allocator() { return adapter_.get(); }

}  // namespace cuda
}  // namespace ferry
