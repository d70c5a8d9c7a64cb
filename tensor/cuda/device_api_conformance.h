// The DeviceMemoryApi conformance suite: one parameterized GoogleTest suite
// (device_api_conformance.cc) that every DeviceMemoryApi passes, together
// with the CachingDeviceAllocator over it. fake_device_api_test.cc runs it on
// FakeDeviceApi (every machine), cuda_device_api_test.cc on CudaDeviceApi
// (skipped, with CUDA's reason, without a GPU).
//
// To run it on an implementation: write a DeviceApiFixture and instantiate
// DeviceApiConformanceTest with it inside namespace ferry::cuda. BUILD:
// deps = [":device_api_conformance", "@system//:gtest_main"] (alwayslink).
#ifndef FERRY_TENSOR_CUDA_DEVICE_API_CONFORMANCE_H_
#define FERRY_TENSOR_CUDA_DEVICE_API_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "ferry/tensor/cuda/device_api.h"
#include "gtest/gtest.h"

namespace ferry {
namespace cuda {

/// One API under test, for one test.
class DeviceApiFixture {
 public:
  virtual ~DeviceApiFixture() = default;
  /// The implementation under test.
  virtual std::shared_ptr<DeviceMemoryApi> api() = 0;
  /// A new stream of `device`, owned by the fixture.
  virtual absl::StatusOr<StreamHandle> NewStream(int device) = 0;
  /// Returns once the work queued on `stream` so far has finished.
  virtual absl::Status Drain(int device, StreamHandle stream) = 0;
};

/// How to make a fixture; FailedPrecondition from `make` skips the test.
struct DeviceApiConformanceParam {
  std::string name;  ///< Test name suffix: letters, digits and '_'.
  /// Called once per test.
  std::function<absl::StatusOr<std::unique_ptr<DeviceApiFixture>>()> make;
};

/// Prints the name (for GoogleTest).
inline std::ostream& operator<<(std::ostream& os,
                                const DeviceApiConformanceParam& p) {
  return os << p.name;
}

/// The suite (tests in device_api_conformance.cc).
class DeviceApiConformanceTest
    : public ::testing::TestWithParam<DeviceApiConformanceParam> {
 protected:
  void SetUp() override;
  std::unique_ptr<DeviceApiFixture> fixture_;  ///< Made by SetUp.
};

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_DEVICE_API_CONFORMANCE_H_
