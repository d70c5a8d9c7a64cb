// examples/parameter_server --device=cuda under ferry_run, as the testonly
// parameter_server_fake binary runs it: every device process has its own
// FakeDeviceApi device (host memory) computing through the host backend, so
// the GPU job's code (device maps, staged tensors, distributed autograd and
// the servers' optimizers on device tensors, autograd::to for a CPU
// server) runs without a GPU. One server keeps its shard on the device and
// the other on the CPU, both ways round (ps0 owns the head); the trainers
// must reach the CPU job's held-out accuracy (the threshold of
// //tests/parameter_server:parameter_server_example_test at this size).
// The real CUDA binary runs in tools/gpu_check's step "ps".
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

using testutil::RunCommand;
using testutil::RunfilePath;

constexpr char kFake[] = "examples/parameter_server/parameter_server_fake";

// ferry_run --nproc `nproc` [`launcher` flags] -- the fake binary `flags`.
std::pair<int, std::string> Launch(int nproc, std::vector<std::string> flags,
                                   std::vector<std::string> launcher = {}) {
  std::vector<std::string> argv = {RunfilePath("tools/launcher/ferry_run"),
                                   "--nproc", absl::StrCat(nproc),
                                   "--timeout_s", "240"};
  argv.insert(argv.end(), launcher.begin(), launcher.end());
  argv.push_back("--");
  argv.push_back(RunfilePath(kFake));
  argv.insert(argv.end(), flags.begin(), flags.end());
  return RunCommand(std::move(argv), {}, absl::Minutes(5));
}

// The value of `key` in the first line of `out` that contains every one of
// `parts` ("" when there is none).
std::string Field(const std::string& out, const std::vector<std::string>& parts,
                  const std::string& key) {
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    bool all = true;
    for (const std::string& p : parts) all = all && absl::StrContains(line, p);
    if (!all) continue;
    for (absl::string_view word : absl::StrSplit(line, ' ')) {
      if (absl::ConsumePrefix(&word, key + "=")) return std::string(word);
    }
  }
  return "";
}

uint64_t Count(const std::string& text) {
  uint64_t n = 0;
  return absl::SimpleAtoi(text, &n) ? n : 0;
}

// Two servers (one shard on the device, one on the CPU) and two trainers
// on the device: both reach the target, the device server's parameters are
// on cuda:0 (the tensors' own device, read by the server's inspector) and
// its stage landed the trainers' tensors on its device (the gradients of
// the lookups it served) and staged its replies back, while the CPU server
// staged nothing.
TEST(ParameterServerDevice, ShardsOnTheDeviceAndTheCpuReachTheCpuAccuracy) {
  for (const bool head_on_device : {true, false}) {
    SCOPED_TRACE(head_on_device ? "ps0 (head) on cuda:0, ps1 on cpu"
                                : "ps0 (head) on cpu, ps1 on cuda:0");
    const int gpu = head_on_device ? 0 : 1, cpu = 1 - gpu;
    auto [code, out] = Launch(
        4, {"--servers=2", "--trainers=2", "--iterations=150",
            "--log_every=50", "--vocab=200", "--target_accuracy=0.85",
            "--device=cuda",
            head_on_device ? "--server_devices=cuda,cpu"
                           : "--server_devices=cpu,cuda:0"});
    ASSERT_EQ(code, 0) << out;
    EXPECT_TRUE(absl::StrContains(
        out, head_on_device
                 ? "[0]: ps0: owns embedding rows [0, 100) and the dense head "
                   "on cuda:0\n"
                 : "[1]: ps1: owns embedding rows [100, 200) on cuda:0\n"))
        << out;
    EXPECT_TRUE(absl::StrContains(
        out, head_on_device
                 ? "[1]: ps1: owns embedding rows [100, 200) on cpu\n"
                 : "[0]: ps0: owns embedding rows [0, 100) and the dense head "
                   "on cpu\n"))
        << out;
    const std::string g = absl::StrCat("ps", gpu, ": inspect ");
    const std::string c = absl::StrCat("ps", cpu, ": inspect ");
    EXPECT_EQ(Field(out, {g, "parameter_server"}, "shard_device"), "cuda:0")
        << out;
    EXPECT_EQ(Field(out, {c, "parameter_server"}, "shard_device"), "cpu")
        << out;
    EXPECT_EQ(Field(out, {g, "devices: worker"}, "devices"), "cuda:0") << out;
    for (int t = 0; t < 2; ++t) {
      const std::vector<std::string> row = {
          g, "devices: staged", absl::StrCat("peer=trainer", t, " ")};
      // Per trainer, 150 training steps and 4 held-out batches. Out: each
      // lookup's partial sums; on ps0 also each head call's logits and the
      // gradient of each training step's h. In: the gradient of each
      // training lookup; on ps0 also each call's h and the gradient of each
      // training step's logits.
      EXPECT_EQ(Count(Field(out, row, "tensors_out")),
                head_on_device ? 154u + 154 + 150 : 154u)
          << out;
      EXPECT_EQ(Count(Field(out, row, "tensors_in")),
                head_on_device ? 150u + 154 + 150 : 150u)
          << out;
      EXPECT_EQ(Field(out, row, "refused"), "0") << out;
      EXPECT_TRUE(absl::StrContains(
          out, absl::StrCat("[", t + 2, "]: trainer", t,
                            " done: 150 iterations")))
          << out;
    }
    EXPECT_FALSE(absl::StrContains(out, c + "devices: staged")) << out;
    const std::vector<std::string> reached =
        absl::StrSplit(out, "target 0.85 reached");
    EXPECT_EQ(reached.size(), 3u) << out;  // One per trainer.
  }
}

