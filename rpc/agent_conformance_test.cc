// The Agent conformance suite: the same semantic tests against every
// implementation of the Agent interface (gRPC, in-process). gRPC-only tests
// (malformed envelopes, admin, rendezvous, large tensors) live in rpc/grpc/.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/common/poll.h"
#include "ferry/common/status.h"
#include "ferry/common/sync.h"
#include "gtest/gtest.h"
#include "ferry/rpc/agent.h"
#include "ferry/rpc/context.h"
#include "ferry/rpc/testing/grpc_cluster.h"
#include "ferry/rpc/testing/agent_cluster.h"
#include "ferry/tensor/tensor.h"

namespace ferry::rpc {
namespace {

using testing::AgentCluster;
using testing::ClusterFactory;
using testing::ClusterSpec;

constexpr MessageType kToy = static_cast<MessageType>(
    static_cast<uint32_t>(MessageType::kFirstLayerType) + 7);

struct Implementation {
  std::string name;
  ClusterFactory start;
  // Registers the basic functions non-blocking: a transport may serve them
  // on its own thread (rpc/function_registry.h); the results must not change.
  bool non_blocking = false;
};

std::shared_ptr<FunctionRegistry> BasicRegistry(bool non_blocking) {
  auto reg = std::make_shared<FunctionRegistry>();
  auto add = [&](std::string name, auto f) {
    EXPECT_TRUE((non_blocking ? reg->RegisterNonBlocking(name, std::move(f))
                              : reg->Register(name, std::move(f)))
                    .ok())
        << name;
  };
  add("add", [](Tensor a, Tensor b) { return a.add(b); });
  add("concat", [](std::string a, int64_t b) { return a + std::to_string(b); });
  add("whoami", [](const CallContext& ctx) { return ctx.caller_name; });
  add("fail", [](std::string why) -> absl::StatusOr<int64_t> {
    return absl::PermissionDeniedError(why);
  });
  add("noop", [] {});
  return reg;
}

// "relay" (blocking) on agent 1 of `cluster`: calls "leaf" on worker "c",
// then "leaf" back on its caller, each with rpc_sync.
absl::Status RegisterRelay(
    FunctionRegistry& reg,
    std::shared_ptr<std::atomic<AgentCluster*>> cluster) {
  return reg.Register(
      "relay",
      [cluster](const CallContext& ctx, int64_t x) -> absl::StatusOr<int64_t> {
        Agent& me = cluster->load()->agent(1);
        ASSIGN_OR_RETURN(int64_t y, me.rpc_sync<int64_t>("c", "leaf", x));
        return me.rpc_sync<int64_t>(ctx.caller_name, "leaf", y);
      });
}

// "slow"(x): notifies `started` (if any), waits for `gate` (bounded), returns
// x + 1.
absl::Status RegisterSlow(FunctionRegistry& reg,
                          std::shared_ptr<Notification> gate,
                          std::shared_ptr<Notification> started = nullptr) {
  return reg.Register("slow", [gate, started](int64_t x) {
    if (started) started->Notify();
    gate->WaitForNotificationWithTimeout(absl::Seconds(30));
    return x + 1;
  });
}

// "block"(): waits for `release` (bounded).
absl::Status RegisterBlock(FunctionRegistry& reg,
                           std::shared_ptr<Notification> release) {
  return reg.Register("block", [release] {
    release->WaitForNotificationWithTimeout(absl::Seconds(30));
  });
}

class AgentConformance : public ::testing::TestWithParam<Implementation> {
 protected:
  std::shared_ptr<FunctionRegistry> BasicRegistry() {
    return rpc::BasicRegistry(GetParam().non_blocking);
  }
  // Workers a, b, c with `threads` executor threads each; `cluster` is set
  // for the functions once they exist.
  std::unique_ptr<AgentCluster> StartTrio(
      std::shared_ptr<FunctionRegistry> reg,
      const std::shared_ptr<std::atomic<AgentCluster*>>& cluster, int threads) {
    Agent::Options opts;
    opts.num_worker_threads = threads;
    auto c = Start({"a", "b", "c"}, std::move(reg), opts);
    cluster->store(c.get());
    return c;
  }
  std::unique_ptr<AgentCluster> Start(std::vector<std::string> names,
                                      std::shared_ptr<FunctionRegistry> reg,
                                      Agent::Options options = {}) {
    auto c = GetParam().start(ClusterSpec{std::move(names), reg, options});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
};

TEST_P(AgentConformance, SyncAndAsyncCallsWithTensors) {
  auto c = Start({"w0", "w1", "w2"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  Agent& w0 = c->agent(0);
  Tensor a = arange(0.0, 4.0, 1.0, DType::kFloat32);
  Tensor b = full({4}, 10.0);
  absl::StatusOr<Tensor> sum = w0.rpc_sync<Tensor>("w1", "add", a, b);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(sum->to_vector<float>(), (std::vector<float>{10, 11, 12, 13}));

  Future<std::string> s =
      w0.rpc_async<std::string>(2, "concat", std::string("x"), 7);
  EXPECT_EQ(*s.Get(absl::Seconds(30)), "x7");
  // By WorkerInfo, and to self.
  EXPECT_EQ(*w0.rpc_sync<std::string>(w0.GetWorkerInfos()[1], "whoami"), "w0");
  EXPECT_EQ(*w0.rpc_sync<std::string>("w0", "whoami"), "w0");
  EXPECT_TRUE(w0.rpc_sync<void>("w2", "noop").ok());
  EXPECT_EQ(w0.GetWorkerInfos().size(), 3u);
  EXPECT_EQ(w0.self().name, "w0");
  EXPECT_EQ(w0.self().id, 0);
  EXPECT_TRUE(c->ShutdownAll().ok());
}

TEST_P(AgentConformance, ErrorsNameWorkerAndFunction) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  Agent& a = c->agent(0);

  auto unknown = a.rpc_sync<Value>("b", "nope");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("worker 'b'"), std::string::npos)
      << unknown.status();
  EXPECT_NE(unknown.status().message().find("'nope'"), std::string::npos);

  auto wrong_count = a.rpc_sync<std::string>("b", "concat", std::string("x"));
  EXPECT_EQ(wrong_count.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_count.status().message().find("concat"), std::string::npos)
      << wrong_count.status();

  auto wrong_type = a.rpc_sync<std::string>("b", "concat", 1, 2);
  EXPECT_EQ(wrong_type.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_type.status().message().find("expected string"),
            std::string::npos)
      << wrong_type.status();

  auto own = a.rpc_sync<int64_t>("b", "fail", std::string("no access"));
  EXPECT_EQ(own.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(
      own.status().message().find("worker 'b' function 'fail': no access"),
      std::string::npos)
      << own.status();

  auto no_worker = a.rpc_sync<Value>("zed", "noop");
  EXPECT_EQ(no_worker.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(no_worker.status().message().find("'zed'"), std::string::npos);
  EXPECT_EQ(a.rpc_sync<Value>(5, "noop").status().code(),
            absl::StatusCode::kNotFound);

  // Result type mismatch on the caller side.
  auto mismatch = a.rpc_sync<Tensor>("b", "concat", std::string("x"), 1);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c->ShutdownAll().ok());
}

TEST_P(AgentConformance, TimeoutIsDeadlineExceededNamingTheCall) {
  auto reg = BasicRegistry();
  auto release = std::make_shared<Notification>();
  ASSERT_TRUE(RegisterBlock(*reg, release).ok());
  auto c = Start({"a", "b"}, reg);
  ASSERT_NE(c, nullptr);
  Future<Value> f =
      c->agent(0).CallAsync("b", "block", {}, absl::Milliseconds(200));
  Result<Value> r = f.Get(absl::Seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded)
      << r.status();
  EXPECT_NE(r.status().message().find("worker 'b' function 'block'"),
            std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("200ms"), std::string::npos)
      << r.status();
  auto typed =
      c->agent(0).rpc_sync_for<void>(absl::Milliseconds(100), "b", "block");
  EXPECT_EQ(typed.code(), absl::StatusCode::kDeadlineExceeded) << typed;
  EXPECT_NE(typed.message().find("100ms"), std::string::npos) << typed;
  release->Notify();
  EXPECT_TRUE(c->ShutdownAll().ok());
}

// The default timeout (Options::rpc_timeout) bounds calls made without one,
// as a per-call timeout does (the gRPC agent sweeps these itself).
TEST_P(AgentConformance, DefaultTimeoutIsDeadlineExceededNamingTheCall) {
  auto reg = BasicRegistry();
  auto release = std::make_shared<Notification>();
  ASSERT_TRUE(RegisterBlock(*reg, release).ok());
  Agent::Options options;
  options.rpc_timeout = absl::Milliseconds(300);
  auto c = Start({"a", "b"}, reg, options);
  ASSERT_NE(c, nullptr);
  const absl::Time start = absl::Now();
  Future<Value> slow = c->agent(0).rpc_async("b", "block");
  absl::Status typed = c->agent(0).rpc_sync<void>("b", "block");
  Result<Value> r = slow.Get(absl::Seconds(30));
  const absl::Duration took = absl::Now() - start;
  for (const absl::Status& s : {r.status(), typed}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("worker 'b' function 'block'"),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find("300ms"), std::string::npos) << s;
  }
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(20));
  // A call that finishes in time is unaffected, before and after.
  EXPECT_TRUE(c->agent(0).rpc_sync<void>("b", "noop").ok());
  release->Notify();
  EXPECT_TRUE(c->agent(0).rpc_sync<void>("b", "noop").ok());
  EXPECT_TRUE(c->ShutdownAll().ok());
}

TEST_P(AgentConformance, AsyncFunctionDoesNotHoldAThread) {
  // One worker thread: if "wait_for_signal" held it, "signal" could never run.
  auto reg = std::make_shared<FunctionRegistry>();
  auto pending = std::make_shared<Promise<int64_t>>();
  ASSERT_TRUE(reg->Register("wait_for_signal",
                            [pending] { return pending->GetFuture(); })
                  .ok());
  ASSERT_TRUE(
      reg->Register("signal", [pending](int64_t v) { pending->SetValue(v); })
          .ok());
  Agent::Options opts;
  opts.num_worker_threads = 1;
  auto c = Start({"a", "b"}, reg, opts);
  ASSERT_NE(c, nullptr);
  Agent& a = c->agent(0);
  Future<int64_t> waiting = a.rpc_async<int64_t>("b", "wait_for_signal");
  ASSERT_TRUE(a.rpc_sync<void>("b", "signal", 42).ok());
  EXPECT_EQ(*waiting.Get(absl::Seconds(30)), 42);
  EXPECT_TRUE(c->ShutdownAll().ok());
}

TEST_P(AgentConformance, NestedCallsAndCallbacksToTheCaller) {
  auto reg = std::make_shared<FunctionRegistry>();
  // Filled once the cluster exists; functions only run after that. (Atomic:
  // the hand-off may go through a library TSAN cannot see.)
  auto cluster = std::make_shared<std::atomic<AgentCluster*>>(nullptr);
  ASSERT_TRUE(reg->Register("leaf", [](int64_t x) { return x * 2; }).ok());
  ASSERT_TRUE(RegisterRelay(*reg, cluster).ok());
  auto c = StartTrio(reg, cluster, /*threads=*/2);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(*c->agent(0).rpc_sync<int64_t>("b", "relay", 5), 20);
  // Several at once, more than the worker threads.
  std::vector<Future<int64_t>> fs;
  for (int i = 0; i < 8; ++i)
    fs.push_back(c->agent(0).rpc_async<int64_t>("b", "relay", i));
  auto all = CollectAll(fs).Get(absl::Seconds(60));
  ASSERT_TRUE(all.ok()) << all.status();
  for (int i = 0; i < 8; ++i) EXPECT_EQ((*all)[i], 4 * i);
  EXPECT_TRUE(c->ShutdownAll().ok());
}

TEST_P(AgentConformance, ThousandsOfConcurrentAsyncCalls) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  constexpr int kCalls = 3000;
  std::vector<Future<std::string>> fs;
  fs.reserve(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    fs.push_back(c->agent(i % 2).rpc_async<std::string>(1 - i % 2, "concat",
                                                        std::string("n"), i));
  }
  auto all = CollectAll(fs).Get(absl::Seconds(120));
  ASSERT_TRUE(all.ok()) << all.status();
  for (int i = 0; i < kCalls; ++i)
    ASSERT_EQ((*all)[i], "n" + std::to_string(i));
  EXPECT_TRUE(c->ShutdownAll().ok());
}

TEST_P(AgentConformance, DeadPeerGivesUnavailableNotAHang) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  c->Kill(1);
  Future<Value> f = c->agent(0).CallAsync("b", "noop", {}, absl::Seconds(20));
  Result<Value> r = f.Get(absl::Seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("worker 'b'"), std::string::npos)
      << r.status();
  EXPECT_TRUE(c->agent(0).Shutdown(/*graceful=*/false).ok());
}

