// Work: the handle every c10d call returns.
//
// A Work completes exactly once, with OK or an error, when the operation it
// stands for has finished on this rank (for CPU backends: the output tensors
// hold their final values; for NCCL: the GPU stream has finished it).
//
//   std::shared_ptr<Work> w = pg->Allreduce(t);
//   RETURN_IF_ERROR(w->Wait());               // or w->GetFuture().Then(...)
//
// Wait(timeout) only bounds how long the caller waits: when it expires Wait
// returns DeadlineExceeded naming the work, and the operation carries on
// (bounded by its own timeout, see types.h).
//
// Callbacks added through GetFuture() run on the thread that completes the
// work (a backend's worker thread, or a thread in Wait where the backend
// polls there, see PollBeforeBlocking) or inline when already complete; they
// must
// not block and must not issue and wait on another collective of the same
// backend (its worker would wait on itself).
//
// Thread safety: all methods are safe from any thread.
#ifndef FERRY_C10D_WORK_H_
#define FERRY_C10D_WORK_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ferry/common/future.h"

namespace ferry {
namespace c10d {

// The handle of one asynchronous collective: wait on it, or its future.
class Work {
 public:
  // `description` names the operation in errors, e.g.
  // "gloo Allreduce #3 (rank 0 of 4)".
  explicit Work(std::string description);
  virtual ~Work();

  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // A work that is already complete with `status` (an error for calls
  // rejected before they were queued, OK for no-ops).
  static std::shared_ptr<Work> Completed(std::string description,
                                         absl::Status status);

  const std::string& description() const { return description_; }  // As given.

  bool IsCompleted() const;  // Completed, with any status.
  // Completed with OK.
  bool IsSuccess() const;
  // The error the work completed with; OK while pending or on success.
  absl::Status status() const;

  // Waits until the work completes or `timeout` passes. Returns the work's
  // status, or DeadlineExceeded naming the work and `timeout`.
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration());

  // Completes with the work's status.
  Future<void> GetFuture() const { return future_; }

  // For backends: completes the work; returns false (and changes nothing)
  // if it was already complete.
  bool Complete(absl::Status status);

  // RecvAnysource: the rank the message came from, set by the backend
  // before it completes the work; -1 otherwise.
  int source_rank() const { return source_rank_.load(); }
  void set_source_rank(int rank) { source_rank_.store(rank); }  // For backends.

 protected:
  // Called by Wait, on the waiting thread, before it blocks: a backend may
  // finish the work here (Complete) by polling its device for up to
  // `budget`, which spares the hand-off from its completion thread. Must not
  // block past `budget`. Default: nothing.
  virtual void PollBeforeBlocking(absl::Duration /*budget*/) {}

 private:
  const std::string description_;
  Promise<void> promise_;
  const Future<void> future_;
  std::atomic<int> source_rank_{-1};
};

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_WORK_H_
