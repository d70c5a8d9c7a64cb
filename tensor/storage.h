// Devices, allocators and reference-counted storage for Ferry tensors.
//
// A Storage is a cheap, copyable handle to a block of device memory: the
// bytes are released (by whoever provided them) when the last handle goes
// away. Memory comes either from an Allocator (CPU here; a CUDA allocator
// plugs into the same interface) or from outside, wrapped without a copy
// (DLPack imports, received gRPC slices), with an owner object that is
// destroyed on release.
//
// A storage may carry a ReadyGate: its bytes are still being written (a
// device-to-host copy in flight) and a reader waits on the gate for the
// prefix it reads; gate() is null for ordinary storage, whose bytes are
// ready. (docs/design/cuda_rpc.md, "Pipelined staging".)
//
// Thread safety: Storage handles may be copied and destroyed concurrently
// from any thread (the count is atomic). The bytes themselves are not
// synchronized. Allocators and gates must be safe to call from any thread.
#ifndef FERRY_TENSOR_STORAGE_H_
#define FERRY_TENSOR_STORAGE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ferry {

// Kinds of device.
enum class DeviceType : int8_t { kCPU = 0, kCUDA = 1 };

// A device: its type and, for CUDA, its index.
struct Device {
  DeviceType type = DeviceType::kCPU;  // The kind.
  int index = 0;  // The CUDA device; ignored for CPU.

  static Device CPU() { return Device{}; }  // The CPU.
  // CUDA device `index`.
  static Device CUDA(int index) { return Device{DeviceType::kCUDA, index}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }  // type is kCPU.
  bool is_cuda() const { return type == DeviceType::kCUDA; }  // type is kCUDA.
  // "cpu" or "cuda:N".
  std::string ToString() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type &&
           (a.type == DeviceType::kCPU || a.index == b.index);
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

// Opaque compute backend of a device storage, owned by a layer above tensor/
// (tensor/cuda's DeviceOps): autograd finds the kernels for a device tensor
// through its storage, without a process-wide registry. tensor/ only stores
// it (docs/design/cuda_kernels.md, "How an op finds its context").
class DeviceComputeInterface {
 public:
  virtual ~DeviceComputeInterface() = default;
};

/// Readiness of a storage whose bytes are written after it was handed on
/// (layer-neutral: tensor/ knows no device). Safe from any thread.
class ReadyGate {
 public:
  virtual ~ReadyGate() = default;
  /// Returns once bytes [0, `bytes`) of the storage are valid, or the error
  /// that keeps them from ever being (the same error on every later call).
  /// Blocks for as long as the writes take.
  virtual absl::Status WaitReady(uint64_t bytes) = 0;
  /// Without blocking: true once bytes [0, `bytes`) are valid, false while
  /// they may not be yet (and from gates that cannot tell without
  /// blocking), or WaitReady's error.
  virtual absl::StatusOr<bool> PollReady(uint64_t bytes) {
    (void)bytes;
    return false;
  }
};

// Memory returned by Ferry's allocators starts on this boundary.
inline constexpr size_t kStorageAlignment = 64;

// Bytes on a device, shared by every Tensor and view over them; a cheap
// shared handle (copies share the bytes).
class Storage {
 public:
  // A null storage (no bytes, defined() is false).
  Storage() = default;

  // Wraps `nbytes` bytes at `data` on `device` without copying. `owner` keeps
  // the bytes alive and is destroyed (on whichever thread drops the last
  // handle) when no Storage or Tensor refers to them any more. `owner` may be
  // null when the bytes outlive every handle (static memory).
  static Storage Wrap(void* data, size_t nbytes, Device device,
                      std::shared_ptr<const void> owner);
  // As Wrap above, and records `compute` (may be null), the backend that
  // computes on these bytes (see DeviceComputeInterface).
  static Storage Wrap(void* data, size_t nbytes, Device device,
                      std::shared_ptr<const void> owner,
                      std::shared_ptr<DeviceComputeInterface> compute);

  /// As Wrap above, with `gate` (not null): readers wait on it before
  /// reading (see the top of the file).
  static Storage WrapGated(void* data, size_t nbytes, Device device,
                           std::shared_ptr<const void> owner,
                           std::shared_ptr<ReadyGate> gate);

  bool defined() const { return impl_ != nullptr; }  // Not null.
  // The bytes; null if null.
  void* data() const { return impl_ ? impl_->data : nullptr; }
  // Their count; 0 if null.
  size_t nbytes() const { return impl_ ? impl_->nbytes : 0; }
  // Where; CPU if null.
  Device device() const { return impl_ ? impl_->device : Device{}; }
  // The compute backend given to Wrap; null for CPU storage and when none.
  DeviceComputeInterface* compute() const {
    return impl_ ? impl_->compute.get() : nullptr;
  }
  // compute(), shared (keeps the backend object alive).
  std::shared_ptr<DeviceComputeInterface> shared_compute() const {
    return impl_ ? impl_->compute : nullptr;
  }
  /// The gate readers wait on; null when the bytes are ready.
  ReadyGate* gate() const { return impl_ ? impl_->gate.get() : nullptr; }
  // Number of handles sharing these bytes (for tests and diagnostics).
  long use_count() const { return impl_.use_count(); }
  // Same bytes (not equal values).
  bool is_same(const Storage& other) const { return impl_ == other.impl_; }

  // Version counter shared by every tensor and view over these bytes:
  // Tensor's in-place ops (copy_, fill_, add_, ...) bump it, so autograd can
  // tell that a tensor it saved for backward was modified since. Writes
  // through data_ptr() are not counted. 0 for a null storage; atomic.
  uint64_t version() const {
    return impl_ ? impl_->version.load(std::memory_order_acquire) : 0;
  }
  // Adds 1 to version() (no-op on a null storage).
  void BumpVersion() const {
    if (impl_) impl_->version.fetch_add(1, std::memory_order_acq_rel);
  }

 private:
  struct Impl {
    void* data = nullptr;
    size_t nbytes = 0;
    Device device;
    std::shared_ptr<const void> owner;
    std::shared_ptr<DeviceComputeInterface> compute;
    // Declared after `owner`, so destroyed before it: a gate's destructor
    // waits for the copies still writing the bytes `owner` frees (e.g.
    // worker/device_stage.cc's ChunkGate over a pinned block). Keep it so.
    std::shared_ptr<ReadyGate> gate;
    mutable std::atomic<uint64_t> version{0};
  };
  std::shared_ptr<const Impl> impl_;
};

// Makes Storages on one device (GetCpuAllocator; c10d/nccl has a CUDA one).
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;  // Where its storages live.
  // Returns `nbytes` uninitialized bytes aligned to kStorageAlignment, or
  // ResourceExhausted naming the size when the memory is not available.
  virtual absl::StatusOr<Storage> Allocate(size_t nbytes) = 0;
};

// The CPU allocator (aligned heap memory). Stateless; lives for the whole
// process; safe from any thread.
Allocator* GetCpuAllocator();

}  // namespace ferry

#endif  // FERRY_TENSOR_STORAGE_H_
