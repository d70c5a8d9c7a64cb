#include "rpc/grpc/admin.h"

#include <unistd.h>

#include "common/grpc_status.h"

namespace ferry::rpc::grpc_agent {
namespace {

constexpr char kVersion[] = "ferry 0.1";

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context) {
  grpc::ServerUnaryReactor* r = context->DefaultReactor();
  r->Finish(grpc::Status::OK);
  return r;
}

}  // namespace

void AdminService::Fill(const WorkerInfo& w,
                        ferry::admin::v1::WorkerInfo* out) const {
  out->set_name(w.name);
  out->set_rank(w.id);
  out->set_world_size(agent_->world_size());
  out->set_address(w.address);
  out->set_version(kVersion);
}

grpc::ServerUnaryReactor* AdminService::GetWorkerInfo(
    grpc::CallbackServerContext* context,
    const ferry::admin::v1::WorkerInfoRequest*,
    ferry::admin::v1::WorkerInfo* out) {
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
  return Done(context);
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
