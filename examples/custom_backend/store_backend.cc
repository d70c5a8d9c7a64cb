#include "ferry/examples/custom_backend/store_backend.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/c10d/reduce.h"
#include "ferry/common/status.h"

namespace ferry {
namespace examples {
namespace {

using c10d::OpType;

// What every rank publishes about its call, so mismatches are caught.
struct Header {
  int32_t op = -1;
  int32_t dtype = -1;
  int32_t reduce_op = -1;
  int64_t numel = -1;
  int32_t root = -1;
  int32_t valid = 1;
};

std::string Encode(const Header& h, const Tensor* data) {
  std::string out(sizeof(Header), '\0');
  std::memcpy(out.data(), &h, sizeof(Header));
  if (data != nullptr && h.valid) {
    out.append(static_cast<const char*>(data->data_ptr()), data->nbytes());
  }
  return out;
}

absl::StatusOr<Header> Decode(const std::string& value, int from) {
  if (value.size() < sizeof(Header)) {
    return absl::DataLossError(absl::StrCat("rank ", from, " published ",
                                            value.size(),
                                            " bytes, less than a header"));
  }
  Header h;
  std::memcpy(&h, value.data(), sizeof(Header));
  return h;
}

bool Same(const Header& a, const Header& b) {
  return a.op == b.op && a.dtype == b.dtype && a.reduce_op == b.reduce_op &&
         a.numel == b.numel && a.root == b.root;
}

std::string Show(const Header& h) {
  return absl::StrCat(
      c10d::OpTypeName(static_cast<OpType>(h.op)), " ",
      h.dtype >= 0 ? DTypeName(static_cast<DType>(h.dtype))
                   : absl::string_view("?"),
      " x ", h.numel,
      h.root >= 0 ? absl::StrCat(" root ", h.root) : std::string());
}

// Checks everyone's headers: InvalidArgument when a rank reported invalid
// arguments or called with different ones.
absl::Status CheckHeaders(const std::vector<Header>& all, const Header& mine,
                          int me) {
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].valid) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " passed invalid arguments"));
    }
  }
  for (size_t r = 0; r < all.size(); ++r) {
    if (!Same(all[r], mine)) {
      return absl::InvalidArgumentError(
          absl::StrCat("arguments differ between ranks: rank ", me, " has ",
                       Show(mine), ", rank ", r, " has ", Show(all[r])));
    }
  }
  return absl::OkStatus();
}

ThreadPoolExecutor::Options WorkerOptions(int rank) {
  ThreadPoolExecutor::Options o;
  o.name = absl::StrCat("store-backend-rank", rank);
  o.num_threads = 1;  // One thread: calls run in issue order.
  return o;
}

}  // namespace

StoreBackend::StoreBackend(std::shared_ptr<Store> store, int rank, int size,
                           absl::Duration timeout)
    : c10d::Backend("store", rank, size, timeout),
      store_(std::move(store)),
      worker_(WorkerOptions(rank)) {}

StoreBackend::~StoreBackend() {
  worker_.Shutdown(ThreadPoolExecutor::ShutdownMode::kCancelPending)
      .IgnoreError();
}

std::shared_ptr<c10d::Work> StoreBackend::Submit(
    OpType op, absl::AnyInvocable<absl::Status(int64_t)> fn) {
  int64_t call;
  std::shared_ptr<c10d::Work> work;
  {
    MutexLock lock(&mu_);
    call = next_call_++;
    work = std::make_shared<c10d::Work>(absl::StrCat(Describe(op), " #", call));
    // Submitting under the lock keeps the queue in call order.
    absl::Status queued = worker_.Submit(
        [work, call, fn = std::move(fn)]() mutable {
          absl::Status s = fn(call);
          work->Complete(Annotate(s, work->description()));
        },
        [work](const absl::Status& s) {
          work->Complete(Annotate(s, work->description()));
        });
    if (!queued.ok()) work->Complete(Annotate(queued, work->description()));
  }
  return work;
}

absl::Status StoreBackend::Finish(const std::string& prefix,
                                  const std::vector<std::string>& keys) {
  ASSIGN_OR_RETURN(int64_t out, store_->Add(prefix + "/done", 1));
  if (out == size()) {
    for (const std::string& k : keys)
      RETURN_IF_ERROR(store_->DeleteKey(k).status());
    RETURN_IF_ERROR(store_->DeleteKey(prefix + "/done").status());
  }
  return absl::OkStatus();
}

c10d::ArgChecks StoreBackend::Checks() const {
  return c10d::ArgChecks("store", DeviceType::kCPU, rank(), size());
}

