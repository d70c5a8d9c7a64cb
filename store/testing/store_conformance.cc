#include "ferry/store/testing/store_conformance.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ferry/common/sync.h"
#include "gmock/gmock.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// For operations expected to succeed: long enough never to fire, even under
// sanitizers, yet a hang fails the test instead of the whole binary.
constexpr absl::Duration kLong = absl::Seconds(20);
// For operations expected to time out.
constexpr absl::Duration kShort = absl::Milliseconds(100);
// A blocked call must not return much later than its timeout.
constexpr absl::Duration kLateness = absl::Seconds(10);

absl::Status ToStatus(const absl::Status& status) { return status; }
template <typename T>
absl::Status ToStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// Evaluate `expr` once.
#define ASSERT_OK(expr)                          \
  do {                                           \
    const absl::Status status_ = ToStatus(expr); \
    ASSERT_TRUE(status_.ok()) << status_;        \
  } while (0)
#define EXPECT_OK(expr)                          \
  do {                                           \
    const absl::Status status_ = ToStatus(expr); \
    EXPECT_TRUE(status_.ok()) << status_;        \
  } while (0)

// Checks a timeout error's code and content.
void ExpectTimeout(const absl::Status& status, const Store& store,
                   const std::vector<std::string>& missing) {
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  for (const std::string& key : missing) {
    EXPECT_THAT(std::string(status.message()), HasSubstr(key));
  }
  EXPECT_THAT(std::string(status.message()), HasSubstr(store.Describe()));
  EXPECT_THAT(std::string(status.message()), HasSubstr("waited"));
}

}  // namespace

void StoreConformanceTest::SetUp() {
  fixture_ = GetParam().make_fixture();
  ASSERT_NE(fixture_, nullptr);
  absl::StatusOr<std::unique_ptr<Store>> store = fixture_->Connect();
  ASSERT_TRUE(store.ok()) << store.status();
  store_ = *std::move(store);
  store_->SetTimeout(kLong);
}

void StoreConformanceTest::TearDown() {
  store_.reset();
  fixture_.reset();
}

std::unique_ptr<Store> StoreConformanceTest::NewHandle() {
  absl::StatusOr<std::unique_ptr<Store>> clone = store_->Clone();
  EXPECT_TRUE(clone.ok()) << clone.status();
  if (!clone.ok()) return nullptr;
  (*clone)->SetTimeout(kLong);
  return *std::move(clone);
}

void StoreConformanceTest::AwaitBlocked(Store& waiter, int64_t n) {
  const absl::Time deadline = absl::Now() + kLong;
  while (fixture_->BlockedCalls(waiter) < n) {
    if (absl::Now() >= deadline) {
      // Not fatal: the caller goes on to wake (and join) its waiter.
      ADD_FAILURE() << "no call on " << waiter.Describe() << " blocked";
      return;
    }
    std::this_thread::yield();
  }
}

namespace {

TEST_P(StoreConformanceTest, SetThenGet) {
  ASSERT_OK(store_->Set("k", "v1"));
  EXPECT_EQ(store_->Get("k").value_or("<error>"), "v1");
  ASSERT_OK(store_->Set("k", "v2"));  // overwrite
  EXPECT_EQ(store_->Get("k").value_or("<error>"), "v2");
  ASSERT_OK(store_->Set("empty", ""));
  EXPECT_EQ(store_->Get("empty").value_or("<error>"), "");
}

TEST_P(StoreConformanceTest, BinaryValuesAndUnusualKeys) {
  const std::string binary("a\0b\xff\n\x01", 6);
  ASSERT_OK(store_->Set("bin", binary));
  EXPECT_EQ(store_->Get("bin").value_or("<error>"), binary);
  const std::string big(64 * 1024, 'x');
  ASSERT_OK(store_->Set("big", big));
  EXPECT_EQ(store_->Get("big").value_or("<error>"), big);
  for (const std::string key : {"a/b/c", "with space", "ключ", "x=y&z"}) {
    ASSERT_OK(store_->Set(key, key + "!"));
    EXPECT_EQ(store_->Get(key).value_or("<error>"), key + "!") << key;
  }
}

TEST_P(StoreConformanceTest, GetIsWokenBySetFromAnotherThread) {
  std::unique_ptr<Store> other = NewHandle();
  ASSERT_NE(other, nullptr);
  absl::StatusOr<std::string> got;
  std::thread waiter([&] { got = store_->Get("late"); });
  AwaitBlocked(*store_);
  EXPECT_OK(other->Set("late", "here"));
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "here");
}

