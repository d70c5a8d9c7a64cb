// Randomized stress: 4 in-process workers (auto delivery), one thread each,
// creating, sharing (user->user, user->owner, owner->user, in lists),
// fetching and dropping RRefs for a bounded number of operations. Afterwards
// every owner holds zero values and no worker holds a pending fork.
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ferry/common/poll.h"
#include "gtest/gtest.h"
#include "ferry/rpc/testing/in_process.h"
#include "ferry/rref/rref.h"

namespace ferry::rref {
namespace {

using rpc::testing::InProcessNetwork;

constexpr int kWorkers = 4;
constexpr int kOpsPerWorker = 300;
constexpr absl::Duration kWait = absl::Seconds(20);

// RRefs a worker holds, with the value each must have.
struct Pool {
  Mutex mu;
  std::vector<std::pair<RRef<int64_t>, int64_t>> refs ABSL_GUARDED_BY(mu);

  void Add(RRef<int64_t> r, int64_t v) {
    MutexLock lock(&mu);
    refs.emplace_back(std::move(r), v);
  }
  std::optional<std::pair<RRef<int64_t>, int64_t>> Pick(std::mt19937& rng) {
    MutexLock lock(&mu);
    if (refs.empty()) return std::nullopt;
    return refs[rng() % refs.size()];
  }
  void DropOne(std::mt19937& rng) {
    std::pair<RRef<int64_t>, int64_t> doomed;
    MutexLock lock(&mu);
    if (refs.empty()) return;
    size_t i = rng() % refs.size();
    doomed = std::move(refs[i]);  // Destroyed after the lock is released.
    refs.erase(refs.begin() + static_cast<long>(i));
  }
  std::vector<std::pair<RRef<int64_t>, int64_t>> TakeAll() {
    MutexLock lock(&mu);
    return std::move(refs);
  }
};

TEST(RRefStressTest, RandomOpsLeaveNothingBehind) {
  std::vector<std::string> names;
  for (int i = 0; i < kWorkers; ++i) names.push_back("w" + std::to_string(i));
  InProcessNetwork net(names);
  std::vector<std::shared_ptr<RRefContext>> ctx(kWorkers);
  std::vector<Pool> pools(kWorkers);
  for (int i = 0; i < kWorkers; ++i) {
    auto c = RRefContext::Install(net.agent(i));
    ASSERT_TRUE(c.ok()) << c.status();
    ctx[i] = *c;
    rpc::Agent& agent = net.agent(i);
    Pool* pool = &pools[i];
    RRefContext* self = ctx[i].get();
    ASSERT_TRUE(
        agent.Register("add", [](int64_t x, int64_t y) { return x + y; }).ok());
    // Keeps the RRef, checking its value when asked to.
    ASSERT_TRUE(agent
                    .Register("hold",
                              [pool](RRef<int64_t> r, int64_t want,
                                     bool check) -> absl::Status {
                                if (check) {
                                  absl::StatusOr<int64_t> v = r.to_here(kWait);
                                  if (!v.ok()) return v.status();
                                  if (*v != want) {
                                    return absl::InternalError(absl::StrCat(
                                        "got ", *v, " want ", want));
                                  }
                                }
                                pool->Add(std::move(r), want);
                                return absl::OkStatus();
                              })
                    .ok());
    ASSERT_TRUE(agent
                    .Register("hold_all",
                              [pool](std::vector<RRef<int64_t>> rs,
                                     std::vector<int64_t> want) {
                                for (size_t k = 0; k < rs.size(); ++k) {
                                  pool->Add(rs[k], want[k]);
                                }
                              })
                    .ok());
    // Returns one of its RRefs (or a fresh local one) and the value.
    ASSERT_TRUE(agent
                    .Register("give",
                              [pool, self](int64_t seed) {
                                std::mt19937 rng(static_cast<uint32_t>(seed));
                                auto picked = pool->Pick(rng);
                                if (picked && seed % 3 != 0) {
                                  return std::make_tuple(picked->first,
                                                         picked->second);
                                }
                                return std::make_tuple(
                                    MakeLocalRRef<int64_t>(*self, seed), seed);
                              })
                    .ok());
  }

  std::vector<std::thread> threads;
  std::vector<std::string> errors(kWorkers);
  for (int i = 0; i < kWorkers; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 rng(1234 + i);
      rpc::Agent& agent = net.agent(i);
      for (int op = 0; op < kOpsPerWorker && errors[i].empty(); ++op) {
        const int peer = static_cast<int>(rng() % kWorkers);
        const int64_t x = static_cast<int64_t>(rng() % 1000);
        switch (rng() % 7) {
          case 0:
            pools[i].Add(remote<int64_t>(*ctx[i], peer, "add", x, 1), x + 1);
            break;
          case 1:
            pools[i].Add(MakeLocalRRef<int64_t>(*ctx[i], x), x);
            break;
          case 2: {  // Share one (to anyone, the owner included).
            auto p = pools[i].Pick(rng);
            if (!p) break;
            absl::Status s = agent.rpc_sync<void>(peer, "hold", p->first,
                                                  p->second, x % 2 == 0);
            if (!s.ok()) errors[i] = s.ToString();
            break;
          }
          case 3: {  // Share several in one list.
            std::vector<RRef<int64_t>> rs;
            std::vector<int64_t> want;
            for (int k = 0; k < 3; ++k) {
              if (auto p = pools[i].Pick(rng)) {
                rs.push_back(p->first);
                want.push_back(p->second);
              }
            }
            absl::Status s = agent.rpc_sync<void>(peer, "hold_all", rs, want);
            if (!s.ok()) errors[i] = s.ToString();
            break;
          }
          case 4: {  // Get one back from a peer.
            auto r = agent.rpc_sync<std::tuple<RRef<int64_t>, int64_t>>(
                peer, "give", x);
            if (!r.ok()) {
              errors[i] = r.status().ToString();
              break;
            }
            pools[i].Add(std::get<0>(*r), std::get<1>(*r));
            break;
          }
          case 5: {  // Check a value.
            auto p = pools[i].Pick(rng);
            if (!p) break;
            absl::StatusOr<int64_t> v = p->first.to_here(kWait);
            if (!v.ok() || *v != p->second) {
              errors[i] = v.ok() ? absl::StrCat("got ", *v, " want ", p->second)
                                 : v.status().ToString();
            }
            break;
          }
          default:
            pools[i].DropOne(rng);
            pools[i].DropOne(rng);
            break;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kWorkers; ++i) EXPECT_EQ(errors[i], "") << "w" << i;

  size_t held = 0;
  for (Pool& p : pools) held += p.TakeAll().size();
  EXPECT_GT(held, 0u);  // The run did build up references to release.
  // Within kWait everything is released (a completed future's continuation
  // may hold a reference a little after its caller moved on).
  auto released = [&] {
    for (const auto& c : ctx) {
      if (c->num_owned() || c->num_users() || c->num_pending_children() ||
          c->num_in_flight()) {
        return false;
      }
    }
    return true;
  };
  PollUntil(released, kWait);
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_TRUE(ctx[i]->AwaitSettled(absl::ZeroDuration()).ok()) << "w" << i;
  }
  // Every kind of protocol message was exercised.
  std::map<rpc::MessageType, int> sent;
  for (const auto& c : ctx) {
    for (const auto& [type, n] : c->messages_sent()) sent[type] += n;
  }
  EXPECT_GT(sent[kRemoteCall], 0);
  EXPECT_GT(sent[kRRefForkRequest], 0);
  EXPECT_GT(sent[kRRefChildAccept], 0);
  EXPECT_GT(sent[kRRefUserDelete], 0);
  for (int i = 0; i < kWorkers; ++i) {
    EXPECT_EQ(ctx[i]->num_owned(), 0u) << "w" << i;
    for (const auto& o : ctx[i]->Owned()) ADD_FAILURE() << o.DebugString();
    EXPECT_EQ(ctx[i]->num_pending_children(), 0u) << "w" << i;
    EXPECT_EQ(ctx[i]->num_users(), 0u) << "w" << i;
  }
}

}  // namespace
}  // namespace ferry::rref
