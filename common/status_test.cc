#include "ferry/common/status.h"

#include <string>

#include "gtest/gtest.h"

namespace ferry {
namespace {

absl::Status FailIfNegative(int x) {
  if (x < 0) return absl::InvalidArgumentError("negative");
  return absl::OkStatus();
}

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status Chain(int x, int* out) {
  RETURN_IF_ERROR(FailIfNegative(x));
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(*out, Half(h));
  return absl::OkStatus();
}

TEST(StatusMacros, PropagateFirstError) {
  int out = -1;
  EXPECT_EQ(Chain(-4, &out).message(), "negative");
  EXPECT_EQ(Chain(6, &out).message(), "odd");  // 6 -> 3 is odd.
  EXPECT_EQ(out, -1);
  ASSERT_TRUE(Chain(8, &out).ok());
  EXPECT_EQ(out, 2);
}

absl::StatusOr<std::string> MoveOnlyPath(bool ok) {
  absl::StatusOr<std::unique_ptr<std::string>> p =
      ok ? absl::StatusOr<std::unique_ptr<std::string>>(
               std::make_unique<std::string>("v"))
         : absl::NotFoundError("k");
  ASSIGN_OR_RETURN(auto ptr, std::move(p));
  return *ptr;
}

TEST(StatusMacros, AssignOrReturnMovesValues) {
  EXPECT_EQ(*MoveOnlyPath(true), "v");
  EXPECT_EQ(MoveOnlyPath(false).status().code(), absl::StatusCode::kNotFound);
}

TEST(Annotate, PrependsContextKeepsCode) {
  absl::Status s =
      Annotate(absl::NotFoundError("key 'a'"), "store 127.0.0.1:1");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "store 127.0.0.1:1: key 'a'");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

}  // namespace
}  // namespace ferry
