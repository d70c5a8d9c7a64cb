// Which device a process of a multi-process job uses: local rank r of a host
// with `device_count` GPUs takes cuda:(r mod device_count). Ranks beyond the
// device count share a device with a lower local rank; NCCL refuses two
// ranks of one host on one device, so each such rank needs its own
// NCCL_HOSTID (NCCL then treats the ranks as separate hosts, talking over
// its socket transport). This only computes the choice: the caller sets the
// variable before creating its NCCL communicator (no process-wide state
// here).
//
// Errors: none; preconditions are checked by the caller (local_rank >= 0,
// device_count > 0; otherwise cuda:0 and no host id).
// Thread safety: a pure function. Design: docs/design/ddp.md (ranks
// sharing a GPU).
#ifndef FERRY_TENSOR_CUDA_LOCAL_RANK_H_
#define FERRY_TENSOR_CUDA_LOCAL_RANK_H_

#include <string>

#include "ferry/tensor/tensor.h"

namespace ferry {
namespace cuda {

/// The device of one local rank, and the NCCL host id it must take.
struct LocalRankDevice {
  Device device;  ///< cuda:(local_rank mod device_count).
  /// Empty when this rank is the first on its device; otherwise a value for
  /// NCCL_HOSTID unique to this local rank.
  std::string nccl_hostid;
};

/// See the top of the file.
LocalRankDevice DeviceForLocalRank(int local_rank, int device_count);

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_LOCAL_RANK_H_
