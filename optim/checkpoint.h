// Shard checkpoints: a parameter server's named tensors, optimizer state and
// applied-step counter, written to disk without stopping service.
//
// Files: <dir>/<name>.ckpt (latest) and <dir>/<name>.prev.ckpt (the one
// before). A write goes to <dir>/<name>.tmp, is fsynced, the latest becomes
// the previous (rename), the temporary becomes the latest (rename), and the
// directory is fsynced. Format (little-endian): a 32-byte header (magic
// "FERRYCKP", version, body length, CRC32C of the body, CRC32C of the
// header) and the body; see docs/design/checkpoints.md.
//
// Errors: Encode/Write: InvalidArgument for a non-CPU tensor; I/O errors
// name the file and errno. Read/LoadLatest: DataLoss naming the file and
// the reason (bad magic, unsupported version, truncated, checksum mismatch,
// malformed body); NotFound when no checkpoint exists. LoadLatest falls
// back to the previous file and reports what it refused.
//
// Checkpointer: the caller copies its state under its own step lock
// (MaybeCheckpoint's `copy`, a memcpy of the shard), and one background
// thread owned by the Checkpointer encodes and writes it; a newer snapshot
// submitted while one is being written replaces the one waiting (the writer
// never falls behind by more than one). Destruction writes what is waiting,
// then joins the thread.
// Thread safety: free functions are reentrant; every Checkpointer method is
// safe from any thread. Two writers on one <dir>/<name> are not supported.
// Design: docs/design/checkpoints.md
#ifndef FERRY_OPTIM_CHECKPOINT_H_
#define FERRY_OPTIM_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/common/sync.h"
#include "ferry/optim/optim.h"
#include "ferry/tensor/tensor.h"

namespace ferry::optim {

// The file format's version this code writes (and the only one it reads).
inline constexpr uint32_t kCheckpointVersion = 1;

// One shard's state at one step.
struct ShardCheckpoint {
  // Applied optimizer steps when the snapshot was taken.
  int64_t step = 0;
  // Named parameters, in order (names unique; CPU tensors).
  std::vector<std::pair<std::string, Tensor>> tensors;
  // Optimizer::kind() ("sgd", "adam", ...); empty without an optimizer.
  std::string optimizer_kind;
  // Optimizer::ExportStateDict().
  StateDict optimizer;
};

// A deep copy of `params` (named "0", "1", ... unless `names` is given) and
// `optimizer`'s state (may be null) at `step`: the copy to take under the
// step lock.
ShardCheckpoint SnapshotShard(int64_t step, const std::vector<Tensor>& params,
                              const Optimizer* optimizer,
                              const std::vector<std::string>& names = {});
// SnapshotShard into `out`, copying into its tensors where name, dtype and
// shape match (a spare from Checkpointer: warm memory, no page faults).
void SnapshotShardInto(ShardCheckpoint& out, int64_t step,
                       const std::vector<Tensor>& params,
                       const Optimizer* optimizer,
                       const std::vector<std::string>& names = {});

// The file image of `checkpoint` (header and body).
absl::StatusOr<std::string> EncodeCheckpoint(const ShardCheckpoint& checkpoint);
// Parses a file image; `file` names it in errors (DataLoss with the reason).
absl::StatusOr<ShardCheckpoint> DecodeCheckpoint(const std::string& bytes,
                                                 const std::string& file);

// <dir>/<name>.ckpt and <dir>/<name>.prev.ckpt.
std::string LatestCheckpointPath(const std::string& dir,
                                 const std::string& name);
// The previous one (see LatestCheckpointPath).
std::string PreviousCheckpointPath(const std::string& dir,
                                   const std::string& name);

// Writes `checkpoint` as the latest (tmp, fsync, renames; see the top).
// Returns the bytes written.
absl::StatusOr<uint64_t> WriteCheckpoint(const std::string& dir,
                                         const std::string& name,
                                         const ShardCheckpoint& checkpoint);
// Reads and verifies one file.
absl::StatusOr<ShardCheckpoint> ReadCheckpointFile(const std::string& path);

// LoadLatest's result.
struct LoadedCheckpoint {
  ShardCheckpoint checkpoint;  // The newest valid one.
  std::string path;            // The file it came from.
  // Files refused on the way, each "path: reason" (empty when the latest
  // was valid).
  std::vector<std::string> refused;
};
// The newest valid checkpoint of `name` in `dir`: the latest, else the
// previous. NotFound when neither file exists; DataLoss naming every file
// and its reason when none is valid.
absl::StatusOr<LoadedCheckpoint> LoadLatest(const std::string& dir,
                                            const std::string& name);

// When a Checkpointer takes snapshots.
struct CheckpointerOptions {
  std::string dir;   // Created if missing.
  std::string name;  // The shard's name (file stem); non-empty, no '/'.
  // A snapshot once this many steps passed since the last one; 0: never.
  int64_t every_steps = 0;
  // A snapshot once this long passed since the last one; zero: never.
  absl::Duration every = absl::ZeroDuration();
  // The writer thread's nice increment (0-19; 0: unchanged): it yields the
  // CPU to the server's threads.
  int writer_nice = 10;
};

// Writes snapshots on a background thread (see the top of this file).
class Checkpointer {
 public:
  // What the writer has done so far.
  struct Stats {
    int64_t submitted = 0;   // Snapshots handed over.
    int64_t written = 0;     // Written successfully.
    int64_t failed = 0;      // Writes that failed.
    int64_t superseded = 0;  // Replaced by a newer one before being written.
    int64_t last_written_step = -1;  // Step of the newest written; -1: none.
    uint64_t last_bytes = 0;          // Size of the newest written file.
    absl::Duration last_write_time;   // Encode + write + fsync + rename.
    absl::Status last_error;          // Of the newest failed write.
  };

