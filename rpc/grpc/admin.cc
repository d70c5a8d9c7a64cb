#include "rpc/grpc/admin.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace ferry::rpc::grpc_agent {
namespace {

constexpr char kVersion[] = "ferry 0.1";

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context,
                               grpc::Status status = grpc::Status::OK) {
  grpc::ServerUnaryReactor* r = context->DefaultReactor();
  r->Finish(std::move(status));
  return r;
}

// The group is read only once known (the server runs while it forms).
grpc::Status NotJoined(const Agent& agent) {
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
  out->set_version(kVersion);
}

grpc::ServerUnaryReactor* AdminService::GetWorkerInfo(
    grpc::CallbackServerContext* context,
    const ferry::admin::v1::WorkerInfoRequest*,
    ferry::admin::v1::WorkerInfo* out) {
  if (!agent_->joined()) return Done(context, NotJoined(*agent_));
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
  if (!agent_->joined()) return Done(context, NotJoined(*agent_));
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

}  // namespace ferry::rpc::grpc_agent