TEST_P(StoreConformanceTest, GetTimesOutNamingKeyStoreAndTime) {
  store_->SetTimeout(kShort);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got = store_->Get("never-set-key");
  const absl::Duration elapsed = absl::Now() - start;
  ExpectTimeout(got.status(), *store_, {"never-set-key"});
  EXPECT_GE(elapsed, kShort * 0.9);
  EXPECT_LT(elapsed, kShort + kLateness);
}

TEST_P(StoreConformanceTest, WaitSucceedsForExistingKeys) {
  ASSERT_OK(store_->Set("a", "1"));
  ASSERT_OK(store_->Set("b", "2"));
  EXPECT_OK(store_->Wait({"a", "b"}));
  EXPECT_OK(store_->Wait({"a"}, kShort));
}

TEST_P(StoreConformanceTest, WaitTimeoutNamesOnlyMissingKeys) {
  ASSERT_OK(store_->Set("present-key-q7", "1"));
  const absl::Time start = absl::Now();
  absl::Status status =
      store_->Wait({"present-key-q7", "absent-one", "absent-two"}, kShort);
  const absl::Duration elapsed = absl::Now() - start;
  ExpectTimeout(status, *store_, {"absent-one", "absent-two"});
  EXPECT_THAT(std::string(status.message()), Not(HasSubstr("present-key-q7")));
  EXPECT_GE(elapsed, kShort * 0.9);
  EXPECT_LT(elapsed, kShort + kLateness);
}

TEST_P(StoreConformanceTest, WaitExplicitTimeoutOverridesDefault) {
  store_->SetTimeout(absl::Seconds(60));
  const absl::Time start = absl::Now();
  absl::Status status = store_->Wait({"absent"}, absl::Milliseconds(50));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_LT(absl::Now() - start, kLateness);
}

TEST_P(StoreConformanceTest, WaitIsWokenByEveryKindOfWrite) {
  std::unique_ptr<Store> other = NewHandle();
  ASSERT_NE(other, nullptr);
  absl::Status status;
  std::thread waiter([&] {
    status = store_->Wait(
        {"by-set", "by-add", "by-cas", "by-append", "by-multiset"});
  });
  AwaitBlocked(*store_);
  EXPECT_OK(other->Set("by-set", "x"));
  EXPECT_OK(other->Add("by-add", 1).status());
  EXPECT_OK(other->CompareSet("by-cas", "", "x").status());
  EXPECT_OK(other->Append("by-append", "x"));
  EXPECT_OK(other->MultiSet({"by-multiset"}, {"x"}));
  waiter.join();
  EXPECT_OK(status);
}

TEST_P(StoreConformanceTest, WaitIsWokenByAdd) {
  std::unique_ptr<Store> other = NewHandle();
  ASSERT_NE(other, nullptr);
  absl::StatusOr<std::string> got;
  std::thread waiter([&] { got = store_->Get("counter"); });
  AwaitBlocked(*store_);
  EXPECT_OK(other->Add("counter", 7).status());
  waiter.join();
  EXPECT_EQ(got.value_or("<error>"), "7");
}

