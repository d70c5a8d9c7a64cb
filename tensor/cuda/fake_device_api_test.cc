// The DeviceMemoryApi conformance suite on FakeDeviceApi.
#include <memory>

#include "ferry/tensor/cuda/device_api_conformance.h"
#include "ferry/tensor/cuda/fake_device_api.h"

namespace ferry {
namespace cuda {
namespace {

class FakeFixture : public DeviceApiFixture {
 public:
  std::shared_ptr<DeviceMemoryApi> api() override { return api_; }
  absl::StatusOr<StreamHandle> NewStream(int /*device*/) override {
    return next_stream_++;
  }
  absl::Status Drain(int device, StreamHandle stream) override {
    api_->CompleteStream(device, stream);
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<FakeDeviceApi> api_ =
      std::make_shared<FakeDeviceApi>(2, uint64_t{64} << 20);
  StreamHandle next_stream_ = 1;
};

INSTANTIATE_TEST_SUITE_P(
    Fake, DeviceApiConformanceTest,
    ::testing::Values(DeviceApiConformanceParam{
        "fake", []() -> absl::StatusOr<std::unique_ptr<DeviceApiFixture>> {
          return std::make_unique<FakeFixture>();
        }}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace cuda
}  // namespace ferry
