#include "ferry/rpc/grpc/stats.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ferry::rpc {

void RpcStats::Ring::Add(double v) {
  if (us.size() < kWindow) {
    us.push_back(v);
  } else {
    us[next] = v;
  }
  next = (next + 1) % kWindow;
}

double RpcStats::Ring::Percentile(double p) const {
  if (us.empty()) return 0;
  std::vector<double> sorted = us;
  size_t k =
      std::min(sorted.size() - 1, static_cast<size_t>(p * sorted.size()));
  std::nth_element(sorted.begin(), sorted.begin() + k, sorted.end());
  return sorted[k];
}

void RpcStats::Record(Direction dir, const std::string& function,
                      absl::Duration latency, bool error, uint64_t bytes_in,
                      uint64_t bytes_out) {
  const int d = dir == Direction::kIn ? 0 : 1;
  absl::string_view key = function;
  std::string cut;
  if (key.size() > kMaxNameBytes) {
    // Cut at a UTF-8 character boundary: the name goes into a proto string.
    size_t n = kMaxNameBytes;
    while (n > 0 && (static_cast<unsigned char>(key[n]) & 0xC0) == 0x80) --n;
    cut = absl::StrCat(key.substr(0, n), "...");
    key = cut;
  }
  MutexLock lock(&mu_);
  // Looked up by view: a known name costs no copy.
  auto it = functions_.find(key);
  if (it == functions_.end()) {
    if (functions_.size() >= kMaxFunctions) key = kOtherName;
    it = functions_.try_emplace(std::string(key)).first;
  }
  PerFunction& f = it->second;
  ++f.calls[d];
  if (error) ++f.errors[d];
  f.bytes_in += bytes_in;
  f.bytes_out += bytes_out;
  f.latency[d].Add(absl::ToDoubleMicroseconds(latency));
}

ferry::admin::v1::GetStatsResponse RpcStats::Snapshot() const {
  ferry::admin::v1::GetStatsResponse out;
  MutexLock lock(&mu_);
  for (const auto& [name, f] : functions_) {
    auto* s = out.add_functions();
    s->set_function(name);
    s->set_calls_in(f.calls[0]);
    s->set_calls_out(f.calls[1]);
    s->set_errors_in(f.errors[0]);
    s->set_errors_out(f.errors[1]);
    s->set_latency_in_p50_us(f.latency[0].Percentile(0.5));
    s->set_latency_in_p99_us(f.latency[0].Percentile(0.99));
    s->set_latency_out_p50_us(f.latency[1].Percentile(0.5));
    s->set_latency_out_p99_us(f.latency[1].Percentile(0.99));
    s->set_bytes_in(f.bytes_in);
    s->set_bytes_out(f.bytes_out);
    out.set_total_calls_in(out.total_calls_in() + f.calls[0]);
    out.set_total_calls_out(out.total_calls_out() + f.calls[1]);
    out.set_total_errors(out.total_errors() + f.errors[0] + f.errors[1]);
    out.set_total_bytes_in(out.total_bytes_in() + f.bytes_in);
    out.set_total_bytes_out(out.total_bytes_out() + f.bytes_out);
  }
  return out;
}

}  // namespace ferry::rpc