TEST_P(StoreConformanceTest, AddKeepsDecimalText) {
  EXPECT_EQ(store_->Add("n", 5).value_or(-1), 5);
  EXPECT_EQ(store_->Add("n", -2).value_or(-1), 3);
  EXPECT_EQ(store_->Add("n", 0).value_or(-1), 3);
  EXPECT_EQ(store_->Get("n").value_or("<error>"), "3");
  ASSERT_OK(store_->Set("preset", "40"));
  EXPECT_EQ(store_->Add("preset", 2).value_or(-1), 42);
  EXPECT_EQ(store_->Add("neg", -9).value_or(0), -9);
  EXPECT_EQ(store_->Get("neg").value_or("<error>"), "-9");
  const int64_t big = int64_t{1} << 40;
  EXPECT_EQ(store_->Add("big", big).value_or(-1), big);
}

TEST_P(StoreConformanceTest, AddOnNonNumericIsInvalidArgument) {
  ASSERT_OK(store_->Set("text-key", "hello"));
  absl::StatusOr<int64_t> sum = store_->Add("text-key", 1);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument)
      << sum.status();
  EXPECT_THAT(std::string(sum.status().message()), HasSubstr("text-key"));
  EXPECT_EQ(store_->Get("text-key").value_or("<error>"), "hello");
}

TEST_P(StoreConformanceTest, CompareSetSemantics) {
  // Absent key, empty expected: stores desired.
  EXPECT_EQ(store_->CompareSet("cas", "", "first").value_or("<error>"),
            "first");
  EXPECT_EQ(store_->Get("cas").value_or("<error>"), "first");
  // Mismatch: unchanged, returns the current value.
  EXPECT_EQ(store_->CompareSet("cas", "wrong", "second").value_or("<error>"),
            "first");
  EXPECT_EQ(store_->Get("cas").value_or("<error>"), "first");
  // Match: swaps, returns desired.
  EXPECT_EQ(store_->CompareSet("cas", "first", "second").value_or("<error>"),
            "second");
  EXPECT_EQ(store_->Get("cas").value_or("<error>"), "second");
  // Absent key, non-empty expected: returns expected, stores nothing.
  EXPECT_EQ(store_->CompareSet("absent", "exp", "des").value_or("<error>"),
            "exp");
  EXPECT_EQ(store_->Check({"absent"}).value_or(true), false);
}

TEST_P(StoreConformanceTest, CheckDoesNotBlock) {
  const absl::Time start = absl::Now();
  EXPECT_EQ(store_->Check({"c1"}).value_or(true), false);
  ASSERT_OK(store_->Set("c1", "x"));
  EXPECT_EQ(store_->Check({"c1"}).value_or(false), true);
  EXPECT_EQ(store_->Check({"c1", "c2"}).value_or(true), false);
  ASSERT_OK(store_->Set("c2", "x"));
  EXPECT_EQ(store_->Check({"c1", "c2"}).value_or(false), true);
  EXPECT_LT(absl::Now() - start, kLateness);
}

TEST_P(StoreConformanceTest, DeleteKey) {
  ASSERT_OK(store_->Set("del", "x"));
  EXPECT_EQ(store_->DeleteKey("del").value_or(false), true);
  EXPECT_EQ(store_->DeleteKey("del").value_or(true), false);
  EXPECT_EQ(store_->DeleteKey("never").value_or(true), false);
  EXPECT_EQ(store_->Check({"del"}).value_or(true), false);
  store_->SetTimeout(kShort);
  ExpectTimeout(store_->Get("del").status(), *store_, {"del"});
  // A deleted counter restarts from zero.
  ASSERT_OK(store_->Add("cnt", 5).status());
  ASSERT_OK(store_->DeleteKey("cnt").status());
  EXPECT_EQ(store_->Add("cnt", 1).value_or(-1), 1);
}

