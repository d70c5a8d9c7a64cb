// Fault-tolerant DDP as real processes (examples/ddp/elastic_main.cc over a
// TCPStore served here on loopback, port 0):
//  - 4 ranks, one SIGKILLed mid-backward: the survivors re-form at 3 ranks,
//    finish the epoch with bit-identical state; a replacement joins at the
//    next quorum, receives parameters and optimizer state from a live peer
//    and matches them bit for bit.
//  - the same with the liveness probe and a 60 s heartbeat timeout: the dead
//    rank is found by the probe, long before its heartbeat goes stale (over
//    Gloo's TCP pairs, and over shared memory in front of Gloo).
//  - a rank SIGSTOPped is treated as dead (heartbeat timeout; the probe is
//    on and must not decide); SIGCONTed it is refused as a stale member and
//    the survivors' state is untouched.
#include <signal.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ferry/store/tcp_store_server.h"
#include "ferry/tests/util/subprocess.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using testutil::Subprocess;

// Timeouts short enough for a test, long enough for a loaded machine.
constexpr int kHeartbeatTimeoutMs = 2000;
constexpr int kCollectiveTimeoutMs = 3000;

struct Event {
  std::string name;
  std::map<std::string, std::string> fields;
};

// Parses "<EVENT> k=v k=v ..." lines (worker output; other lines ignored).
std::vector<Event> Parse(const std::string& text) {
  std::vector<Event> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() < 2 || !absl::StrContains(parts[1], "id=")) continue;
    Event e;
    e.name = parts[0];
    for (size_t i = 1; i < parts.size(); ++i) {
      size_t eq = parts[i].find('=');
      if (eq == std::string::npos) continue;
      e.fields[parts[i].substr(0, eq)] = parts[i].substr(eq + 1);
    }
    out.push_back(std::move(e));
  }
  return out;
}

// The comma-separated ids of `list`, sorted (generation 1's order is the
// order the processes arrived in).
std::vector<std::string> Sorted(const std::string& list) {
  std::vector<std::string> v = absl::StrSplit(list, ',');
  std::sort(v.begin(), v.end());
  return v;
}

// A pointer into `events` (keep the vector alive while using it), or null.
const Event* Find(const std::vector<Event>& events, const std::string& name,
                  const std::string& key = "", const std::string& value = "") {
  for (const Event& e : events) {
    if (e.name != name) continue;
    if (!key.empty()) {
      auto it = e.fields.find(key);
      if (it == e.fields.end() || it->second != value) continue;
    }
    return &e;
  }
  return nullptr;
}