  // Checks `options` (InvalidArgument naming the field) and creates the
  // directory (errors name it); starts the writer thread.
  static absl::StatusOr<std::unique_ptr<Checkpointer>> Create(
      CheckpointerOptions options);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Whether a snapshot is due at `step` (every_steps or every passed since
  // the last submitted one; the first call only starts the clocks).
  bool Due(int64_t step);
  // Hands `snapshot` to the writer and returns at once (see the top).
  void Submit(ShardCheckpoint snapshot);
  // If Due(step): calls `copy` (on this thread, under the caller's lock) on
  // a spare snapshot (the last one written, or empty) to fill, e.g. with
  // SnapshotShardInto, and submits it. Returns whether it did.
  bool MaybeCheckpoint(int64_t step,
                       absl::FunctionRef<void(ShardCheckpoint&)> copy);
  // Waits until every submitted snapshot was written or failed; the status
  // of the newest finished write, the error naming the shard and step
  // (DeadlineExceeded after `timeout`).
  absl::Status Flush(absl::Duration timeout);
  // A copy of the counters.
  Stats stats() const;

 private:
  // Writer states: idle (nothing waiting), writing, stopping (destructor:
  // write what waits, then exit).
  enum class State { kIdle, kWriting, kStopping };
  explicit Checkpointer(CheckpointerOptions options);
  void WriterLoop();

  const CheckpointerOptions options_;
  mutable Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kIdle;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<ShardCheckpoint> pending_ ABSL_GUARDED_BY(mu_);
  // The last snapshot written, its buffers reused by MaybeCheckpoint.
  std::optional<ShardCheckpoint> spare_ ABSL_GUARDED_BY(mu_);
  // Step and time of the last submitted snapshot (clocks for Due).
  std::optional<int64_t> last_step_ ABSL_GUARDED_BY(mu_);
  absl::Time last_time_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // Of the newest finished write (OK before any).
  absl::Status last_status_ ABSL_GUARDED_BY(mu_);
  std::thread writer_;
};

}  // namespace ferry::optim

#endif  // FERRY_OPTIM_CHECKPOINT_H_
