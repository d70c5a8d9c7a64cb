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

absl::StatusOr<IpcTensor> DecodeIpc(
    absl::string_view what, const device::v1::DeviceHeader::IpcTensor& p,
    int events, int i) {
  const std::string field = absl::StrCat("placement ", i, "'s IPC tensor");
  if (p.memory_handle().size() != kIpcHandleSize) {
    return Bad(what, absl::StrCat(field, " has a memory handle of ",
                                  p.memory_handle().size(), " bytes (",
                                  kIpcHandleSize, " expected)"));
  }
  if (p.allocation_bytes() == 0 || p.allocation_bytes() > kMaxIpcAllocation) {
    return Bad(what, absl::StrCat(field, " names an allocation of ",
                                  p.allocation_bytes(), " bytes (valid: 1..",
                                  kMaxIpcAllocation, ")"));
  }
  if (p.offset() >= p.allocation_bytes()) {
    return Bad(what, absl::StrCat(field, " has offset ", p.offset(),
                                  " outside its allocation of ",
                                  p.allocation_bytes(), " bytes"));
  }
  if (p.sizes_size() > kMaxIpcDims) {
    return Bad(what, absl::StrCat(field, " has ", p.sizes_size(),
                                  " dimensions (at most ", kMaxIpcDims, ")"));
  }
  // Every element takes at least one byte: the shape must fit the bytes
  // after the offset (the stage checks the dtype's size).
  const uint64_t room = p.allocation_bytes() - p.offset();
  uint64_t numel = 1;
  for (int d = 0; d < p.sizes_size(); ++d) {
    const int64_t n = p.sizes(d);
    if (n < 0) {
      return Bad(what, absl::StrCat(field, " has size ", n, " at dimension ",
                                    d));
    }
    if (n != 0 && numel > room / static_cast<uint64_t>(n)) {
      return Bad(what, absl::StrCat(field, "'s shape holds more elements "
                                           "than the ", room,
                                    " bytes after its offset"));
    }
    numel *= static_cast<uint64_t>(n);
  }
  if (numel == 0) {
    return Bad(what, absl::StrCat(field, " has no elements (empty tensors "
                                         "travel staged)"));
  }
  if (static_cast<int64_t>(p.event()) >= events) {
    return Bad(what, absl::StrCat(field, " names event ", p.event(), " of ",
                                  events));
  }
  IpcTensor out;
  out.memory_handle = p.memory_handle();
  out.offset = p.offset();
  out.allocation_bytes = p.allocation_bytes();
  out.sizes.assign(p.sizes().begin(), p.sizes().end());
  out.event = p.event();
  return out;
}

}  // namespace

absl::Status ClaimDeviceLayer() {
  static const rpc::LayerClaim* const kClaim =
      new rpc::LayerClaim{"device",
                          kDeviceHeaderLayer,
                          {{kDeviceIpcAckType, kDeviceIpcAckType}},
                          {{kDeviceIpcAckType, "DEVICE_IPC_ACK"}}};
  return rpc::ClaimLayer(*kClaim);
}

std::string EncodeDeviceHeader(const DeviceHeader& header) {
  device::v1::DeviceHeader proto;
  for (const DevicePlacement& p : header.placements) {
    device::v1::DeviceHeader::Placement* out = proto.add_placements();
    out->set_position(p.position);
    out->set_source(p.source);
    if (p.target.has_value()) out->set_target(*p.target);
    if (p.ipc.has_value()) {
      device::v1::DeviceHeader::IpcTensor* ipc = out->mutable_ipc();
      ipc->set_memory_handle(p.ipc->memory_handle);
      ipc->set_offset(p.ipc->offset);
      ipc->set_allocation_bytes(p.ipc->allocation_bytes);
      for (int64_t d : p.ipc->sizes) ipc->add_sizes(d);
      ipc->set_event(p.ipc->event);
    }
  }
  proto.set_returning(header.returning);
  for (const std::string& e : header.events) proto.add_events(e);
  if (header.ipc_ack.has_value()) proto.set_ipc_ack(*header.ipc_ack);
  proto.set_ipc_replies(header.ipc_replies);
  for (uint64_t id : header.reply_acks) proto.add_reply_acks(id);
  if (header.ipc_reply.has_value()) proto.set_ipc_reply(*header.ipc_reply);
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
    if (p.has_ipc()) {
      absl::StatusOr<IpcTensor> ipc =
          DecodeIpc(what, p.ipc(), proto.events_size(), i);
      if (!ipc.ok()) return ipc.status();
      placement.ipc = *std::move(ipc);
    }
    out.placements.push_back(placement);
  }
  for (int i = 0; i < proto.events_size(); ++i) {
    if (proto.events(i).size() != kIpcHandleSize) {
      return Bad(what, absl::StrCat("event ", i, " has ",
                                    proto.events(i).size(), " bytes (",
                                    kIpcHandleSize, " expected)"));
    }
    out.events.push_back(proto.events(i));
  }
  if (proto.has_ipc_ack()) {
    if (request) return Bad(what, "a request carries an IPC acknowledgement");
    out.ipc_ack = proto.ipc_ack();
  }
  if (!request && (proto.ipc_replies() || proto.reply_acks_size() > 0)) {
    return Bad(what, "a reply carries ipc_replies or reply acknowledgements "
                     "(requests only)");
  }
  if (static_cast<size_t>(proto.reply_acks_size()) > kMaxReplyAcks) {
    return Bad(what, absl::StrCat("a request acknowledges ",
                                  proto.reply_acks_size(), " replies (at most ",
                                  kMaxReplyAcks, ")"));
  }
  bool has_ipc = false;
  for (const DevicePlacement& p : out.placements) has_ipc |= p.ipc.has_value();
  if (proto.has_ipc_reply() != (!request && has_ipc)) {
    return Bad(what, proto.has_ipc_reply()
                         ? "ipc_reply on a request or a reply without IPC "
                           "tensors"
                         : "a reply's IPC tensors without ipc_reply");
  }
  if (proto.has_ipc_reply()) out.ipc_reply = proto.ipc_reply();
  out.ipc_replies = proto.ipc_replies();
  out.reply_acks.assign(proto.reply_acks().begin(), proto.reply_acks().end());
  return out;
}

}  // namespace ferry
