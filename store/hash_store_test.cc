#include "ferry/store/hash_store.h"

#include <memory>
#include <thread>

#include "gtest/gtest.h"
#include "ferry/store/testing/store_conformance.h"

namespace ferry {
namespace {

class HashStoreFixture : public StoreFixture {
 public:
  absl::StatusOr<std::unique_ptr<Store>> Connect() override {
    return std::make_unique<HashStore>();
  }
  int64_t BlockedCalls(Store& waiter) override {
    return static_cast<HashStore&>(waiter).BlockedCalls();
  }
};

INSTANTIATE_TEST_SUITE_P(
    HashStore, StoreConformanceTest,
    ::testing::Values(StoreConformanceParam{
        "HashStore", [] { return std::make_unique<HashStoreFixture>(); }}),
    StoreConformanceParamName);

TEST(HashStoreTest, SeparateStoresAreIndependent) {
  HashStore a;
  HashStore b;
  ASSERT_TRUE(a.Set("k", "a").ok());
  EXPECT_FALSE(b.Check({"k"}).value());
  EXPECT_NE(a.Describe(), b.Describe());
  EXPECT_EQ(a.Describe().rfind("hash:", 0), 0u) << a.Describe();
}

TEST(HashStoreTest, CloneSharesDescribeAndCopiesTimeout) {
  HashStore a;
  a.SetTimeout(absl::Seconds(7));
  auto clone = a.Clone();
  ASSERT_TRUE(clone.ok());
  EXPECT_EQ((*clone)->Describe(), a.Describe());
  EXPECT_EQ((*clone)->Timeout(), absl::Seconds(7));
}

TEST(HashStoreTest, DefaultTimeoutIsPyTorchs) {
  HashStore a;
  EXPECT_EQ(a.Timeout(), absl::Seconds(300));
}

TEST(HashStoreTest, AddOverflowIsOutOfRange) {
  HashStore a;
  ASSERT_TRUE(a.Set("n", "9223372036854775807").ok());
  EXPECT_EQ(a.Add("n", 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(a.Get("n").value(), "9223372036854775807");
}

TEST(HashStoreTest, ManyWaitersAllWake) {
  HashStore store;
  store.SetTimeout(absl::Seconds(20));
  constexpr int kWaiters = 16;
  std::vector<std::thread> waiters;
  std::atomic<int> woken{0};
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&] {
      if (store.Wait({"go"}).ok()) woken.fetch_add(1);
    });
  }
  ASSERT_TRUE(store.Set("go", "1").ok());
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(woken.load(), kWaiters);
}

}  // namespace
}  // namespace ferry
