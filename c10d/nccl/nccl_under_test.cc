#include "ferry/c10d/nccl/nccl_under_test.h"

#include <algorithm>
#include <memory>
#include <string>

#include "ferry/c10d/nccl/cuda_util.h"
#include "ferry/c10d/nccl/nccl_backend.h"
#include "ferry/common/status.h"
#include "gtest/gtest.h"

namespace ferry {
namespace c10d {

BackendUnderTest NcclUnderTest() {
  BackendUnderTest b;
  b.name = "Nccl";
  b.create =
      [](std::shared_ptr<Store> store, int rank, int size,
         absl::Duration timeout) -> absl::StatusOr<std::unique_ptr<Backend>> {
    ASSIGN_OR_RETURN(
        auto nccl, NcclBackend::Create(std::move(store), rank, size, timeout));
    return std::unique_ptr<Backend>(std::move(nccl));
  };
  b.skip_reason = [] {
    return CudaDeviceCount() == 0
               ? std::string("no CUDA device (cudaGetDeviceCount is 0)")
               : std::string();
  };
  // NCCL allows one rank per GPU in a communicator of one host.
  b.max_ranks = [] { return std::min(4, CudaDeviceCount()); };
  b.to_device = [](const Tensor& t, int rank) {
    auto d = CopyToCuda(t, rank % std::max(1, CudaDeviceCount()));
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : Tensor();
  };
  b.to_cpu = [](const Tensor& t) {
    auto h = CopyToCpu(t);
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : Tensor();
  };
  b.ops = {OpType::kAllreduce,     OpType::kBroadcast, OpType::kReduce,
           OpType::kAllgather,     OpType::kGather,    OpType::kScatter,
           OpType::kReduceScatter, OpType::kAlltoall,  OpType::kBarrier};
  b.reduce_ops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct,
                  ReduceOp::kMin, ReduceOp::kMax};
  b.exact_avg = false;  // NCCL pre-multiplies by 1/N.
  b.detects_mismatch = false;
  b.rendezvous_at_create = false;
  return b;
}

}  // namespace c10d
}  // namespace ferry
