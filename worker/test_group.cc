#include "ferry/worker/test_group.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

std::string FreshFile(const std::string& tag) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path =
      absl::StrCat(dir ? dir : "/tmp", "/worker_group_", tag, "_", getpid());
  std::remove(path.c_str());
  return "file://" + path;
}

}  // namespace

WorkerGroup StartWorkerGroup(const std::string& tag,
                       std::vector<WorkerOptions> options) {
  const std::string init = FreshFile(tag);
  WorkerGroup out(options.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < options.size(); ++r) {
    threads.emplace_back([&, r] {
      WorkerOptions& o = options[r];
      o.name = absl::StrCat("w", r);
      o.init_method = init;
      o.rank = static_cast<int>(r);
      o.world_size = static_cast<int>(options.size());
      out[r] = InitWorker(o);
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

void ShutdownWorkerGroup(WorkerGroup& group) {
  std::vector<std::thread> ends;
  for (auto& worker : group) {
    if (!worker.ok()) continue;
    ends.emplace_back([&worker] {
      absl::Status s = (*worker)->Shutdown();
      EXPECT_TRUE(s.ok()) << (*worker)->name() << ": " << s;
    });
  }
  for (std::thread& t : ends) t.join();
}

}  // namespace ferry
