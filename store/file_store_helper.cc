// A child process for file_store_test: joins a FileStore and plays a worker.
//
//   file_store_helper <path> <world_size> <id> <adds>
//
// Adds 1 to "counter" <adds> times, pushes <id> to the queue "arrived",
// blocks on Get("go"), adds 1 to "finished", then leaves. Exits 0 on
// success, 1 (with the error on stderr) otherwise.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "ferry/store/file_store.h"

namespace {

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "file_store_helper: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int world_size = 0;
  int adds = 0;
  if (argc != 5 || !absl::SimpleAtoi(argv[2], &world_size) ||
      !absl::SimpleAtoi(argv[4], &adds)) {
    std::fprintf(stderr, "usage: %s <path> <world_size> <id> <adds>\n",
                 argv[0]);
    return 2;
  }
  const std::string id = argv[3];
  auto store = ferry::FileStore::Open(argv[1], world_size);
  if (!store.ok()) return Fail("open", store.status());
  (*store)->SetTimeout(absl::Seconds(30));
  for (int i = 0; i < adds; ++i) {
    auto sum = (*store)->Add("counter", 1);
    if (!sum.ok()) return Fail("add", sum.status());
  }
  if (auto s = (*store)->QueuePush("arrived", id); !s.ok()) {
    return Fail("push", s);
  }
  if (auto go = (*store)->Get("go"); !go.ok())
    return Fail("get go", go.status());
  if (auto sum = (*store)->Add("finished", 1); !sum.ok()) {
    return Fail("add finished", sum.status());
  }
  return 0;
}