class FtDdp : public ::testing::Test {
 public:
  void SetUp() override {
    TcpStoreServer::Options o;
    o.host = "127.0.0.1";
    auto server = TcpStoreServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  std::unique_ptr<Subprocess> Spawn(const std::string& id,
                                    std::vector<std::string> extra) {
    std::vector<std::string> argv = {
        testutil::RunfilePath("examples/ddp/ddp_elastic"),
        absl::StrCat("--port=", server_->port()),
        absl::StrCat("--id=", id),
        absl::StrCat("--heartbeat_timeout_ms=", kHeartbeatTimeoutMs),
        absl::StrCat("--collective_timeout_ms=", kCollectiveTimeoutMs)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto child = Subprocess::Spawn(
        argv, testutil::SpawnOptions().CaptureStdout().MergeStderr());
    EXPECT_TRUE(child.ok()) << child.status();
    return child.ok() ? std::move(*child) : nullptr;
  }

 protected:
  std::unique_ptr<TcpStoreServer> server_;
};

absl::Time Deadline() { return absl::Now() + absl::Seconds(120); }

// Reads `child` until a line starting with `event` that contains `needle`.
std::string ReadUntilEvent(Subprocess& child, const std::string& event,
                           const std::string& needle, std::string* all) {
  std::string got = child.ReadUntil(Deadline(), [&](const std::string& text) {
    for (const Event& e : Parse(text)) {
      if (e.name != event) continue;
      std::string joined;
      for (const auto& [k, v] : e.fields) joined += k + "=" + v + " ";
      if (absl::StrContains(joined, needle)) return true;
    }
    return false;
  });
  *all += got;
  return got;
}

TEST_F(FtDdp, SigkillMidBackwardSurvivorsReformAndReplacementMatches) {
  constexpr int kSteps = 25;
  std::vector<std::unique_ptr<Subprocess>> workers;
  std::vector<std::string> out(4);
  for (int i = 0; i < 4; ++i) {
    std::vector<std::string> extra = {"--min_size=4",
                                      absl::StrCat("--steps=", kSteps),
                                      "--hold_at_step=12",
                                      "--hold_until_size=4"};
    if (i == 0) extra.push_back("--die_at_step=5");
    workers.push_back(Spawn(absl::StrCat("w", i), extra));
    ASSERT_NE(workers.back(), nullptr);
  }
  // A survivor re-forms at 3 ranks; then the replacement starts.
  std::string got = ReadUntilEvent(*workers[1], "REFORMED", "gen=2", &out[1]);
  ASSERT_NE(Find(Parse(got), "REFORMED", "gen", "2"), nullptr) << got;
  auto replacement = Spawn("r0", {absl::StrCat("--steps=", kSteps)});
  ASSERT_NE(replacement, nullptr);

  // The killed rank died by SIGKILL.
  absl::StatusOr<int> dead = workers[0]->Wait(Deadline());
  EXPECT_FALSE(dead.ok());
  EXPECT_TRUE(absl::StrContains(dead.status().message(), "9") ||
              absl::StrContains(dead.status().message(), "KILL"))
      << dead.status();
  out[0] += workers[0]->ReadAll(Deadline());
  for (int i = 1; i < 4; ++i) {
    absl::StatusOr<int> code = workers[i]->Wait(Deadline());
    out[i] += workers[i]->ReadAll(Deadline());
    ASSERT_TRUE(code.ok()) << code.status() << "\n" << out[i];
    EXPECT_EQ(*code, 0) << out[i];
  }
  absl::StatusOr<int> rcode = replacement->Wait(Deadline());
  std::string rout = replacement->ReadAll(Deadline());
  ASSERT_TRUE(rcode.ok()) << rcode.status() << "\n" << rout;
  EXPECT_EQ(*rcode, 0) << rout;

  // The dying rank was inside backward (bucket 1's hook) at step 5.
  EXPECT_NE(Find(Parse(out[0]), "DYING", "step", "5"), nullptr) << out[0];
  EXPECT_EQ(Find(Parse(out[0]), "FINAL"), nullptr) << out[0];

  // Generation 2: the three survivors, identical state, same step.
  std::string gen2_hash, gen3_hash, final_hash;
  for (int i = 1; i < 4; ++i) {
    std::vector<Event> ev = Parse(out[i]);
    EXPECT_NE(Find(ev, "STEP_FAILED"), nullptr) << out[i];
    const Event* g2 = Find(ev, "REFORMED", "gen", "2");
    ASSERT_NE(g2, nullptr) << out[i];
    EXPECT_EQ(g2->fields.at("size"), "3");
    EXPECT_EQ(Sorted(g2->fields.at("members")),
              (std::vector<std::string>{"w1", "w2", "w3"}));
    if (gen2_hash.empty()) gen2_hash = g2->fields.at("hash");
    EXPECT_EQ(g2->fields.at("hash"), gen2_hash) << out[i];
    const Event* g3 = Find(ev, "REFORMED", "gen", "3");
    ASSERT_NE(g3, nullptr) << out[i];
    EXPECT_EQ(g3->fields.at("size"), "4");
    EXPECT_EQ(g3->fields.at("joined"), "r0");
    if (gen3_hash.empty()) gen3_hash = g3->fields.at("hash");
    EXPECT_EQ(g3->fields.at("hash"), gen3_hash) << out[i];
    const Event* fin = Find(ev, "FINAL");
    ASSERT_NE(fin, nullptr) << out[i];
    EXPECT_EQ(fin->fields.at("identical"), "1");
    EXPECT_EQ(fin->fields.at("gen"), "3");
    EXPECT_EQ(fin->fields.at("step"), absl::StrCat(kSteps));
    if (final_hash.empty()) final_hash = fin->fields.at("hash");
    EXPECT_EQ(fin->fields.at("hash"), final_hash) << out[i];
  }
  // The replacement: its own initial parameters, then exactly the peers'
  // state (parameters + momentum) at generation 3, and the same end.
  std::vector<Event> rev = Parse(rout);
  const Event* init = Find(rev, "INIT");
  const Event* ready = Find(rev, "READY");
  const Event* rfin = Find(rev, "FINAL");
  ASSERT_NE(init, nullptr) << rout;
  ASSERT_NE(ready, nullptr) << rout;
  ASSERT_NE(rfin, nullptr) << rout;
  EXPECT_EQ(ready->fields.at("gen"), "3");
  EXPECT_EQ(ready->fields.at("rank"), "3");
  EXPECT_EQ(ready->fields.at("hash"), gen3_hash) << rout;
  EXPECT_NE(init->fields.at("hash"), ready->fields.at("hash"));
  EXPECT_NE(ready->fields.at("step"), "0");
  EXPECT_EQ(rfin->fields.at("hash"), final_hash) << rout;
  EXPECT_EQ(rfin->fields.at("identical"), "1");
  EXPECT_NE(gen3_hash, final_hash);  // Training went on after the join.
}

// With the liveness probe, a SIGKILLed rank is known dead as soon as its
// listener is gone: recovery long before a 60 s heartbeat timeout. `extra`
// is passed to every worker (e.g. the shared-memory backend).
void SigkillWithProbe(FtDdp* t, const std::vector<std::string>& extra_all) {
  constexpr int kSteps = 15;
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int i = 0; i < 4; ++i) {
    std::vector<std::string> extra = {"--min_size=4",
                                      absl::StrCat("--steps=", kSteps),
                                      "--probe", "--heartbeat_timeout_ms=60000"};
    extra.insert(extra.end(), extra_all.begin(), extra_all.end());
    if (i == 3) extra.push_back("--die_at_step=4");
    workers.push_back(t->Spawn(absl::StrCat("w", i), extra));
    ASSERT_NE(workers.back(), nullptr);
  }
  const absl::Time start = absl::Now();
  std::string final_hash;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<int> code = workers[i]->Wait(Deadline());
    std::string out = workers[i]->ReadAll(Deadline());
    ASSERT_TRUE(code.ok()) << code.status() << "\n" << out;
    EXPECT_EQ(*code, 0) << out;
    const std::vector<Event> ev = Parse(out);
    const Event* g2 = Find(ev, "REFORMED", "gen", "2");
    ASSERT_NE(g2, nullptr) << out;
    EXPECT_EQ(g2->fields.at("size"), "3");
    const Event* fin = Find(ev, "FINAL");
    ASSERT_NE(fin, nullptr) << out;
    EXPECT_EQ(fin->fields.at("identical"), "1");
    if (final_hash.empty()) final_hash = fin->fields.at("hash");
    EXPECT_EQ(fin->fields.at("hash"), final_hash) << out;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(40));
  EXPECT_FALSE(workers[3]->Wait(Deadline()).ok());  // Killed.
}

