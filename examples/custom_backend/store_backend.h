// StoreBackend: an example c10d backend defined outside c10d/, moving
// tensors through the rendezvous Store itself (no sockets of its own).
//
// It implements Allreduce, Broadcast and Barrier; every other operation is
// left to c10d::Backend's default, which reports Unimplemented naming this
// backend and the operation. Useful as a template and for tiny CPU tensors
// (every byte goes through the store), not for bulk data.
//
// Protocol, for the k-th call (all ranks issue calls in the same order):
// rank r sets "c/k/r" to a header (operation, dtype, element count, root,
// ReduceOp, whether its arguments were valid) followed, for Allreduce and
// the Broadcast root, by the tensor's bytes; then it waits for every rank's
// key, checks the headers agree, and finishes locally:
//   Allreduce: reduces the ranks' bytes in rank order (every rank gets
//              bit-identical results);
//   Broadcast: copies the root's bytes;
//   Barrier:   nothing more (the wait is the barrier).
// Finally each rank counts itself out on "c/k/done"; the last one deletes
// the call's keys.
// Calls run on one worker thread in issue order. Headers carry dtype and
// element count (and root), so mismatched calls fail with InvalidArgument on
// every rank; a rank that never calls makes the others fail with the store's
// DeadlineExceeded (naming the missing keys) after the timeout.
//
// Thread safety: as c10d::Backend.
#ifndef FERRY_EXAMPLES_CUSTOM_BACKEND_STORE_BACKEND_H_
#define FERRY_EXAMPLES_CUSTOM_BACKEND_STORE_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "ferry/c10d/backend.h"
#include "ferry/c10d/registry.h"
#include "ferry/common/executor.h"
#include "ferry/common/sync.h"
#include "ferry/store/store.h"

namespace ferry {
namespace examples {

class StoreBackend : public c10d::Backend {
 public:
  StoreBackend(std::shared_ptr<Store> store, int rank, int size,
               absl::Duration timeout);
  ~StoreBackend() override;

  std::shared_ptr<c10d::Work> Allreduce(
      Tensor tensor, const c10d::AllreduceOptions& options = {}) override;
  std::shared_ptr<c10d::Work> Broadcast(
      Tensor tensor, const c10d::BroadcastOptions& options = {}) override;
  std::shared_ptr<c10d::Work> Barrier(
      const c10d::BarrierOptions& options = {}) override;

 private:
  // The shared argument checks, for this backend's rank and size.
  c10d::ArgChecks Checks() const;
  // Runs `fn` on the worker thread, in issue order, completing the Work.
  std::shared_ptr<c10d::Work> Submit(
      c10d::OpType op, absl::AnyInvocable<absl::Status(int64_t)> fn);
  // Counts this rank out of call `prefix`; the last one deletes `keys`.
  absl::Status Finish(const std::string& prefix,
                      const std::vector<std::string>& keys);

  const std::shared_ptr<Store> store_;
  Mutex mu_;
  int64_t next_call_ ABSL_GUARDED_BY(mu_) = 0;
  ThreadPoolExecutor worker_;
};

// Registers StoreBackend as `name` for CPU tensors.
absl::Status RegisterStoreBackend(c10d::BackendRegistry& registry,
                                  const std::string& name = "store");

}  // namespace examples
}  // namespace ferry

#endif  // FERRY_EXAMPLES_CUSTOM_BACKEND_STORE_BACKEND_H_
