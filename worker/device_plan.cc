#include "ferry/worker/device_plan.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ferry/common/same_host.h"
#include "ferry/common/status.h"

namespace ferry {

namespace {

constexpr absl::string_view kRecordVersion = "ferry-devices v1";

std::string DeviceList(const std::vector<Device>& devices) {
  return absl::StrJoin(devices, ",", [](std::string* out, const Device& d) {
    out->append(d.ToString());
  });
}

}  // namespace

const char* CudaPathName(CudaPath path) {
  return path == CudaPath::kIpc ? "ipc" : "staged";
}

std::string DeviceRecordKey(absl::string_view worker) {
  return absl::StrCat("ferry/worker/devices/", worker);
}

std::string EncodeDeviceRecord(const DeviceRecord& record) {
  return absl::StrCat(kRecordVersion, "\n", record.host, "\n",
                      DeviceList(record.devices));
}

absl::StatusOr<DeviceRecord> DecodeDeviceRecord(absl::string_view peer,
                                                absl::string_view text) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("the device record of worker '",
                                            peer, "' is malformed: ", why));
  };
  if (lines.size() != 3 || lines[0] != kRecordVersion) {
    return bad(absl::StrCat("expected 3 lines starting with \"",
                            kRecordVersion, "\""));
  }
  DeviceRecord record;
  record.host = std::string(lines[1]);
  if (lines[2].empty()) return record;
  for (absl::string_view text : absl::StrSplit(lines[2], ',')) {
    absl::StatusOr<Device> d = rpc::ParseDevice(text);
    if (!d.ok() || d->is_cpu()) {
      return bad(absl::StrCat("'", text, "' is not a CUDA device"));
    }
    record.devices.push_back(*d);
  }
  return record;
}

absl::StatusOr<DeviceOptions> ParseDeviceOptions(
    const std::string& me, const std::vector<std::string>& devices,
    const std::map<std::string, std::map<std::string, std::string>>&
        device_maps,
    bool stage_unmapped_to_cpu, absl::string_view transport,
    int device_count) {
  auto invalid = [&](absl::string_view option, const absl::Status& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker '", me, "': WorkerOptions::", option, ": ", why.message()));
  };
  DeviceOptions out;
  for (const std::string& text : devices) {
    absl::StatusOr<Device> d = rpc::ParseDevice(text);
    if (!d.ok()) return invalid("devices", d.status());
    if (d->is_cpu()) {
      return invalid("devices", absl::InvalidArgumentError(
                                    "lists cpu (it names CUDA devices only)"));
    }
    if (device_count < 0) {
      return invalid("devices", absl::InvalidArgumentError(absl::StrCat(
                                    "lists ", text,
                                    " but WorkerOptions::device_api is null "
                                    "(no CUDA devices to check it against)")));
    }
    if (d->index >= device_count) {
      return invalid("devices",
                     absl::InvalidArgumentError(absl::StrCat(
                         text, " does not exist: the device API has ",
                         device_count, " device", device_count == 1 ? "" : "s")));
    }
    if (std::find(out.devices.begin(), out.devices.end(), *d) !=
        out.devices.end()) {
      return invalid("devices", absl::InvalidArgumentError(
                                    absl::StrCat(text, " is listed twice")));
    }
    out.devices.push_back(*d);
  }
  for (const auto& [peer, map] : device_maps) {
    if (peer == me) {
      return invalid("device_maps", absl::InvalidArgumentError(
                                        "maps the worker to itself"));
    }
    for (const auto& [from, to] : map) {
      absl::Status set = out.maps.Set(peer, from, to);
      if (!set.ok()) return invalid("device_maps", set);
    }
  }
  out.maps.set_stage_unmapped_to_cpu(stage_unmapped_to_cpu);
  RETURN_IF_ERROR(out.maps.Validate(me, out.devices));
  if (transport == "ipc" || transport == "staged") {
    out.force = true;
    out.forced = transport == "ipc" ? CudaPath::kIpc : CudaPath::kStaged;
  } else if (transport != "auto") {
    return invalid("cuda_transport",
                   absl::InvalidArgumentError(absl::StrCat(
                       "'", transport, "': expected auto, ipc or staged")));
  }
  return out;
}