TEST_F(FtDdp, SigkillWithProbeRecoversBeforeHeartbeatTimeout) {
  SigkillWithProbe(this, {});
}

// The same over the default same-host path: shared memory in front of Gloo.
TEST_F(FtDdp, SigkillWithProbeOverSharedMemory) {
  SigkillWithProbe(this, {"--shm"});
}

TEST_F(FtDdp, SigstopStalledRankDeclaredDeadThenRefusedWhenResumed) {
  constexpr int kSteps = 40;
  std::vector<std::unique_ptr<Subprocess>> workers;
  std::vector<std::string> out(4);
  for (int i = 0; i < 4; ++i) {
    // The probe is on: a stalled process still accepts connections, so
    // only its heartbeat can show it dead.
    std::vector<std::string> extra = {
        "--min_size=4", absl::StrCat("--steps=", kSteps), "--probe"};
    if (i == 2) extra.push_back("--stop_at_step=4");
    workers.push_back(Spawn(absl::StrCat("w", i), extra));
    ASSERT_NE(workers.back(), nullptr);
  }
  std::string got = ReadUntilEvent(*workers[2], "STOPPING", "", &out[2]);
  ASSERT_NE(Find(Parse(got), "STOPPING"), nullptr) << got;
  // The survivors detect it (heartbeat timeout) and re-form without it.
  got = ReadUntilEvent(*workers[0], "REFORMED", "gen=2", &out[0]);
  const std::vector<Event> ev0 = Parse(got);
  const Event* g2 = Find(ev0, "REFORMED", "gen", "2");
  ASSERT_NE(g2, nullptr) << got;
  EXPECT_EQ(Sorted(g2->fields.at("members")),
            (std::vector<std::string>{"w0", "w1", "w3"}));
  // It wakes up: refused as a member of generation 1.
  ASSERT_TRUE(workers[2]->Signal(SIGCONT).ok());
  absl::StatusOr<int> stale = workers[2]->Wait(Deadline());
  out[2] += workers[2]->ReadAll(Deadline());
  ASSERT_TRUE(stale.ok()) << stale.status() << "\n" << out[2];
  EXPECT_EQ(*stale, 3) << out[2];
  std::vector<Event> sev = Parse(out[2]);
  const Event* refused = Find(sev, "REFUSED");
  ASSERT_NE(refused, nullptr) << out[2];
  EXPECT_NE(Find(sev, "RESUMED"), nullptr) << out[2];
  EXPECT_EQ(Find(sev, "STEP", "gen", "2"), nullptr) << out[2];
  EXPECT_TRUE(absl::StrContains(out[2], "generation 1")) << out[2];

  std::string final_hash;
  for (int i : {0, 1, 3}) {
    absl::StatusOr<int> code = workers[i]->Wait(Deadline());
    out[i] += workers[i]->ReadAll(Deadline());
    ASSERT_TRUE(code.ok()) << code.status() << "\n" << out[i];
    EXPECT_EQ(*code, 0) << out[i];
    const std::vector<Event> ev = Parse(out[i]);
    const Event* fin = Find(ev, "FINAL");
    ASSERT_NE(fin, nullptr) << out[i];
    EXPECT_EQ(fin->fields.at("gen"), "2");
    EXPECT_EQ(fin->fields.at("size"), "3");
    EXPECT_EQ(fin->fields.at("identical"), "1");
    EXPECT_EQ(fin->fields.at("step"), absl::StrCat(kSteps));
    if (final_hash.empty()) final_hash = fin->fields.at("hash");
    EXPECT_EQ(fin->fields.at("hash"), final_hash) << out[i];
  }
}

}  // namespace
}  // namespace ferry