std::shared_ptr<c10d::Work> StoreBackend::Allreduce(
    Tensor tensor, const c10d::AllreduceOptions& options) {
  absl::Status local = Checks().One(OpType::kAllreduce, tensor, "tensor");
  if (local.ok()) {
    local = c10d::CheckReduceOp(OpType::kAllreduce, options.op, tensor.dtype());
  }
  Header h;
  h.op = static_cast<int32_t>(OpType::kAllreduce);
  h.reduce_op = static_cast<int32_t>(options.op);
  if (local.ok()) {
    h.dtype = static_cast<int32_t>(tensor.dtype());
    h.numel = tensor.numel();
  }
  h.valid = local.ok();
  // The worker thread gets its own copy (see c10d::CopyStatus).
  local = c10d::CopyStatus(local);
  absl::Duration timeout = TimeoutOr(options.timeout);
  c10d::ReduceOp op = options.op;
  return Submit(
      OpType::kAllreduce,
      [this, tensor, h, local = std::move(local), timeout,
       op](int64_t call) mutable -> absl::Status {
        std::string prefix = absl::StrCat("c/", call);
        std::vector<std::string> keys;
        for (int r = 0; r < size(); ++r)
          keys.push_back(absl::StrCat(prefix, "/", r));
        RETURN_IF_ERROR(store_->Set(keys[rank()], Encode(h, &tensor)));
        RETURN_IF_ERROR(store_->Wait(keys, timeout));
        ASSIGN_OR_RETURN(std::vector<std::string> values,
                         store_->MultiGet(keys));
        std::vector<Header> headers;
        for (int r = 0; r < size(); ++r) {
          ASSIGN_OR_RETURN(Header hr, Decode(values[r], r));
          headers.push_back(hr);
        }
        absl::Status agreed =
            local.ok() ? CheckHeaders(headers, h, rank()) : local;
        if (agreed.ok()) {
          // Reduce in rank order, so every rank computes the same bits.
          Tensor acc = empty(tensor.sizes(), tensor.dtype());
          for (int r = 0; r < size(); ++r) {
            Tensor part = empty(tensor.sizes(), tensor.dtype());
            if (tensor.nbytes() > 0) {
              std::memcpy(part.data_ptr(), values[r].data() + sizeof(Header),
                          tensor.nbytes());
            }
            if (r == 0) {
              acc = part;
            } else {
              RETURN_IF_ERROR(c10d::ReduceInto(acc, part, op));
            }
          }
          if (op == c10d::ReduceOp::kAvg) c10d::FinishAverage(acc, size());
          tensor.copy_(acc);
        }
        RETURN_IF_ERROR(Finish(prefix, keys));
        return agreed;
      });
}

std::shared_ptr<c10d::Work> StoreBackend::Broadcast(
    Tensor tensor, const c10d::BroadcastOptions& options) {
  absl::Status local =
      Checks().Rooted(OpType::kBroadcast, tensor, "tensor", options.root);
  Header h;
  h.op = static_cast<int32_t>(OpType::kBroadcast);
  h.root = options.root;
  if (local.ok()) {
    h.dtype = static_cast<int32_t>(tensor.dtype());
    h.numel = tensor.numel();
  }
  h.valid = local.ok();
  // The worker thread gets its own copy (see c10d::CopyStatus).
  local = c10d::CopyStatus(local);
  absl::Duration timeout = TimeoutOr(options.timeout);
  int root = options.root;
  return Submit(
      OpType::kBroadcast,
      [this, tensor, h, local = std::move(local), timeout,
       root](int64_t call) mutable -> absl::Status {
        std::string prefix = absl::StrCat("c/", call);
        // Everyone publishes a header; only the root publishes the bytes.
        std::vector<std::string> keys;
        for (int r = 0; r < size(); ++r)
          keys.push_back(absl::StrCat(prefix, "/", r));
        RETURN_IF_ERROR(store_->Set(
            keys[rank()], Encode(h, rank() == root ? &tensor : nullptr)));
        RETURN_IF_ERROR(store_->Wait(keys, timeout));
        ASSIGN_OR_RETURN(std::vector<std::string> values,
                         store_->MultiGet(keys));
        std::vector<Header> headers;
        for (int r = 0; r < size(); ++r) {
          ASSIGN_OR_RETURN(Header hr, Decode(values[r], r));
          headers.push_back(hr);
        }
        absl::Status agreed =
            local.ok() ? CheckHeaders(headers, h, rank()) : local;
        if (agreed.ok() && rank() != root) {
          const std::string& v = values[root];
          if (v.size() != sizeof(Header) + tensor.nbytes()) {
            agreed = absl::DataLossError(
                absl::StrCat("root published ", v.size(), " bytes, expected ",
                             sizeof(Header) + tensor.nbytes()));
          } else if (tensor.nbytes() > 0) {
            std::memcpy(tensor.data_ptr(), v.data() + sizeof(Header),
                        tensor.nbytes());
          }
        }
        RETURN_IF_ERROR(Finish(prefix, keys));
        return agreed;
      });
}

std::shared_ptr<c10d::Work> StoreBackend::Barrier(
    const c10d::BarrierOptions& options) {
  absl::Duration timeout = TimeoutOr(options.timeout);
  return Submit(
      OpType::kBarrier, [this, timeout](int64_t call) -> absl::Status {
        // Publish a header and wait for everyone's: nobody leaves before all
        // ranks arrived, and a rank calling something else is caught.
        std::string prefix = absl::StrCat("c/", call);
        Header h;
        h.op = static_cast<int32_t>(OpType::kBarrier);
        std::vector<std::string> keys;
        for (int r = 0; r < size(); ++r)
          keys.push_back(absl::StrCat(prefix, "/", r));
        RETURN_IF_ERROR(store_->Set(keys[rank()], Encode(h, nullptr)));
        RETURN_IF_ERROR(store_->Wait(keys, timeout));
        ASSIGN_OR_RETURN(std::vector<std::string> values,
                         store_->MultiGet(keys));
        std::vector<Header> headers;
        for (int r = 0; r < size(); ++r) {
          ASSIGN_OR_RETURN(Header hr, Decode(values[r], r));
          headers.push_back(hr);
        }
        absl::Status agreed = CheckHeaders(headers, h, rank());
        RETURN_IF_ERROR(Finish(prefix, keys));
        return agreed;
      });
}

absl::Status RegisterStoreBackend(c10d::BackendRegistry& registry,
                                  const std::string& name) {
  return registry.RegisterBackend(
      name,
      [](const c10d::BackendConfig& c)
          -> absl::StatusOr<std::unique_ptr<c10d::Backend>> {
        if (!c.options.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("the store backend takes no options, got '",
                           c.options.begin()->first, "'"));
        }
        return std::make_unique<StoreBackend>(c.store, c.rank, c.size,
                                              c.timeout);
      },
      {DeviceType::kCPU});
}

}  // namespace examples
}  // namespace ferry
