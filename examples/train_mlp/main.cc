// Trains an MLP on seeded Gaussian clusters and checks it reaches
// --target_accuracy on held-out points (exit status 1 otherwise).
//   bazel run --config=opt //examples/train_mlp -- --steps=400
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "ferry/examples/train_mlp/train_mlp.h"

ABSL_FLAG(int64_t, steps, 400, "training steps");
ABSL_FLAG(int64_t, batch, 64, "batch size");
ABSL_FLAG(int64_t, hidden, 64, "hidden width");
ABSL_FLAG(uint64_t, seed, 1, "seed for data and initialization");
ABSL_FLAG(double, target_accuracy, 0.95, "held-out accuracy to reach");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ferry::examples::MlpConfig c;
  c.steps = absl::GetFlag(FLAGS_steps);
  c.batch = absl::GetFlag(FLAGS_batch);
  c.hidden = absl::GetFlag(FLAGS_hidden);
  c.seed = absl::GetFlag(FLAGS_seed);
  auto r = ferry::examples::TrainMlp(c, &std::cout);
  if (!r.ok()) {
    std::cerr << "train_mlp: " << r.status() << "\n";
    return 2;
  }
  const double target = absl::GetFlag(FLAGS_target_accuracy);
  std::cout << "held-out accuracy " << r->test_accuracy << " (target " << target
            << ")\n";
  return r->test_accuracy >= target ? 0 : 1;
}
