#include "ferry/tests/rpc/toy_layer.h"

#include "ferry/rpc/context.h"

namespace ferry::rpc::toy {

absl::Status Install(Agent& agent) {
  return agent.RegisterHandler(kToyDouble, [](Message m) -> Future<Message> {
    const Tensor* t = m.payload.if_tensor();
    const std::string* header = m.FindHeader(kToyHeader);
    if (t == nullptr || header == nullptr) {
      return MakeErrorFuture<Message>(
          absl::InvalidArgumentError("toy: expected a tensor and its header"));
    }
    Message reply;
    reply.SetHeader(kToyHeader, *header);
    reply.payload = Value::FromList(
        {Value::FromTensor(t->add(*t)),
         Value::String(CurrentContextValue("toy/tag").value_or(""))});
    return MakeReadyFuture<Message>(std::move(reply));
  });
}

Future<Doubled> Double(Agent& agent, const WorkerRef& to, Tensor t,
                       std::string header) {
  Message m;
  m.type = kToyDouble;
  m.SetHeader(kToyHeader, std::move(header));
  m.payload = Value::FromTensor(std::move(t));
  return agent.Send(to, std::move(m))
      .Then([](const Result<Message>& r) -> absl::StatusOr<Doubled> {
        if (!r.ok()) return r.status();
        const Value::List* l = r->payload.if_list();
        if (l == nullptr || l->size() != 2 || !(*l)[0].if_tensor() ||
            !(*l)[1].if_string() || r->FindHeader(kToyHeader) == nullptr) {
          return absl::InvalidArgumentError("toy: malformed reply");
        }
        return Doubled{*(*l)[0].if_tensor(), *r->FindHeader(kToyHeader),
                       *(*l)[1].if_string()};
      });
}

}  // namespace ferry::rpc::toy
