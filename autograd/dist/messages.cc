#include "ferry/autograd/dist/messages.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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
  if (!h.context.has_value() && !h.fields.has_value() &&
      !h.releases.has_value() && h.fused_steps.empty()) {
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
    for (int i : h.fields->grad_tensors) {
      f->add_grad_tensors(static_cast<uint32_t>(i));
    }
  }
  if (h.releases) {
    v1::AutogradHeader::Releases* r = p.mutable_releases();
    r->set_sender(h.releases->sender);
    r->set_receiver(h.releases->receiver);
    for (GlobalId id : h.releases->context_ids) r->add_context_ids(id.value());
  }
  for (const FusedStep& step : h.fused_steps) {
    v1::AutogradHeader::FusedStep* f = p.add_fused_steps();
    f->set_worker(step.worker);
    f->set_step_id(step.step_id);
  }
  m.SetHeader(kAutogradHeader, p.SerializeAsString());
}

namespace {

absl::Status Malformed(const rpc::Message& m, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed autograd header on ", m.DebugString(), ": ", why));
}

}  // namespace

absl::StatusOr<AutogradHeader> AutogradHeaderOf(const rpc::Message& m) {
  AutogradHeader h;
  const std::string* bytes = m.FindHeader(kAutogradHeader);
  if (bytes == nullptr) return h;
  v1::AutogradHeader p;
  if (!p.ParseFromString(*bytes)) return Malformed(m, "does not decode");
  if (p.has_context()) h.context = GlobalId::FromValue(p.context().id());
  if (p.has_fields()) {
    const v1::AutogradHeader::Fields& f = p.fields();
    AutogradFields fields{GlobalId::FromValue(f.context_id()),
                          GlobalId::FromValue(f.message_id()),
                          f.retain_graph(), {}};
    fields.grad_tensors.reserve(f.grad_tensors_size());
    for (uint32_t i : f.grad_tensors()) {
      if (i > static_cast<uint32_t>(std::numeric_limits<int>::max()) ||
          (!fields.grad_tensors.empty() &&
           static_cast<int>(i) <= fields.grad_tensors.back())) {
        return Malformed(m, absl::StrCat("grad-tensor index ", i,
                                         " out of order or out of range"));
      }
      fields.grad_tensors.push_back(static_cast<int>(i));
    }
    h.fields = std::move(fields);
  }
  if (p.has_releases()) {
    const v1::AutogradHeader::Releases& r = p.releases();
    if (r.context_ids_size() == 0) {
      return Malformed(m, "a release list names no context");
    }
    AutogradReleases releases{r.sender(), r.receiver(), {}};
    releases.context_ids.reserve(r.context_ids_size());
    for (uint64_t id : r.context_ids()) {
      releases.context_ids.push_back(GlobalId::FromValue(id));
    }
    h.releases = std::move(releases);
  }
  h.fused_steps.reserve(p.fused_steps_size());
  for (const v1::AutogradHeader::FusedStep& f : p.fused_steps()) {
    h.fused_steps.push_back(FusedStep{f.worker(), f.step_id()});
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
