#include "ferry/store/file_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/store/testing/store_conformance.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

// A fresh path in the test's temporary directory.
std::string NewPath(absl::string_view tag) {
  static std::atomic<int> counter{0};
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/filestore_", tag, "_",
                      getpid(), "_", counter.fetch_add(1));
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

class FileStoreFixture : public StoreFixture {
 public:
  FileStoreFixture() : path_(NewPath("conformance")) {}
  // Every handle is gone by now: the last one must have removed the file.
  ~FileStoreFixture() override {
    EXPECT_FALSE(Exists(path_)) << path_ << " was not cleaned up";
    unlink(path_.c_str());
  }
  absl::StatusOr<std::unique_ptr<Store>> Connect() override {
    absl::StatusOr<std::unique_ptr<FileStore>> store =
        FileStore::Open(path_, /*world_size=*/1);
    if (!store.ok()) return store.status();
    return std::unique_ptr<Store>(*std::move(store));
  }
  int64_t BlockedCalls(Store& waiter) override {
    return static_cast<FileStore&>(waiter).BlockedCalls();
  }

 private:
  const std::string path_;
};

INSTANTIATE_TEST_SUITE_P(
    FileStore, StoreConformanceTest,
    ::testing::Values(StoreConformanceParam{
        "FileStore", [] { return std::make_unique<FileStoreFixture>(); }}),
    StoreConformanceParamName);

TEST(FileStoreTest, DescribeIsFileUrl) {
  const std::string path = NewPath("describe");
  auto store = FileStore::Open(path, 1);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Describe(), "file://" + path);
}

TEST(FileStoreTest, TwoHandlesInOneProcessShareData) {
  const std::string path = NewPath("two");
  auto a = FileStore::Open(path, 2);
  auto b = FileStore::Open(path, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Set("k", "v").ok());
  EXPECT_EQ((*b)->Get("k").value_or(""), "v");
  EXPECT_EQ((*b)->Add("n", 2).value_or(0), 2);
  EXPECT_EQ((*a)->Add("n", 3).value_or(0), 5);
}

TEST(FileStoreTest, FileStaysUntilWorldSizeHaveJoinedAndLeft) {
  const std::string path = NewPath("world");
  {
    auto first = FileStore::Open(path, 2);
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE((*first)->Set("from-first", "1").ok());
  }
  // Only one of two has joined: the rendezvous survives its leaving.
  ASSERT_TRUE(Exists(path));
  {
    auto second = FileStore::Open(path, 2);
    ASSERT_TRUE(second.ok()) << second.status();
    (*second)->SetTimeout(absl::Seconds(5));
    EXPECT_EQ((*second)->Get("from-first").value_or(""), "1");
  }
  EXPECT_FALSE(Exists(path));
  // A new generation starts empty.
  auto third = FileStore::Open(path, 1);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE((*third)->Check({"from-first"}).value_or(true));
}

TEST(FileStoreTest, ClonesKeepTheFileAlive) {
  const std::string path = NewPath("clone");
  auto store = FileStore::Open(path, 1);
  ASSERT_TRUE(store.ok()) << store.status();
  auto clone = (*store)->Clone();
  ASSERT_TRUE(clone.ok()) << clone.status();
  store->reset();
  EXPECT_TRUE(Exists(path));
  ASSERT_TRUE((*clone)->Set("still", "here").ok());
  clone->reset();
  EXPECT_FALSE(Exists(path));
}

TEST(FileStoreTest, NotAStoreFileIsDataLoss) {
  const std::string path = NewPath("garbage");
  std::ofstream(path) << "this is not a store log";
  auto store = FileStore::Open(path, 1);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss)
      << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(path));
  unlink(path.c_str());
}

TEST(FileStoreTest, TruncatedRecordIsDataLoss) {
  const std::string path = NewPath("truncated");
  {
    std::ofstream out(path, std::ios::binary);
    out << "FERRYFS1";
    out.write(
        "\x01\x05\x00\x00\x00"
        "ab",
        7);  // a set whose key is cut short
  }
  auto store = FileStore::Open(path, 1);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss)
      << store.status();
  unlink(path.c_str());
}

