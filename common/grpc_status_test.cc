#include "ferry/common/grpc_status.h"

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(GrpcStatus, EveryCanonicalCodeRoundTrips) {
  for (int c = 0; c <= 16; ++c) {
    absl::Status s(static_cast<absl::StatusCode>(c), c == 0 ? "" : "msg é\n");
    grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    absl::Status back = FromGrpcStatus(g);
    EXPECT_EQ(back, s) << c;
  }
}

TEST(GrpcStatus, OutOfRangeCodeBecomesUnknown) {
  // 20 is inside the enum's value range (so constructing it is defined) but
  // is no canonical code.
  grpc::Status g(static_cast<grpc::StatusCode>(20), "weird");
  absl::Status s = FromGrpcStatus(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(s.message(), "weird");
}

}  // namespace
}  // namespace ferry
