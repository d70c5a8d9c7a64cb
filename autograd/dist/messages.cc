#include "ferry/autograd/dist/messages.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "ferry/proto/dist_autograd.pb.h"
#include "ferry/rpc/layer.h"

namespace ferry::autograd::dist {

absl::Status ClaimMessages() {
  static const rpc::LayerClaim* const kClaim = new rpc::LayerClaim{
      "autograd",
      kAutogradHeader,
      {{20, 29}},
      {{20, "BACKWARD"}, {21, "CLEANUP_AUTOGRAD_CONTEXT"}}};
  return rpc::ClaimLayer(*kClaim);
}

void SetAutogradHeader(rpc::Message& m, const AutogradHeader& h) {
  if (!h.context.has_value() && !h.fields.has_value()) {
    m.ClearHeader(kAutogradHeader);
    return;
  }
  v1::AutogradHeader p;
  if (h.context) p.mutable_context()->set_id(h.context->value());
  if (h.fields) {
    v1::AutogradHeader::Fields* f = p.mutable_fields();
    f->set_context_id(h.fields->context_id.value());
    f->set_message_id(h.fields->message_id.value());
    f->set_retain_graph(h.fields->retain_graph);
  }
  m.SetHeader(kAutogradHeader, p.SerializeAsString());
}

absl::StatusOr<AutogradHeader> AutogradHeaderOf(const rpc::Message& m) {
  AutogradHeader h;
  const std::string* bytes = m.FindHeader(kAutogradHeader);
  if (bytes == nullptr) return h;
  v1::AutogradHeader p;
  if (!p.ParseFromString(*bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed autograd header on ", m.DebugString()));
  }
  if (p.has_context()) h.context = GlobalId::FromValue(p.context().id());
  if (p.has_fields()) {
    h.fields = AutogradFields{GlobalId::FromValue(p.fields().context_id()),
                              GlobalId::FromValue(p.fields().message_id()),
                              p.fields().retain_graph()};
  }
  return h;
}

void SetAutogradFields(rpc::Message& m, const AutogradFields& fields) {
  absl::StatusOr<AutogradHeader> h = AutogradHeaderOf(m);
  AutogradHeader out = h.ok() ? *std::move(h) : AutogradHeader{};
  out.fields = fields;
  SetAutogradHeader(m, out);
}

}  // namespace ferry::autograd::dist
