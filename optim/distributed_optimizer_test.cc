#include "ferry/optim/distributed_optimizer.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "ferry/autograd/engine.h"
#include "ferry/autograd/ops.h"
#include "ferry/rpc/testing/in_process.h"
#include "gtest/gtest.h"

namespace ferry::optim {
namespace {

using autograd::dist::ContextScope;
using autograd::dist::DistAutogradContainer;
using rref::RRef;
using rref::RRefContext;

Tensor Param(const std::vector<int64_t>& sizes, uint64_t seed) {
  Tensor t = randn(sizes, seed, DType::kFloat64);
  autograd::SetRequiresGrad(t);
  return t;
}

FunctionalOptions Options(int kind) {
  switch (kind) {
    case 0:
      return SgdOptions{.lr = 0.05, .momentum = 0.9};
    case 1:
      return AdamOptions{.lr = 0.05};
    case 2:
      return AdamWOptions{{.lr = 0.05, .weight_decay = 0.1}};
    default:
      return AdagradOptions{.lr = 0.1, .lr_decay = 0.01};
  }
}

// The local functional optimizer the distributed one must match.
struct LocalReplay {
  SgdState sgd;
  AdamState adam;
  AdagradState adagrad;
  absl::Status Step(const FunctionalOptions& o, const std::vector<Tensor>& p,
                    const std::vector<Tensor>& g) {
    if (const auto* s = std::get_if<SgdOptions>(&o)) {
      return SgdStep(p, g, sgd, *s);
    }
    if (const auto* a = std::get_if<AdamOptions>(&o)) {
      return AdamStep(p, g, adam, *a);
    }
    if (const auto* a = std::get_if<AdamWOptions>(&o)) {
      return AdamWStep(p, g, adam, *a);
    }
    return AdagradStep(p, g, adagrad, std::get<AdagradOptions>(o));
  }
};

// A trainer and a parameter server "ps" that owns w and v of
// y = x w + v; the trainer's loss is sum(y * y).
class DistOptimizerTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    net_ = std::make_unique<rpc::testing::InProcessNetwork>(
        std::vector<std::string>{"trainer", "ps"});
    for (int i = 0; i < 2; ++i) {
      auto d = DistAutogradContainer::Install(net_->agent(i));
      ASSERT_TRUE(d.ok()) << d.status();
      dist_.push_back(*d);
      auto r = RRefContext::Install(net_->agent(i));
      ASSERT_TRUE(r.ok()) << r.status();
      rrefs_.push_back(*r);
      auto s = DistOptimizerService::Install(
          net_->agent(i), {.param_mutex = nullptr, .dist = dist_[i]});
      ASSERT_TRUE(s.ok()) << s.status();
      services_.push_back(*s);
    }
    w_ = Param({3, 2}, 71);
    v_ = Param({2}, 72);
    RRefContext* ps = rrefs_[1].get();
    ASSERT_TRUE(net_->agent(1)
                    .Register("params",
                              [this, ps] {
                                return std::vector<RRef<Tensor>>{
                                    rref::MakeLocalRRef<Tensor>(*ps, w_),
                                    rref::MakeLocalRRef<Tensor>(*ps, v_)};
                              })
                    .ok());
    ASSERT_TRUE(net_->agent(1)
                    .Register("forward",
                              [this](Tensor x) {
                                return autograd::add(autograd::matmul(x, w_),
                                                     v_);
                              })
                    .ok());
  }

  rpc::Agent& trainer() { return net_->agent(0); }

  std::unique_ptr<rpc::testing::InProcessNetwork> net_;
  std::vector<std::shared_ptr<DistAutogradContainer>> dist_;
  std::vector<std::shared_ptr<RRefContext>> rrefs_;
  std::vector<std::shared_ptr<DistOptimizerService>> services_;
  Tensor w_, v_;
};

