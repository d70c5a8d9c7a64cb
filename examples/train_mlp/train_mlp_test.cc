#include "ferry/examples/train_mlp/train_mlp.h"

#include <sstream>

#include "gtest/gtest.h"

namespace ferry::examples {
namespace {

TEST(TrainMlpTest, ReachesStatedAccuracyInBoundedSteps) {
  MlpConfig c;
  c.steps = 200;
  c.log_every = 50;
  std::ostringstream log;
  absl::StatusOr<MlpResult> r = TrainMlp(c, &log);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(r->test_accuracy, 0.95) << log.str();
  EXPECT_LT(r->final_loss, 0.5) << log.str();
  EXPECT_NE(log.str().find("step 200 loss"), std::string::npos) << log.str();
  EXPECT_GT(r->samples_per_second, 0);
}

TEST(TrainMlpTest, SameSeedSameRun) {
  MlpConfig c;
  c.steps = 20;
  c.log_every = 0;
  absl::StatusOr<MlpResult> a = TrainMlp(c, nullptr), b = TrainMlp(c, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->final_loss, b->final_loss);
  EXPECT_EQ(a->test_accuracy, b->test_accuracy);
}

}  // namespace
}  // namespace ferry::examples
