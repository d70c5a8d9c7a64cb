// A 1 GiB tensor argument crosses the agent (issue: no 4 MiB ceiling), as
// one unary message and streamed (rpc/grpc/stream.h).
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "rpc/grpc/agent.h"
#include "store/hash_store.h"
#include "tensor/tensor.h"

namespace ferry::rpc {
namespace {

class GrpcAgentLarge : public ::testing::TestWithParam<bool> {};

TEST_P(GrpcAgentLarge, OneGibTensorArgument) {
  const bool streamed = GetParam();
  GrpcAgentOptions options;
  options.stream.enabled = streamed;
  auto registry = std::make_shared<FunctionRegistry>();
  ASSERT_TRUE(registry
                  ->Register("probe",
                             [](Tensor t) {
                               // Size, and a few elements from both ends.
                               const uint8_t* p = t.data<uint8_t>();
                               return std::vector<int64_t>{t.numel(), p[0],
                                                           p[t.numel() / 2],
                                                           p[t.numel() - 1]};
                             })
                  .ok());
  auto store = std::make_shared<HashStore>();
  std::vector<absl::StatusOr<std::unique_ptr<GrpcAgent>>> agents(2);
  std::vector<std::thread> ts;
  for (int i = 0; i < 2; ++i) {
    ts.emplace_back([&, i] {
      agents[i] = GrpcAgent::Start(i == 0 ? "sender" : "receiver", i, 2, store,
                                   options, registry);
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_TRUE(agents[0].ok()) << agents[0].status();
  ASSERT_TRUE(agents[1].ok()) << agents[1].status();

  constexpr int64_t kBytes = int64_t{1} << 30;
  Tensor big = empty({kBytes}, DType::kUInt8);
  uint8_t* p = big.data<uint8_t>();
  p[0] = 11;
  p[kBytes / 2] = 22;
  p[kBytes - 1] = 33;
  // 1 GiB each way through loopback on a loaded 2-core machine can take
  // longer than the default 60 s call timeout; the test is about size limits.
  auto r = (*agents[0])
               ->rpc_sync_for<std::vector<int64_t>>(absl::Minutes(5),
                                                    "receiver", "probe", big);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::vector<int64_t>{kBytes, 11, 22, 33}));
  // The path taken: streamed, every byte copied once into the receiver's
  // buffer, never more than two pieces held besides it.
  const StreamStats& in = (*agents[1])->stream_stats();
  EXPECT_EQ(in.requests_received.load(), streamed ? 1u : 0u);
  if (streamed) {
    EXPECT_GE(in.bytes_received.load(), uint64_t{kBytes});
    EXPECT_LT(in.bytes_received.load(), uint64_t{kBytes} + 4096);
    EXPECT_LE(in.max_piece_bytes.load(), 2 * options.stream.piece_bytes);
  }

  std::thread down([&] { EXPECT_TRUE((*agents[1])->Shutdown().ok()); });
  EXPECT_TRUE((*agents[0])->Shutdown().ok());
  down.join();
}

INSTANTIATE_TEST_SUITE_P(Paths, GrpcAgentLarge, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Streamed" : "Unary";
                         });

}  // namespace
}  // namespace ferry::rpc
