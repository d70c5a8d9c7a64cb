#include "ferry/worker/device_header.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/proto/device_rpc.pb.h"
#include "ferry/rpc/layer.h"

namespace ferry {
namespace {

absl::Status Bad(absl::string_view what, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": malformed device header: ", why));
}

absl::Status CheckIndex(absl::string_view what, int index,
                        absl::string_view field, size_t i) {
  if (index < 0 || index > kMaxDeviceIndex) {
    return Bad(what, absl::StrCat("placement ", i, " has ", field,
                                  " device index ", index, " (valid: 0..",
                                  kMaxDeviceIndex, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ClaimDeviceLayer() {
  static const rpc::LayerClaim* const kClaim =
      new rpc::LayerClaim{"device", kDeviceHeaderLayer, {}, {}};
  return rpc::ClaimLayer(*kClaim);
}

std::string EncodeDeviceHeader(const DeviceHeader& header) {
  device::v1::DeviceHeader proto;
  for (const DevicePlacement& p : header.placements) {
    device::v1::DeviceHeader::Placement* out = proto.add_placements();
    out->set_position(p.position);
    out->set_source(p.source);
    if (p.target.has_value()) out->set_target(*p.target);
  }
  proto.set_returning(header.returning);
  return proto.SerializeAsString();
}

absl::StatusOr<DeviceHeader> DecodeDeviceHeader(absl::string_view bytes,
                                                size_t tensor_count,
                                                bool request,
                                                absl::string_view what) {
  device::v1::DeviceHeader proto;
  if (bytes.size() > (size_t{1} << 30) ||
      !proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Bad(what, absl::StrCat("not a DeviceHeader (", bytes.size(),
                                  " bytes)"));
  }
  if (proto.returning() && !request) {
    return Bad(what, "a reply marked returning (only requests return tensors)");
  }
  // Targets only where the sender's map chose them.
  const bool targeted = request && !proto.returning();
  DeviceHeader out;
  out.returning = proto.returning();
  out.placements.reserve(proto.placements_size());
  for (int i = 0; i < proto.placements_size(); ++i) {
    const device::v1::DeviceHeader::Placement& p = proto.placements(i);
    if (p.position() >= tensor_count) {
      return Bad(what, absl::StrCat("placement ", i, " names tensor ",
                                    p.position(), " of a payload with ",
                                    tensor_count, " tensors"));
    }
    if (!out.placements.empty() &&
        p.position() <= out.placements.back().position) {
      return Bad(what, absl::StrCat("placement ", i, " names tensor ",
                                    p.position(), " after tensor ",
                                    out.placements.back().position,
                                    " (positions must increase)"));
    }
    if (absl::Status s = CheckIndex(what, p.source(), "source", i); !s.ok()) {
      return s;
    }
    DevicePlacement placement{p.position(), p.source(), std::nullopt};
    if (targeted != p.has_target()) {
      return Bad(
          what,
          absl::StrCat(
              "placement ", i, " of a ",
              !request ? "reply" : (targeted ? "request" : "returning request"),
              targeted ? " has no" : " has a", " target device"));
    }
    if (p.has_target()) {
      if (absl::Status s = CheckIndex(what, p.target(), "target", i);
          !s.ok()) {
        return s;
      }
      placement.target = p.target();
    }
    out.placements.push_back(placement);
  }
  return out;
}

}  // namespace ferry
