#include "ferry/c10d/process_group.h"

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/c10d/default_registry.h"
#include "ferry/c10d/init.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/store/hash_store.h"
#include "ferry/tests/util/run_ranks.h"

namespace ferry {
namespace c10d {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(20);

// A "cuda" backend that does no math: it records which calls reached it.
class RecorderBackend : public Backend {
 public:
  RecorderBackend(int rank, int size, std::atomic<int>* calls)
      : Backend("recorder", rank, size, kTimeout), calls_(calls) {}
  std::shared_ptr<Work> Allreduce(Tensor, const AllreduceOptions&) override {
    calls_->fetch_add(1);
    return Work::Completed("recorder Allreduce", absl::OkStatus());
  }

 private:
  std::atomic<int>* calls_;
};

Tensor FakeCudaTensor() {
  static char bytes[64];
  Storage s = Storage::Wrap(bytes, sizeof(bytes), Device::CUDA(0), nullptr);
  return *Tensor::FromStorage(s, DType::kFloat32, {4}, {1});
}

std::shared_ptr<BackendRegistry> TestRegistry(std::atomic<int>* calls) {
  auto registry = MakeDefaultBackendRegistry();
  EXPECT_TRUE(
      registry
          ->RegisterBackend("recorder",
                            [calls](const BackendConfig& c)
                                -> absl::StatusOr<std::unique_ptr<Backend>> {
                              return std::make_unique<RecorderBackend>(
                                  c.rank, c.size, calls);
                            },
                            {DeviceType::kCUDA})
          .ok());
  return registry;
}

// Runs body(rank, group) on n threads sharing one HashStore.
void RunRanks(int n, std::shared_ptr<const BackendRegistry> registry,
              const std::string& spec,
              const std::function<void(int, ProcessGroup&)>& body) {
  auto store = std::make_shared<HashStore>();
  testutil::RunRanks(
      n,
      [&](int r) {
        ProcessGroupOptions o;
        o.backend = spec;
        o.timeout = kTimeout;
        return ProcessGroup::Create(store, r, n, registry, o);
      },
      [&](int r, auto& pg) {
        ASSERT_TRUE(pg.ok()) << pg.status();
        body(r, **pg);
      });
}

TEST(BackendSpecTest, ParsesSingleNamesAndLists) {
  std::atomic<int> calls{0};
  auto registry = TestRegistry(&calls);
  auto one = ParseBackendSpec("gloo", *registry);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->size(), 1u);
  EXPECT_EQ(one->at(DeviceType::kCPU), "gloo");
  auto both = ParseBackendSpec(" cpu:gloo, CUDA:recorder ", *registry);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->at(DeviceType::kCUDA), "recorder");
  EXPECT_EQ(both->at(DeviceType::kCPU), "gloo");