absl::StatusOr<DevicePlan> DevicePlan::Make(
    const std::string& me, const DeviceOptions& options,
    const DeviceRecord& mine,
    const std::map<std::string, DeviceRecord>& peers) {
  DevicePlan plan;
  plan.devices_ = options.devices;
  plan.stage_unmapped_to_cpu_ = options.maps.stage_unmapped_to_cpu();
  for (const std::string& peer : options.maps.peers()) {
    auto it = peers.find(peer);
    if (it == peers.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker '", me, "': no device record of '", peer,
          "', which the device maps name"));
    }
    const DeviceRecord& theirs = it->second;
    RETURN_IF_ERROR(options.maps.CheckPeerDevices(me, peer, theirs.devices));
    const bool same_host = !mine.host.empty() && mine.host == theirs.host;
    PeerDevicePlan entry;
    entry.peer = peer;
    entry.map = options.maps.Describe(peer);
    if (options.force) {
      if (options.forced == CudaPath::kIpc && !same_host) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker '", me, "': cuda_transport \"ipc\" but '", peer,
            "' runs on another host (or its host is unknown): CUDA IPC needs "
            "one host"));
      }
      entry.path = options.forced;
    } else {
      entry.path = same_host ? CudaPath::kIpc : CudaPath::kStaged;
    }
    plan.peers_.push_back(std::move(entry));
  }
  return plan;
}

absl::StatusOr<DevicePlan> DevicePlan::Settle(const std::string& me,
                                              const DeviceOptions& options,
                                              Store& store,
                                              absl::Duration timeout) {
  const DeviceRecord mine{options.devices, HostIdentity()};
  absl::Status published =
      store.Set(DeviceRecordKey(me), EncodeDeviceRecord(mine));
  if (!published.ok()) {
    return Annotate(published,
                    absl::StrCat("worker '", me, "': publishing its devices"));
  }
  std::map<std::string, DeviceRecord> records;
  const absl::Time deadline = absl::Now() + timeout;  // For all the peers.
  for (const std::string& peer : options.maps.peers()) {
    const std::string key = DeviceRecordKey(peer);
    const absl::Duration left =
        std::max(deadline - absl::Now(), absl::ZeroDuration());
    absl::Status waited = store.Wait({key}, left);
    if (!waited.ok()) {
      return Annotate(waited,
                      absl::StrCat("worker '", me, "': waiting ",
                                   absl::FormatDuration(timeout),
                                   " for the device record of '", peer, "'"));
    }
    ASSIGN_OR_RETURN(std::string text, store.Get(key));
    ASSIGN_OR_RETURN(records[peer], DecodeDeviceRecord(peer, text));
  }
  return Make(me, options, mine, records);
}

const PeerDevicePlan* DevicePlan::Find(absl::string_view peer) const {
  for (const PeerDevicePlan& p : peers_) {
    if (p.peer == peer) return &p;
  }
  return nullptr;
}

std::vector<rpc::InspectionRow> DevicePlan::Inspect(
    const std::string& ipc_unavailable) const {
  std::vector<rpc::InspectionRow> rows;
  rows.push_back({"worker",
                  {{"devices", DeviceList(devices_)},
                   {"stage_unmapped_to_cpu",
                    stage_unmapped_to_cpu_ ? "true" : "false"}}});
  for (const PeerDevicePlan& p : peers_) {
    // What carries requests' tensors, and replies' (asked for by IPC
    // unless unmapped tensors may land on the CPU; the peer stages them
    // past its hold limit or without IPC of its own).
    const bool ipc = p.path == CudaPath::kIpc && ipc_unavailable.empty();
    rpc::InspectionRow row{
        "peer",
        {{"peer", p.peer},
         {"path", CudaPathName(p.path)},
         {"carried", ipc ? "ipc" : "staged"},
         {"replies", ipc && !stage_unmapped_to_cpu_ ? "ipc" : "staged"},
         {"map", absl::StrJoin(p.map, ",", absl::PairFormatter("->"))}}};
    if (p.path == CudaPath::kIpc && !ipc) {
      row.fields.push_back({"ipc_unavailable", ipc_unavailable});
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace ferry
