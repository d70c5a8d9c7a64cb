// CUDA tensors through rpc_sync over the staged path on a real GPU
// (worker/device_stage.h over CudaDeviceApi): two workers in one process
// share device 0 and echo tensors of 4 KiB to 256 MiB, which must come back
// on cuda:0 with their bytes; each size's round trip is printed.
// The IPC path (worker/device_ipc.h) needs two processes, since CUDA
// refuses to open a handle in the process that exported it: this binary
// runs itself again as w1 (kChildEnv) and echoes 4 KiB to 256 MiB by IPC.
// Without a GPU it skips, naming CUDA's reason: on such machines (this one
// included when it was written) it is compiled, never run on a device.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/copy.h"
#include "ferry/tensor/cuda/cuda_device_api.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tests/util/subprocess.h"
#include "ferry/worker/test_group.h"
#include "ferry/worker/worker.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

// Echoes float tensors of 4 KiB to 256 MiB from w0's cuda:0 through w1;
// each must come back on cuda:0 with its bytes. Prints each round trip.
void EchoEachSize(Worker& w0, cuda::CudaDeviceApi& api, const char* label) {
  for (size_t bytes : {size_t{4} << 10, size_t{1} << 20, size_t{64} << 20,
                       size_t{256} << 20}) {
    const Tensor cpu =
        arange(static_cast<int64_t>(bytes / 4), DType::kFloat32);
    absl::StatusOr<Tensor> x =
        cuda::CopyToDevice(cpu, 0, 0, *w0.device_allocator(), api);
    ASSERT_TRUE(x.ok()) << x.status();
    const absl::Time start = absl::Now();
    Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", *x);
    const absl::Duration took = absl::Now() - start;
    ASSERT_TRUE(back.ok()) << bytes << ": " << back.status();
    EXPECT_EQ(back->device(), Device::CUDA(0));
    absl::StatusOr<Tensor> host = cuda::CopyToHost(*back, 0, api);
    ASSERT_TRUE(host.ok()) << host.status();
    EXPECT_EQ(std::memcmp(host->data_ptr(), cpu.data_ptr(), bytes), 0)
        << bytes;
    std::printf("%s %zu bytes: %.3f ms round trip (%.2f GB/s, both ways)\n",
                label, bytes, absl::ToDoubleMilliseconds(took),
                2.0 * bytes / absl::ToDoubleSeconds(took) / 1e9);
  }
}

// The staged path between two workers of this process: through the
// same-host channel (`same_host`), or streamed over gRPC, where messages of
// 2 MiB and more land pipelined (worker/device_landing.h).
void StagedEcho(bool same_host) {
  absl::StatusOr<std::shared_ptr<cuda::CudaDeviceApi>> api =
      cuda::CudaDeviceApi::Create();
  if (!api.ok()) GTEST_SKIP() << api.status();
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  ASSERT_TRUE(registry->Register("echo", [](Tensor t) { return t; }).ok());
  std::vector<WorkerOptions> o(2);
  for (WorkerOptions& each : o) {
    each.devices = {"cuda:0"};
    each.device_api = *api;
    each.cuda_transport = "staged";
    each.same_host = same_host;
    each.join_timeout = absl::Seconds(60);
    each.rpc_timeout = absl::Seconds(120);
  }
  o[0].device_maps = {{"w1", {{"cuda:0", "cuda:0"}}}};
  o[1].registry = registry;
  WorkerGroup w = StartWorkerGroup(same_host ? "gpu" : "gpu_streamed", o);
  for (auto& each : w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = **w[0];
  EchoEachSize(w0, **api, same_host ? "staged echo" : "streamed staged echo");
  EXPECT_EQ(w0.staged_traffic("w1").tensors_out, 4u);
  if (!same_host) {  // 64 and 256 MiB, each way.
    EXPECT_EQ((*w[1])->staged_traffic("w0").pipelined_in, 2u);
    EXPECT_EQ(w0.staged_traffic("w1").pipelined_in, 2u);
  }
  ShutdownWorkerGroup(w);
}

TEST(CudaRpcGpu, StagedEchoFrom4KiBTo256MiBComesBackOnTheDevice) {
  StagedEcho(/*same_host=*/true);
}

TEST(CudaRpcGpu, StreamedStagedEchoLandsPipelinedOnTheDevice) {
  StagedEcho(/*same_host=*/false);
}

// Set (to the group's init method) in the process that plays w1.
constexpr char kChildEnv[] = "FERRY_CUDA_IPC_CHILD_INIT";

TEST(CudaRpcGpu, IpcEchoBetweenTwoProcessesFrom4KiBTo256MiB) {
  absl::StatusOr<std::shared_ptr<cuda::CudaDeviceApi>> api =
      cuda::CudaDeviceApi::Create();
  if (!api.ok()) GTEST_SKIP() << api.status();
  WorkerOptions o;
  o.devices = {"cuda:0"};
  o.device_api = *api;
  o.cuda_transport = "ipc";
  o.world_size = 2;
  o.join_timeout = absl::Seconds(60);
  o.rpc_timeout = absl::Seconds(120);
  if (const char* init = std::getenv(kChildEnv)) {
    // The child: w1 serves echo until the parent ends the group.
    auto registry = std::make_shared<rpc::FunctionRegistry>();
    ASSERT_TRUE(registry->Register("echo", [](Tensor t) { return t; }).ok());
    o.name = "w1";
    o.rank = 1;
    o.init_method = init;
    o.registry = registry;
    absl::StatusOr<std::unique_ptr<Worker>> w1 = InitWorker(o);
    ASSERT_TRUE(w1.ok()) << w1.status();
    ASSERT_TRUE((*w1)->Shutdown().ok());
    return;
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string init = absl::StrCat("file://", tmp ? tmp : "/tmp",
                                        "/cuda_ipc_group_", getpid());
  absl::StatusOr<std::unique_ptr<testutil::Subprocess>> child =
      testutil::Subprocess::Spawn(
          {"/proc/self/exe",
           "--gtest_filter=CudaRpcGpu.IpcEchoBetweenTwoProcessesFrom4KiBTo256MiB"},
          testutil::SpawnOptions{.env = {{kChildEnv, init}}});
  ASSERT_TRUE(child.ok()) << child.status();
  o.name = "w0";
  o.rank = 0;
  o.init_method = init;
  o.device_maps = {{"w1", {{"cuda:0", "cuda:0"}}}};
  absl::StatusOr<std::unique_ptr<Worker>> started = InitWorker(o);
  ASSERT_TRUE(started.ok()) << started.status();
  Worker& w0 = **started;
  EchoEachSize(w0, **api, "ipc request + ipc reply");
  EXPECT_EQ(w0.ipc_traffic("w1").tensors_out, 4u);
  EXPECT_EQ(w0.ipc_traffic("w1").held_calls, 0u);
  EXPECT_EQ(w0.staged_traffic("w1").tensors_out, 0u);
  // The replies came by IPC too (w0 asked for them: its plan says ipc).
  EXPECT_EQ(w0.ipc_traffic("w1").reply_tensors_in, 4u);
  EXPECT_EQ(w0.staged_traffic("w1").tensors_in, 0u);
  EXPECT_TRUE(w0.Shutdown().ok());
  absl::StatusOr<int> code = (*child)->Wait(absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

}  // namespace
}  // namespace ferry
