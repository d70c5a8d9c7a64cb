#include "ferry/ddp/reducer.h"

#include <algorithm>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/autograd/grad_mode.h"
#include "ferry/autograd/node.h"
#include "ferry/common/status.h"
#include "ferry/tensor/cuda/device_ops.h"

namespace ferry::ddp {
namespace {

// Gradients on a CUDA device are bucketed and copied by the compute backend
// their storage carries (tensor/cuda/device_ops.h); CPU ones by tensor ops.
absl::StatusOr<cuda::DeviceOps*> OpsOf(const Tensor& t, const char* what) {
  cuda::DeviceOps* ops = cuda::DeviceOpsOf(t);
  if (ops == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "DDP: ", what, " on ", t.device().ToString(),
        " has no compute backend (a device tensor made without a CudaContext, "
        "e.g. by DLPack import, cannot be reduced)"));
  }
  return ops;
}

// dst = src (same shape and dtype; both on dst's device).
absl::Status CopyInto(const Tensor& dst, const Tensor& src) {
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    Tensor(dst).copy_(src);
    return absl::OkStatus();
  }
  if (dst.device() != src.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DDP: a gradient on ", src.device().ToString(),
        " for a bucket on ", dst.device().ToString()));
  }
  ASSIGN_OR_RETURN(cuda::DeviceOps * ops, OpsOf(dst, "a bucket"));
  if (src.dtype() != dst.dtype()) {  // A compression hook's result.
    ASSIGN_OR_RETURN(Tensor cast, ops->Cast(src, dst.dtype()));
    return ops->CopyInto(dst, cast);
  }
  return ops->CopyInto(dst, src);
}

absl::Status ZeroOut(const Tensor& t) {
  if (t.device().is_cpu()) {
    Tensor(t).zero_();
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(cuda::DeviceOps * ops, OpsOf(t, "a bucket"));
  return ops->Fill(t, 0);
}

// A contiguous copy of `t` on its device.
absl::StatusOr<Tensor> CloneOf(const Tensor& t) {
  if (t.device().is_cpu()) return t.clone();
  ASSIGN_OR_RETURN(cuda::DeviceOps * ops, OpsOf(t, "a gradient"));
  ASSIGN_OR_RETURN(Tensor out, ops->Empty(t.sizes(), t.dtype(), t.device()));
  RETURN_IF_ERROR(ops->CopyInto(out, t));
  return out;
}

// A zeroed flat buffer of `numel` elements like `like` (its dtype, device).
absl::StatusOr<Tensor> ZeroBuffer(int64_t numel, const Tensor& like) {
  if (like.device().is_cpu()) return zeros({numel}, like.dtype());
  ASSIGN_OR_RETURN(cuda::DeviceOps * ops, OpsOf(like, "a parameter"));
  ASSIGN_OR_RETURN(Tensor out, ops->Empty({numel}, like.dtype(), like.device()));
  RETURN_IF_ERROR(ops->Fill(out, 0));
  return out;
}

// The hook's result future for `out` once `work` completes.
Future<Tensor> WhenDone(const std::shared_ptr<c10d::Work>& work, Tensor out) {
  return work->GetFuture().Then(
      [out](const absl::Status& s) -> absl::StatusOr<Tensor> {
        if (!s.ok()) return c10d::CopyStatus(s);
        return out;
      });
}

// A device bucket's collective runs after the work queued on its stream.
c10d::AllreduceOptions OnStream(const GradBucket& b) {
  c10d::AllreduceOptions o;
  o.stream = b.stream;
  return o;
}

CommHook CompressHook(DType wire) {
  return [wire](c10d::ProcessGroup& pg, const GradBucket& b) -> Future<Tensor> {
    if (!b.buffer.device().is_cpu()) {
      // On a device: divide, convert, all-reduce the 16-bit copy; the
      // reducer converts it back into the bucket.
      absl::StatusOr<cuda::DeviceOps*> ops = OpsOf(b.buffer, "a bucket");
      if (!ops.ok()) return MakeErrorFuture<Tensor>(ops.status());
      absl::StatusOr<Tensor> scaled =
          (*ops)->Scalar(cuda::math::BinaryOp::kDiv, b.buffer,
                         static_cast<double>(b.world_size));
      if (!scaled.ok()) return MakeErrorFuture<Tensor>(scaled.status());
      absl::StatusOr<Tensor> compressed = (*ops)->Cast(*scaled, wire);
      if (!compressed.ok()) {
        return MakeErrorFuture<Tensor>(Annotate(
            compressed.status(),
            absl::StrCat("DDP ", DTypeName(wire), " hook, bucket ", b.index)));
      }
      return WhenDone(pg.Allreduce(*compressed, OnStream(b)), *compressed);
    }
    Tensor compressed = b.buffer.div(b.world_size).to(wire);
    return WhenDone(pg.Allreduce(compressed), compressed);
  };
}

}  // namespace

