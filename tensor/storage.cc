#include "ferry/tensor/storage.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ferry {

std::string Device::ToString() const {
  if (type == DeviceType::kCPU) return "cpu";
  return absl::StrCat("cuda:", index);
}

Storage Storage::Wrap(void* data, size_t nbytes, Device device,
                      std::shared_ptr<const void> owner) {
  Storage s;
  auto impl = std::make_shared<Impl>();
  impl->data = data;
  impl->nbytes = nbytes;
  impl->device = device;
  impl->owner = std::move(owner);
  s.impl_ = std::move(impl);
  return s;
}

Storage Storage::Wrap(void* data, size_t nbytes, Device device,
                      std::shared_ptr<const void> owner,
                      std::shared_ptr<DeviceComputeInterface> compute) {
  Storage s = Wrap(data, nbytes, device, std::move(owner));
  std::const_pointer_cast<Impl>(s.impl_)->compute = std::move(compute);
  return s;
}

Storage Storage::WrapGated(void* data, size_t nbytes, Device device,
                           std::shared_ptr<const void> owner,
                           std::shared_ptr<ReadyGate> gate) {
  Storage s = Wrap(data, nbytes, device, std::move(owner));
  std::const_pointer_cast<Impl>(s.impl_)->gate = std::move(gate);
  return s;
}

namespace {

class CpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device::CPU(); }

  absl::StatusOr<Storage> Allocate(size_t nbytes) override {
    // aligned_alloc needs a multiple of the alignment; never ask for 0 bytes.
    size_t rounded = nbytes == 0 ? kStorageAlignment
                                 : (nbytes + kStorageAlignment - 1) /
                                       kStorageAlignment * kStorageAlignment;
    if (rounded < nbytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("CpuAllocator: cannot allocate ", nbytes, " bytes"));
    }
    void* base = nullptr;  // What free() takes.
    void* data = nullptr;  // kStorageAlignment-aligned, inside base.
    if (rounded <= kSmallBlock) {
      // Small blocks (e.g. a received 4-float tensor) are malloc'd with room
      // to align by hand: glibc's memalign splits off and frees the slack of
      // every block, which cost more than the rest of the allocation.
      base = std::malloc(rounded + kStorageAlignment - 1);
      data = reinterpret_cast<void*>(
          (reinterpret_cast<uintptr_t>(base) + kStorageAlignment - 1) &
          ~uintptr_t{kStorageAlignment - 1});
    } else {
      // Large blocks: 2 MiB aligned and backed by transparent huge pages
      // where the kernel allows it, so first touch (e.g. a received tensor
      // being copied in) takes one page fault per 2 MiB instead of per 4 KiB.
      constexpr size_t kHugePage = size_t{2} << 20;
      const bool huge = rounded >= 2 * kHugePage;
      if (huge) rounded = (rounded + kHugePage - 1) / kHugePage * kHugePage;
      base = data =
          std::aligned_alloc(huge ? kHugePage : kStorageAlignment, rounded);
      if (base != nullptr && huge)
        madvise(base, rounded, MADV_HUGEPAGE);  // Advisory only.
    }
    if (base == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "CpuAllocator: out of memory allocating ", nbytes, " bytes"));
    }
    std::shared_ptr<const void> owner(
        base, [](const void* q) { std::free(const_cast<void*>(q)); });
    return Storage::Wrap(data, nbytes, Device::CPU(), std::move(owner));
  }

 private:
  static constexpr size_t kSmallBlock = 4096;
};

}  // namespace

Allocator* GetCpuAllocator() {
  // Stateless, so sharing one instance across the process is harmless.
  static CpuAllocator* const allocator = new CpuAllocator();
  return allocator;
}

}  // namespace ferry