// --fault_tolerant with checkpoints: ps0, its shard and the head on cuda:0,
// SIGKILLs itself at applied step 60; ferry_run restarts it, it restores its
// newest checkpoint (written from host copies of the device parameters)
// onto cuda:0 with the fingerprint the snapshot had, rejoins, and the
// trainers, after re-creating their optimizers there, reach the target.
TEST(ParameterServerDevice, ADeviceServerRestoresItsCheckpointOntoTheDevice) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  auto [code, out] = Launch(
      4,
      {"--servers=2", "--trainers=2", "--iterations=150", "--log_every=50",
       "--vocab=200", "--target_accuracy=0.85", "--device=cuda",
       "--server_devices=cuda,cpu", "--fault_tolerant",
       absl::StrCat("--checkpoint_dir=", tmp, "/ckpt"), "--checkpoint_every=20",
       "--kill_server=0", "--kill_server_at_step=60"},
      {"--elastic_ranks", "2-3", "--restart_ranks", "0-1", "--rank_restarts",
       "2"});
  ASSERT_EQ(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "[0]: ps0: killing itself (SIGKILL) at "
                                     "applied step 60"))
      << out;
  // "restored applied step K from DIR/ps0.ckpt (fingerprint F)".
  const std::string restored = "[0]: ps0: restarted (FERRY_RUN_RESTART=1): "
                               "restored applied step ";
  const size_t at = out.find(restored);
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line =
      out.substr(at + restored.size(),
                 out.find('\n', at) - at - restored.size());
  const std::string step = line.substr(0, line.find(' '));
  const size_t f = line.find("(fingerprint ");
  ASSERT_NE(f, std::string::npos) << line;
  const std::string fingerprint = line.substr(f);
  EXPECT_TRUE(absl::StrContains(
      out, absl::StrCat("[0]: ps0: checkpoint of applied step ", step,
                        " taken ", fingerprint)))
      << step << " " << fingerprint << "\n" << out;
  // Both instances serve from cuda:0.
  const std::vector<std::string> starts = absl::StrSplit(
      out, "[0]: ps0: owns embedding rows [0, 100) and the dense head on "
           "cuda:0\n");
  EXPECT_EQ(starts.size(), 3u) << out;
  EXPECT_EQ(Field(out, {"ps0: inspect parameter_server", "restart=1"},
                  "shard_device"),
            "cuda:0")
      << out;
  const std::vector<std::string> reached =
      absl::StrSplit(out, "target 0.85 reached");
  EXPECT_EQ(reached.size(), 3u) << out;
}

// A shard device the server does not have: the job stops at once (no
// worker waits for it), the error naming the server and the device.
TEST(ParameterServerDevice, AShardDeviceTheServerLacksIsAClearError) {
  const absl::Time start = absl::Now();
  auto [code, out] =
      Launch(4, {"--servers=2", "--trainers=2", "--device=cuda",
                 "--server_devices=cuda:1,cpu", "--fake_devices=1"});
  EXPECT_NE(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "ps0: moving its shard to cuda:1"))
      << out;
  EXPECT_TRUE(absl::StrContains(out, "cuda:1 is not one of the 1 fake devices"))
      << out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(60)) << out;
  // Trainers asking for a device their process lacks: refused at InitWorker
  // naming the trainer and the device.
  auto [trainer_code, trainer_out] = Launch(
      3, {"--servers=1", "--trainers=2", "--device=cuda:1",
          "--server_devices=cpu", "--fake_devices=1"});
  EXPECT_NE(trainer_code, 0) << trainer_out;
  EXPECT_TRUE(absl::StrContains(trainer_out, "worker 'trainer"))
      << trainer_out;
  EXPECT_TRUE(absl::StrContains(trainer_out, "cuda:1 does not exist"))
      << trainer_out;
}

// Flags that cannot make a job are refused before any worker starts.
TEST(ParameterServerDevice, InconsistentDeviceFlagsAreRefused) {
  auto [code, out] = Launch(4, {"--servers=2", "--trainers=2", "--device=cpu",
                                "--server_devices=cuda,cpu"});
  EXPECT_NE(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(
      out, "--server_devices puts ps0's shard on cuda:0, which needs "
           "trainers on a device too"))
      << out;
  auto [count_code, count_out] =
      Launch(4, {"--servers=2", "--trainers=2", "--device=cuda",
                 "--server_devices=cuda"});
  EXPECT_NE(count_code, 0) << count_out;
  EXPECT_TRUE(absl::StrContains(count_out, "names 1 devices, --servers=2"))
      << count_out;
  auto [bad_code, bad_out] =
      Launch(4, {"--servers=2", "--trainers=2", "--device=gpu"});
  EXPECT_NE(bad_code, 0) << bad_out;
  EXPECT_TRUE(absl::StrContains(bad_out, "--device: 'gpu' is not cpu, cuda"))
      << bad_out;
}

}  // namespace
}  // namespace ferry