CommHook AllreduceHook() {
  return [](c10d::ProcessGroup& pg, const GradBucket& b) -> Future<Tensor> {
    Tensor buffer = b.buffer;
    if (buffer.device().is_cpu()) {
      buffer.div_(b.world_size);
      return WhenDone(pg.Allreduce(buffer), buffer);
    }
    // On a device: the quotient is a new tensor, reduced in place; the
    // reducer copies it back into the bucket.
    absl::StatusOr<cuda::DeviceOps*> ops = OpsOf(buffer, "a bucket");
    if (!ops.ok()) return MakeErrorFuture<Tensor>(ops.status());
    absl::StatusOr<Tensor> scaled = (*ops)->Scalar(
        cuda::math::BinaryOp::kDiv, buffer, static_cast<double>(b.world_size));
    if (!scaled.ok()) return MakeErrorFuture<Tensor>(scaled.status());
    return WhenDone(pg.Allreduce(*scaled, OnStream(b)), *scaled);
  };
}

CommHook Fp16CompressHook() { return CompressHook(DType::kFloat16); }
CommHook Bf16CompressHook() { return CompressHook(DType::kBFloat16); }

std::vector<std::vector<int>> AssignBuckets(const std::vector<Tensor>& params,
                                            const std::vector<int>& order,
                                            int64_t first_cap, int64_t cap) {
  std::vector<std::vector<int>> groups;
  std::vector<int> current;
  int64_t bytes = 0;
  int64_t limit = first_cap;
  for (int index : order) {
    const Tensor& p = params[index];
    const int64_t n = static_cast<int64_t>(p.nbytes());
    const bool dtype_change =
        !current.empty() && params[current[0]].dtype() != p.dtype();
    if (!current.empty() && (dtype_change || bytes + n > limit)) {
      groups.push_back(std::move(current));
      current.clear();
      bytes = 0;
      limit = cap;
    }
    current.push_back(index);
    bytes += n;
  }
  if (!current.empty()) groups.push_back(std::move(current));
  return groups;
}

absl::StatusOr<std::shared_ptr<Reducer>> Reducer::Create(
    std::vector<std::pair<std::string, Tensor>> named_params,
    std::shared_ptr<c10d::ProcessGroup> pg, ReducerOptions options) {
  if (pg == nullptr) return absl::InvalidArgumentError("DDP: null group");
  if (named_params.empty())
    return absl::InvalidArgumentError("DDP: no parameters");
  for (const auto& [name, p] : named_params) {
    if (!p.defined() || !autograd::IsLeaf(p) || !autograd::RequiresGrad(p) ||
        !p.is_contiguous() || !IsFloatingPoint(p.dtype())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DDP: parameter '", name,
          "' must be a contiguous floating leaf that requires grad"));
    }
  }
  // One device per model: buckets are flat tensors on it.
  const auto& [first_name, first] = named_params[0];
  for (const auto& [name, p] : named_params) {
    if (p.device() != first.device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DDP: parameter '", name, "' is on ", p.device().ToString(),
          " but parameter '", first_name, "' is on ",
          first.device().ToString(), ": a replica's parameters share a device"));
    }
    if (!p.device().is_cpu()) {
      RETURN_IF_ERROR(
          OpsOf(p, absl::StrCat("parameter '", name, "'").c_str()).status());
    }
  }
  if (options.first_bucket_bytes <= 0 || options.bucket_cap_bytes <= 0)
    return absl::InvalidArgumentError("DDP: bucket caps must be positive");
  if (options.comm_hook == nullptr) options.comm_hook = AllreduceHook();
  std::shared_ptr<Reducer> r(
      new Reducer(std::move(named_params), std::move(pg), std::move(options)));
  if (!first.device().is_cpu()) {
    // Device gradients are bucketed and reduced on a stream of their own.
    ASSIGN_OR_RETURN(r->ops_, OpsOf(r->params_[0], "a parameter"));
    r->device_ = r->params_[0].device();
    absl::StatusOr<uintptr_t> comm = r->ops_->NewStream(r->device_);
    if (!comm.ok()) {
      return Annotate(comm.status(),
                      absl::StrCat("DDP: making the communication stream on ",
                                   r->device_.ToString()));
    }
    r->comm_stream_ = *comm;
  }
  std::vector<int> reverse(r->params_.size());
  for (size_t i = 0; i < reverse.size(); ++i)
    reverse[i] = static_cast<int>(reverse.size() - 1 - i);
  {
    MutexLock l(&r->mu_);
    RETURN_IF_ERROR(r->BuildBuckets(AssignBuckets(
        r->params_, reverse, r->options_.first_bucket_bytes,
        r->options_.bucket_cap_bytes)));
  }
  std::weak_ptr<Reducer> weak = r;
  for (size_t i = 0; i < r->params_.size(); ++i) {
    autograd::RegisterPostAccumulateHook(
        r->params_[i], [weak, i](const Tensor&) {
          if (std::shared_ptr<Reducer> self = weak.lock())
            self->OnGradReady(static_cast<int>(i));
        });
  }
  return r;
}

