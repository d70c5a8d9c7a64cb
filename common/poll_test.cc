#include "ferry/common/poll.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(PollUntil, TrueOnceAnotherThreadMakesItTrue) {
  std::atomic<bool> set{false};
  std::thread t([&] { set = true; });
  EXPECT_TRUE(PollUntil([&] { return set.load(); }, absl::Seconds(30)));
  t.join();
}

TEST(PollUntil, FalseAfterTheLimit) {
  int checks = 0;
  const absl::Time start = absl::Now();
  EXPECT_FALSE(PollUntil(
      [&] {
        ++checks;
        return false;
      },
      absl::Milliseconds(20)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
  EXPECT_GE(checks, 2);
}

}  // namespace
}  // namespace ferry
