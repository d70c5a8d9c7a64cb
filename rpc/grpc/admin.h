// The Admin gRPC service of a GrpcAgent (proto/admin.proto): worker info,
// the group, registered functions and call statistics, for grpcurl and
// tools, and the layers' inspectors (rpc/inspect.h). Read-only, except
// Invoke (off unless enable_admin_invoke), which runs a registered function
// through this worker's own Worker service, as a peer's call would (same
// limits, interceptors and errors).
#ifndef FERRY_RPC_GRPC_ADMIN_H_
#define FERRY_RPC_GRPC_ADMIN_H_

#include <grpcpp/grpcpp.h>

#include "ferry/proto/admin.grpc.pb.h"
#include "ferry/rpc/grpc/agent.h"

namespace ferry::rpc::grpc_agent {

class AdminService final : public ferry::admin::v1::Admin::CallbackService {
 public:
  // `agent` outlives the service.
  explicit AdminService(GrpcAgent* agent) : agent_(agent) {}

  grpc::ServerUnaryReactor* GetWorkerInfo(
      grpc::CallbackServerContext* context,
      const ferry::admin::v1::WorkerInfoRequest*,
      ferry::admin::v1::WorkerInfo* out) override;
  grpc::ServerUnaryReactor* ListWorkers(
      grpc::CallbackServerContext* context,
      const ferry::admin::v1::ListWorkersRequest*,
      ferry::admin::v1::ListWorkersResponse* out) override;
  grpc::ServerUnaryReactor* ListFunctions(
      grpc::CallbackServerContext* context,
      const ferry::admin::v1::ListFunctionsRequest*,
      ferry::admin::v1::ListFunctionsResponse* out) override;
  grpc::ServerUnaryReactor* GetStats(
      grpc::CallbackServerContext* context,
      const ferry::admin::v1::GetStatsRequest*,
      ferry::admin::v1::GetStatsResponse* out) override;
  grpc::ServerUnaryReactor* Invoke(
      grpc::CallbackServerContext* context,
      const ferry::admin::v1::InvokeRequest* request,
      ferry::admin::v1::InvokeResponse* out) override;
  grpc::ServerUnaryReactor* Inspect(
      grpc::CallbackServerContext* context,
      const ferry::admin::v1::InspectRequest* request,
      ferry::admin::v1::InspectResponse* out) override;

 private:
  void Fill(const WorkerInfo& w, ferry::admin::v1::WorkerInfo* out) const;

  GrpcAgent* const agent_;
};

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_ADMIN_H_