TEST_P(AgentConformance, NonGracefulShutdownCancelsCallsInFlight) {
  auto reg = BasicRegistry();
  auto release = std::make_shared<Notification>();
  ASSERT_TRUE(RegisterBlock(*reg, release).ok());
  auto c = Start({"a", "b"}, reg);
  ASSERT_NE(c, nullptr);
  Future<Value> f = c->agent(0).CallAsync("b", "block", {});
  ASSERT_TRUE(c->agent(0).Shutdown(/*graceful=*/false).ok());
  Result<Value> r = f.Get(absl::Seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  absl::Status after = c->agent(0).rpc_sync<Value>("b", "noop").status();
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(after.message().find("worker 'a' is shut down"), std::string::npos)
      << after;
  release->Notify();
  EXPECT_TRUE(c->agent(0).Shutdown().ok());  // Idempotent.
  EXPECT_TRUE(c->agent(1).Shutdown(/*graceful=*/false).ok());
}

TEST_P(AgentConformance, GracefulShutdownDrainsCallsInFlight) {
  auto reg = BasicRegistry();
  auto gate = std::make_shared<Notification>();
  ASSERT_TRUE(RegisterSlow(*reg, gate).ok());
  auto c = Start({"a", "b"}, reg);
  ASSERT_NE(c, nullptr);
  std::vector<Future<int64_t>> fs;
  for (int i = 0; i < 4; ++i)
    fs.push_back(c->agent(0).rpc_async<int64_t>("b", "slow", i));
  // b's graceful shutdown waits at the barrier for a, whose calls are still
  // running on b; a finishes only once the gate opens.
  std::thread b_down([&] { EXPECT_TRUE(c->agent(1).Shutdown().ok()); });
  gate->Notify();
  EXPECT_TRUE(c->agent(0).Shutdown().ok());
  b_down.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(*fs[i].Get(absl::Seconds(1)), i + 1);
}

// A layer above rpc/ adds its own message type with fields and tensors.
TEST_P(AgentConformance, HandlerForALayerDefinedMessageType) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->agent(1)
                  .RegisterHandler(kToy,
                                   [](Message m) -> Future<Message> {
                                     Message reply;
                                     reply.headers = m.headers;
                                     reply.SetHeader(1, "reply");
                                     Tensor t = *m.payload.if_tensor();
                                     reply.payload = Value::FromTensor(
                                         t.add(full(t.sizes(), 1.0)));
                                     return MakeReadyFuture<Message>(reply);
                                   })
                  .ok());
  EXPECT_EQ(c->agent(1)
                .RegisterHandler(
                    kToy, [](Message m) { return MakeReadyFuture<Message>(m); })
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(c->agent(1)
                .RegisterHandler(
                    MessageType::kCall,
                    [](Message m) { return MakeReadyFuture<Message>(m); })
                .code(),
            absl::StatusCode::kAlreadyExists);

  Message m;
  m.type = kToy;
  m.SetHeader(1, "request");
  m.SetHeader(6, std::string("\0typed\xff", 7));
  m.payload = Value::FromTensor(full({3}, 2.0));
  Result<Message> r = c->agent(0).Send("b", m).Get(absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type, kToy);
  EXPECT_EQ(r->id.worker_id(), 0);  // The request's id, minted by "a".
  // Layer headers travel both ways as their bytes.
  EXPECT_EQ(r->headers,
            (LayerHeaders{{1, "reply"}, {6, std::string("\0typed\xff", 7)}}));
  ASSERT_EQ(r->Tensors().size(), 1u);
  EXPECT_EQ(r->Tensors()[0].to_vector<float>(), (std::vector<float>{3, 3, 3}));

  // The same type to a worker without the handler.
  Result<Message> none = c->agent(1).Send("a", m).Get(absl::Seconds(30));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnimplemented)
      << none.status();
  EXPECT_NE(none.status().message().find("worker 'a'"), std::string::npos)
      << none.status();
  EXPECT_NE(none.status().message().find("TYPE_1007"), std::string::npos)
      << none.status();
  EXPECT_TRUE(c->ShutdownAll().ok());
}