// Each owner-side step equals the local functional step applied to the
// same gradients, over several iterations (so optimizer state carries).
TEST_P(DistOptimizerTest, StepsEqualTheLocalOptimizerOnTheSameGradients) {
  const FunctionalOptions options = Options(GetParam());
  auto params = trainer().rpc_sync<std::vector<RRef<Tensor>>>("ps", "params");
  ASSERT_TRUE(params.ok()) << params.status();
  auto opt = DistributedOptimizer::Create(trainer(), options, *params);
  ASSERT_TRUE(opt.ok()) << opt.status();
  EXPECT_EQ(services_[1]->num_optimizers(), 1u);

  std::vector<Tensor> ref = {autograd::Detach(w_).clone(),
                             autograd::Detach(v_).clone()};
  LocalReplay replay;
  double first_loss = 0, last_loss = 0;
  for (int it = 0; it < 4; ++it) {
    ContextScope ctx(*dist_[0]);
    Tensor x = randn({4, 3}, 80 + it, DType::kFloat64);
    auto y = trainer().rpc_sync<Tensor>("ps", "forward", x);
    ASSERT_TRUE(y.ok()) << y.status();
    Tensor loss = autograd::sum(autograd::mul(*y, *y));
    (it == 0 ? first_loss : last_loss) = loss.item();
    ASSERT_TRUE(dist_[0]->Backward(ctx.id(), {loss}).ok());
    auto grads = dist_[1]->GetGradients(ctx.id());
    ASSERT_TRUE(grads.ok());
    std::vector<Tensor> g = {grads->Get(w_).clone(), grads->Get(v_).clone()};
    ASSERT_TRUE(g[0].defined() && g[1].defined());
    Tensor before = autograd::Detach(w_).clone();
    absl::Status s = (*opt)->Step(ctx.id());
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(replay.Step(options, ref, g).ok());
    EXPECT_TRUE(w_.allclose(ref[0], 1e-12, 1e-14)) << "iteration " << it;
    EXPECT_TRUE(v_.allclose(ref[1], 1e-12, 1e-14)) << "iteration " << it;
    EXPECT_FALSE(w_.equal(before)) << "the step left w unchanged";
  }
  EXPECT_LT(last_loss, first_loss) << "training did not reduce the loss";
  opt->reset();
  EXPECT_EQ(services_[1]->num_optimizers(), 0u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(dist_[i]->NumContexts(), 0u);
}

// The step fused into the backward pass equals Backward then Step bit for
// bit, over several iterations (optimizer state carries): two copies of the
// parameters, one stepped each way, stay equal. The fused pass sends only
// the forward and the backward to the owner (no optimizer-step request).
TEST_P(DistOptimizerTest, FusedStepIsBitIdenticalToBackwardThenStep) {
  const FunctionalOptions options = Options(GetParam());
  Tensor w2 = autograd::Detach(w_).clone(), v2 = autograd::Detach(v_).clone();
  autograd::SetRequiresGrad(w2);
  autograd::SetRequiresGrad(v2);
  RRefContext* ps = rrefs_[1].get();
  ASSERT_TRUE(net_->agent(1)
                  .Register("params2",
                            [w2, v2, ps] {
                              return std::vector<RRef<Tensor>>{
                                  rref::MakeLocalRRef<Tensor>(*ps, w2),
                                  rref::MakeLocalRRef<Tensor>(*ps, v2)};
                            })
                  .ok());
  ASSERT_TRUE(net_->agent(1)
                  .Register("forward2",
                            [w2, v2](Tensor x) {
                              return autograd::add(autograd::matmul(x, w2), v2);
                            })
                  .ok());
  auto params = trainer().rpc_sync<std::vector<RRef<Tensor>>>("ps", "params");
  auto params2 =
      trainer().rpc_sync<std::vector<RRef<Tensor>>>("ps", "params2");
  ASSERT_TRUE(params.ok() && params2.ok());
  auto separate = DistributedOptimizer::Create(trainer(), options, *params);
  auto fused = DistributedOptimizer::Create(trainer(), options, *params2);
  ASSERT_TRUE(separate.ok() && fused.ok());
  // Shared: the interceptor outlives this test's body.
  auto steps = std::make_shared<std::atomic<int>>(0);
  std::atomic<int>& step_requests = *steps;
  net_->agent(1).AddInterceptor([steps](rpc::InterceptPoint point,
                                        const rpc::WorkerInfo&,
                                        rpc::Message& m) {
    if (point == rpc::InterceptPoint::kReceiveRequest &&
        m.type == kOptimStep) {
      ++*steps;
    }
    return absl::OkStatus();
  });
  for (int it = 0; it < 4; ++it) {
    Tensor x = randn({4, 3}, 180 + it, DType::kFloat64);
    Tensor before = autograd::Detach(w2).clone();
    {
      ContextScope ctx(*dist_[0]);
      auto y = trainer().rpc_sync<Tensor>("ps", "forward", x);
      ASSERT_TRUE(y.ok()) << y.status();
      ASSERT_TRUE(
          dist_[0]->Backward(ctx.id(), {autograd::sum(autograd::mul(*y, *y))})
              .ok());
      absl::Status s = (*separate)->Step(ctx.id());
      ASSERT_TRUE(s.ok()) << s;
    }
    const int separate_steps = step_requests.load();
    {
      ContextScope ctx(*dist_[0]);
      auto y = trainer().rpc_sync<Tensor>("ps", "forward2", x);
      ASSERT_TRUE(y.ok()) << y.status();
      absl::Status s = dist_[0]->Backward(
          ctx.id(), {autograd::sum(autograd::mul(*y, *y))},
          {.fused_optimizer = fused->get()});
      ASSERT_TRUE(s.ok()) << s;
    }
    EXPECT_EQ(step_requests.load(), separate_steps);
    EXPECT_TRUE(w_.equal(w2)) << "iteration " << it;
    EXPECT_TRUE(v_.equal(v2)) << "iteration " << it;
    EXPECT_FALSE(w2.equal(before)) << "the fused step left w unchanged";
  }
  EXPECT_EQ(step_requests.load(), 4);
}

// A step that fails on the owner fails the backward pass, naming the owner
// and the parameter: here a hook on v returns a gradient of the wrong shape,
// which the functional step refuses.
TEST_F(DistOptimizerTest, FailedFusedStepFailsTheBackwardNamingOwnerAndParam) {
  autograd::RegisterHook(v_, [](const Tensor&) {
    return zeros({5}, DType::kFloat64);
  });
  auto params = trainer().rpc_sync<std::vector<RRef<Tensor>>>("ps", "params");
  ASSERT_TRUE(params.ok()) << params.status();
  auto opt = DistributedOptimizer::Create(trainer(), SgdOptions{}, *params);
  ASSERT_TRUE(opt.ok()) << opt.status();
  Tensor before = autograd::Detach(v_).clone();
  ContextScope ctx(*dist_[0]);
  auto y = trainer().rpc_sync<Tensor>("ps", "forward",
                                      randn({4, 3}, 7, DType::kFloat64));
  ASSERT_TRUE(y.ok()) << y.status();
  absl::Status s = dist_[0]->Backward(ctx.id(), {autograd::sum(*y)},
                                      {.fused_optimizer = opt->get()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("worker 'ps' fused optimizer step, parameter 1 "
                             "of 2 ([2])"),
            std::string::npos)
      << s;
  EXPECT_TRUE(v_.equal(before));
}

// An owner without DistOptimizerService refuses a fused step instead of
// skipping it.
TEST(DistOptimizerFusedTest, OwnerWithoutTheServiceFailsTheFusedPass) {
  rpc::testing::InProcessNetwork net({"trainer", "ps"});
  auto d0 = DistAutogradContainer::Install(net.agent(0));
  auto d1 = DistAutogradContainer::Install(net.agent(1));
  ASSERT_TRUE(d0.ok() && d1.ok());
  Tensor w = Param({3, 2}, 5);
  ASSERT_TRUE(net.agent(1)
                  .Register("forward",
                            [w](Tensor x) { return autograd::matmul(x, w); })
                  .ok());
  struct OneStep : autograd::dist::FusedOptimizer {
    const std::vector<std::pair<int, int64_t>>& FusedSteps() const override {
      return steps;
    }
    std::vector<std::pair<int, int64_t>> steps = {{1, 1}};
  } opt;
  ContextScope ctx(**d0);
  auto y = net.agent(0).rpc_sync<Tensor>("ps", "forward",
                                         randn({4, 3}, 7, DType::kFloat64));
  ASSERT_TRUE(y.ok()) << y.status();
  absl::Status s = (*d0)->Backward(ctx.id(), {autograd::sum(*y)},
                                   {.fused_optimizer = &opt});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("worker 'ps'"), std::string::npos) << s;
}

// The after-update hook (a parameter server's applied-step counter and
// checkpoint snapshot) runs once per updated parameter, after the update,
// with the parameter mutex held, for fused and for separate steps.
TEST(DistOptimizerHookTest, AfterUpdateRunsPerParameterUnderTheMutex) {
  rpc::testing::InProcessNetwork net({"trainer", "ps"});
  auto d0 = DistAutogradContainer::Install(net.agent(0));
  auto d1 = DistAutogradContainer::Install(net.agent(1));
  auto r0 = RRefContext::Install(net.agent(0));
  auto r1 = RRefContext::Install(net.agent(1));
  ASSERT_TRUE(d0.ok() && d1.ok() && r0.ok() && r1.ok());
  Tensor w = Param({3, 2}, 5), v = Param({2}, 6);
  auto mu = std::make_shared<Mutex>();
  struct Seen {
    int w = 0, v = 0, other = 0, unlocked = 0, unchanged = 0;
  };
  auto seen = std::make_shared<Seen>();
  Tensor w_before = autograd::Detach(w).clone();
  auto s0 = DistOptimizerService::Install(
      net.agent(0), {.param_mutex = nullptr, .dist = *d0});
  auto s1 = DistOptimizerService::Install(
      net.agent(1),
      {.param_mutex = mu,
       .after_update =
           [mu, seen, w, v, &w_before](const Tensor& p) {
             // Held: another thread cannot take it.
             bool free = false;
             std::thread([&] {
               free = mu->TryLock();
               if (free) mu->Unlock();
             }).join();
             seen->unlocked += free;
             if (p.is_same(w)) {
               ++seen->w;
               seen->unchanged += w.equal(w_before);  // Already updated.
             } else if (p.is_same(v)) {
               ++seen->v;
             } else {
               ++seen->other;
             }
           },
       .dist = *d1});
  ASSERT_TRUE(s0.ok() && s1.ok());
  RRefContext* ps = r1->get();
  ASSERT_TRUE(net.agent(1)
                  .Register("params",
                            [w, v, ps] {
                              return std::vector<RRef<Tensor>>{
                                  rref::MakeLocalRRef<Tensor>(*ps, w),
                                  rref::MakeLocalRRef<Tensor>(*ps, v)};
                            })
                  .ok());
  ASSERT_TRUE(net.agent(1)
                  .Register("forward",
                            [w, v](Tensor x) {
                              return autograd::add(autograd::matmul(x, w), v);
                            })
                  .ok());
  auto params = net.agent(0).rpc_sync<std::vector<RRef<Tensor>>>("ps", "params");
  ASSERT_TRUE(params.ok()) << params.status();
  auto opt = DistributedOptimizer::Create(net.agent(0), SgdOptions{.lr = 0.1},
                                          *params);
  ASSERT_TRUE(opt.ok()) << opt.status();
  for (int fused = 0; fused < 2; ++fused) {
    w_before = autograd::Detach(w).clone();
    ContextScope ctx(**d0);
    auto y = net.agent(0).rpc_sync<Tensor>("ps", "forward",
                                           randn({4, 3}, 9, DType::kFloat64));
    ASSERT_TRUE(y.ok()) << y.status();
    if (fused == 1) {
      absl::Status s = (*d0)->Backward(ctx.id(), {autograd::sum(*y)},
                                       {.fused_optimizer = opt->get()});
      ASSERT_TRUE(s.ok()) << s;
    } else {
      ASSERT_TRUE((*d0)->Backward(ctx.id(), {autograd::sum(*y)}).ok());
      absl::Status s = (*opt)->Step(ctx.id());
      ASSERT_TRUE(s.ok()) << s;
    }
    EXPECT_EQ(seen->w, fused + 1);
    EXPECT_EQ(seen->v, fused + 1);
  }
  EXPECT_EQ(seen->other, 0);
  EXPECT_EQ(seen->unlocked, 0);
  EXPECT_EQ(seen->unchanged, 0);
}

// 0 SGD with momentum, 1 Adam, 2 AdamW, 3 Adagrad.
INSTANTIATE_TEST_SUITE_P(SgdAdamAdamWAdagrad, DistOptimizerTest,
                         ::testing::Values(0, 1, 2, 3));

// Two workers of one process create optimizers on the same owner: each gets
// its own id from the owner, so they are independent (destroying one keeps
// the other stepping).
TEST_F(DistOptimizerTest, OptimizersOfSeveralWorkersAreIndependent) {
  auto params = trainer().rpc_sync<std::vector<RRef<Tensor>>>("ps", "params");
  ASSERT_TRUE(params.ok()) << params.status();
  const std::vector<RRef<Tensor>> own = {
      rref::MakeLocalRRef<Tensor>(*rrefs_[1], w_),
      rref::MakeLocalRRef<Tensor>(*rrefs_[1], v_)};
  auto first = DistributedOptimizer::Create(trainer(), SgdOptions{}, *params);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = DistributedOptimizer::Create(net_->agent(1), SgdOptions{}, own);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(services_[1]->num_optimizers(), 2u);
  first->reset();
  EXPECT_EQ(services_[1]->num_optimizers(), 1u);
  {
    ContextScope ctx(*dist_[1]);
    Tensor y = autograd::add(
        autograd::matmul(randn({4, 3}, 90, DType::kFloat64), w_), v_);
    ASSERT_TRUE(dist_[1]->Backward(ctx.id(), {autograd::sum(y)}).ok());
    Tensor before = autograd::Detach(w_).clone();
    absl::Status s = (*second)->Step(ctx.id());
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_FALSE(w_.equal(before));
  }
  second->reset();
  EXPECT_EQ(services_[1]->num_optimizers(), 0u);
}

TEST_F(DistOptimizerTest, UnknownOptimizerKindIsRefusedNamingTheOwner) {
  auto params = trainer().rpc_sync<std::vector<RRef<Tensor>>>("ps", "params");
  ASSERT_TRUE(params.ok()) << params.status();
  rpc::Message create;
  create.type = kOptimCreate;
  create.payload = ToValue(std::make_tuple(
      std::string("lion"), std::vector<double>{1, 2, 3, 4, 5}, *params));
  Result<rpc::Message> r =
      trainer().Send("ps", create, absl::Seconds(30)).Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("worker 'ps'"), std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("'lion'"), std::string::npos);
  EXPECT_EQ(services_[1]->num_optimizers(), 0u);
  // Malformed arguments are refused naming the message, and nothing is
  // registered in the user's function registry.
  rpc::Message bad;
  bad.type = kOptimStep;
  bad.payload = Value::FromList({Value::String("x")});
  Result<rpc::Message> refused =
      trainer().Send("ps", bad, absl::Seconds(30)).Get();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
      << refused.status();
  EXPECT_NE(refused.status().message().find("OPTIM_STEP"), std::string::npos)
      << refused.status();
  EXPECT_FALSE(trainer().rpc_sync<int64_t>("ps", "ferry.optim.create").ok());
}

