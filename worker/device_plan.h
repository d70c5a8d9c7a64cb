// DevicePlan: where a worker's CUDA tensors land on each peer and by which
// path they would travel (issue #32), settled once at InitWorker.
//
// Each worker publishes a DeviceRecord (its CUDA devices and its host
// identity, common/same_host.h) in the group's store. For every peer its
// device maps name, InitWorker reads that peer's record and checks the
// map's targets against the peer's devices (rpc::DeviceMaps::
// CheckPeerDevices), then picks the pair's path: CUDA IPC when both run on
// one host, staging through host memory otherwise; a forced "ipc" between
// two hosts is an error naming both workers.
//
// Calls follow the maps through worker/device_stage.h: requests of an "ipc"
// pair by CUDA IPC (worker/device_ipc.h) when the device API supports it,
// everything else staged; the Admin inspector "devices" shows the plan and
// what carries it (docs/design/cuda_rpc.md).
//
// Errors: InvalidArgument naming the worker and the option for malformed
// devices, maps or transport; FailedPrecondition naming both workers and the
// device for a target the peer lacks or a forced IPC across hosts;
// DataLoss naming the peer for a malformed record; the store's
// DeadlineExceeded naming the peer when its record does not appear.
// Thread safety: a const DevicePlan is safe to share.
#ifndef FERRY_WORKER_DEVICE_PLAN_H_
#define FERRY_WORKER_DEVICE_PLAN_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/rpc/device_map.h"
#include "ferry/rpc/inspect.h"
#include "ferry/store/store.h"
#include "ferry/tensor/storage.h"

namespace ferry {

/// How CUDA tensors travel between one pair of workers.
enum class CudaPath {
  kIpc,     ///< CUDA IPC handles: both workers on one host.
  kStaged,  ///< Through pinned host buffers over the gRPC stream.
};

/// "ipc" or "staged".
const char* CudaPathName(CudaPath path);

/// What a worker publishes for its peers.
struct DeviceRecord {
  std::vector<Device> devices;  ///< Its CUDA devices.
  std::string host;             ///< HostIdentity(); "" when unknown.
};

/// The record as stored: a version line, the host, the devices.
std::string EncodeDeviceRecord(const DeviceRecord& record);
/// Parses EncodeDeviceRecord's text of worker `peer`; DataLoss naming it.
absl::StatusOr<DeviceRecord> DecodeDeviceRecord(absl::string_view peer,
                                                absl::string_view text);
/// The store key of `worker`'s record.
std::string DeviceRecordKey(absl::string_view worker);

/// One peer's entry of the plan.
struct PeerDevicePlan {
  std::string peer;  ///< The peer's name.
  CudaPath path = CudaPath::kStaged;  ///< How tensors travel to it.
  /// This worker's device -> the peer's, as text, sorted.
  std::vector<std::pair<std::string, std::string>> map;
};

/// What a worker's options say about devices, parsed and checked.
struct DeviceOptions {
  std::vector<Device> devices;  ///< CUDA devices this worker uses.
  rpc::DeviceMaps maps;          ///< Per peer.
  bool force = false;            ///< A transport was forced.
  CudaPath forced = CudaPath::kStaged;  ///< Which, when force.
};

/// Parses and checks the options of worker `me`: `devices` ("cuda:N"),
/// `device_maps` (peer -> this worker's device -> the peer's),
/// `transport` ("auto", "ipc" or "staged"), against `device_count` devices
/// (-1: no device API, then `devices` must be empty).
absl::StatusOr<DeviceOptions> ParseDeviceOptions(
    const std::string& me, const std::vector<std::string>& devices,
    const std::map<std::string, std::map<std::string, std::string>>&
        device_maps,
    bool stage_unmapped_to_cpu, absl::string_view transport,
    int device_count);

/// The plan of one worker (see the top).
class DevicePlan {
 public:
  /// Publishes `me`'s record in `store`, then reads the record of every
  /// peer `options.maps` names (all the waits together bounded by
  /// `timeout`), checks the maps against them and picks each pair's path.
  static absl::StatusOr<DevicePlan> Settle(const std::string& me,
                                           const DeviceOptions& options,
                                           Store& store,
                                           absl::Duration timeout);
  /// The same from records already read (peer name -> record).
  static absl::StatusOr<DevicePlan> Make(
      const std::string& me, const DeviceOptions& options,
      const DeviceRecord& mine,
      const std::map<std::string, DeviceRecord>& peers);

  /// One entry per mapped peer, by name.
  const std::vector<PeerDevicePlan>& peers() const { return peers_; }
  /// The entry of `peer`, or null when it has no map.
  const PeerDevicePlan* Find(absl::string_view peer) const;
  /// Rows for the Admin inspector "devices": one per mapped peer; a pair
  /// planned "ipc" is carried by IPC unless `ipc_unavailable` says why not.
  std::vector<rpc::InspectionRow> Inspect(
      const std::string& ipc_unavailable = "not built") const;

 private:
  std::vector<PeerDevicePlan> peers_;
  std::vector<Device> devices_;
  bool stage_unmapped_to_cpu_ = false;
};

}  // namespace ferry

#endif  // FERRY_WORKER_DEVICE_PLAN_H_
