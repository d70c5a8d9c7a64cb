#include "ferry/common/logging.h"

#include <string>
#include <thread>
#include <vector>

#include "ferry/common/sync.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

Mutex g_mu;
std::vector<std::string>* g_lines ABSL_GUARDED_BY(g_mu) = nullptr;

void Capture(absl::string_view line) {
  MutexLock lock(&g_mu);
  g_lines->emplace_back(line);
}

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    {
      MutexLock lock(&g_mu);
      g_lines = &lines_;
    }
    saved_ = GetLogLevel();
    SetLogSinkForTest(&Capture);
  }
  void TearDown() override {
    SetLogSinkForTest(nullptr);
    SetLogLevel(saved_);
    SetDefaultLogLabel("");
    MutexLock lock(&g_mu);
    g_lines = nullptr;
  }
  std::vector<std::string> Lines() {
    MutexLock lock(&g_mu);
    return lines_;
  }

  std::vector<std::string> lines_;
  LogLevel saved_;
};

TEST(ParseLogLevel, NamesNumbersAndFallback) {
  EXPECT_EQ(ParseLogLevel("DEBUG", LogLevel::kOff), LogLevel::kDebug);
  EXPECT_EQ(ParseLogLevel(" info ", LogLevel::kOff), LogLevel::kInfo);
  EXPECT_EQ(ParseLogLevel("warn", LogLevel::kOff), LogLevel::kWarning);
  EXPECT_EQ(ParseLogLevel("3", LogLevel::kOff), LogLevel::kError);
  EXPECT_EQ(ParseLogLevel("off", LogLevel::kDebug), LogLevel::kOff);
  EXPECT_EQ(ParseLogLevel("loud", LogLevel::kInfo), LogLevel::kInfo);
  EXPECT_EQ(ParseLogLevel("9", LogLevel::kInfo), LogLevel::kInfo);
}

TEST_F(LoggingTest, FormatHasLevelLabelAndLocation) {
  SetLogLevel(LogLevel::kInfo);
  {
    ScopedLogLabel label("trainer:2");
    FERRY_LOG(INFO) << "hello " << 42;
  }
  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0][0], 'I');
  EXPECT_NE(lines[0].find(" trainer:2 logging_test.cc:"), std::string::npos)
      << lines[0];
  EXPECT_NE(lines[0].find("] hello 42\n"), std::string::npos) << lines[0];
}

TEST_F(LoggingTest, DisabledStatementsDoNotEvaluateOperands) {
  SetLogLevel(LogLevel::kError);
  int evaluated = 0;
  auto touch = [&] { return ++evaluated; };
  FERRY_LOG(INFO) << touch();
  FERRY_LOG(WARNING) << touch();
  EXPECT_EQ(evaluated, 0);
  FERRY_LOG(ERROR) << touch();
  EXPECT_EQ(evaluated, 1);
  EXPECT_EQ(Lines().size(), 1u);
}

TEST_F(LoggingTest, LabelsArePerThreadAndNest) {
  SetLogLevel(LogLevel::kDebug);
  SetDefaultLogLabel("proc");
  EXPECT_EQ(ScopedLogLabel::Current(), "proc");
  std::thread t([] {
    ScopedLogLabel outer("w0:0");
    {
      ScopedLogLabel inner("w0:0/rpc");
      EXPECT_EQ(ScopedLogLabel::Current(), "w0:0/rpc");
    }
    EXPECT_EQ(ScopedLogLabel::Current(), "w0:0");
  });
  ScopedLogLabel mine("w1:1");
  EXPECT_EQ(ScopedLogLabel::Current(), "w1:1");
  t.join();
  EXPECT_EQ(ScopedLogLabel::Current(), "w1:1");
}

TEST_F(LoggingTest, ConcurrentLinesStayWhole) {
  SetLogLevel(LogLevel::kInfo);
  constexpr int kThreads = 4, kPerThread = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kPerThread; ++i)
        FERRY_LOG(INFO) << "t" << t << " i" << i;
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), static_cast<size_t>(kThreads * kPerThread));
  for (const std::string& l : lines) {
    EXPECT_EQ(l.find('\n'), l.size() - 1);
  }
}

}  // namespace
}  // namespace ferry
