// The corpus replay driver behind every *_fuzz_corpus_test: it must feed
// each file to the target (plus the empty input), and a target that crashes
// must fail the run.
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

std::string Corpus(const std::string& name, const std::string& bytes) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::pair<int, std::string> Replay(std::vector<std::string> files) {
  files.insert(files.begin(),
               testutil::RunfilePath("tools/fuzz/crash_on_marker_replay"));
  return testutil::RunCommand(std::move(files), {}, absl::Seconds(30));
}

TEST(CorpusMain, FeedsEveryFileAndTheEmptyInput) {
  auto [code, out] = Replay({Corpus("a", "abc"), Corpus("b", "hello")});
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "input 0 bytes")) << out;
  EXPECT_TRUE(absl::StrContains(out, "input 3 bytes")) << out;
  EXPECT_TRUE(absl::StrContains(out, "input 5 bytes")) << out;
  EXPECT_TRUE(absl::StrContains(out, "replayed 2 corpus inputs")) << out;
}

TEST(CorpusMain, ACrashingInputFailsTheRun) {
  auto [code, out] = Replay({Corpus("ok", "abc"), Corpus("bad", "crash")});
  EXPECT_NE(code, 0) << out;
  EXPECT_FALSE(absl::StrContains(out, "replayed")) << out;
}

TEST(CorpusMain, AMissingFileFailsTheRun) {
  auto [code, out] = Replay({"/nonexistent/corpus"});
  EXPECT_EQ(code, 1) << out;
  EXPECT_TRUE(absl::StrContains(out, "cannot read corpus file")) << out;
}

}  // namespace
}  // namespace ferry