TEST_P(AgentConformance, HandlerErrorsAndAsyncReplies) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  auto later = std::make_shared<Promise<Message>>();
  ASSERT_TRUE(c->agent(1)
                  .RegisterHandler(kToy,
                                   [later](Message m) -> Future<Message> {
                                     if (m.function == "later")
                                       return later->GetFuture();
                                     return MakeErrorFuture<Message>(
                                         absl::AbortedError("toy refuses"));
                                   })
                  .ok());
  Message m;
  m.type = kToy;
  Result<Message> refused = c->agent(0).Send("b", m).Get(absl::Seconds(30));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(refused.status().message().find("toy refuses"), std::string::npos)
      << refused.status();
  m.function = "later";
  Future<Message> pending = c->agent(0).Send("b", m);
  Message answer;
  answer.payload = Value::Int(5);
  later->SetValue(answer);
  Result<Message> r = pending.Get(absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->payload.if_int(), 5);
  EXPECT_TRUE(c->ShutdownAll().ok());
}

// Interceptors see every message in the four places, with its tensors.
TEST_P(AgentConformance, InterceptorsSeeEveryTensor) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  struct Seen {
    Mutex mu;
    std::vector<std::pair<InterceptPoint, int64_t>> events ABSL_GUARDED_BY(mu);
  };
  auto seen = std::make_shared<Seen>();
  for (int i = 0; i < 2; ++i) {
    c->agent(i).AddInterceptor(
        [seen](InterceptPoint p, const WorkerInfo&, Message& m) {
          int64_t n = 0;
          for (const Tensor& t : m.Tensors()) n += t.numel();
          MutexLock lock(&seen->mu);
          seen->events.emplace_back(p, n);
          return absl::OkStatus();
        });
  }
  Tensor x = full({4}, 1.0);
  Tensor y = full({4}, 2.0);
  ASSERT_TRUE(c->agent(0).rpc_sync<Tensor>("b", "add", x, y).ok());
  MutexLock lock(&seen->mu);
  ASSERT_EQ(seen->events.size(), 4u);
  EXPECT_EQ(seen->events[0],
            std::make_pair(InterceptPoint::kSendRequest, int64_t{8}));
  EXPECT_EQ(seen->events[1],
            std::make_pair(InterceptPoint::kReceiveRequest, int64_t{8}));
  EXPECT_EQ(seen->events[2],
            std::make_pair(InterceptPoint::kSendReply, int64_t{4}));
  EXPECT_EQ(seen->events[3],
            std::make_pair(InterceptPoint::kReceiveReply, int64_t{4}));
}

