#include "ferry/tests/rref/counter.h"

#include <unistd.h>

#include "ferry/common/status.h"

namespace ferry::testutil {

using rref::RRef;
using rref::RRefContext;


absl::Status InstallRRefTestLayer(rpc::Agent& agent,
                                  std::shared_ptr<RRefContext>* out) {
  ASSIGN_OR_RETURN(std::shared_ptr<RRefContext> ctx,
                   RRefContext::Install(agent));
  ctx->classes()
      .RegisterClass<Counter>("Counter")
      .Constructor<int64_t>()
      .Method("add", &Counter::Add)
      .Method("get", &Counter::Get);
  RETURN_IF_ERROR(
      agent.Register("add", [](int64_t x, int64_t y) { return x + y; }));
  RETURN_IF_ERROR(
      agent.Register("pid", [] { return static_cast<int64_t>(getpid()); }));
  RETURN_IF_ERROR(agent.Register(
      "counter_add", [](RRef<Counter> c, int64_t x) -> absl::StatusOr<int64_t> {
        return c.rpc_sync(absl::Seconds(30)).call<int64_t>("add", x);
      }));
  RETURN_IF_ERROR(agent.Register(
      "fetch", [](RRef<int64_t> r) -> absl::StatusOr<int64_t> {
        return r.to_here(absl::Seconds(30));
      }));
  *out = std::move(ctx);
  return absl::OkStatus();
}

}  // namespace ferry::testutil