namespace {
std::vector<std::string> Names(
    const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [name, p] : named) out.push_back(name);
  return out;
}
std::vector<Tensor> Tensors(
    const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<Tensor> out;
  for (const auto& [name, p] : named) out.push_back(p);
  return out;
}
}  // namespace

Reducer::Reducer(std::vector<std::pair<std::string, Tensor>> named_params,
                 std::shared_ptr<c10d::ProcessGroup> pg, ReducerOptions options)
    : names_(Names(named_params)),
      params_(Tensors(named_params)),
      pg_(std::move(pg)),
      options_(std::move(options)) {
  for (size_t i = 0; i < params_.size(); ++i)
    index_of_[params_[i].autograd_meta()] = static_cast<int>(i);
}

absl::Status Reducer::BuildBuckets(
    const std::vector<std::vector<int>>& groups) {
  const size_t n = params_.size();
  bucket_of_.assign(n, -1);
  position_of_.assign(n, -1);
  ready_.assign(n, false);
  std::vector<Tensor> old_views = std::move(views_);
  views_.assign(n, Tensor());
  buckets_.clear();
  for (const std::vector<int>& group : groups) {
    Bucket b;
    b.params = group;
    int64_t numel = 0;
    for (int index : group) {
      b.offsets.push_back(numel);
      numel += params_[index].numel();
    }
    ASSIGN_OR_RETURN(b.buffer, ZeroBuffer(numel, params_[group[0]]));
    if (ops_ != nullptr) {
      // Made on the compute stream, used on the communication stream.
      RETURN_IF_ERROR(ops_->RecordStream(b.buffer, comm_stream_));
    }
    for (size_t k = 0; k < group.size(); ++k) {
      const int index = group[k];
      bucket_of_[index] = static_cast<int>(buckets_.size());
      position_of_[index] = static_cast<int>(k);
      views_[index] =
          b.buffer.slice(0, b.offsets[k], b.offsets[k] + params_[index].numel())
              .view(params_[index].sizes());
    }
    buckets_.push_back(std::move(b));
  }
  if (!options_.gradient_as_bucket_view) return absl::OkStatus();
  // .grad becomes the bucket view, keeping any gradient already there.
  for (size_t i = 0; i < n; ++i) {
    Tensor g = autograd::GradOf(params_[i]);
    if (g.defined()) RETURN_IF_ERROR(CopyInto(views_[i], g));
    autograd::SetGrad(params_[i], views_[i]);
  }
  return absl::OkStatus();
}

absl::Status Reducer::FillSlot(const Tensor& slot, const Tensor& g) {
  if (ops_ == nullptr) {
    if (g.defined() && g.is_same(slot)) return absl::OkStatus();
    return g.defined() ? CopyInto(slot, g) : ZeroOut(slot);
  }
  // The communication stream goes on once the gradient's producer (this
  // thread's current stream) has made it; the host does not wait.
  ASSIGN_OR_RETURN(uintptr_t producer, ops_->CurrentStream(device_));
  RETURN_IF_ERROR(ops_->StreamWaitStream(device_, comm_stream_, producer));
  if (g.defined() && g.is_same(slot)) return absl::OkStatus();  // The view.
  cuda::ThreadStreamGuard on_comm(ops_, device_, comm_stream_);
  RETURN_IF_ERROR(on_comm.status());
  if (!g.defined()) return ZeroOut(slot);
  // The gradient's memory is not reused before the copy has read it.
  RETURN_IF_ERROR(ops_->RecordStream(g, comm_stream_));
  if (g.is_contiguous() && g.dtype() == slot.dtype() &&
      g.device() == slot.device()) {
    return ops_->CopyAsync(slot, g, comm_stream_);
  }
  return CopyInto(slot, g);  // A kernel on the communication stream.
}

