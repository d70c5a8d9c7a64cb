// Counts the requests a worker sends, by message type (and function name for
// calls), through an agent interceptor; prints them per operation as a table
// and one JSON line. Message counts are repeatable where times are not.
//
// Thread safety: the counter may be read while the agent sends.
#ifndef FERRY_BENCH_UTIL_REQUESTS_H_
#define FERRY_BENCH_UTIL_REQUESTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "ferry/common/sync.h"
#include "ferry/rpc/agent.h"

namespace ferry::bench {

class RequestCounter {
 public:
  using Counts = std::map<std::string, int64_t>;

  // Counts every request `agent` sends from now on (the agent holds the
  // counter; so may the caller).
  static std::shared_ptr<RequestCounter> Install(rpc::Agent& agent);

  Counts Snapshot() const;

 private:
  mutable Mutex mu_;
  Counts sent_ ABSL_GUARDED_BY(mu_);
};

// Prints the requests counted between `before` and `after`, divided by
// `ops`: "  requests/<unit> TYPE n" rows, a "<name> total" row and
// {"bench": bench, "impl": "ferry", "name": name, "requests_per_op": ...,
// "by_type": {...}}.
void PrintRequests(const std::string& bench, const std::string& name,
                   const std::string& unit,
                   const RequestCounter::Counts& before,
                   const RequestCounter::Counts& after, int64_t ops);

}  // namespace ferry::bench

#endif  // FERRY_BENCH_UTIL_REQUESTS_H_
