#include "ferry/tests/util/run_ranks.h"

#include <thread>
#include <vector>

namespace ferry::testutil {

void RunThreads(int n, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

}  // namespace ferry::testutil
