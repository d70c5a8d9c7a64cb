// Distributed autograd through the RRef layer: remote() arguments, to_here()
// fetches and a remote object's method are recorded like calls, because
// they are Messages through the same interceptors.
#include <memory>

#include "autograd/dist/dist_autograd.h"
#include "autograd/engine.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "rpc/testing/in_process.h"
#include "rref/rref.h"

namespace ferry::autograd::dist {
namespace {

using rref::RRef;
using rref::RRefContext;

constexpr absl::Duration kWait = absl::Seconds(20);

Tensor Param(const std::vector<int64_t>& sizes, uint64_t seed) {
  Tensor t = randn(sizes, seed, DType::kFloat64);
  SetRequiresGrad(t);
  return t;
}

Tensor Copy(const Tensor& t) {
  Tensor c = Detach(t).clone();
  SetRequiresGrad(c);
  return c;
}

// A remote object holding its own parameter.
class Net {
 public:
  explicit Net(int64_t seed) : w_(Param({3, 2}, seed)) {}
  Tensor Forward(Tensor x) { return tanh(matmul(x, w_)); }
  const Tensor& weight() const { return w_; }

 private:
  Tensor w_;
};

TEST(DistAutogradRRef, ToHereAndRemoteMethodGradientsEqualSingleProcess) {
  rpc::testing::InProcessNetwork net({"a", "b"});
  std::shared_ptr<DistAutogradContainer> dist[2];
  std::shared_ptr<RRefContext> rrefs[2];
  for (int i = 0; i < 2; ++i) {
    auto d = DistAutogradContainer::Install(net.agent(i));
    ASSERT_TRUE(d.ok()) << d.status();
    dist[i] = *d;
    auto r = RRefContext::Create(&net.agent(i));
    ASSERT_TRUE(r.ok()) << r.status();
    rrefs[i] = *r;
    rrefs[i]->classes().RegisterClass<Net>("Net").Constructor<int64_t>().Method(
        "forward", &Net::Forward);
  }
  Tensor wv = Param({2, 3}, 61);
  ASSERT_TRUE(
      net.agent(1).Register("make", [&](Tensor x) { return mul(x, wv); }).ok());
  Tensor x = Param({2, 3}, 62);

  // The same model in one process.
  Tensor rx = Copy(x), rwv = Copy(wv), rw = Copy(Net(63).weight());
  ASSERT_TRUE(Backward({sum(tanh(matmul(mul(rx, rwv), rw)))}).ok());

  {
    ContextScope ctx(*dist[0]);
    RRef<Tensor> made = rref::remote<Tensor>(*rrefs[0], "b", "make", x);
    absl::StatusOr<Tensor> t = made.to_here(kWait);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(RequiresGrad(*t));
    RRef<Net> model = rref::remote<Net>(*rrefs[0], "b", "Net", int64_t{63});
    absl::StatusOr<Tensor> y =
        model.rpc_sync(kWait).call<Tensor>("forward", *t);
    ASSERT_TRUE(y.ok()) << y.status();
    absl::Status s = dist[0]->Backward(ctx.id(), {sum(*y)});
    ASSERT_TRUE(s.ok()) << s;

    GradientMap ga = *dist[0]->GetGradients(ctx.id());
    Tensor gx = ga.Get(x);
    ASSERT_TRUE(gx.defined());
    EXPECT_TRUE(gx.allclose(GradOf(rx), 1e-9, 1e-12));
    GradientMap gb = *dist[1]->GetGradients(ctx.id());
    Tensor gwv = gb.Get(wv);
    ASSERT_TRUE(gwv.defined());
    EXPECT_TRUE(gwv.allclose(GradOf(rwv), 1e-9, 1e-12));
    // b's other leaf is the Net's weight.
    ASSERT_EQ(gb.size(), 2u);
    bool found = false;
    for (const auto& [leaf, grad] : gb.entries()) {
      if (leaf.sizes() == std::vector<int64_t>{3, 2}) {
        found = true;
        EXPECT_TRUE(grad.allclose(GradOf(rw), 1e-9, 1e-12));
      }
    }
    EXPECT_TRUE(found) << "no gradient for the remote Net's weight";
  }
  for (int i = 0; i < 2; ++i) EXPECT_EQ(dist[i]->NumContexts(), 0u) << i;
}

}  // namespace
}  // namespace ferry::autograd::dist
