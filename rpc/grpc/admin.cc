#include "ferry/rpc/grpc/admin.h"

#include <unistd.h>

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/common/grpc_status.h"
#include "ferry/common/status.h"
#include "ferry/common/version.h"
#include "ferry/rpc/grpc/admin_json.h"

namespace ferry::rpc::grpc_agent {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context,
                               grpc::Status status = grpc::Status::OK) {
  grpc::ServerUnaryReactor* r = context->DefaultReactor();
  r->Finish(std::move(status));
  return r;
}

// The group is read only once known (the server runs while it forms).
grpc::Status GroupNotKnown(const Agent& agent) {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrCat("worker '", agent.self().name,
                                   "' has not joined its group yet"));
}

}  // namespace

void AdminService::Fill(const WorkerInfo& w,
                        ferry::admin::v1::WorkerInfo* out) const {
  out->set_name(w.name);
  out->set_rank(w.id);
  out->set_world_size(agent_->world_size());
  out->set_address(w.address);
  out->set_version(absl::StrCat("ferry ", ferry::kVersion));
}

grpc::ServerUnaryReactor* AdminService::GetWorkerInfo(
    grpc::CallbackServerContext* context,
    const ferry::admin::v1::WorkerInfoRequest*,
    ferry::admin::v1::WorkerInfo* out) {
  if (!agent_->has_group()) return Done(context, GroupNotKnown(*agent_));
  Fill(agent_->self(), out);
  out->set_uptime_seconds(
      absl::ToDoubleSeconds(absl::Now() - agent_->start_time()));
  out->set_pid(static_cast<int>(getpid()));
  return Done(context);
}

grpc::ServerUnaryReactor* AdminService::ListWorkers(
    grpc::CallbackServerContext* context,
    const ferry::admin::v1::ListWorkersRequest*,
    ferry::admin::v1::ListWorkersResponse* out) {
  if (!agent_->has_group()) return Done(context, GroupNotKnown(*agent_));
  for (const WorkerInfo& w : agent_->GetWorkerInfos()) {
    Fill(w, out->add_workers());
  }
  return Done(context);
}

grpc::ServerUnaryReactor* AdminService::ListFunctions(
    grpc::CallbackServerContext* context,
    const ferry::admin::v1::ListFunctionsRequest*,
    ferry::admin::v1::ListFunctionsResponse* out) {
  for (const auto& e : agent_->registry().List()) {
    auto* f = out->add_functions();
    f->set_name(e->name);
    f->set_signature(e->signature);
    f->set_doc(e->doc);
    f->set_is_async(e->is_async);
  }
  return Done(context);
}

grpc::ServerUnaryReactor* AdminService::GetStats(
    grpc::CallbackServerContext* context,
    const ferry::admin::v1::GetStatsRequest*,
    ferry::admin::v1::GetStatsResponse* out) {
  *out = agent_->stats().Snapshot();
  out->set_calls_in_flight(agent_->calls_in_flight());
  out->set_identity_refusals(agent_->identity_refusals() +
                             agent_->same_host().stats().refused.load(
                                 std::memory_order_relaxed));
  out->set_executor_queue_depth(agent_->executor_queue_depth());
  for (const WorkerInfo& w : agent_->GetWorkerInfos()) {
    auto* peer = out->add_peers();
    peer->set_name(w.name);
    peer->set_rank(w.id);
    peer->set_address(w.address);
    peer->set_state(agent_->ChannelState(w.id));
  }
  return Done(context);
}

grpc::ServerUnaryReactor* AdminService::Invoke(
    grpc::CallbackServerContext* context,
    const ferry::admin::v1::InvokeRequest* request,
    ferry::admin::v1::InvokeResponse* out) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const std::string& me = agent_->self().name;
  if (!agent_->grpc_options_.enable_admin_invoke) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat("worker '", me,
                     "': admin Invoke is disabled (GrpcAgentOptions::"
                     "enable_admin_invoke)")));
    return reactor;
  }
  // CallAsync looks this worker up in the group.
  if (!agent_->has_group()) {
    reactor->Finish(GroupNotKnown(*agent_));
    return reactor;
  }
  Value::List args;
  for (int i = 0; i < request->args().values_size(); ++i) {
    absl::StatusOr<Value> v =
        JsonToValue(request->args().values(i), absl::StrCat("args[", i, "]"));
    if (!v.ok()) {
      reactor->Finish(ToGrpcStatus(
          Annotate(v.status(), absl::StrCat("worker '", me, "' invoking '",
                                            request->function(), "'"))));
      return reactor;
    }
    args.push_back(*std::move(v));
  }
  std::optional<absl::Duration> timeout;
  if (request->timeout_seconds() > 0) {
    timeout = absl::Seconds(request->timeout_seconds());
  }
  const absl::Time start = absl::Now();
  agent_->CallAsync(me, request->function(), std::move(args), timeout)
      .OnComplete([reactor, out, start](const Result<Value>& result) {
        if (!result.ok()) {
          reactor->Finish(ToGrpcStatus(result.status()));
          return;
        }
        *out->mutable_result() = ValueToJson(*result);
        out->set_latency_us(absl::ToDoubleMicroseconds(absl::Now() - start));
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::Inspect(
    grpc::CallbackServerContext* context,
    const ferry::admin::v1::InspectRequest* request,
    ferry::admin::v1::InspectResponse* out) {
  absl::StatusOr<std::vector<Inspection>> found =
      agent_->inspectors().Inspect(request->inspector());
  grpc::ServerUnaryReactor* r = context->DefaultReactor();
  if (!found.ok()) {
    r->Finish(ToGrpcStatus(found.status()));
    return r;
  }
  out->set_worker(agent_->self().name);
  for (const Inspection& in : *found) {
    auto* i = out->add_inspections();
    i->set_inspector(in.name);
    for (const InspectionRow& row : in.rows) {
      auto* o = i->add_rows();
      o->set_kind(row.kind);
      for (const auto& [k, v] : row.fields) (*o->mutable_fields())[k] = v;
    }
  }
  r->Finish(grpc::Status::OK);
  return r;
}

}  // namespace ferry::rpc::grpc_agent