  auto unknown = ParseBackendSpec("cpu:ucc", *registry);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("unknown backend 'ucc'"));
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("gloo"));
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("recorder"));
  EXPECT_EQ(ParseBackendSpec("ucc", *registry).status().code(),
            absl::StatusCode::kNotFound);
  for (const char* bad :
       {"", "tpu:gloo", "cpu:gloo,cpu:gloo", "cpu:gloo:x", "gloo,recorder"}) {
    EXPECT_EQ(ParseBackendSpec(bad, *registry).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(ProcessGroupTest, SingleNameSpecRunsCollectives) {
  std::atomic<int> calls{0};
  RunRanks(3, TestRegistry(&calls), "gloo", [](int r, ProcessGroup& pg) {
    EXPECT_EQ(pg.rank(), r);
    EXPECT_EQ(pg.size(), 3);
    EXPECT_EQ(pg.BackendSpec(), "cpu:gloo");
    Tensor t = full({5}, r + 1.0);
    ASSERT_TRUE(pg.Allreduce(t)->Wait(kTimeout).ok());
    EXPECT_EQ(t.to_vector<float>(), std::vector<float>(5, 6));
    ASSERT_TRUE(pg.Barrier()->Wait(kTimeout).ok());
    auto cuda = pg.Allreduce(FakeCudaTensor())->Wait(kTimeout);
    EXPECT_EQ(cuda.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(cuda.message()), HasSubstr("no backend for cuda"));
    EXPECT_THAT(std::string(cuda.message()), HasSubstr("cpu:gloo"));
  });
}

TEST(ProcessGroupTest, MixedSpecDispatchesByDevice) {
  std::atomic<int> calls{0};
  RunRanks(2, TestRegistry(&calls), "cpu:gloo,cuda:recorder",
           [&](int r, ProcessGroup& pg) {
             EXPECT_EQ(pg.BackendSpec(), "cpu:gloo,cuda:recorder");
             ASSERT_TRUE(pg.Allreduce(FakeCudaTensor())->Wait(kTimeout).ok());
             Tensor t = full({2}, r);
             ASSERT_TRUE(pg.Allreduce(t)->Wait(kTimeout).ok());
             EXPECT_EQ(t.to_vector<float>(), std::vector<float>(2, 1));
             // The recorder does not implement Broadcast.
             auto bc = pg.Broadcast(FakeCudaTensor())->Wait(kTimeout);
             EXPECT_EQ(bc.code(), absl::StatusCode::kUnimplemented);
             EXPECT_THAT(std::string(bc.message()), HasSubstr("recorder"));
             auto mixed =
                 pg.Allgather({FakeCudaTensor(), FakeCudaTensor()}, ones({4}))
                     ->Wait(kTimeout);
             EXPECT_EQ(mixed.code(), absl::StatusCode::kInvalidArgument);
             EXPECT_THAT(std::string(mixed.message()),
                         HasSubstr("share a device type"));
             EXPECT_TRUE(pg.GetBackend(DeviceType::kCUDA).ok());
           });
  EXPECT_EQ(calls.load(), 2);
}

TEST(ProcessGroupTest, SubgroupsHaveTheirOwnRanksAndNamespace) {
  std::atomic<int> calls{0};
  RunRanks(4, TestRegistry(&calls), "gloo", [](int r, ProcessGroup& pg) {
    // Every rank calls NewGroup in the same order.
    auto odd = pg.NewGroup({3, 1});
    ASSERT_TRUE(odd.ok()) << odd.status();
    auto even = pg.NewGroup({0, 2});
    ASSERT_TRUE(even.ok()) << even.status();
    std::shared_ptr<ProcessGroup> mine = r % 2 ? *odd : *even;
    std::shared_ptr<ProcessGroup> other = r % 2 ? *even : *odd;
    ASSERT_NE(mine, nullptr);
    EXPECT_EQ(other, nullptr);
    EXPECT_EQ(mine->size(), 2);
    if (r % 2) {
      EXPECT_EQ(mine->rank(), r == 3 ? 0 : 1);
      EXPECT_EQ(mine->parent_ranks(), (std::vector<int>{3, 1}));
    } else {
      EXPECT_EQ(mine->rank(), r / 2);
    }
    Tensor t = full({3}, r);
    ASSERT_TRUE(mine->Allreduce(t)->Wait(kTimeout).ok());
    EXPECT_EQ(t.to_vector<float>(), std::vector<float>(3, r % 2 ? 4 : 2));
    // Broadcast from subgroup rank 0 (global 3 or 0).
    Tensor b = full({2}, r);
    ASSERT_TRUE(mine->Broadcast(b, {.root = 0})->Wait(kTimeout).ok());
    EXPECT_EQ(b.to_vector<float>(), std::vector<float>(2, r % 2 ? 3 : 0));
    // The parent group still works, interleaved with the subgroups.
    Tensor all = ones({1});
    ASSERT_TRUE(pg.Allreduce(all)->Wait(kTimeout).ok());
    EXPECT_EQ(all.to_vector<float>()[0], 4);
    // A nested subgroup of a subgroup.
    auto nested = mine->NewGroup({1});
    ASSERT_TRUE(nested.ok()) << nested.status();
    if (mine->rank() == 1) {
      ASSERT_NE(*nested, nullptr);
      EXPECT_EQ((*nested)->size(), 1);
      Tensor one = full({1}, 7);
      ASSERT_TRUE((*nested)->Allreduce(one)->Wait(kTimeout).ok());
      EXPECT_EQ(one.to_vector<float>()[0], 7);
    } else {
      EXPECT_EQ(*nested, nullptr);
    }
  });
}

TEST(ProcessGroupTest, NewGroupRejectsBadRanks) {
  std::atomic<int> calls{0};
  RunRanks(1, TestRegistry(&calls), "gloo", [](int, ProcessGroup& pg) {
    EXPECT_EQ(pg.NewGroup({}).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(pg.NewGroup({1}).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(pg.NewGroup({0, 0}).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(pg.NewGroup({0}, std::string("nope")).status().code(),
              absl::StatusCode::kNotFound);
  });
}

TEST(ProcessGroupTest, CreateErrors) {
  std::atomic<int> calls{0};
  auto registry = TestRegistry(&calls);
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions o;
  o.backend = "ucc";  // Not registered.
  auto unknown = ProcessGroup::Create(store, 0, 1, registry, o);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("gloo"));
  o.backend = "gloo";
  EXPECT_EQ(ProcessGroup::Create(store, 1, 1, registry, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ProcessGroup::Create(nullptr, 0, 1, registry, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.backend_options = {{"colour", "blue"}};
  auto bad_option = ProcessGroup::Create(store, 0, 1, registry, o);
  EXPECT_EQ(bad_option.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_option.status().message()), HasSubstr("colour"));
  // A rank that never arrives: DeadlineExceeded within the timeout.
  o.backend_options.clear();
  o.timeout = absl::Milliseconds(300);
  absl::Time start = absl::Now();
  auto lonely = ProcessGroup::Create(store, 0, 2, registry, o);
  EXPECT_EQ(lonely.status().code(), absl::StatusCode::kDeadlineExceeded)
      << lonely.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(InitProcessGroupTest, ExplicitStoreAndFileInitMethod) {
  auto store = std::make_shared<HashStore>();
  std::string path = absl::StrCat(::testing::TempDir(), "/c10d_init_file");
  std::remove(path.c_str());
  testutil::RunRanks(2, [&](int r) {
    InitProcessGroupOptions a;
    a.store = store;
    a.rank = r;
    a.world_size = 2;
    a.group.timeout = kTimeout;
    auto pg = InitProcessGroup(a);
    ASSERT_TRUE(pg.ok()) << pg.status();
    Tensor t = full({2}, r + 1);
    ASSERT_TRUE((*pg)->Allreduce(t)->Wait(kTimeout).ok());
    EXPECT_EQ(t.to_vector<float>(), std::vector<float>(2, 3));

    InitProcessGroupOptions f;
    f.init_method = absl::StrCat("file://", path, "?world_size=2&rank=", r);
    f.group.timeout = kTimeout;
    auto fpg = InitProcessGroup(f);
    ASSERT_TRUE(fpg.ok()) << fpg.status();
    EXPECT_EQ((*fpg)->rank(), r);
    Tensor u = full({2}, r);
    ASSERT_TRUE(
        (*fpg)->Allreduce(u, {.op = ReduceOp::kMax})->Wait(kTimeout).ok());
    EXPECT_EQ(u.to_vector<float>(), std::vector<float>(2, 1));
    ASSERT_TRUE((*fpg)->Barrier()->Wait(kTimeout).ok());
  });
}

TEST(InitProcessGroupTest, Errors) {
  InitProcessGroupOptions none;
  EXPECT_EQ(InitProcessGroup(none).status().code(),
            absl::StatusCode::kInvalidArgument);
  InitProcessGroupOptions env;
  env.init_method = "env://";
  auto no_master = InitProcessGroup(
      env, [](absl::string_view) -> std::optional<std::string> {
        return std::nullopt;
      });
  EXPECT_EQ(no_master.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(no_master.status().message()),
              HasSubstr("MASTER_ADDR"));
  InitProcessGroupOptions no_rank;
  no_rank.store = std::make_shared<HashStore>();
  EXPECT_EQ(InitProcessGroup(no_rank).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(InitProcessGroupTest, TcpInitMethodSingleRank) {
  InitProcessGroupOptions t;
  // Port 0: rank 0 serves on a free port (a group of one needs no peers).
  t.init_method = "tcp://127.0.0.1:0?rank=0&world_size=1";
  t.group.timeout = kTimeout;
  auto pg = InitProcessGroup(t);
  ASSERT_TRUE(pg.ok()) << pg.status();
  Tensor x = full({3}, 2);
  ASSERT_TRUE((*pg)->Allreduce(x)->Wait(kTimeout).ok());
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(3, 2));
}

// Backends learn the store's host from tcp:// (Gloo listens on the local
// address routing toward it, so a group across hosts works without
// MASTER_ADDR), and subgroups inherit it.
TEST(InitProcessGroupTest, TcpInitMethodGivesBackendsTheStoreHost) {
  auto registry = std::make_shared<BackendRegistry>();
  std::vector<std::string> seen;
  ASSERT_TRUE(
      registry
          ->RegisterBackend("hostcheck",
                            [&seen](const BackendConfig& c)
                                -> absl::StatusOr<std::unique_ptr<Backend>> {
                              seen.push_back(c.rendezvous_host);
                              return std::make_unique<RecorderBackend>(
                                  c.rank, c.size, nullptr);
                            })
          .ok());
  InitProcessGroupOptions t;
  t.init_method = "tcp://127.0.0.1:0?rank=0&world_size=1";
  t.registry = registry;
  t.group.backend = "hostcheck";
  t.group.timeout = kTimeout;
  auto pg = InitProcessGroup(t);
  ASSERT_TRUE(pg.ok()) << pg.status();
  auto sub = (*pg)->NewGroup({0});
  ASSERT_TRUE(sub.ok()) << sub.status();
  EXPECT_EQ(seen, std::vector<std::string>({"127.0.0.1", "127.0.0.1"}));
}

TEST(InitProcessGroupTest, AgentStoreFromEnv) {
  auto lookup = [](std::map<std::string, std::string> vars) {
    return [vars](absl::string_view k) -> std::optional<std::string> {
      auto it = vars.find(std::string(k));
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
  };
  auto none = AgentStoreFromEnv(lookup({}));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->use);
  auto ferry = AgentStoreFromEnv(lookup({{"FERRY_USE_AGENT_STORE", "1"}}));
  ASSERT_TRUE(ferry.ok());
  EXPECT_TRUE(ferry->use);
  EXPECT_EQ(ferry->prefix, "");
  auto torch =
      AgentStoreFromEnv(lookup({{"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  ASSERT_TRUE(torch.ok());
  EXPECT_TRUE(torch->use);
  EXPECT_EQ(torch->prefix, "/worker/attempt_2");
  auto off =
      AgentStoreFromEnv(lookup({{"TORCHELASTIC_USE_AGENT_STORE", "False"}}));
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->use);
  auto bad = AgentStoreFromEnv(lookup({{"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                       {"TORCHELASTIC_RESTART_COUNT", "x"}}));
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
}

}  // namespace
}  // namespace c10d
}  // namespace ferry
