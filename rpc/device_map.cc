#include "ferry/rpc/device_map.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace ferry::rpc {

namespace {

// "cuda:0->cuda:1, cuda:1->cuda:0", or "none".
std::string MapText(
    const std::vector<std::pair<std::string, std::string>>& pairs) {
  if (pairs.empty()) return "none";
  return absl::StrJoin(pairs, ", ", [](std::string* out, const auto& p) {
    absl::StrAppend(out, p.first, "->", p.second);
  });
}

}  // namespace

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  if (text == "cpu") return Device::CPU();
  if (text == "cuda") return Device::CUDA(0);
  int index = -1;
  absl::string_view rest = text;
  if (absl::ConsumePrefix(&rest, "cuda:") && absl::SimpleAtoi(rest, &index) &&
      index >= 0) {
    return Device::CUDA(index);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device '", text, "': expected \"cpu\" or \"cuda:N\""));
}

bool DeviceMaps::Less::operator()(const Device& a, const Device& b) const {
  const int ai = a.is_cpu() ? 0 : a.index;
  const int bi = b.is_cpu() ? 0 : b.index;
  return std::tie(a.type, ai) < std::tie(b.type, bi);
}

absl::Status DeviceMaps::Set(const std::string& peer, Device from, Device to) {
  if (from.is_cpu() != to.is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device map to '", peer, "': ", from.ToString(), " -> ",
        to.ToString(), " mixes CPU and CUDA (a CPU tensor always lands on "
        "the peer's CPU; see DeviceMaps::set_stage_unmapped_to_cpu)"));
  }
  if (from.is_cpu()) return absl::OkStatus();  // Implicit.
  Map& map = maps_[peer];
  auto [it, inserted] = map.emplace(from, to);
  if (!inserted && it->second != to) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device map to '", peer, "': ", from.ToString(), " is already mapped "
        "to ", it->second.ToString(), ", not ", to.ToString()));
  }
  return absl::OkStatus();
}

absl::Status DeviceMaps::Set(const std::string& peer, absl::string_view from,
                             absl::string_view to) {
  absl::StatusOr<Device> f = ParseDevice(from);
  if (!f.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device map to '", peer, "': source ", f.status().message()));
  }
  absl::StatusOr<Device> t = ParseDevice(to);
  if (!t.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device map to '", peer, "': target ", t.status().message()));
  }
  return Set(peer, *f, *t);
}

absl::Status DeviceMaps::Validate(const std::string& me,
                                  const std::vector<Device>& devices) const {
  for (const auto& [peer, map] : maps_) {
    std::map<Device, Device, Less> seen;  // Target -> its source.
    for (const auto& [from, to] : map) {
      if (std::find(devices.begin(), devices.end(), from) == devices.end()) {
        std::vector<std::string> names;
        for (const Device& d : devices) names.push_back(d.ToString());
        return absl::InvalidArgumentError(absl::StrCat(
            "worker '", me, "': the device map to '", peer, "' maps ",
            from.ToString(), ", which is not among the worker's devices [",
            absl::StrJoin(names, ", "), "]"));
      }
      auto [it, inserted] = seen.emplace(to, from);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            "worker '", me, "': the device map to '", peer, "' is not 1:1: ",
            it->second.ToString(), " and ", from.ToString(),
            " both map to ", to.ToString()));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceMaps::CheckPeerDevices(
    const std::string& me, const std::string& peer,
    const std::vector<Device>& peer_devices) const {
  auto it = maps_.find(peer);
  if (it == maps_.end()) return absl::OkStatus();
  for (const auto& [from, to] : it->second) {
    if (std::find(peer_devices.begin(), peer_devices.end(), to) ==
        peer_devices.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker '", me, "': the device map to '", peer, "' maps ",
          from.ToString(), " to ", to.ToString(), ", which '", peer,
          "' does not have (it has ", peer_devices.size(), " CUDA device",
          peer_devices.size() == 1 ? "" : "s", ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Device> DeviceMaps::Target(const std::string& me,
                                          const std::string& peer,
                                          Device device, int position) const {
  if (device.is_cpu()) return Device::CPU();
  auto it = maps_.find(peer);
  if (it != maps_.end()) {
    auto found = it->second.find(device);
    if (found != it->second.end()) return found->second;
  }
  if (stage_to_cpu_) return Device::CPU();
  return absl::InvalidArgumentError(absl::StrCat(
      "worker '", me, "': tensor ", position, " of the message to '", peer,
      "' is on ", device.ToString(), ", which has no entry in the device map "
      "to '", peer, "' (", MapText(Describe(peer)),
      "); map it or allow staging to CPU"));
}

absl::StatusOr<Device> DeviceMaps::ReplyTarget(const std::string& me,
                                               const std::string& peer,
                                               Device device,
                                               int position) const {
  if (device.is_cpu()) return Device::CPU();
  auto it = maps_.find(peer);
  if (it != maps_.end()) {
    for (const auto& [from, to] : it->second) {
      if (to == device) return from;
    }
  }
  if (stage_to_cpu_) return Device::CPU();
  return absl::InvalidArgumentError(absl::StrCat(
      "worker '", me, "': tensor ", position, " of the reply from '", peer,
      "' is on its ", device.ToString(), ", which no device of '", me,
      "' maps to (", MapText(Describe(peer)),
      "); map it or allow staging to CPU"));
}

std::vector<std::string> DeviceMaps::peers() const {
  std::vector<std::string> out;
  for (const auto& entry : maps_) out.push_back(entry.first);
  return out;
}

std::vector<std::pair<std::string, std::string>> DeviceMaps::Describe(
    const std::string& peer) const {
  std::vector<std::pair<std::string, std::string>> out;
  auto it = maps_.find(peer);
  if (it == maps_.end()) return out;
  for (const auto& [from, to] : it->second) {
    out.emplace_back(from.ToString(), to.ToString());
  }
  return out;
}

}  // namespace ferry::rpc
