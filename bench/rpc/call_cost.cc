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
// With 64 calls in flight (issue #12's throughput figure; the counts include
// the wake-ups' user-space work but not the kernel's):
//   grpc_callback_64  raw gRPC callback API, each completion issuing the next
//                     from gRPC's thread (rpc_bench's grpc_callback_64 floor)
//   ferry_async_64    rpc_async to the no-op on the executor, the caller's
//                     thread waiting on the oldest future (rpc_bench's
//                     rpc_async_64)
//   ferry_async_64_inline  the same, no-op registered non-blocking
//   ferry_async_64_chained  the no-op on the executor, each completion
//                     issuing the next from its callback (the floor's shape)
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "ferry/common/sync.h"
#include "ferry/proto/rpc.grpc.pb.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/store/hash_store.h"
#include "ferry/tensor/tensor.h"

ABSL_FLAG(std::string, mode, "ferry",
          "grpc_sync, grpc_callback, grpc_callback_64, ferry, ferry_inline, "
          "ferry_tensor4, ferry_tensor4_inline, ferry_async_64, "
          "ferry_async_64_inline or ferry_async_64_chained");
ABSL_FLAG(int, calls, 1000, "Round trips to make.");

// Calls in flight for the *_64 modes.
constexpr int kWindow = 64;

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

// Keeps kWindow calls in flight until `calls` completed; each completion
// issues the next from the thread that completed it. `issue(done)` starts one
// call and arranges for `done(ok)` to run when it ends.
class Chain {
 public:
  using Done = std::function<void(bool ok)>;
  using Issue = std::function<void(Done)>;
  Chain(int calls, Issue issue) : calls_(calls), issue_(std::move(issue)) {}

  // False if a call failed.
  bool Run() {
    {
      MutexLock l(&mu_);
      issued_ = std::min(kWindow, calls_);
    }
    for (int i = 0, n = std::min(kWindow, calls_); i < n; ++i) Start();
    MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](Chain* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
          return c->completed_ == c->issued_;
        },
        this));
    return ok_;
  }

 private:
  void Start() {
    issue_([this](bool ok) {
      bool next = false;
      {
        MutexLock l(&mu_);
        ++completed_;
        ok_ = ok_ && ok;
        if (ok_ && issued_ < calls_) {
          ++issued_;
          next = true;
        }
      }
      if (next) Start();
    });
  }

  const int calls_;
  const Issue issue_;
  Mutex mu_;
  int issued_ ABSL_GUARDED_BY(mu_) = 0;
  int completed_ ABSL_GUARDED_BY(mu_) = 0;
  bool ok_ ABSL_GUARDED_BY(mu_) = true;
};

int RunGrpc(bool callback, bool windowed, int calls) {
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
  if (windowed) {
    struct Call {
      grpc::ClientContext ctx;
      ferry::rpc::v1::RpcResponse resp;
    };
    Chain chain(calls, [&](Chain::Done done) {
      auto* call = new Call;
      stub->async()->Call(&call->ctx, &tiny, &call->resp,
                          [call, done](grpc::Status s) {
                            delete call;
                            done(s.ok());
                          });
    });
    if (!chain.Run()) return Fail("a windowed call failed");
    server->Shutdown();
    return 0;
  }
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

// How RunFerry makes its calls.
enum class Pattern {
  kSync,      // rpc_sync, one at a time
  kWindow,    // rpc_async, kWindow in flight, this thread waits on the oldest
  kChained,   // rpc_async, kWindow in flight, completions issue the next
};

absl::Status MakeCalls(rpc::Agent& agent, const std::string& function,
                       bool tensor4, Pattern pattern, int calls) {
  const Tensor four = from_vector<float>({1, 2, 3, 4});
  switch (pattern) {
    case Pattern::kSync:
      for (int i = 0; i < calls; ++i) {
        absl::Status s =
            tensor4 ? agent.rpc_sync<Tensor>(1, function, four).status()
                    : agent.rpc_sync<void>(1, function);
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    case Pattern::kWindow: {
      std::deque<Future<Value>> inflight;
      for (int issued = 0, done = 0; done < calls; ++done) {
        while (issued < calls && inflight.size() < kWindow) {
          inflight.push_back(agent.CallAsync(1, function, {}));
          ++issued;
        }
        if (!inflight.front().Get().ok()) return inflight.front().status();
        inflight.pop_front();
      }
      return absl::OkStatus();
    }
    case Pattern::kChained: {
      Chain chain(calls, [&](Chain::Done done) {
        agent.CallAsync(1, function, {})
            .OnComplete([done](const Result<Value>& r) { done(r.ok()); });
      });
      return chain.Run() ? absl::OkStatus()
                         : absl::InternalError("a chained call failed");
    }
  }
  return absl::InternalError("unknown pattern");
}

// Calls `function` (a no-op, or with `tensor4` an echo of a 4-float tensor).
int RunFerry(const std::string& function, bool tensor4, Pattern pattern,
             int calls) {
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
  if (absl::Status s = MakeCalls(**agents[0], function, tensor4, pattern,
                                 calls);
      !s.ok()) {
    return Fail(s.ToString());
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
  if (mode == "grpc_sync") return ferry::RunGrpc(false, false, calls);
  if (mode == "grpc_callback") return ferry::RunGrpc(true, false, calls);
  if (mode == "grpc_callback_64") return ferry::RunGrpc(true, true, calls);
  using ferry::Pattern;
  struct FerryMode {
    const char* mode;
    const char* function;
    bool tensor;
    Pattern pattern;
  };
  constexpr FerryMode kFerryModes[] = {
      {"ferry", "noop", false, Pattern::kSync},
      {"ferry_inline", "noop_inline", false, Pattern::kSync},
      {"ferry_tensor4", "echo", true, Pattern::kSync},
      {"ferry_tensor4_inline", "echo_inline", true, Pattern::kSync},
      {"ferry_async_64", "noop", false, Pattern::kWindow},
      {"ferry_async_64_inline", "noop_inline", false, Pattern::kWindow},
      {"ferry_async_64_chained", "noop", false, Pattern::kChained},
  };
  for (const FerryMode& m : kFerryModes) {
    if (mode == m.mode) {
      return ferry::RunFerry(m.function, m.tensor, m.pattern, calls);
    }
  }
  std::fprintf(stderr, "call_cost: unknown --mode=%s\n", mode.c_str());
  return 2;
}
