// Per-call CPU cost of one round trip, for callgrind: both ends in this
// process on loopback, so instruction counts cover caller and callee.
//
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null
//       call_cost --mode=ferry_inline --calls=N   (one command)
//
// bench/rpc/call_cost.sh runs each mode at two call counts and prints
// (instructions(N2) - instructions(N1)) / (N2 - N1): start-up cancels out.
// Modes:
//   grpc_sync      raw gRPC sync stub, tiny protobuf echoed by a callback
//                  service replying on gRPC's thread (the unary floor)
//   grpc_callback  the same call through the callback API, the caller waiting
//                  for the completion (Ferry's client-side pattern)
//   ferry          rpc_sync to a no-op function run on the agent's executor
//   ferry_inline   rpc_sync to a no-op registered non-blocking (served on
//                  gRPC's thread)
//   ferry_tensor4  rpc_sync echoing a 4-float tensor, on the executor
//   ferry_tensor4_inline  the same registered non-blocking
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/sync.h"
#include "proto/rpc.grpc.pb.h"
#include "rpc/grpc/agent.h"
#include "store/hash_store.h"
#include "tensor/tensor.h"

ABSL_FLAG(std::string, mode, "ferry",
          "grpc_sync, grpc_callback, ferry, ferry_inline, ferry_tensor4 or "
          "ferry_tensor4_inline");
ABSL_FLAG(int, calls, 1000, "Round trips to make.");

namespace ferry {
namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "call_cost: %s\n", what.c_str());
  return 1;
}

// Echoes the request's bytes from gRPC's callback thread.
class Echo final : public ferry::rpc::v1::Worker::WithRawCallbackMethod_Call<
                       ferry::rpc::v1::Worker::Service> {
 public:
  grpc::ServerUnaryReactor* Call(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override {
    *response = *request;
    grpc::ServerUnaryReactor* r = context->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

int RunGrpc(bool callback, int calls) {
  Echo echo;
  int port = 0;
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&echo);
  auto server = b.BuildAndStart();
  if (!server || port == 0) return Fail("server did not start");
  auto stub = ferry::rpc::v1::Worker::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  ferry::rpc::v1::RpcRequest tiny;
  tiny.set_payload("0123456789abcdef");
  for (int i = 0; i < calls; ++i) {
    grpc::ClientContext ctx;
    ferry::rpc::v1::RpcResponse resp;
    grpc::Status status;
    if (callback) {
      Notification done;
      stub->async()->Call(&ctx, &tiny, &resp, [&](grpc::Status s) {
        status = std::move(s);
        done.Notify();
      });
      done.WaitForNotification();
    } else {
      status = stub->Call(&ctx, tiny, &resp);
    }
    if (!status.ok()) return Fail(status.error_message());
  }
  server->Shutdown();
  return 0;
}

// Calls `function` (a no-op, or with `tensor4` an echo of a 4-float tensor).
int RunFerry(const std::string& function, bool tensor4, int calls) {
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  if (!registry->Register("noop", [] {}).ok() ||
      !registry->RegisterNonBlocking("noop_inline", [] {}).ok() ||
      !registry->Register("echo", [](Tensor t) { return t; }).ok() ||
      !registry->RegisterNonBlocking("echo_inline", [](Tensor t) { return t; })
           .ok()) {
    return Fail("register");
  }
  auto store = std::make_shared<HashStore>();
  std::vector<absl::StatusOr<std::unique_ptr<rpc::GrpcAgent>>> agents(2);
  std::vector<std::thread> ts;
  for (int i = 0; i < 2; ++i) {
    ts.emplace_back([&, i] {
      agents[i] = rpc::GrpcAgent::Start(absl::StrCat("w", i), i, 2, store, {},
                                        registry);
    });
  }
  for (auto& t : ts) t.join();
  for (auto& a : agents) {
    if (!a.ok()) return Fail(a.status().ToString());
  }
  const Tensor four = from_vector<float>({1, 2, 3, 4});
  for (int i = 0; i < calls; ++i) {
    absl::Status s =
        tensor4 ? (*agents[0])->rpc_sync<Tensor>(1, function, four).status()
                : (*agents[0])->rpc_sync<void>(1, function);
    if (!s.ok()) return Fail(s.ToString());
  }
  std::thread down([&] { (*agents[1])->Shutdown().IgnoreError(); });
  absl::Status s = (*agents[0])->Shutdown();
  down.join();
  return s.ok() ? 0 : Fail(s.ToString());
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const int calls = absl::GetFlag(FLAGS_calls);
  if (mode == "grpc_sync") return ferry::RunGrpc(false, calls);
  if (mode == "grpc_callback") return ferry::RunGrpc(true, calls);
  if (mode == "ferry") return ferry::RunFerry("noop", false, calls);
  if (mode == "ferry_inline")
    return ferry::RunFerry("noop_inline", false, calls);
  if (mode == "ferry_tensor4") return ferry::RunFerry("echo", true, calls);
  if (mode == "ferry_tensor4_inline") {
    return ferry::RunFerry("echo_inline", true, calls);
  }
  std::fprintf(stderr, "call_cost: unknown --mode=%s\n", mode.c_str());
  return 2;
}
