#include "ferry/rref/messages.h"

#include "absl/strings/str_cat.h"
#include "ferry/proto/rref.pb.h"
#include "ferry/rpc/layer.h"

namespace ferry::rref {

absl::Status ClaimMessages() {
  static const rpc::LayerClaim* const kClaim = new rpc::LayerClaim{
      "rref",
      kRRefHeader,
      {{2, 2}, {10, 19}, {1017, 1017}},
      {{2, "REMOTE_CALL", /*names_function=*/true},
       {10, "RREF_FETCH"},
       {11, "RREF_USER_DELETE"},
       {12, "RREF_FORK_REQUEST"},
       {13, "RREF_CHILD_ACCEPT"}}};
  return rpc::ClaimLayer(*kClaim);
}

void SetFields(rpc::Message& m, const RRefFields& f) {
  v1::RRefHeader h;
  h.set_rref_id(f.rref_id.value());
  h.set_fork_id(f.fork_id.value());
  h.set_owner_id(f.owner_id);
  h.set_peer_id(f.peer_id);
  h.set_type_name(f.type_name);
  h.mutable_deletes()->Reserve(2 * static_cast<int>(f.deletes.size()));
  for (const auto& [rref_id, fork_id] : f.deletes) {
    h.add_deletes(rref_id.value());
    h.add_deletes(fork_id.value());
  }
  m.SetHeader(kRRefHeader, h.SerializeAsString());
}

absl::StatusOr<std::optional<RRefFields>> FieldsOf(const rpc::Message& m) {
  const std::string* bytes = m.FindHeader(kRRefHeader);
  if (bytes == nullptr) return std::optional<RRefFields>();
  v1::RRefHeader h;
  if (!h.ParseFromString(*bytes) || h.deletes_size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed RRef header on ", m.DebugString()));
  }
  std::optional<RRefFields> out(std::in_place);
  out->rref_id = GlobalId::FromValue(h.rref_id());
  out->fork_id = GlobalId::FromValue(h.fork_id());
  out->owner_id = h.owner_id();
  out->peer_id = h.peer_id();
  out->type_name = h.type_name();
  out->deletes.reserve(h.deletes_size() / 2);
  for (int i = 0; i < h.deletes_size(); i += 2) {
    out->deletes.emplace_back(GlobalId::FromValue(h.deletes(i)),
                              GlobalId::FromValue(h.deletes(i + 1)));
  }
  return out;
}

}  // namespace ferry::rref