void Reducer::CopyIntoSlot(int index) {
  Tensor slot = views_[index];
  Tensor g = autograd::GradOf(params_[index]);
  absl::Status s = FillSlot(slot, g);
  if (!s.ok() && deferred_.ok()) {
    // The bucket still launches (every rank issues the same collectives);
    // Finish reports this and breaks the reducer.
    deferred_ = Annotate(s, absl::StrCat("DDP on rank ", pg_->rank(),
                                         ": bucketing parameter '",
                                         names_[index], "'"));
  }
  if (options_.gradient_as_bucket_view) autograd::SetGrad(params_[index], slot);
}

void Reducer::OnGradReady(int index) {
  MutexLock l(&mu_);
  if (state_ != State::kActive) return;  // Not a synchronized pass.
  if (ready_[index]) return;  // A second gradient in one pass: kept local.
  CopyIntoSlot(index);
  MarkReady(index);
}

void Reducer::MarkReady(int index) {
  ready_[index] = true;
  if (!rebuilt_) ready_order_.push_back(index);
  Bucket& b = buckets_[bucket_of_[index]];
  --b.pending;
  LaunchReadyBuckets();
}

void Reducer::LaunchReadyBuckets() {
  while (next_launch_ < static_cast<int>(buckets_.size()) &&
         buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_];
    GradBucket view{next_launch_, b.buffer, b.params, pg_->size(),
                    comm_stream_};
    bytes_reduced_ += static_cast<int64_t>(b.buffer.nbytes());
    if (ops_ == nullptr) {
      b.result = options_.comm_hook(*pg_, view);
    } else {
      // The hook's kernels go on the communication stream, after the
      // bucket's copies; its collectives are ordered after them too.
      cuda::ThreadStreamGuard on_comm(ops_, device_, comm_stream_);
      b.result = on_comm.status().ok()
                     ? options_.comm_hook(*pg_, view)
                     : MakeErrorFuture<Tensor>(on_comm.status());
    }
    ++next_launch_;
  }
  if (options_.optimizer_in_backward) CompleteFinishedBuckets();
}

void Reducer::CompleteFinishedBuckets() {
  while (deferred_.ok() && next_complete_ < next_launch_ &&
         buckets_[next_complete_].result.IsReady()) {
    deferred_ = CompleteBucket(next_complete_++);
    if (deferred_.ok() && options_.optimizer_in_backward)
      ++steps_during_backward_;
  }
}

absl::Status Reducer::CompleteBucket(int k) {
  Bucket& b = buckets_[k];
  const absl::StatusOr<Tensor>& r = b.result.result();
  const std::string where =
      absl::StrCat("DDP bucket ", k, " on rank ", pg_->rank());
  if (!r.ok()) return Annotate(r.status(), where);
  if (r->numel() != b.buffer.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": comm hook returned ", r->numel(),
                     " elements, not ", b.buffer.numel()));
  }
  std::vector<Tensor> params, grads;
  for (int i : b.params) {
    params.push_back(params_[i]);
    grads.push_back(views_[i]);
  }
  if (ops_ != nullptr) {
    RETURN_IF_ERROR(Annotate(CopyOutOnComm(b, *r), where));
  } else {
    if (!r->is_same(b.buffer)) {
      RETURN_IF_ERROR(Annotate(
          CopyInto(b.buffer, r->reshape({b.buffer.numel()})), where));
    }
    for (int i : b.params) {
      if (options_.gradient_as_bucket_view) continue;  // .grad is the view.
      Tensor g = autograd::GradOf(params_[i]);
      if (g.defined()) {
        // In place: the caller's .grad tensor.
        RETURN_IF_ERROR(Annotate(CopyInto(g, views_[i]), where));
      } else {
        absl::StatusOr<Tensor> copy = CloneOf(views_[i]);
        if (!copy.ok()) return Annotate(copy.status(), where);
        autograd::SetGrad(params_[i], *copy);
      }
    }
  }
  if (!options_.optimizer_in_backward) return absl::OkStatus();
  if (ops_ != nullptr) {
    // The step runs on the compute stream, after the copies out.
    RETURN_IF_ERROR(Annotate(ComputeWaitsForComm(), where));
  }
  return Annotate(options_.optimizer_in_backward(b.params, params, grads),
                  absl::StrCat(where, ": optimizer step"));
}