// Only an optimizer's creator may step or destroy it: another worker that
// names its id (ids are small integers) is refused, naming both, and the
// optimizer stays.
TEST_F(DistOptimizerTest, OnlyTheCreatorStepsOrDestroysAnOptimizer) {
  auto params = trainer().rpc_sync<std::vector<RRef<Tensor>>>("ps", "params");
  ASSERT_TRUE(params.ok()) << params.status();
  auto opt = DistributedOptimizer::Create(trainer(), SgdOptions{}, *params);
  ASSERT_TRUE(opt.ok()) << opt.status();
  ASSERT_EQ(services_[1]->num_optimizers(), 1u);
  int denied = 0;
  for (int64_t id = 0; id < 8; ++id) {
    for (rpc::MessageType type : {kOptimStep, kOptimDestroy}) {
      rpc::Message m;
      m.type = type;
      m.payload = type == kOptimStep
                      ? Value::FromList({Value::Int(id), Value::Int(0)})
                      : Value::FromList({Value::Int(id)});
      // "ps" itself asks: any worker but the trainer.
      Result<rpc::Message> r =
          net_->agent(1).Send("ps", m, absl::Seconds(30)).Get();
      if (r.status().code() != absl::StatusCode::kPermissionDenied) continue;
      ++denied;
      EXPECT_NE(r.status().message().find("belongs to worker id 0, not to "
                                          "the caller, worker id 1"),
                std::string::npos)
          << r.status();
    }
  }
  EXPECT_EQ(denied, 2);  // The one optimizer, step and destroy.
  EXPECT_EQ(services_[1]->num_optimizers(), 1u);
  opt->reset();  // Its creator destroys it.
  EXPECT_EQ(services_[1]->num_optimizers(), 0u);
}