TEST(FileStoreTest, HugeLengthPrefixIsDataLossNotACrash) {
  const std::string path = NewPath("huge");
  {
    std::ofstream out(path, std::ios::binary);
    out << "FERRYFS1";
    out.write("\x01\xff\xff\xff\xff", 5);
  }
  auto store = FileStore::Open(path, 1);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss)
      << store.status();
  unlink(path.c_str());
}

// Arbitrary bytes after the header: Open either replays them or reports
// DataLoss; it never crashes or reads out of bounds.
TEST(FileStoreTest, RandomLogsNeverCrash) {
  std::mt19937 rng(12345);
  for (int iter = 0; iter < 300; ++iter) {
    const std::string path = NewPath("random");
    std::string bytes = "FERRYFS1";
    const int n = std::uniform_int_distribution<int>(0, 64)(rng);
    for (int i = 0; i < n; ++i) {
      // Mostly small values so that lengths are often in range.
      const int b = std::uniform_int_distribution<int>(0, 15)(rng) == 0
                        ? std::uniform_int_distribution<int>(0, 255)(rng)
                        : std::uniform_int_distribution<int>(0, 9)(rng);
      bytes.push_back(static_cast<char>(b));
    }
    {
      std::ofstream out(path, std::ios::binary);
      out.write(bytes.data(), bytes.size());
    }
    auto store = FileStore::Open(path, 0);
    if (!store.ok()) {
      EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss)
          << store.status();
    } else {
      EXPECT_TRUE((*store)->NumKeys().ok());
    }
    store = absl::InternalError("closed");
    unlink(path.c_str());
  }
}

TEST(FileStoreTest, OpenInMissingDirectoryFails) {
  auto store = FileStore::Open("/nonexistent-dir-ferry/x/store", 1);
  EXPECT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr("/nonexistent-dir-ferry/x/store"));
  EXPECT_EQ(FileStore::Open("", 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Real processes rendezvous through one file: atomic adds, a queue, a
// cross-process blocking Get, and cleanup by the last to leave.
TEST(FileStoreTest, WorksAcrossProcesses) {
  constexpr int kChildren = 4;
  constexpr int kAdds = 50;
  const std::string path = NewPath("procs");
  auto store = FileStore::Open(path, kChildren + 1);
  ASSERT_TRUE(store.ok()) << store.status();
  (*store)->SetTimeout(absl::Seconds(30));
  std::vector<std::unique_ptr<testutil::Subprocess>> children;
  for (int i = 0; i < kChildren; ++i) {
    auto child = testutil::Subprocess::Spawn(
        {testutil::RunfilePath("store/file_store_helper"), path,
         absl::StrCat(kChildren + 1), absl::StrCat(i), absl::StrCat(kAdds)});
    ASSERT_TRUE(child.ok()) << child.status();
    children.push_back(*std::move(child));
  }
  ASSERT_EQ(children.size(), kChildren);
  std::vector<int> arrived;
  for (int i = 0; i < kChildren; ++i) {
    absl::StatusOr<std::string> id = (*store)->QueuePop("arrived", true);
    EXPECT_TRUE(id.ok()) << id.status();
    if (id.ok()) arrived.push_back(std::stoi(*id));
  }
  std::sort(arrived.begin(), arrived.end());
  EXPECT_THAT(arrived, ::testing::ElementsAre(0, 1, 2, 3));
  EXPECT_EQ((*store)->Get("counter").value_or(""),
            absl::StrCat(kChildren * kAdds));
  // The children are blocked in Get("go"); release them.
  EXPECT_TRUE((*store)->Set("go", "1").ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (auto& child : children) {
    absl::StatusOr<int> code = child->Wait(deadline);
    EXPECT_EQ(code.value_or(-1), 0) << code.status();
  }
  EXPECT_EQ((*store)->Get("finished").value_or(""), absl::StrCat(kChildren));
  EXPECT_TRUE(Exists(path));
  store->reset();  // the last user leaves
  EXPECT_FALSE(Exists(path));
}

}  // namespace
}  // namespace ferry
