// The Store conformance suite: one parameterized GoogleTest suite that every
// Store implementation must pass (store_conformance.cc holds the tests).
//
// To run it against an implementation, write a StoreFixture that brings up
// an empty store and hands out handles (Connect, BlockedCalls), and
// instantiate StoreConformanceTest with it inside namespace ferry (the
// suite's name is unqualified); store/hash_store_test.cc is the smallest
// instance, store/tcp_store_test.cc one whose fixture owns a server. BUILD:
// deps = ["//store/testing:store_conformance", "@system//:gtest_main"] (the
// library is alwayslink, so its TEST_Ps are linked in).
//
// What the suite requires beyond store.h:
// - A timeout is DeadlineExceeded whose message contains every missing key
//   (as a substring; quoting is free), the store's Describe(), and the word
//   "waited" next to the time waited; keys that exist are not named.
// - Blocking QueuePop with several concurrent consumers hands every item to
//   exactly one consumer and never fails NotFound.
// - Add returns unique, gapless results under concurrency (atomic).
// The suite uses timeouts of 50-300 ms for expected timeouts and sets a long
// timeout (20 s) for operations expected to succeed, so it stays fast and
// is not flaky under sanitizers.
#ifndef FERRY_STORE_TESTING_STORE_CONFORMANCE_H_
#define FERRY_STORE_TESTING_STORE_CONFORMANCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "ferry/store/store.h"

namespace ferry {

// Owns one store under test (and whatever it needs: a server, a file) for
// the duration of one test. The suite destroys every handle before the
// fixture.
class StoreFixture {
 public:
  virtual ~StoreFixture() = default;
  // A new handle to the store under test. The store is empty when the test
  // begins. Called once per test; further handles come from Clone().
  virtual absl::StatusOr<std::unique_ptr<Store>> Connect() = 0;
  // How many calls are blocked right now waiting for a key or queue item,
  // where `waiter` is the handle (from Connect or a Clone) they were made on.
  // A call counts once it has found its keys missing, so that any write
  // after the count covers it must wake it: the suite waits for the count
  // before writing, so the wake-up path is what gets tested.
  virtual int64_t BlockedCalls(Store& waiter) = 0;
};

struct StoreConformanceParam {
  // Test name suffix: letters, digits and '_' only.
  std::string name;
  // Called once per test.
  std::function<std::unique_ptr<StoreFixture>()> make_fixture;
};

inline void PrintTo(const StoreConformanceParam& param, std::ostream* os) {
  *os << param.name;
}

// For INSTANTIATE_TEST_SUITE_P's name generator.
inline std::string StoreConformanceParamName(
    const ::testing::TestParamInfo<StoreConformanceParam>& info) {
  return info.param.name;
}

class StoreConformanceTest
    : public ::testing::TestWithParam<StoreConformanceParam> {
 protected:
  void SetUp() override;
  void TearDown() override;

  // A new handle (Clone of store_) with the long timeout.
  std::unique_ptr<Store> NewHandle();

  // Returns once at least `n` calls on `waiter` are blocked (see
  // StoreFixture::BlockedCalls), or adds a failure after a long timeout.
  void AwaitBlocked(Store& waiter, int64_t n = 1);

  std::unique_ptr<StoreFixture> fixture_;
  std::unique_ptr<Store> store_;
};

}  // namespace ferry

#endif  // FERRY_STORE_TESTING_STORE_CONFORMANCE_H_
