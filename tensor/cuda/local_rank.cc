#include "ferry/tensor/cuda/local_rank.h"

#include "absl/strings/str_cat.h"

namespace ferry {
namespace cuda {

LocalRankDevice DeviceForLocalRank(int local_rank, int device_count) {
  LocalRankDevice out;
  if (local_rank < 0 || device_count <= 0) {
    out.device = Device::CUDA(0);
    return out;
  }
  out.device = Device::CUDA(local_rank % device_count);
  if (local_rank >= device_count) {
    out.nccl_hostid = absl::StrCat("ferry-local-rank-", local_rank);
  }
  return out;
}

}  // namespace cuda
}  // namespace ferry