TEST_P(AgentConformance, InterceptorsEditAndFailMessages) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  // The sender stamps a layer header; the receiver reads it and refuses
  // calls to "noop".
  c->agent(0).AddInterceptor(
      [](InterceptPoint p, const WorkerInfo&, Message& m) {
        if (p == InterceptPoint::kSendRequest)
          m.SetHeader(2, "77");
        return absl::OkStatus();
      });
  auto got = std::make_shared<std::atomic<uint64_t>>(0);
  // The header's bytes as a number (a layer would decode its own format).
  c->agent(1).AddInterceptor(
      [got](InterceptPoint p, const WorkerInfo& peer, Message& m) {
        if (p != InterceptPoint::kReceiveRequest) return absl::OkStatus();
        if (const std::string* h = m.FindHeader(2)) {
          got->store(static_cast<uint64_t>(std::stoull(*h)));
        }
        if (m.function == "noop") {
          return absl::FailedPreconditionError(
              absl::StrCat("refused a call from '", peer.name, "'"));
        }
        return absl::OkStatus();
      });
  EXPECT_EQ(*c->agent(0).rpc_sync<std::string>("b", "whoami"), "a");
  EXPECT_EQ(got->load(), 77u);
  absl::Status refused = c->agent(0).rpc_sync<void>("b", "noop");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("refused a call from 'a'"),
            std::string::npos)
      << refused;
  EXPECT_TRUE(c->ShutdownAll().ok());
}

// The thread-local context travels with calls, through nested calls.
TEST_P(AgentConformance, ContextTravelsWithCalls) {
  auto reg = std::make_shared<FunctionRegistry>();
  auto cluster = std::make_shared<std::atomic<AgentCluster*>>(nullptr);
  ASSERT_TRUE(reg->Register("read",
                            [](std::string key) {
                              return CurrentContextValue(key).value_or(
                                  "<unset>");
                            })
                  .ok());
  ASSERT_TRUE(
      reg->Register("forward",
                    [cluster](std::string key) {
                      return cluster->load()->agent(1).rpc_sync<std::string>(
                          "c", "read", key);
                    })
          .ok());
  auto c = Start({"a", "b", "c"}, reg);
  ASSERT_NE(c, nullptr);
  cluster->store(c.get());
  EXPECT_EQ(*c->agent(0).rpc_sync<std::string>("b", "read", std::string("k")),
            "<unset>");
  {
    ScopedContextEntry ctx("k", "ctx-42");
    EXPECT_EQ(*c->agent(0).rpc_sync<std::string>("b", "read", std::string("k")),
              "ctx-42");
    EXPECT_EQ(
        *c->agent(0).rpc_sync<std::string>("b", "forward", std::string("k")),
        "ctx-42");
  }
  // Gone with the scope, on the caller and on the callee's threads.
  EXPECT_EQ(
      *c->agent(0).rpc_sync<std::string>("b", "forward", std::string("k")),
      "<unset>");
  EXPECT_TRUE(c->ShutdownAll().ok());
}

