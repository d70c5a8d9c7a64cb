// custom_backend_example: registers the example StoreBackend under the name
// "store", then runs three ranks (threads of this process, meeting through a
// HashStore) that use it by name, alone and next to gloo, and shows the
// errors for an unregistered name and an unimplemented call.
//
//   bazel run //examples/custom_backend:custom_backend_example
#include <cstdio>
#include <latch>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/c10d/default_registry.h"
#include "ferry/c10d/process_group.h"
#include "ferry/examples/custom_backend/store_backend.h"
#include "ferry/store/hash_store.h"

namespace {

using ferry::Tensor;
using ferry::c10d::ProcessGroup;
using ferry::c10d::ProcessGroupOptions;

constexpr int kRanks = 3;

void Rank(int rank, std::shared_ptr<ferry::Store> store,
          std::shared_ptr<ferry::c10d::BackendRegistry> registry) {
  ProcessGroupOptions o;
  o.backend = "store";
  o.timeout = absl::Seconds(30);
  auto pg = ProcessGroup::Create(store, rank, kRanks, registry, o);
  if (!pg.ok()) {
    std::printf("rank %d: %s\n", rank, pg.status().ToString().c_str());
    return;
  }
  Tensor t = ferry::full({4}, rank + 1.0);
  absl::Status s = (*pg)->Allreduce(t)->Wait();
  std::printf("rank %d: store allreduce -> %s [%s]\n", rank,
              s.ToString().c_str(),
              absl::StrJoin(t.to_vector<float>(), ", ").c_str());
  // Mixed: a gloo group, with a subgroup on the custom backend.
  o.backend = "gloo";
  o.name = "mixed";
  auto gloo = ProcessGroup::Create(store, rank, kRanks, registry, o);
  if (!gloo.ok()) return;
  auto sub = (*gloo)->NewGroup({0, 1}, std::string("store"));
  if (sub.ok() && *sub != nullptr) {
    Tensor b = ferry::full({2}, rank * 10.0);
    s = (*sub)->Broadcast(b, {.root = 1})->Wait();
    std::printf("rank %d: store subgroup broadcast from rank 1 -> %s [%s]\n",
                rank, s.ToString().c_str(),
                absl::StrJoin(b.to_vector<float>(), ", ").c_str());
  }
  if (rank == 0) {
    std::vector<Tensor> outs(kRanks, ferry::zeros({1}));
    s = (*pg)->Allgather(outs, ferry::ones({1}))->Wait();
    std::printf("rank 0: store allgather -> %s\n", s.ToString().c_str());
  }
}

}  // namespace

int main() {
  auto registry = ferry::c10d::MakeDefaultBackendRegistry();
  auto store = std::make_shared<ferry::HashStore>();
  ProcessGroupOptions o;
  o.backend = "store";
  auto missing = ProcessGroup::Create(store, 0, 1, registry, o);
  std::printf("before registering: %s\n", missing.status().ToString().c_str());
  absl::Status reg = ferry::examples::RegisterStoreBackend(*registry);
  std::printf("RegisterBackend(\"store\"): %s; registered: %s\n",
              reg.ToString().c_str(),
              absl::StrJoin(registry->Names(), ", ").c_str());
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] { Rank(r, store, registry); });
  }
  for (std::thread& t : threads) t.join();
  return 0;
}
