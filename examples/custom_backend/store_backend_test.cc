#include "ferry/examples/custom_backend/store_backend.h"

#include <atomic>
#include <memory>
#include <vector>

#include "ferry/c10d/default_registry.h"
#include "ferry/c10d/process_group.h"
#include "ferry/c10d/testing/backend_conformance.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/store/hash_store.h"
#include "ferry/tests/util/run_ranks.h"

namespace ferry {
namespace c10d {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(20);

BackendUnderTest StoreUnderTest() {
  BackendUnderTest b;
  b.name = "StoreBackend";
  b.create =
      [](std::shared_ptr<Store> store, int rank, int size,
         absl::Duration timeout) -> absl::StatusOr<std::unique_ptr<Backend>> {
    return std::make_unique<examples::StoreBackend>(std::move(store), rank,
                                                    size, timeout);
  };
  b.ops = {OpType::kAllreduce, OpType::kBroadcast, OpType::kBarrier};
  b.rendezvous_at_create = false;
  return b;
}

INSTANTIATE_TEST_SUITE_P(Example, BackendConformanceTest,
                         ::testing::Values(StoreUnderTest()),
                         BackendUnderTestName);

void RunRanks(int n,
              const std::function<void(int, std::shared_ptr<Store>)>& body) {
  auto store = std::make_shared<HashStore>();
  testutil::RunRanks(n, [&](int r) { body(r, store); });
}

ProcessGroupOptions Options(const std::string& spec) {
  ProcessGroupOptions o;
  o.backend = spec;
  o.timeout = kTimeout;
  return o;
}

TEST(CustomBackendTest, UsedByNameThroughTheRegistry) {
  auto registry = MakeDefaultBackendRegistry();
  ASSERT_TRUE(examples::RegisterStoreBackend(*registry).ok());
  EXPECT_EQ(examples::RegisterStoreBackend(*registry).code(),
            absl::StatusCode::kAlreadyExists);
  RunRanks(3, [&](int r, std::shared_ptr<Store> store) {
    auto pg = ProcessGroup::Create(store, r, 3, registry, Options("store"));
    ASSERT_TRUE(pg.ok()) << pg.status();
    EXPECT_EQ((*pg)->BackendSpec(), "cpu:store");
    Tensor t = full({4}, r + 1, DType::kInt64);
    auto w = (*pg)->Allreduce(t, {.op = ReduceOp::kProduct});
    ASSERT_TRUE(w->Wait(kTimeout).ok());
    EXPECT_THAT(w->description(), HasSubstr("store Allreduce"));
    EXPECT_EQ(t.to_vector<int64_t>(), std::vector<int64_t>(4, 6));
    // A call the backend does not implement.
    std::vector<Tensor> outs = {zeros({4}), zeros({4}), zeros({4})};
    absl::Status s = (*pg)->Allgather(outs, ones({4}))->Wait(kTimeout);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("backend 'store' does not implement Allgather"));
  });
}

TEST(CustomBackendTest, MixedWithGlooInOneJob) {
  auto registry = MakeDefaultBackendRegistry();
  ASSERT_TRUE(examples::RegisterStoreBackend(*registry).ok());
  RunRanks(3, [&](int r, std::shared_ptr<Store> store) {
    // Parent on gloo; a subgroup on the custom backend, chosen by name.
    auto pg = ProcessGroup::Create(store, r, 3, registry, Options("gloo"));
    ASSERT_TRUE(pg.ok()) << pg.status();
    auto sub = (*pg)->NewGroup({2, 0}, std::string("store"));
    ASSERT_TRUE(sub.ok()) << sub.status();
    if (r == 1) {
      EXPECT_EQ(*sub, nullptr);
    } else {
      ASSERT_NE(*sub, nullptr);
      EXPECT_EQ((*sub)->BackendSpec(), "cpu:store");
      Tensor t = full({2}, r);
      ASSERT_TRUE((*sub)->Broadcast(t, {.root = 0})->Wait(kTimeout).ok());
      EXPECT_EQ(t.to_vector<float>(), std::vector<float>(2, 2));  // global 2
    }
    Tensor all = ones({3});
    ASSERT_TRUE((*pg)->Allreduce(all)->Wait(kTimeout).ok());
    EXPECT_EQ(all.to_vector<float>(), std::vector<float>(3, 3));
  });
}

TEST(CustomBackendTest, MixedSpecWithABuiltInBackend) {
  auto registry = MakeDefaultBackendRegistry();
  ASSERT_TRUE(examples::RegisterStoreBackend(*registry).ok());
  // The custom backend serves CPU tensors; CUDA tensors go to the other
  // backend of the spec (nccl where built, else a second custom instance
  // registered for CUDA to show the dispatch).
  std::string cuda_backend = "nccl";
  if (!registry->IsRegistered("nccl")) {
    cuda_backend = "store_cuda";
    ASSERT_TRUE(
        registry
            ->RegisterBackend("store_cuda",
                              [](const BackendConfig& c)
                                  -> absl::StatusOr<std::unique_ptr<Backend>> {
                                return std::make_unique<examples::StoreBackend>(
                                    c.store, c.rank, c.size, c.timeout);
                              },
                              {DeviceType::kCUDA})
            .ok());
  }
  std::string spec = "cpu:store,cuda:" + cuda_backend;
  RunRanks(2, [&](int r, std::shared_ptr<Store> store) {
    auto pg = ProcessGroup::Create(store, r, 2, registry, Options(spec));
    ASSERT_TRUE(pg.ok()) << pg.status();
    EXPECT_EQ((*pg)->BackendSpec(), spec);
    Tensor t = full({2}, r + 1);
    auto w = (*pg)->Allreduce(t);
    ASSERT_TRUE(w->Wait(kTimeout).ok());
    EXPECT_THAT(w->description(), HasSubstr("store Allreduce"));
    EXPECT_EQ(t.to_vector<float>(), std::vector<float>(2, 3));
    auto cuda = (*pg)->GetBackend(DeviceType::kCUDA);
    ASSERT_TRUE(cuda.ok());
    EXPECT_EQ((*cuda)->name(), cuda_backend == "nccl" ? "nccl" : "store");
  });
}

TEST(CustomBackendTest, UnregisteredNameIsAClearError) {
  auto registry = MakeDefaultBackendRegistry();
  auto pg = ProcessGroup::Create(std::make_shared<HashStore>(), 0, 1, registry,
                                 Options("store"));
  EXPECT_EQ(pg.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(pg.status().message()),
              HasSubstr("unknown backend 'store'; registered backends: auto, "
                        "gloo"));
}

}  // namespace
}  // namespace c10d
}  // namespace ferry