// The callee's deadline is the caller's: the remaining time travels, not the
// full timeout. An interceptor plays "time already spent" by moving the
// deadline of a 60 s call to 2 s from now before it is sent.
TEST_P(AgentConformance, CalleeDeadlineIsTheCallersRemainingTime) {
  auto reg = std::make_shared<FunctionRegistry>();
  ASSERT_TRUE(reg->Register("remaining_ms",
                            [](const CallContext& ctx) {
                              return absl::ToInt64Milliseconds(ctx.deadline -
                                                               absl::Now());
                            })
                  .ok());
  auto c = Start({"a", "b"}, reg);
  ASSERT_NE(c, nullptr);
  auto full =
      c->agent(0).rpc_sync_for<int64_t>(absl::Seconds(60), "b", "remaining_ms");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_GT(*full, 50'000);
  EXPECT_LE(*full, 60'000);
  c->agent(0).AddInterceptor(
      [](InterceptPoint p, const WorkerInfo&, Message& m) {
        if (p == InterceptPoint::kSendRequest)
          m.deadline = absl::Now() + absl::Seconds(2);
        return absl::OkStatus();
      });
  auto spent =
      c->agent(0).rpc_sync_for<int64_t>(absl::Seconds(60), "b", "remaining_ms");
  ASSERT_TRUE(spent.ok()) << spent.status();
  EXPECT_GT(*spent, 0);
  EXPECT_LE(*spent, 2'000);
  EXPECT_TRUE(c->ShutdownAll().ok());
}

// What one agent's peer-down listener heard, in order.
struct DownReports {
  Mutex mu;
  std::vector<PeerDown> seen ABSL_GUARDED_BY(mu);
  void Listen(Agent& agent, PeerDownReasons reasons = kAnyPeerDownReason) {
    agent.AddPeerDownListener(
        [this](const PeerDown& down) {
          MutexLock lock(&mu);
          seen.push_back(down);
        },
        reasons);
  }
  std::vector<PeerDown> Get() {
    MutexLock lock(&mu);
    return seen;
  }
  // Waits (bounded) until `n` entries were heard; returns whether they were.
  bool AwaitCount(size_t n, absl::Duration limit = absl::Seconds(30)) {
    MutexLock lock(&mu);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return seen.size() >= n;
    };
    return mu.AwaitWithTimeout(absl::Condition(&enough), limit);
  }
};

// `down` is worker `name` (id `id`) down for `reason`, and its status says
// so: the code of `cause_code`, the worker, its id and the reason named.
void ExpectEntry(const PeerDown& down, const std::string& name, int id,
                 PeerDownReason reason, absl::StatusCode cause_code,
                 bool first) {
  EXPECT_EQ(down.peer.name, name);
  EXPECT_EQ(down.peer.id, id);
  EXPECT_EQ(down.reason, reason) << down.why;
  EXPECT_EQ(down.first, first) << down.why;
  EXPECT_EQ(down.cause.code(), cause_code) << down.cause;
  EXPECT_EQ(down.why.code(), cause_code) << down.why;
  const std::string text(down.why.message());
  EXPECT_NE(text.find(absl::StrCat("worker '", name, "' (id ", id, ")")),
            std::string::npos)
      << down.why;
  EXPECT_NE(text.find(std::string(PeerDownReasonName(reason))),
            std::string::npos)
      << down.why;
  EXPECT_NE(text.find(std::string(down.cause.message())), std::string::npos)
      << down.why;
}

constexpr PeerDownReasons Only(PeerDownReason r) {
  return static_cast<PeerDownReasons>(r);
}

// Failure reports: a listener learns once that a killed peer failed (the
// in-process agent at the kill, the gRPC agent once a call to it failed and
// its health probe did too), a listener added later learns it at once, and a
// live peer is never reported.
TEST_P(AgentConformance, PeerFailureListenersLearnOfADeadPeerOnce) {
  auto c = Start({"a", "b", "c"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  struct Reports {
    Mutex mu;
    std::vector<std::pair<WorkerInfo, absl::Status>> seen ABSL_GUARDED_BY(mu);
  };
  auto reports = std::make_shared<Reports>();
  Agent& a = c->agent(0);
  a.AddPeerFailureListener(
      [reports](const WorkerInfo& peer, const absl::Status& why) {
        MutexLock lock(&reports->mu);
        reports->seen.emplace_back(peer, why);
      });
  DownReports downs;  // The same failure, as a peer-state entry.
  downs.Listen(a);
  ASSERT_TRUE(a.rpc_sync("b", "noop").ok());
  EXPECT_FALSE(a.IsPeerFailed(1));
  EXPECT_FALSE(a.IsPeerDown(1));
  c->Kill(1);
  Result<Value> r =
      a.CallAsync("b", "noop", {}, absl::Seconds(20)).Get(absl::Seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  {
    MutexLock lock(&reports->mu);
    auto reported = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reports->mu) {
      return !reports->seen.empty();
    };
    ASSERT_TRUE(reports->mu.AwaitWithTimeout(absl::Condition(&reported),
                                             absl::Seconds(30)));
    EXPECT_EQ(reports->seen[0].first.name, "b");
    EXPECT_EQ(reports->seen[0].first.id, 1);
    EXPECT_EQ(reports->seen[0].second.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(reports->seen[0].second.message().find("'b'"), std::string::npos)
        << reports->seen[0].second;
  }
  EXPECT_TRUE(a.IsPeerFailed(1));
  EXPECT_FALSE(a.IsPeerFailed(2));
  // The peer-state table holds it, for this reason alone.
  EXPECT_TRUE(a.IsPeerDown(1));
  EXPECT_TRUE(a.IsPeerDown(1, Only(PeerDownReason::kTransportFailure)));
  EXPECT_FALSE(a.IsPeerDown(1, Only(PeerDownReason::kDeparted)));
  EXPECT_FALSE(a.IsPeerDown(2));
  ASSERT_TRUE(downs.AwaitCount(1));
  ASSERT_EQ(a.PeersDown().size(), 1u);
  ExpectEntry(a.PeersDown()[0], "b", 1, PeerDownReason::kTransportFailure,
              absl::StatusCode::kUnavailable, /*first=*/true);
  {
    MutexLock lock(&reports->mu);
    EXPECT_EQ(a.PeersDown()[0].cause, reports->seen[0].second);
  }
  // Once failed, later failed calls report nothing more.
  EXPECT_FALSE(a.rpc_sync_for(absl::Seconds(20), "b", "noop").ok());
  std::atomic<int> late{0};
  a.AddPeerFailureListener(
      [&late](const WorkerInfo& peer, const absl::Status&) {
        if (peer.id == 1) ++late;
      });
  EXPECT_EQ(late.load(), 1);
  // The live peer still serves and is not reported, not even as the
  // survivors leave (gRPC: non-graceful, since b never reaches the barrier).
  EXPECT_TRUE(a.rpc_sync("c", "noop").ok());
  EXPECT_TRUE(c->agent(2).Shutdown(/*graceful=*/false).ok());
  EXPECT_TRUE(a.Shutdown(/*graceful=*/false).ok());
  EXPECT_EQ(downs.Get().size(), 1u);
  MutexLock lock(&reports->mu);
  EXPECT_EQ(reports->seen.size(), 1u);
}

// The two reasons reported from outside the agent (a detector, a layer's
// exhausted retries): recorded once per reason, queried, told once to the
// listeners that asked for them (and to one added later), each status naming
// the worker and the reason; the agent does nothing else with them: the
// peers still serve, are not "failed", and the failure listeners hear
// nothing. A report is taken while the agent stops too.
TEST_P(AgentConformance, ReportedPeersAreRecordedAndTheAgentCarriesOn) {
  auto c = Start({"a", "b", "c"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  Agent& a = c->agent(0);
  std::atomic<int> failures{0};
  a.AddPeerFailureListener(
      [&failures](const WorkerInfo&, const absl::Status&) { ++failures; });
  DownReports all;
  all.Listen(a);
  DownReports retries;
  retries.Listen(a, Only(PeerDownReason::kRetriesExhausted));
  const absl::Status exited = absl::UnavailableError("launcher: pid 4242 exited");
  const absl::Status spent = absl::UnavailableError("last attempt refused");
  EXPECT_TRUE(a.ReportPeerDown(1, PeerDownReason::kDetectorReport, exited).ok());
  EXPECT_TRUE(
      a.ReportPeerDown(2, PeerDownReason::kRetriesExhausted, spent).ok());
  // Repeats change nothing; a second reason for b is its own entry.
  EXPECT_TRUE(a.ReportPeerDown(1, PeerDownReason::kDetectorReport,
                               absl::UnavailableError("again"))
                  .ok());
  EXPECT_TRUE(
      a.ReportPeerDown(1, PeerDownReason::kRetriesExhausted, spent).ok());
  EXPECT_TRUE(
      a.ReportPeerDown(2, PeerDownReason::kRetriesExhausted, spent).ok());

  std::vector<PeerDown> heard = all.Get();
  ASSERT_EQ(heard.size(), 3u);
  ExpectEntry(heard[0], "b", 1, PeerDownReason::kDetectorReport,
              absl::StatusCode::kUnavailable, /*first=*/true);
  EXPECT_EQ(heard[0].cause, exited);
  ExpectEntry(heard[1], "c", 2, PeerDownReason::kRetriesExhausted,
              absl::StatusCode::kUnavailable, /*first=*/true);
  ExpectEntry(heard[2], "b", 1, PeerDownReason::kRetriesExhausted,
              absl::StatusCode::kUnavailable, /*first=*/false);
  std::vector<PeerDown> only_retries = retries.Get();
  ASSERT_EQ(only_retries.size(), 2u);
  EXPECT_EQ(only_retries[0].peer.name, "c");
  EXPECT_EQ(only_retries[1].peer.name, "b");

  EXPECT_TRUE(a.IsPeerDown(1));
  EXPECT_TRUE(a.IsPeerDown(1, Only(PeerDownReason::kDetectorReport)));
  EXPECT_TRUE(a.IsPeerDown(2, Only(PeerDownReason::kRetriesExhausted)));
  EXPECT_FALSE(a.IsPeerDown(2, Only(PeerDownReason::kDetectorReport)));
  EXPECT_FALSE(a.IsPeerDown(0));
  // The table, by id: b's two entries in order, then c's.
  std::vector<PeerDown> table = a.PeersDown();
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(table[0].reason, PeerDownReason::kDetectorReport);
  EXPECT_EQ(table[1].reason, PeerDownReason::kRetriesExhausted);
  EXPECT_EQ(table[1].peer.name, "b");
  EXPECT_EQ(table[2].peer.name, "c");
  // Another agent's table is its own.
  EXPECT_FALSE(c->agent(2).IsPeerDown(1));

  // What the agent does is as before: not failed, still served and waited
  // for, no failure report.
  EXPECT_FALSE(a.IsPeerFailed(1));
  EXPECT_FALSE(a.IsPeerFailed(2));
  EXPECT_TRUE(a.rpc_sync("b", "noop").ok());
  EXPECT_TRUE(a.rpc_sync("c", "noop").ok());
  absl::StatusOr<WorkerInfo> back = a.WaitForWorker("b", absl::Seconds(10));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->id, 1);
  EXPECT_EQ(failures.load(), 0);

  // A listener added later hears every entry once, at once.
  DownReports late;
  late.Listen(a);
  EXPECT_EQ(late.Get().size(), 3u);
  EXPECT_TRUE(c->ShutdownAll().ok());
  EXPECT_TRUE(a.ReportPeerDown(2, PeerDownReason::kDetectorReport, exited).ok());
  EXPECT_TRUE(a.IsPeerDown(2, Only(PeerDownReason::kDetectorReport)));
  EXPECT_EQ(all.Get().size(), 4u);
  EXPECT_EQ(late.Get().size(), 4u);
  EXPECT_EQ(failures.load(), 0);
}

// ReportPeerDown refuses what it cannot record, naming the worker: a
// negative id, this worker itself, the reasons the agent records itself, an
// OK cause. Nothing is recorded.
TEST_P(AgentConformance, ReportPeerDownRefusesBadReports) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  Agent& a = c->agent(0);
  const absl::Status down = absl::UnavailableError("gone");
  struct Case {
    int id;
    PeerDownReason reason;
    absl::Status cause;
    std::string says;
  };
  const Case cases[] = {
      {-1, PeerDownReason::kDetectorReport, down, "not negative"},
      {0, PeerDownReason::kDetectorReport, down, "itself"},
      {1, PeerDownReason::kTransportFailure, down, "transport failure"},
      {1, PeerDownReason::kDeparted, down, "departed"},
      {1, PeerDownReason::kRetriesExhausted, absl::OkStatus(), "not OK"},
  };
  for (const Case& k : cases) {
    absl::Status s = a.ReportPeerDown(k.id, k.reason, k.cause);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("worker 'a'"), std::string::npos) << s;
    EXPECT_NE(s.message().find(absl::StrCat("worker id ", k.id)),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find(k.says), std::string::npos) << s;
  }
  EXPECT_TRUE(a.PeersDown().empty());
  EXPECT_FALSE(a.IsPeerDown(1));
  EXPECT_TRUE(c->ShutdownAll().ok());
}

// A peer a detector reported first still fails at the transport as before:
// the failure is its own entry (not the first), the failure listeners hear
// it, and IsPeerFailed holds.
TEST_P(AgentConformance, AReportedPeerStillFailsAtTheTransport) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  Agent& a = c->agent(0);
  std::atomic<int> failures{0};
  a.AddPeerFailureListener(
      [&failures](const WorkerInfo& peer, const absl::Status&) {
        if (peer.id == 1) ++failures;
      });
  DownReports downs;
  downs.Listen(a);
  ASSERT_TRUE(a.ReportPeerDown(1, PeerDownReason::kDetectorReport,
                               absl::UnavailableError("heartbeat stopped"))
                  .ok());
  c->Kill(1);
  Result<Value> r =
      a.CallAsync("b", "noop", {}, absl::Seconds(20)).Get(absl::Seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  ASSERT_TRUE(downs.AwaitCount(2));
  std::vector<PeerDown> heard = downs.Get();
  ASSERT_EQ(heard.size(), 2u);
  EXPECT_EQ(heard[0].reason, PeerDownReason::kDetectorReport);
  ExpectEntry(heard[1], "b", 1, PeerDownReason::kTransportFailure,
              absl::StatusCode::kUnavailable, /*first=*/false);
  EXPECT_TRUE(a.IsPeerFailed(1));
  EXPECT_EQ(failures.load(), 1);
  EXPECT_TRUE(a.Shutdown(/*graceful=*/false).ok());
}

// Non-blocking functions beside blocking ones that nest calls: with one
// worker thread per agent, blocking relays call non-blocking leaves on a third
// worker and back on their caller, and a non-blocking function forwards a
// call asynchronously (its reply completes later, on a transport thread).
TEST_P(AgentConformance, NonBlockingFunctionsMixWithNestedBlockingCalls) {
  auto reg = std::make_shared<FunctionRegistry>();
  auto cluster = std::make_shared<std::atomic<AgentCluster*>>(nullptr);
  ASSERT_TRUE(
      reg->RegisterNonBlocking("leaf", [](int64_t x) { return x * 2; }).ok());
  ASSERT_TRUE(reg->RegisterNonBlocking(
                     "forward",
                     [cluster](int64_t x) {
                       return cluster->load()->agent(1).rpc_async<int64_t>(
                           "c", "leaf", x);
                     })
                  .ok());
  ASSERT_TRUE(RegisterRelay(*reg, cluster).ok());
  auto c = StartTrio(reg, cluster, /*threads=*/1);
  ASSERT_NE(c, nullptr);
  std::vector<Future<int64_t>> relayed;
  std::vector<Future<int64_t>> forwarded;
  for (int i = 0; i < 8; ++i) {
    relayed.push_back(c->agent(0).rpc_async<int64_t>("b", "relay", i));
    forwarded.push_back(c->agent(0).rpc_async<int64_t>("b", "forward", i));
  }
  auto r = CollectAll(relayed).Get(absl::Seconds(60));
  auto f = CollectAll(forwarded).Get(absl::Seconds(60));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(f.ok()) << f.status();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ((*r)[i], 4 * i);
    EXPECT_EQ((*f)[i], 2 * i);
  }
  EXPECT_TRUE(c->ShutdownAll().ok());
}

// Membership: what one worker's listener heard, in order.
struct Changes {
  Mutex mu;
  std::vector<std::pair<std::string, MembershipChange>> seen
      ABSL_GUARDED_BY(mu);
  void Listen(Agent& agent) {
    agent.AddMembershipListener(
        [this](const WorkerInfo& w, MembershipChange change) {
          MutexLock lock(&mu);
          seen.emplace_back(w.name, change);
        });
  }
  std::vector<std::pair<std::string, MembershipChange>> Get() {
    MutexLock lock(&mu);
    return seen;
  }
};

std::vector<std::string> Names(const Agent& agent) {
  std::vector<std::string> out;
  for (const WorkerInfo& w : agent.GetWorkerInfos()) out.push_back(w.name);
  return out;
}

// A worker joins a running group: every member knows it when Join returns
// (table, listeners), it knows every member, and calls go both ways.
TEST_P(AgentConformance, JoinedWorkerAppearsInEveryTableAndServes) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  Changes heard;
  heard.Listen(c->agent(0));
  EXPECT_EQ(c->agent(0).membership_version(), 0u);
  absl::StatusOr<Agent*> t = c->Join("t");
  ASSERT_TRUE(t.ok()) << t.status();
  Agent& a = c->agent(0);
  EXPECT_EQ((*t)->self().id, 2);  // The next id after the static group.
  EXPECT_EQ(Names(**t), (std::vector<std::string>{"a", "b", "t"}));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Names(c->agent(i)), (std::vector<std::string>{"a", "b", "t"}));
    EXPECT_EQ(c->agent(i).world_size(), 3);
    absl::StatusOr<WorkerInfo> by_name = c->agent(i).GetWorkerInfo("t");
    ASSERT_TRUE(by_name.ok()) << by_name.status();
    EXPECT_EQ(by_name->id, 2);
    EXPECT_EQ(c->agent(i).GetWorkerInfo(2)->name, "t");
  }
  EXPECT_EQ(a.membership_version(), 1u);
  EXPECT_EQ(heard.Get(), (std::vector<std::pair<std::string, MembershipChange>>{
                             {"t", MembershipChange::kJoined}}));
  EXPECT_EQ(*a.rpc_sync<std::string>("t", "whoami"), "a");
  EXPECT_EQ(*(*t)->rpc_sync<std::string>("b", "whoami"), "t");
  EXPECT_EQ(*(*t)->rpc_sync<std::string>(1, "concat", std::string("j"), 1),
            "j1");
  EXPECT_TRUE((*t)->Leave().ok());
  EXPECT_TRUE(c->ShutdownAll().ok());
}

