#include "ferry/bench/util/requests.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ferry::bench {

std::shared_ptr<RequestCounter> RequestCounter::Install(rpc::Agent& agent) {
  auto counter = std::make_shared<RequestCounter>();
  agent.AddInterceptor([counter](rpc::InterceptPoint point,
                                 const rpc::WorkerInfo&, rpc::Message& m) {
    if (point != rpc::InterceptPoint::kSendRequest) return absl::OkStatus();
    std::string key = rpc::MessageTypeName(m.type);
    if (!m.function.empty()) absl::StrAppend(&key, " ", m.function);
    MutexLock lock(&counter->mu_);
    ++counter->sent_[key];
    return absl::OkStatus();
  });
  return counter;
}

RequestCounter::Counts RequestCounter::Snapshot() const {
  MutexLock lock(&mu_);
  return sent_;
}

void PrintRequests(const std::string& bench, const std::string& name,
                   const std::string& unit,
                   const RequestCounter::Counts& before,
                   const RequestCounter::Counts& after, int64_t ops) {
  const double per = 1.0 / static_cast<double>(ops);
  int64_t total = 0;
  std::string json;
  for (const auto& [key, count] : after) {
    auto it = before.find(key);
    const int64_t n = count - (it == before.end() ? 0 : it->second);
    if (n == 0) continue;
    total += n;
    std::printf("  requests/%s %-30s %7.3f\n", unit.c_str(), key.c_str(),
                n * per);
    absl::StrAppend(&json, json.empty() ? "" : ", ", "\"", key,
                    "\": ", absl::StrFormat("%.3f", n * per));
  }
  std::printf(
      "%-24s %7.3f requests per %s (each answered by one reply), "
      "%lld %ss\n",
      name.c_str(), total * per, unit.c_str(), static_cast<long long>(ops),
      unit.c_str());
  std::printf(
      "{\"bench\": \"%s\", \"impl\": \"ferry\", \"name\": \"%s\", "
      "\"requests_per_op\": %.3f, \"by_type\": {%s}}\n",
      bench.c_str(), name.c_str(), total * per, json.c_str());
}

}  // namespace ferry::bench