absl::Status Reducer::ComputeWaitsForComm() {
  ASSIGN_OR_RETURN(uintptr_t compute, ops_->CurrentStream(device_));
  return ops_->StreamWaitStream(device_, compute, comm_stream_);
}

absl::Status Reducer::CopyOutOnComm(const Bucket& b, const Tensor& result) {
  // Tensors made here for the caller are used on its (compute) stream.
  ASSIGN_OR_RETURN(uintptr_t compute, ops_->CurrentStream(device_));
  cuda::ThreadStreamGuard on_comm(ops_, device_, comm_stream_);
  RETURN_IF_ERROR(on_comm.status());
  // Queued on the communication stream: the hook's kernels and (through
  // the stream the collective waited on) the copies in come first.
  auto copy = [&](const Tensor& dst, const Tensor& src) -> absl::Status {
    if (src.is_contiguous() && src.dtype() == dst.dtype()) {
      return ops_->CopyAsync(dst, src, comm_stream_);
    }
    return CopyInto(dst, src);  // A conversion kernel on the stream.
  };
  if (!result.is_same(b.buffer)) {
    RETURN_IF_ERROR(copy(b.buffer, result.reshape({b.buffer.numel()})));
  }
  if (options_.gradient_as_bucket_view) return absl::OkStatus();
  for (int i : b.params) {
    Tensor g = autograd::GradOf(params_[i]);
    if (!g.defined() || !g.is_contiguous() || g.dtype() != views_[i].dtype()) {
      if (g.defined()) {  // In place: the caller's .grad tensor.
        RETURN_IF_ERROR(ops_->RecordStream(g, comm_stream_));
        RETURN_IF_ERROR(CopyInto(g, views_[i]));
        continue;
      }
      ASSIGN_OR_RETURN(g, ops_->Empty(views_[i].sizes(), views_[i].dtype(),
                                      device_));
      RETURN_IF_ERROR(ops_->RecordStream(g, compute));
      autograd::SetGrad(params_[i], g);
    }
    RETURN_IF_ERROR(ops_->RecordStream(g, comm_stream_));
    RETURN_IF_ERROR(ops_->CopyAsync(g, views_[i], comm_stream_));
  }
  return absl::OkStatus();
}

std::vector<bool> Reducer::Reachable(const std::vector<Tensor>& outputs) const {
  std::vector<bool> reached(params_.size(), false);
  std::unordered_set<const autograd::Node*> visited;
  std::vector<const autograd::Node*> stack;
  for (const Tensor& o : outputs) {
    autograd::Edge e = autograd::GradientEdge(o);
    if (e.valid() && visited.insert(e.node.get()).second)
      stack.push_back(e.node.get());
  }
  while (!stack.empty()) {
    const autograd::Node* node = stack.back();
    stack.pop_back();
    if (auto* acc = dynamic_cast<const autograd::AccumulateGrad*>(node)) {
      auto it = index_of_.find(acc->variable().autograd_meta());
      if (it != index_of_.end()) reached[it->second] = true;
    }
    for (const autograd::Edge& e : node->next_edges()) {
      if (e.valid() && visited.insert(e.node.get()).second)
        stack.push_back(e.node.get());
    }
  }
  return reached;
}

absl::Status Reducer::Prepare(const std::vector<Tensor>& outputs) {
  MutexLock l(&mu_);
  std::vector<bool> reached;
  if (options_.find_unused_parameters) {
    if (options_.static_graph && !static_reached_.empty()) {
      reached = static_reached_;
    } else {
      reached = Reachable(outputs);
      if (options_.static_graph) static_reached_ = reached;
    }
  }
  if (state_ == State::kBroken)
    return absl::FailedPreconditionError(
        "DDP: an earlier pass failed; the group is out of step");
  if (state_ == State::kActive)
    return absl::FailedPreconditionError(
        "DDP: Prepare called twice without Finish");
  state_ = State::kActive;
  next_launch_ = 0;
  next_complete_ = 0;
  deferred_ = absl::OkStatus();
  std::fill(ready_.begin(), ready_.end(), false);
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.result = Future<Tensor>();
  }
  if (!options_.find_unused_parameters) return absl::OkStatus();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!reached[i]) {
      CopyIntoSlot(static_cast<int>(i));
      MarkReady(static_cast<int>(i));
    }
  }
  return absl::OkStatus();
}

