#include "ferry/store/prefix_store.h"

#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/store/hash_store.h"
#include "ferry/store/testing/store_conformance.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

class PrefixStoreFixture : public StoreFixture {
 public:
  absl::StatusOr<std::unique_ptr<Store>> Connect() override {
    // Another namespace's keys share the underlying store; the suite only
    // counts NumKeys deltas, so they must not disturb it.
    base_ = std::make_shared<HashStore>();
    if (!base_->Set("other/unrelated", "x").ok()) {
      return absl::InternalError("setup failed");
    }
    return std::make_unique<PrefixStore>("pg0", base_);
  }
  // Every handle's calls end up on base_ (clones share its state).
  int64_t BlockedCalls(Store&) override { return base_->BlockedCalls(); }

 private:
  std::shared_ptr<HashStore> base_;
};

INSTANTIATE_TEST_SUITE_P(PrefixStore, StoreConformanceTest,
                         ::testing::Values(StoreConformanceParam{
                             "PrefixStoreOverHashStore",
                             [] {
                               return std::make_unique<PrefixStoreFixture>();
                             }}),
                         StoreConformanceParamName);

TEST(PrefixStoreTest, KeysAreNamespaced) {
  auto base = std::make_shared<HashStore>();
  PrefixStore a("a", base);
  PrefixStore b("b", base);
  ASSERT_TRUE(a.Set("k", "from-a").ok());
  ASSERT_TRUE(b.Set("k", "from-b").ok());
  EXPECT_EQ(base->Get("a/k").value(), "from-a");
  EXPECT_EQ(base->Get("b/k").value(), "from-b");
  EXPECT_EQ(a.Get("k").value(), "from-a");
  ASSERT_TRUE(a.QueuePush("q", "x").ok());
  EXPECT_EQ(base->QueueLen("a/q").value(), 1);
  EXPECT_EQ(b.QueueLen("q").value(), 0);
  // NumKeys is the underlying store's count, as in PyTorch.
  EXPECT_EQ(a.NumKeys().value(), 2);
  EXPECT_EQ(a.Add("n", 2).value(), 2);
  EXPECT_EQ(base->Get("a/n").value(), "2");
}

TEST(PrefixStoreTest, NestedPrefixes) {
  auto base = std::make_shared<HashStore>();
  auto outer = std::make_shared<PrefixStore>("job", base);
  PrefixStore inner("pg1", outer);
  ASSERT_TRUE(inner.Set("k", "v").ok());
  EXPECT_EQ(base->Get("job/pg1/k").value(), "v");
  EXPECT_EQ(inner.Describe(),
            "prefix 'pg1/' of prefix 'job/' of " + base->Describe());
}

TEST(PrefixStoreTest, TimeoutIsPerHandleAndNamesPrefixedKey) {
  auto base = std::make_shared<HashStore>();
  base->SetTimeout(absl::Seconds(60));
  PrefixStore store("pg", base);
  EXPECT_EQ(store.Timeout(), absl::Seconds(60));
  store.SetTimeout(absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  absl::Status status = store.Get("missing").status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(status.message()), HasSubstr("pg/missing"));
  EXPECT_EQ(base->Timeout(), absl::Seconds(60));  // not changed
}

TEST(PrefixStoreTest, CloneKeepsPrefix) {
  auto base = std::make_shared<HashStore>();
  PrefixStore store("p", base);
  auto clone = store.Clone();
  ASSERT_TRUE(clone.ok());
  ASSERT_TRUE((*clone)->Set("k", "v").ok());
  EXPECT_EQ(base->Get("p/k").value(), "v");
  EXPECT_EQ((*clone)->Describe(), store.Describe());
}

}  // namespace
}  // namespace ferry