TEST_P(StoreConformanceTest, NumKeysCountsKeys) {
  absl::StatusOr<int64_t> base = store_->NumKeys();
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_OK(store_->Set("nk1", "x"));
  ASSERT_OK(store_->Set("nk2", "x"));
  ASSERT_OK(store_->Set("nk2", "y"));  // overwrite: no new key
  ASSERT_OK(store_->Add("nk3", 1).status());
  EXPECT_EQ(store_->NumKeys().value_or(-1), *base + 3);
  ASSERT_OK(store_->DeleteKey("nk1").status());
  EXPECT_EQ(store_->NumKeys().value_or(-1), *base + 2);
}

TEST_P(StoreConformanceTest, MultiSetMultiGet) {
  ASSERT_OK(store_->MultiSet({"m1", "m2", "m3"}, {"v1", "v2", "v3"}));
  absl::StatusOr<std::vector<std::string>> values =
      store_->MultiGet({"m3", "m1", "m2"});
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("v3", "v1", "v2"));
  EXPECT_EQ(store_->Get("m2").value_or("<error>"), "v2");
  ASSERT_OK(store_->MultiSet({}, {}));
  values = store_->MultiGet({});
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_TRUE(values->empty());
}

TEST_P(StoreConformanceTest, MultiSetLengthMismatchIsInvalidArgument) {
  absl::Status status = store_->MultiSet({"x1", "x2"}, {"only-one"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(store_->Check({"x1"}).value_or(true), false);
}

TEST_P(StoreConformanceTest, MultiGetWaitsAndTimesOut) {
  std::unique_ptr<Store> other = NewHandle();
  ASSERT_NE(other, nullptr);
  ASSERT_OK(store_->Set("mg1", "a"));
  absl::StatusOr<std::vector<std::string>> values;
  std::thread waiter([&] { values = store_->MultiGet({"mg1", "mg2"}); });
  AwaitBlocked(*store_);
  EXPECT_OK(other->Set("mg2", "b"));
  waiter.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("a", "b"));

  store_->SetTimeout(kShort);
  values = store_->MultiGet({"mg1", "mg-missing"});
  ExpectTimeout(values.status(), *store_, {"mg-missing"});
}

TEST_P(StoreConformanceTest, AppendCreatesAndExtends) {
  ASSERT_OK(store_->Append("log", "ab"));
  ASSERT_OK(store_->Append("log", std::string("\0c", 2)));
  ASSERT_OK(store_->Append("log", ""));
  EXPECT_EQ(store_->Get("log").value_or("<error>"), std::string("ab\0c", 4));
  ASSERT_OK(store_->Set("log2", "x"));
  ASSERT_OK(store_->Append("log2", "y"));
  EXPECT_EQ(store_->Get("log2").value_or("<error>"), "xy");
}

TEST_P(StoreConformanceTest, QueueIsFifo) {
  EXPECT_EQ(store_->QueueLen("q").value_or(-1), 0);
  ASSERT_OK(store_->QueuePush("q", "1"));
  ASSERT_OK(store_->QueuePush("q", std::string("\0two", 4)));
  ASSERT_OK(store_->QueuePush("q", "3"));
  EXPECT_EQ(store_->QueueLen("q").value_or(-1), 3);
  EXPECT_EQ(store_->QueuePop("q", false).value_or("<error>"), "1");
  EXPECT_EQ(store_->QueuePop("q", true).value_or("<error>"),
            std::string("\0two", 4));
  EXPECT_EQ(store_->QueueLen("q").value_or(-1), 1);
  EXPECT_EQ(store_->QueuePop("q", false).value_or("<error>"), "3");
  EXPECT_EQ(store_->QueueLen("q").value_or(-1), 0);
  EXPECT_EQ(store_->QueueLen("other-q").value_or(-1), 0);
}

TEST_P(StoreConformanceTest, NonBlockingPopOnEmptyIsNotFound) {
  absl::StatusOr<std::string> popped = store_->QueuePop("empty-queue", false);
  EXPECT_EQ(popped.status().code(), absl::StatusCode::kNotFound)
      << popped.status();
  EXPECT_THAT(std::string(popped.status().message()), HasSubstr("empty-queue"));
  ASSERT_OK(store_->QueuePush("empty-queue", "x"));
  ASSERT_OK(store_->QueuePop("empty-queue", false).status());
  EXPECT_EQ(store_->QueuePop("empty-queue", false).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_P(StoreConformanceTest, BlockingPopIsWokenByPush) {
  std::unique_ptr<Store> other = NewHandle();
  ASSERT_NE(other, nullptr);
  absl::StatusOr<std::string> popped;
  std::thread waiter([&] { popped = store_->QueuePop("wq", true); });
  AwaitBlocked(*store_);
  EXPECT_OK(other->QueuePush("wq", "item"));
  waiter.join();
  EXPECT_EQ(popped.value_or("<error>"), "item");
  EXPECT_EQ(store_->QueueLen("wq").value_or(-1), 0);
}

TEST_P(StoreConformanceTest, BlockingPopTimesOut) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> popped =
      store_->QueuePop("starved-queue", true, kShort);
  ExpectTimeout(popped.status(), *store_, {"starved-queue"});
  EXPECT_LT(absl::Now() - start, kShort + kLateness);
  // The default timeout applies when none is given.
  store_->SetTimeout(kShort);
  popped = store_->QueuePop("starved-queue", true);
  ExpectTimeout(popped.status(), *store_, {"starved-queue"});
}

TEST_P(StoreConformanceTest, ConcurrentConsumersGetEachItemOnce) {
  constexpr int kConsumers = 4;
  constexpr int kItems = 40;
  std::vector<std::unique_ptr<Store>> handles;
  for (int i = 0; i < kConsumers; ++i) {
    handles.push_back(NewHandle());
    ASSERT_NE(handles.back(), nullptr);
  }
  Mutex mu;
  std::vector<std::string> received;
  std::vector<absl::Status> errors;
  std::vector<std::thread> consumers;
  for (int i = 0; i < kConsumers; ++i) {
    consumers.emplace_back([&, i] {
      for (int n = 0; n < kItems / kConsumers; ++n) {
        absl::StatusOr<std::string> item = handles[i]->QueuePop("work", true);
        MutexLock lock(&mu);
        if (item.ok()) {
          received.push_back(*item);
        } else {
          errors.push_back(item.status());
        }
      }
    });
  }
  for (int n = 0; n < kItems; ++n) {
    EXPECT_OK(store_->QueuePush("work", absl::StrCat(n)));
  }
  for (std::thread& t : consumers) t.join();
  for (const absl::Status& error : errors) ADD_FAILURE() << error;
  std::vector<int> numbers;
  for (const std::string& item : received) numbers.push_back(std::stoi(item));
  std::sort(numbers.begin(), numbers.end());
  ASSERT_EQ(numbers.size(), kItems);
  for (int n = 0; n < kItems; ++n) EXPECT_EQ(numbers[n], n);
}

TEST_P(StoreConformanceTest, CloneSharesDataBothWays) {
  std::unique_ptr<Store> clone = NewHandle();
  ASSERT_NE(clone, nullptr);
  ASSERT_OK(store_->Set("from-original", "1"));
  EXPECT_EQ(clone->Get("from-original").value_or("<error>"), "1");
  ASSERT_OK(clone->Set("from-clone", "2"));
  EXPECT_EQ(store_->Get("from-clone").value_or("<error>"), "2");
  ASSERT_OK(clone->QueuePush("cq", "x"));
  // A push has no reply (as in PyTorch's protocol); a later answered request
  // on the same handle proves the server has applied it.
  EXPECT_EQ(clone->Get("from-clone").value_or("<error>"), "2");
  EXPECT_EQ(store_->QueueLen("cq").value_or(-1), 1);
  // A clone of a clone, and a clone outliving its original.
  absl::StatusOr<std::unique_ptr<Store>> grandchild = clone->Clone();
  ASSERT_TRUE(grandchild.ok()) << grandchild.status();
  clone.reset();
  EXPECT_EQ((*grandchild)->Get("from-clone").value_or("<error>"), "2");
  ASSERT_OK((*grandchild)->Set("from-grandchild", "3"));
  EXPECT_EQ(store_->Get("from-grandchild").value_or("<error>"), "3");
}

TEST_P(StoreConformanceTest, CloneWorksConcurrently) {
  std::unique_ptr<Store> clone = NewHandle();
  ASSERT_NE(clone, nullptr);
  // The clone blocks while the original writes, and vice versa.
  absl::StatusOr<std::string> on_clone;
  std::thread waiter([&] { on_clone = clone->Get("ping"); });
  AwaitBlocked(*clone);
  EXPECT_OK(store_->Set("ping", "1"));
  waiter.join();
  EXPECT_EQ(on_clone.value_or("<error>"), "1");

  absl::StatusOr<std::string> on_original;
  std::thread waiter2([&] { on_original = store_->Get("pong"); });
  AwaitBlocked(*store_);
  EXPECT_OK(clone->Set("pong", "2"));
  waiter2.join();
  EXPECT_EQ(on_original.value_or("<error>"), "2");
}

TEST_P(StoreConformanceTest, ConcurrentAddsAreAtomic) {
  constexpr int kThreads = 8;
  constexpr int kAddsPerThread = 100;
  // Half the threads share store_, half use their own clone.
  std::vector<std::unique_ptr<Store>> clones;
  for (int i = 0; i < kThreads / 2; ++i) {
    clones.push_back(NewHandle());
    ASSERT_NE(clones.back(), nullptr);
  }
  Mutex mu;
  std::vector<int64_t> results;
  int failures = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    Store* store = i % 2 == 0 ? store_.get() : clones[i / 2].get();
    threads.emplace_back([&, store] {
      std::vector<int64_t> mine;
      int my_failures = 0;
      for (int n = 0; n < kAddsPerThread; ++n) {
        absl::StatusOr<int64_t> sum = store->Add("hammer", 1);
        if (sum.ok()) {
          mine.push_back(*sum);
        } else {
          ++my_failures;
        }
      }
      MutexLock lock(&mu);
      results.insert(results.end(), mine.begin(), mine.end());
      failures += my_failures;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  constexpr int64_t kTotal = kThreads * kAddsPerThread;
  EXPECT_EQ(store_->Get("hammer").value_or("<error>"), absl::StrCat(kTotal));
  // Every intermediate value was returned exactly once.
  std::sort(results.begin(), results.end());
  ASSERT_EQ(results.size(), kTotal);
  for (int64_t i = 0; i < kTotal; ++i) ASSERT_EQ(results[i], i + 1);
}

TEST_P(StoreConformanceTest, SetTimeoutChangesTheDefault) {
  store_->SetTimeout(absl::Milliseconds(250));
  EXPECT_EQ(store_->Timeout(), absl::Milliseconds(250));
  store_->SetTimeout(absl::Milliseconds(50));
  EXPECT_EQ(store_->Timeout(), absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  EXPECT_EQ(store_->Get("nope").status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(store_->Wait({"nope"}).code(), absl::StatusCode::kDeadlineExceeded);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_GE(elapsed, absl::Milliseconds(90));
  EXPECT_LT(elapsed, absl::Milliseconds(100) + kLateness);
  // A clone starts with a working default timeout of its own.
  absl::StatusOr<std::unique_ptr<Store>> clone = store_->Clone();
  ASSERT_TRUE(clone.ok()) << clone.status();
  (*clone)->SetTimeout(kLong);
  EXPECT_EQ(store_->Timeout(), absl::Milliseconds(50));
}

}  // namespace
}  // namespace ferry