TEST_F(DistOptimizerTest, StepWithAnUnknownContextNamesTheOwner) {
  auto params = trainer().rpc_sync<std::vector<RRef<Tensor>>>("ps", "params");
  ASSERT_TRUE(params.ok()) << params.status();
  auto opt = DistributedOptimizer::Create(trainer(), SgdOptions{}, *params);
  ASSERT_TRUE(opt.ok()) << opt.status();
  Tensor before = autograd::Detach(w_).clone();
  absl::Status s = (*opt)->Step(GlobalId(0, 12345));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("worker 'ps'"), std::string::npos) << s;
  EXPECT_TRUE(w_.equal(before));
}

// A creator found dead takes its owner-side optimizers (and their state)
// with it: the owner's service frees them on the agent's peer-failure
// report, and only them.
TEST_F(DistOptimizerTest, ADeadCreatorsOptimizersAreReleased) {
  auto params = trainer().rpc_sync<std::vector<RRef<Tensor>>>("ps", "params");
  ASSERT_TRUE(params.ok()) << params.status();
  auto a = DistributedOptimizer::Create(trainer(), Options(1), *params);
  auto b = DistributedOptimizer::Create(trainer(), Options(3), *params);
  ASSERT_TRUE(a.ok() && b.ok());
  // One the owner made for itself: not the dead worker's.
  auto own = DistributedOptimizer::Create(net_->agent(1), Options(0), *params);
  ASSERT_TRUE(own.ok()) << own.status();
  const int trainer_id = trainer().self().id;
  EXPECT_EQ(services_[1]->num_optimizers(), 3u);
  EXPECT_EQ(services_[1]->num_optimizers_of(trainer_id), 2u);
  ASSERT_TRUE(net_->Kill("trainer").ok());
  EXPECT_EQ(services_[1]->num_optimizers_of(trainer_id), 0u);
  EXPECT_EQ(services_[1]->released_of(trainer_id), 2u);
  EXPECT_EQ(services_[1]->num_optimizers(), 1u);
  // A second report (a departure after the failure) frees nothing more.
  EXPECT_EQ(services_[1]->ReleaseWorker(trainer_id), 0u);
  EXPECT_EQ(services_[1]->released_of(trainer_id), 2u);
  own->reset();
  EXPECT_EQ(services_[1]->num_optimizers(), 0u);
  // The dead trainer's handles: destroying them asks a dead worker's agent
  // to send, which fails at once (logged), and the owner has nothing left.
  const absl::Time start = absl::Now();
  a->reset();
  b->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(services_[1]->num_optimizers(), 0u);
}

}  // namespace
}  // namespace ferry::optim