// A worker leaves: every member drops it from its table and hears it once;
// calls to it fail at once naming it (by name and by id); it is not a
// failure; its name may join again, with a new id.
TEST_P(AgentConformance, LeftWorkerDisappearsAndCallsToItFailNamingIt) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  Agent& a = c->agent(0);
  std::atomic<int> failures{0};
  a.AddPeerFailureListener(
      [&failures](const WorkerInfo&, const absl::Status&) { ++failures; });
  Changes heard;
  heard.Listen(a);
  DownReports downs;
  downs.Listen(a);
  absl::StatusOr<Agent*> t = c->Join("t");
  ASSERT_TRUE(t.ok()) << t.status();
  const int old_id = (*t)->self().id;
  ASSERT_TRUE(a.rpc_sync("t", "noop").ok());
  ASSERT_TRUE((*t)->Leave().ok());
  EXPECT_TRUE((*t)->Leave().ok());  // Idempotent.
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Names(c->agent(i)), (std::vector<std::string>{"a", "b"}));
    EXPECT_TRUE(c->agent(i).HasLeft(old_id));
  }
  EXPECT_EQ(heard.Get(), (std::vector<std::pair<std::string, MembershipChange>>{
                             {"t", MembershipChange::kJoined},
                             {"t", MembershipChange::kLeft}}));
  for (const WorkerRef& to : {WorkerRef("t"), WorkerRef(old_id)}) {
    absl::Status gone = a.rpc_sync_for(absl::Seconds(20), to, "noop").status();
    EXPECT_EQ(gone.code(), absl::StatusCode::kUnavailable) << gone;
    EXPECT_NE(gone.message().find("worker 't'"), std::string::npos) << gone;
    EXPECT_NE(gone.message().find("left the group"), std::string::npos) << gone;
  }
  EXPECT_EQ(failures.load(), 0);
  EXPECT_FALSE(a.IsPeerFailed(old_id));
  // The peer-state table holds the departure, once, as that alone.
  EXPECT_TRUE(a.IsPeerDown(old_id));
  EXPECT_TRUE(a.IsPeerDown(old_id, Only(PeerDownReason::kDeparted)));
  EXPECT_FALSE(a.IsPeerDown(old_id, Only(PeerDownReason::kTransportFailure)));
  std::vector<PeerDown> left = downs.Get();
  ASSERT_EQ(left.size(), 1u);
  ExpectEntry(left[0], "t", old_id, PeerDownReason::kDeparted,
              absl::StatusCode::kUnavailable, /*first=*/true);
  EXPECT_NE(left[0].why.message().find("left the group"), std::string::npos)
      << left[0].why;
  DownReports late;
  late.Listen(a, Only(PeerDownReason::kDeparted));
  EXPECT_EQ(late.Get().size(), 1u);
  // The departed worker cannot call either.
  EXPECT_EQ((*t)->rpc_sync("a", "noop").status().code(),
            absl::StatusCode::kUnavailable);

  absl::StatusOr<Agent*> again = c->Join("t");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT((*again)->self().id, old_id);  // Ids are never reused.
  EXPECT_EQ(*a.rpc_sync<std::string>("t", "whoami"), "a");
  EXPECT_EQ(*(*again)->rpc_sync<std::string>("b", "whoami"), "t");
  EXPECT_FALSE(a.IsPeerDown((*again)->self().id));
  EXPECT_TRUE((*again)->Leave().ok());
  EXPECT_TRUE(c->ShutdownAll().ok());
  EXPECT_EQ(downs.Get().size(), 2u);  // The second departure, once.
}

