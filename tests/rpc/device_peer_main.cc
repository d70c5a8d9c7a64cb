// A peer process of device_sender_kill_test: worker NAME (rank RANK of a
// group of 3 formed through INIT, a file:// init method) whose cuda:0 is a
// FakeDeviceApi in this process's memory, on the staged path (a fake cannot
// share memory across processes) and off the same-host channel, so its
// tensors cross as streamed gRPC pieces the test can hold midway.
// Serves make(pad, n): a CUDA tensor of n float32 (0, 1, ..., n-1; pad, a
// CPU tensor, only makes the request streamed, since replies to unary
// requests never are). Prints "ready", then reads commands from stdin:
// "send N" calls w0's sink with a CUDA tensor of N float32 and prints
// "sent R" (R: sink's answer) or "error STATUS". Ends at stdin's EOF.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/copy.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/tensor.h"
#include "ferry/worker/worker.h"

namespace {

// n float32 (0 .. n-1) on cuda:0 of `w`.
absl::StatusOr<ferry::Tensor> Make(ferry::Worker& w,
                                   ferry::cuda::DeviceMemoryApi& api,
                                   int64_t n) {
  if (n <= 0 || n > (int64_t{1} << 28)) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker '", w.name(), "': make(", n,
                     "): the count must be in 1 .. 2^28"));
  }
  return ferry::cuda::CopyToDevice(ferry::arange(n, ferry::DType::kFloat32), 0,
                                   0, *w.device_allocator(), api);
}

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  const char* name = std::getenv("NAME");
  const char* rank = std::getenv("RANK");
  const char* init = std::getenv("INIT");
  int r = -1;
  if (name == nullptr || init == nullptr || rank == nullptr ||
      !absl::SimpleAtoi(rank, &r)) {
    std::fprintf(stderr, "usage: NAME=w1 RANK=1 INIT=file://... %s\n",
                 "device_peer_main");
    return 2;
  }
  auto api = std::make_shared<ferry::cuda::FakeDeviceApi>(1, uint64_t{1}
                                                                  << 30);
  ferry::WorkerOptions o;
  o.name = name;
  o.rank = r;
  o.world_size = 3;
  o.init_method = init;
  o.join_timeout = absl::Seconds(60);
  o.rpc_timeout = absl::Seconds(60);
  o.same_host = false;
  o.devices = {"cuda:0"};
  o.device_api = api;
  o.cuda_transport = "staged";
  o.device_maps = {{"w0", {{"cuda:0", "cuda:0"}}}};
  o.before_serving = [api](ferry::Worker& w) {
    return w.registry().Register(
        "make", [&w, api](ferry::Tensor pad, int64_t n) {
          (void)pad;
          return Make(w, *api, n);
        });
  };
  absl::StatusOr<std::unique_ptr<ferry::Worker>> w = ferry::InitWorker(o);
  if (!w.ok()) return Fail(name, w.status());
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    int64_t n = 0;
    if (line.rfind("send ", 0) != 0 || !absl::SimpleAtoi(line.substr(5), &n)) {
      std::printf("error unknown command '%s'\n", line.c_str());
    } else if (absl::StatusOr<ferry::Tensor> t = Make(**w, *api, n); !t.ok()) {
      std::printf("error %s\n", t.status().ToString().c_str());
    } else {
      ferry::Result<int64_t> got = (*w)->rpc_sync<int64_t>("w0", "sink", *t);
      if (got.ok()) {
        std::printf("sent %lld\n", static_cast<long long>(*got));
      } else {
        std::printf("error %s\n", got.status().ToString().c_str());
      }
    }
    std::fflush(stdout);
  }
  // A peer was killed: the collective Shutdown could not complete; the
  // worker's destructor stops it abruptly.
  return 0;
}