absl::Status Reducer::MissingError() const {
  std::vector<std::string> missing;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i])
      missing.push_back(absl::StrCat("'", names_[i], "' (", i, ")"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "DDP on rank ", pg_->rank(), ": parameters ",
      absl::StrJoin(missing, ", "),
      " received no gradient in this backward pass, so their buckets were "
      "never reduced; other ranks will fail on their timeout. If parts of "
      "the model go unused, set find_unused_parameters"));
}

absl::Status Reducer::Finish() {
  MutexLock l(&mu_);
  if (state_ != State::kActive)
    return absl::FailedPreconditionError("DDP: Finish without Prepare");
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::Status status = deferred_;
  if (status.ok() && next_launch_ < static_cast<int>(buckets_.size()))
    status = MissingError();
  for (int k = next_complete_; k < next_launch_; ++k) {
    // Waits even after an error: launched buckets must drain (bounded).
    absl::Status waited = buckets_[k].result.Wait(
        std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!status.ok()) continue;
    status = waited.ok()
                 ? CompleteBucket(k)
                 : Annotate(waited, absl::StrCat("DDP bucket ", k, " on rank ",
                                                 pg_->rank()));
  }
  if (ops_ != nullptr) {
    // The caller's stream (the optimizer, the next pass) goes on after
    // the communication stream's copies out; the host does not wait.
    absl::Status ordered = ComputeWaitsForComm();
    if (status.ok() && !ordered.ok()) {
      status = Annotate(ordered, absl::StrCat("DDP on rank ", pg_->rank(),
                                              ": ordering the compute stream "
                                              "after communication"));
    }
  }
  if (!status.ok()) {
    state_ = State::kBroken;
    return status;
  }
  state_ = State::kIdle;
  ++passes_;
  if (!rebuilt_ && options_.rebuild_buckets &&
      (!options_.find_unused_parameters || options_.static_graph)) {
    absl::Status s = Rebuild();
    if (!s.ok()) {
      state_ = State::kBroken;
      return s;
    }
  }
  rebuilt_ = true;
  ready_order_.clear();
  return absl::OkStatus();
}

absl::Status Reducer::Rebuild() {
  const int64_t n = static_cast<int64_t>(params_.size());
  if (static_cast<int64_t>(ready_order_.size()) != n)
    return absl::InternalError("DDP: ready order incomplete");
  Tensor order = from_vector<int64_t>(
      std::vector<int64_t>(ready_order_.begin(), ready_order_.end()));
  c10d::BroadcastOptions o;
  o.root = 0;
  absl::Status s = pg_->Broadcast(order, o)->Wait(options_.timeout);
  if (!s.ok()) return Annotate(s, "DDP: broadcasting the bucket order");
  std::vector<int> agreed;
  std::vector<bool> seen(n, false);
  for (int64_t v : order.to_vector<int64_t>()) {
    if (v < 0 || v >= n || seen[v])
      return absl::InternalError("DDP: rank 0 sent an invalid bucket order");
    seen[v] = true;
    agreed.push_back(static_cast<int>(v));
  }
  return BuildBuckets(AssignBuckets(params_, agreed,
                                    options_.first_bucket_bytes,
                                    options_.bucket_cap_bytes));
}

std::vector<std::vector<int>> Reducer::buckets() const {
  MutexLock l(&mu_);
  std::vector<std::vector<int>> out;
  for (const Bucket& b : buckets_) out.push_back(b.params);
  return out;
}

int64_t Reducer::bytes_reduced() const {
  MutexLock l(&mu_);
  return bytes_reduced_;
}

int64_t Reducer::steps_during_backward() const {
  MutexLock l(&mu_);
  return steps_during_backward_;
}

uintptr_t Reducer::comm_stream() const { return comm_stream_; }

int64_t Reducer::passes() const {
  MutexLock l(&mu_);
  return passes_;
}

}  // namespace ferry::ddp