TEST_P(AgentConformance, JoinRefusesANameAPresentWorkerHolds) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  absl::StatusOr<Agent*> dup = c->Join("b");
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists)
      << dup.status();
  EXPECT_NE(dup.status().message().find("'b'"), std::string::npos)
      << dup.status();
  EXPECT_EQ(Names(c->agent(0)), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(c->ShutdownAll().ok());
}

// Calls members sent before they knew of the departure are answered: the
// leaver serves what it received before it stops.
TEST_P(AgentConformance, LeaveAnswersCallsAlreadyReceived) {
  auto reg = BasicRegistry();
  auto gate = std::make_shared<Notification>();
  auto started = std::make_shared<Notification>();
  ASSERT_TRUE(RegisterSlow(*reg, gate, started).ok());
  auto c = Start({"a", "b"}, reg);
  ASSERT_NE(c, nullptr);
  absl::StatusOr<Agent*> t = c->Join("t");
  ASSERT_TRUE(t.ok()) << t.status();
  Agent& a = c->agent(0);
  const int tid = (*t)->self().id;
  auto told = std::make_shared<Notification>();
  a.AddMembershipListener([told, tid](const WorkerInfo& w, MembershipChange m) {
    if (w.id == tid && m == MembershipChange::kLeft) told->Notify();
  });
  Future<int64_t> in_flight = a.rpc_async<int64_t>("t", "slow", 41);
  ASSERT_TRUE(started->WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::Status left;
  std::thread leaving([&] { left = (*t)->Leave(); });
  // "a" learns of the departure while its call still runs on "t".
  EXPECT_TRUE(told->WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(a.HasLeft(tid));
  gate->Notify();
  leaving.join();
  EXPECT_TRUE(left.ok()) << left;
  Result<int64_t> r = in_flight.Get(absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 42);
  EXPECT_TRUE(c->ShutdownAll().ok());
}

// Several workers join at once: each ends up in every table.
TEST_P(AgentConformance, ConcurrentJoinersAllSeeEachOther) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  constexpr int kJoiners = 3;
  std::vector<absl::StatusOr<Agent*>> joined(kJoiners,
                                             absl::UnknownError("unset"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kJoiners; ++i) {
    threads.emplace_back([&, i] { joined[i] = c->Join(absl::StrCat("t", i)); });
  }
  for (auto& th : threads) th.join();
  const std::vector<std::string> all = {"a", "b", "t0", "t1", "t2"};
  std::vector<Agent*> everyone = {&c->agent(0), &c->agent(1)};
  for (auto& j : joined) {
    ASSERT_TRUE(j.ok()) << j.status();
    everyone.push_back(*j);
  }
  for (Agent* w : everyone) {
    std::vector<std::string> names = Names(*w);
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, all) << w->self().name;
  }
  for (auto& j : joined) {
    EXPECT_EQ(*(*j)->rpc_sync<std::string>("t2", "whoami"), (*j)->self().name);
  }
  for (auto& j : joined) EXPECT_TRUE((*j)->Leave().ok());
  EXPECT_EQ(Names(c->agent(1)), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(c->ShutdownAll().ok());
}

// A member of the static group may leave too: the others go on, and their
// collective shutdown counts it as arrived.
TEST_P(AgentConformance, StaticMemberLeavesAndTheOthersShutDown) {
  auto c = Start({"a", "b", "c"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->agent(2).Leave().ok());
  EXPECT_EQ(Names(c->agent(0)), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(c->agent(1).HasLeft(2));
  EXPECT_EQ(*c->agent(0).rpc_sync<std::string>("b", "whoami"), "a");
  absl::Status gone = c->agent(1).rpc_sync("c", "noop").status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kUnavailable) << gone;
  EXPECT_NE(gone.message().find("worker 'c' (id 2) left the group"),
            std::string::npos)
      << gone;
  EXPECT_TRUE(c->ShutdownAll().ok());
}

// A member waiting in the shutdown barrier still serves: it takes a joiner
// (and knows it when Join returns, well within the join's time limit), the
// joiner works with the members still running and leaves before they shut
// down, and the barrier then completes.
TEST_P(AgentConformance, AMemberWaitingInTheShutdownBarrierTakesAJoiner) {
  auto c = Start({"a", "b", "c"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  absl::Status b_down = absl::UnknownError("not returned");
  std::thread down([&] { b_down = c->agent(1).Shutdown(); });
  const bool waiting = PollUntil(
      [&] { return c->ArrivedAtShutdownBarrier() == 1; }, absl::Seconds(30));
  EXPECT_TRUE(waiting);
  const absl::Time start = absl::Now();
  absl::StatusOr<Agent*> t =
      waiting ? c->Join("t") : absl::UnknownError("b not in the barrier");
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(t.ok()) << t.status();
  // Join's limit is 60 s or more; a member that does not answer costs it.
  EXPECT_LT(took, absl::Seconds(20));
  if (t.ok()) {
    EXPECT_EQ(Names(c->agent(1)),
              (std::vector<std::string>{"a", "b", "c", "t"}));
    EXPECT_EQ(*(*t)->rpc_sync<std::string>("a", "whoami"), "t");
    EXPECT_TRUE((*t)->Leave().ok());
    EXPECT_TRUE(c->agent(1).HasLeft((*t)->self().id));
  }
  EXPECT_TRUE(c->ShutdownAll().ok());
  down.join();
  EXPECT_TRUE(b_down.ok()) << b_down;
}

// Once every worker reached the shutdown barrier the group is shutting down:
// Join fails at once, naming the joiner and why.
TEST_P(AgentConformance, JoinFailsFastOnceTheGroupShutsDown) {
  auto c = Start({"a", "b"}, BasicRegistry());
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->ShutdownAll().ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<Agent*> t = c->Join("t");
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition)
      << t.status();
  EXPECT_NE(t.status().message().find("'t'"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("the group is shutting down"),
            std::string::npos)
      << t.status();
}

std::vector<Implementation> Implementations() {
  return {{"InProcess", testing::StartInProcessCluster},
          {"Grpc", testing::StartGrpcCluster},
          {"GrpcNonBlocking", testing::StartGrpcCluster,
           /*non_blocking=*/true},
          {"GrpcStreamed", testing::StartGrpcStreamedCluster},
          {"GrpcSameHost", testing::StartGrpcSameHostCluster},
          {"GrpcSameHostNonBlocking", testing::StartGrpcSameHostCluster,
           /*non_blocking=*/true}};
}

INSTANTIATE_TEST_SUITE_P(All, AgentConformance,
                         ::testing::ValuesIn(Implementations()),
                         [](const ::testing::TestParamInfo<Implementation>& i) {
                           return i.param.name;
                         });

}  // namespace
}  // namespace ferry::rpc
