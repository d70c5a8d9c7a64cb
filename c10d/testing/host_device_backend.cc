#include "ferry/c10d/testing/host_device_backend.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/c10d/backend.h"
#include "ferry/c10d/gloo/gloo_backend.h"
#include "ferry/c10d/work.h"
#include "ferry/tensor/tensor.h"

namespace ferry {
namespace testutil {
namespace {

using c10d::Backend;
using c10d::BackendConfig;
using c10d::GlooBackend;
using c10d::Work;
using c10d::AllreduceOptions;
using c10d::BroadcastOptions;

class HostDeviceBackend final : public Backend {
 public:
  HostDeviceBackend(std::unique_ptr<GlooBackend> gloo, absl::Duration timeout)
      : Backend("host-device", gloo->rank(), gloo->size(), timeout),
        gloo_(std::move(gloo)) {}

  std::shared_ptr<Work> Allreduce(Tensor tensor,
                                  const AllreduceOptions& options) override {
    absl::StatusOr<Tensor> host = Alias("Allreduce", tensor);
    if (!host.ok()) return Work::Completed("host-device Allreduce", host.status());
    return gloo_->Allreduce(*host, options);
  }
  std::shared_ptr<Work> Broadcast(Tensor tensor,
                                  const BroadcastOptions& options) override {
    absl::StatusOr<Tensor> host = Alias("Broadcast", tensor);
    if (!host.ok()) return Work::Completed("host-device Broadcast", host.status());
    return gloo_->Broadcast(*host, options);
  }

 private:
  // A CPU tensor over `t`'s bytes, keeping `t`'s storage alive.
  static absl::StatusOr<Tensor> Alias(const char* op, const Tensor& t) {
    if (!t.defined() || t.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host-device ", op, ": needs a device tensor, got ",
          t.defined() ? t.device().ToString() : "an undefined tensor"));
    }
    const Storage& s = t.storage();
    auto keep = std::make_shared<Storage>(s);
    Storage alias = Storage::Wrap(s.data(), s.nbytes(), Device::CPU(),
                                  std::shared_ptr<const void>(keep, keep.get()));
    return Tensor::FromStorage(std::move(alias), t.dtype(), t.sizes(),
                               t.strides(), t.storage_offset());
  }

  std::unique_ptr<GlooBackend> gloo_;
};

}  // namespace

c10d::BackendFactory HostDeviceBackendFactory() {
  return [](const BackendConfig& c)
             -> absl::StatusOr<std::unique_ptr<Backend>> {
    absl::StatusOr<std::unique_ptr<GlooBackend>> gloo =
        GlooBackend::Create(c.store, c.rank, c.size, c.timeout);
    if (!gloo.ok()) return gloo.status();
    return std::make_unique<HostDeviceBackend>(*std::move(gloo), c.timeout);
  };
}

}  // namespace testutil
}  // namespace ferry
