// A remote-object class shared by the multi-process RRef test and its worker
// processes, plus the setup every process of that test runs before serving.
#ifndef FERRY_TESTS_RREF_COUNTER_H_
#define FERRY_TESTS_RREF_COUNTER_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/agent.h"
#include "ferry/rref/rref.h"

namespace ferry::testutil {

class Counter {
 public:
  explicit Counter(int64_t start) : total_(start) {}
  int64_t Add(int64_t x) {
    MutexLock lock(&mu_);
    return total_ += x;
  }
  int64_t Get() const {
    MutexLock lock(&mu_);
    return total_;
  }

 private:
  mutable Mutex mu_;
  int64_t total_ ABSL_GUARDED_BY(mu_);
};

// Creates the process's RRefContext on `agent` (into *out), registers
// Counter and the functions the test calls: "add"(x, y), "pid"(),
// "counter_add"(RRef<Counter>, x) (calls the object's add from this process),
// "fetch"(RRef<int64>) (to_here from this process).
absl::Status InstallRRefTestLayer(rpc::Agent& agent,
                                  std::shared_ptr<rref::RRefContext>* out);

}  // namespace ferry::testutil

#endif  // FERRY_TESTS_RREF_COUNTER_H_
