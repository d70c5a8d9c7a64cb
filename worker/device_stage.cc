#include "ferry/worker/device_stage.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/autograd/dist/messages.h"
#include "ferry/common/status.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/copy.h"
#include "ferry/tensor/cuda/device_api.h"
#include "ferry/tensor/cuda/device_ops.h"
#include "ferry/tensor/cuda/event.h"
#include "ferry/tensor/cuda/pinned_allocator.h"
#include "ferry/worker/device_header.h"

namespace ferry {
namespace {

// Copies are queued on the device's default stream, where the handler's
// work also goes, and each device's stream is waited for once per message:
// a landed tensor is ready before the handler runs (also for a handler that
// reads it on the host), and a staged one's host bytes before the
// transport reads them.
constexpr cuda::StreamHandle kStream = 0;

// Waits, once per device in `devices`, for the work queued on kStream so
// far (an event recorded there now); the first error, naming the device.
absl::Status WaitForDevices(const std::set<int>& devices,
                            const std::shared_ptr<cuda::DeviceMemoryApi>& api,
                            absl::string_view what) {
  absl::Status first;
  for (int d : devices) {
    absl::StatusOr<cuda::StreamEvent> event =
        cuda::StreamEvent::Record(api, d, kStream);
    absl::Status s = event.ok() ? event->Wait() : event.status();
    if (!s.ok()) {
      // Without an event, the whole stream still orders the host.
      if (!event.ok()) s = api->SynchronizeStream(d, kStream);
      if (!s.ok() && first.ok()) {
        first = Annotate(s, absl::StrCat(what, ": waiting for cuda:", d));
      }
    }
  }
  return first;
}

// The readiness of a pipelined staged tensor (tensor/storage.h's
// ReadyGate): its chunks' events, waited in order; the first error sticks.
// Holds the device source until every chunk ran (the caller may drop it);
// its destructor waits for the chunks still queued.
class ChunkGate final : public ReadyGate {
 public:
  ChunkGate(std::shared_ptr<cuda::DeviceMemoryApi> api, cuda::ChunkedCopy copy,
            Tensor source, std::string what)
      : api_(std::move(api)),
        device_(source.device().index),
        chunk_bytes_(copy.chunk_bytes),
        what_(std::move(what)),
        events_(std::move(copy.events)),
        source_(std::move(source)) {}

  ~ChunkGate() override {
    if (WaitReady(UINT64_MAX).ok()) return;
    // A failed event: the whole stream still orders the host (as
    // WaitForDevices), so nothing queued reads the source after this.
    (void)api_->SynchronizeStream(device_, kStream);
  }

  absl::Status WaitReady(uint64_t bytes) override {
    MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    const uint64_t n = events_.size();
    const uint64_t needed = ChunksCovering(bytes);
    while (ready_ < needed) {
      absl::Status s = events_[ready_].Wait();
      if (!s.ok()) {
        error_ = Annotate(
            s, absl::StrCat(what_, ": chunk ", ready_, " of ", n, " (",
                            chunk_bytes_, " bytes each) of its copy to "
                            "pinned memory"));
        return error_;
      }
      ++ready_;
    }
    if (ready_ == n) source_ = Tensor();  // Every chunk ran.
    return absl::OkStatus();
  }

  absl::StatusOr<bool> PollReady(uint64_t bytes) override {
    MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    const uint64_t needed = ChunksCovering(bytes);
    while (ready_ < needed) {
      absl::StatusOr<bool> done = events_[ready_].Query();
      if (!done.ok() || !*done) return false;  // WaitReady tells an error.
      ++ready_;
    }
    if (ready_ == events_.size()) source_ = Tensor();
    return true;
  }

 private:
  // The chunks bytes [0, `bytes`) lie in.
  uint64_t ChunksCovering(uint64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t n = events_.size();
    return bytes >= n * chunk_bytes_ ? n
                                     : (bytes + chunk_bytes_ - 1) / chunk_bytes_;
  }

  const std::shared_ptr<cuda::DeviceMemoryApi> api_;
  const int device_;
  const uint64_t chunk_bytes_;
  const std::string what_;  // "worker 'a': staging tensor 0 (cuda:0, ...".
  Mutex mu_;
  std::vector<cuda::StreamEvent> events_ ABSL_GUARDED_BY(mu_);
  uint64_t ready_ ABSL_GUARDED_BY(mu_) = 0;  // Chunks seen done.
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  Tensor source_ ABSL_GUARDED_BY(mu_);
};

// "the request CALL 'f'" / "the reply to CALL 'f'", for errors.
std::string Which(const rpc::Message& m, bool request) {
  std::string s = absl::StrCat(request ? "the request " : "the reply to ",
                               rpc::MessageTypeName(m.type));
  if (!m.function.empty()) absl::StrAppend(&s, " '", m.function, "'");
  return s;
}

}  // namespace

absl::StatusOr<std::shared_ptr<DeviceStage>> DeviceStage::Create(
    std::string me, const DeviceOptions& options,
    std::shared_ptr<cuda::DeviceMemoryApi> api,
    std::shared_ptr<DeviceComputeInterface> compute) {
  RETURN_IF_ERROR(ClaimDeviceLayer());
  std::unique_ptr<cuda::CachingDeviceAllocator> allocator;
  std::unique_ptr<cuda::CachingHostAllocator> pinned;
  if (!options.devices.empty()) {
    if (api == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker '", me, "': devices listed but WorkerOptions::device_api is "
          "null"));
    }
    ASSIGN_OR_RETURN(allocator, cuda::CachingDeviceAllocator::Create(api, {}));
    ASSIGN_OR_RETURN(pinned, cuda::CachingHostAllocator::Create(api, {}));
  }
  return std::shared_ptr<DeviceStage>(new DeviceStage(
      std::move(me), options, std::move(api), std::move(allocator),
      std::move(pinned), std::move(compute)));
}

DeviceStage::DeviceStage(
    std::string me, const DeviceOptions& options,
    std::shared_ptr<cuda::DeviceMemoryApi> api,
    std::shared_ptr<cuda::CachingDeviceAllocator> allocator,
    std::shared_ptr<cuda::CachingHostAllocator> pinned,
    std::shared_ptr<DeviceComputeInterface> compute)
    : me_(std::move(me)),
      devices_(options.devices),
      maps_(options.maps),
      api_(std::move(api)),
      allocator_(std::move(allocator)),
      pinned_(std::move(pinned)),
      compute_(std::move(compute)),
      ipc_(DeviceIpc::Create(me_, api_, allocator_.get())),
      landing_(allocator_ != nullptr
                   ? std::make_shared<DeviceLanding>(me_, devices_, maps_,
                                                     allocator_, pinned_)
                   : nullptr) {}

DeviceStage::~DeviceStage() = default;

rpc::Interceptor DeviceStage::ReceiveInterceptor(
    std::weak_ptr<DeviceStage> stage) {
  return [stage = std::move(stage)](rpc::InterceptPoint point,
                                    const rpc::WorkerInfo& peer,
                                    rpc::Message& m) -> absl::Status {
    if (point != rpc::InterceptPoint::kReceiveRequest &&
        point != rpc::InterceptPoint::kReceiveReply) {
      return absl::OkStatus();
    }
    if (m.FindHeader(kDeviceHeaderLayer) == nullptr) return absl::OkStatus();
    std::shared_ptr<DeviceStage> s = stage.lock();
    if (s == nullptr) {
      return absl::UnavailableError(
          "a device header arrived after its worker's device stage ended");
    }
    return s->LandIn(peer, m,
                     point == rpc::InterceptPoint::kReceiveRequest);
  };
}

rpc::Interceptor DeviceStage::SendInterceptor(
    std::weak_ptr<DeviceStage> stage) {
  return [stage = std::move(stage)](rpc::InterceptPoint point,
                                    const rpc::WorkerInfo& peer,
                                    rpc::Message& m) -> absl::Status {
    if (point != rpc::InterceptPoint::kSendRequest &&
        point != rpc::InterceptPoint::kSendReply) {
      return absl::OkStatus();
    }
    std::shared_ptr<DeviceStage> s = stage.lock();
    if (s == nullptr) return absl::OkStatus();  // The wire refuses CUDA.
    return s->StageOut(peer, m, point == rpc::InterceptPoint::kSendRequest);
  };
}

bool DeviceStage::Uses(const Device& device) const {
  return std::find(devices_.begin(), devices_.end(), device) !=
         devices_.end();
}

std::string DeviceStage::DeviceListText() const {
  if (devices_.empty()) return "it has no CUDA devices";
  std::vector<std::string> names;
  for (const Device& d : devices_) names.push_back(d.ToString());
  return absl::StrCat("its devices: ", absl::StrJoin(names, ", "));
}

void DeviceStage::Count(const std::string& peer, const StagedTraffic& d) {
  MutexLock lock(&mu_);
  // Keyed by the peer's declared name: bounded, so that names a caller
  // makes up cannot grow it (the rest is counted together).
  constexpr size_t kMaxPeers = 1024;
  const bool known = traffic_.count(peer) > 0;
  StagedTraffic& t =
      traffic_[known || traffic_.size() < kMaxPeers ? peer : "(other)"];
  t.tensors_out += d.tensors_out;
  t.bytes_out += d.bytes_out;
  t.to_cpu_out += d.to_cpu_out;
  t.tensors_in += d.tensors_in;
  t.bytes_in += d.bytes_in;
  t.pipelined_in += d.pipelined_in;
  t.early_chunks += d.early_chunks;
  t.refused += d.refused;
}

absl::Status DeviceStage::StageOut(const rpc::WorkerInfo& peer,
                                   rpc::Message& m, bool request) {
  // Only this stage writes the header: one another layer set is dropped.
  m.ClearHeader(kDeviceHeaderLayer);
  DeviceHeader header;
  // Gradients going back along a forward request travel as a reply's (the
  // receiver's map governs); the local mark never travels.
  // (The key is built once: this runs on every message.)
  static const std::string* const kReturning =
      new std::string(autograd::dist::kReturningEntry);
  header.returning =
      !m.context.empty() && m.context.erase(*kReturning) > 0 && request;
  StagedTraffic counted;
  absl::Status status;
  // Forward requests to a peer on this host: handles instead of host bytes.
  // Replies too, and a returning request's gradients (which travel as a
  // reply's), when the peer said it can open this worker's handles.
  // The exporter is made at the message's first CUDA tensor, so a message
  // without one allocates nothing for it.
  enum class IpcUse { kNone, kRequest, kReturning, kReply };
  IpcUse use = IpcUse::kNone;
  std::unique_ptr<IpcOutgoing> ipc;
  bool ipc_begun = false;
  absl::Time hold_until = m.deadline;
  if (ipc_ != nullptr && request) {
    if (ipc_->Carries(peer.name)) {
      // The callee may answer by IPC (not when an unmapped reply tensor may
      // land on this worker's CPU: an IPC placement has no host bytes), and
      // the replies this worker copied are acknowledged.
      header.ipc_replies = !maps_.stage_unmapped_to_cpu();
      header.reply_acks = ipc_->TakeAcks(
          peer.name, m.type == static_cast<rpc::MessageType>(kDeviceIpcAckType));
      use = IpcUse::kRequest;
    }
    if (header.returning) use = IpcUse::kReturning;
  } else if (ipc_ != nullptr) {
    const DeviceIpc::ReplyPlan plan = ipc_->TakeReply(peer.name, m.id);
    // A reply acknowledges a request whose tensors came by IPC.
    if (plan.ack) header.ipc_ack = m.id.value();
    if (plan.ipc) use = IpcUse::kReply;
    hold_until = plan.deadline == absl::InfiniteFuture()
                     ? plan.deadline
                     : plan.deadline + DeviceIpc::kReplyHoldGrace;
  }
  // Sources stay alive until their queued copies ran (WaitForDevices).
  std::vector<Tensor> sources;
  std::set<int> queued;  // Devices with copies queued on kStream.
  std::set<int> ordered;  // Devices whose kStream waits for the sender's.
  // Tensors to pipeline (in m.payload, which keeps its shape meanwhile).
  struct Later {
    Tensor* tensor;
    uint32_t position;
  };
  std::vector<Later> later;
  // "worker 'a': staging tensor 0 (cuda:0, 16 bytes) of ... to 'b'".
  auto staging = [&](uint32_t i, const Tensor& t) {
    return absl::StrCat("worker '", me_, "': staging tensor ", i, " (",
                        t.device().ToString(), ", ", t.nbytes(),
                        " bytes) of ", Which(m, request), " to '", peer.name,
                        "'");
  };
  uint32_t position = 0;
  rpc::ForEachTensor(m.payload, [&](Tensor& t) {
    const uint32_t i = position++;
    if (!status.ok() || !t.defined() || !t.device().is_cuda()) return;
    const Device source = t.device();
    if (!Uses(source)) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "worker '", me_, "': tensor ", i, " of ", Which(m, request),
          " to '", peer.name, "' is on ", source.ToString(),
          ", which this worker does not use (", DeviceListText(),
          "; WorkerOptions::devices)"));
      return;
    }
    // The copies below (and an IPC event) go on kStream; where the sending
    // thread's current stream is another (a backward op running on its
    // forward's stream, engine.cc), kStream first waits for it on the
    // device, once per device and message.
    if (ordered.insert(source.index).second) {
      if (cuda::DeviceOps* ops = cuda::DeviceOpsOf(t)) {
        absl::StatusOr<uintptr_t> current = ops->CurrentStream(source);
        absl::Status waited =
            !current.ok()           ? current.status()
            : *current == kStream   ? absl::OkStatus()
                                    : ops->StreamWaitStream(source, kStream,
                                                            *current);
        if (!waited.ok()) {
          status = Annotate(waited, staging(i, t));
          return;
        }
      }
    }
    Device target = Device::CPU();
    if (request && !header.returning) {
      absl::StatusOr<Device> mapped =
          maps_.Target(me_, peer.name, source, static_cast<int>(i));
      if (!mapped.ok()) {
        status = mapped.status();
        return;
      }
      target = *mapped;
    }
    const bool as_reply = !request || header.returning;  // No target.
    if (use != IpcUse::kNone && !ipc_begun) {
      ipc_begun = true;
      ipc = use == IpcUse::kRequest     ? ipc_->Begin(peer.name)
            : use == IpcUse::kReturning ? ipc_->BeginReturning(peer.name)
                                        : ipc_->BeginReply(peer.name);
    }
    if (ipc != nullptr && (target.is_cuda() || as_reply) && t.nbytes() > 0 &&
        t.is_contiguous()) {  // IPC (worker/device_ipc.h).
      DevicePlacement p{i, source.index, std::nullopt};
      if (!as_reply) p.target = target.index;
      // A reply's (or returned gradient's) tensor something here still
      // holds (a parameter, an RRef's value, the request an echo answers, a
      // gradient the engine keeps) may be written after the message left,
      // before the peer's copy ran: export a snapshot queued on kStream
      // ahead of such writes. One only the message holds goes as is.
      absl::StatusOr<Tensor> exported = t;
      if (as_reply && (t.use_count() > 1 || t.storage().use_count() > 1)) {
        exported = ipc->Snapshot(t, *allocator_, kStream);
      }
      absl::StatusOr<Tensor> placeholder =
          exported.ok() ? ipc->Add(*exported, p, header) : exported.status();
      if (!placeholder.ok()) {
        status = Annotate(placeholder.status(),
                          absl::StrCat("worker '", me_, "': exporting tensor ",
                                       i, " (", source.ToString(), ") of ",
                                       Which(m, request), " to '", peer.name,
                                       "' by CUDA IPC"));
        return;
      }
      header.placements.push_back(std::move(p));
      t = *std::move(placeholder);
      return;
    }
    // Large tensors are pipelined, after the small ones' wait (below).
    const bool pipelined =
        t.nbytes() >= kPipelineMinBytes && t.is_contiguous();
    if (pipelined) {
      later.push_back({&t, i});
    } else {
      absl::StatusOr<Tensor> host =
          cuda::QueueCopyToPinned(t, kStream, *pinned_);
      if (!host.ok()) {
        status = Annotate(host.status(), staging(i, t));
        return;
      }
      queued.insert(source.index);
      sources.push_back(std::move(t));
      t = *std::move(host);
    }
    ++counted.tensors_out;
    counted.bytes_out += t.nbytes();
    if (request && !header.returning && target.is_cpu()) {
      ++counted.to_cpu_out;
    } else {
      DevicePlacement p{i, source.index, std::nullopt};
      if (request && !header.returning) p.target = target.index;
      header.placements.push_back(p);
    }
  });
  // One wait per device, also after a failure (the queued copies still
  // read the sources and write pinned blocks).
  if (!queued.empty()) {
    absl::Status waited = WaitForDevices(
        queued, api_,
        absl::StrCat("worker '", me_, "': staging ", Which(m, request),
                     " to '", peer.name, "'"));
    sources.clear();
    if (status.ok()) status = waited;
  }
  // Pipelined: each large tensor's copy is queued in chunks, an event after
  // each, and the pinned tensor goes into the message at once with a gate
  // on those events (tensor/storage.h's ReadyGate); the transport waits on
  // it piece by piece (docs/design/cuda_rpc.md, "Pipelined staging").
  for (const Later& each : later) {
    if (!status.ok()) break;
    Tensor& t = *each.tensor;
    absl::StatusOr<cuda::ChunkedCopy> copy = cuda::QueueChunkedCopyToPinned(
        t, kStream, *pinned_, kPipelineChunkBytes);
    if (!copy.ok()) {
      status = Annotate(copy.status(), staging(each.position, t));
      // Chunks already queued still read the source: wait before it goes.
      (void)WaitForDevices({t.device().index}, api_, staging(each.position, t));
      break;
    }
    Tensor host = copy->tensor;
    const Storage& s = host.storage();
    auto gate = std::make_shared<ChunkGate>(api_, *std::move(copy), t,
                                            staging(each.position, t));
    absl::StatusOr<Tensor> gated = Tensor::FromStorage(
        Storage::WrapGated(s.data(), s.nbytes(), s.device(),
                           std::make_shared<Storage>(s), std::move(gate)),
        host.dtype(), host.sizes(), host.strides(), host.storage_offset());
    if (!gated.ok()) {  // The gate, dropped, waits for the chunks.
      status = Annotate(gated.status(), staging(each.position, t));
      break;
    }
    t = *std::move(gated);
  }
  if (!status.ok()) {
    Count(peer.name, StagedTraffic{.refused = 1});
    return status;
  }
  if (!request && ipc != nullptr && !ipc->empty()) {
    header.ipc_reply = m.id.value();  // What the caller acknowledges.
  }
  if (!header.placements.empty() || header.ipc_ack.has_value() ||
      header.ipc_replies || !header.reply_acks.empty()) {
    m.SetHeader(kDeviceHeaderLayer, EncodeDeviceHeader(header));
  }
  if (ipc != nullptr) ipc->Commit(m.id, hold_until);
  if (counted.tensors_out > 0) Count(peer.name, counted);
  return absl::OkStatus();
}

absl::StatusOr<Tensor> DeviceStage::WithCompute(Tensor t) const {
  if (compute_ == nullptr) return t;  // So autograd can compute on it.
  const Storage& s = t.storage();
  return Tensor::FromStorage(
      Storage::Wrap(s.data(), s.nbytes(), s.device(),
                    std::make_shared<Storage>(s), compute_),
      t.dtype(), t.sizes(), t.strides(), t.storage_offset());
}

absl::Status DeviceStage::LandIn(const rpc::WorkerInfo& peer, rpc::Message& m,
                                 bool request) {
  const std::string* bytes = m.FindHeader(kDeviceHeaderLayer);
  if (bytes == nullptr) return absl::OkStatus();
  const std::string what = absl::StrCat("worker '", me_, "': ",
                                        Which(m, request), " from '",
                                        peer.name, "'");
  const std::vector<Tensor> tensors = m.Tensors();
  absl::StatusOr<DeviceHeader> header =
      DecodeDeviceHeader(*bytes, tensors.size(), request, what);
  std::map<uint32_t, Tensor> landed;  // Released if any placement fails.
  std::unique_ptr<IpcIncoming> ipc;   // Copies from a peer's handles.
  std::set<int> queued;  // Devices with staged copies queued on kStream.
  StagedTraffic counted;
  absl::Status status = header.status();
  if (status.ok() && ipc_ != nullptr) {
    // The callee copied the request's IPC tensors: release them.
    if (header->ipc_ack.has_value()) {
      ipc_->Replied(peer.name, GlobalId::FromValue(*header->ipc_ack));
    }
    // The caller copied our replies' IPC tensors: release them.
    if (!header->reply_acks.empty()) {
      ipc_->RepliesAcked(peer.name, header->reply_acks);
    }
  }
  if (status.ok()) {
    for (const DevicePlacement& p : header->placements) {
      const Tensor& host = tensors[p.position];
      const std::string tensor = absl::StrCat(
          "tensor ", p.position, " (", host.defined() ? host.nbytes() : 0,
          " bytes, from its cuda:", p.source, ")");
      if (!host.defined() || !host.device().is_cpu()) {
        status = absl::InvalidArgumentError(absl::StrCat(
            what, ": malformed device header: ", tensor,
            " did not arrive as host bytes"));
        break;
      }
      Device target;
      if (request && !header->returning) {
        target = Device::CUDA(*p.target);
      } else {
        absl::StatusOr<Device> back =
            maps_.ReplyTarget(me_, peer.name, Device::CUDA(p.source),
                              static_cast<int>(p.position));
        if (!back.ok()) {
          status = back.status();
          break;
        }
        target = *back;
      }
      if (target.is_cpu()) {
        if (p.ipc.has_value()) {  // No host bytes to keep.
          status = absl::InvalidArgumentError(absl::StrCat(
              what, ": ", tensor, " came by CUDA IPC but lands on this "
              "worker's CPU (IPC replies are asked for only without "
              "stage_unmapped_to_cpu)"));
          break;
        }
        continue;  // Staging to CPU was allowed.
      }
      if (devices_.empty()) {
        status = absl::FailedPreconditionError(absl::StrCat(
            what, ": ", tensor, " is sent to ", target.ToString(),
            ", but this worker has no CUDA devices (WorkerOptions::devices)"));
        break;
      }
      if (!Uses(target)) {
        status = absl::InvalidArgumentError(absl::StrCat(
            what, ": ", tensor, " is sent to ", target.ToString(),
            ", which this worker does not use (", DeviceListText(), ")"));
        break;
      }
      if (p.ipc.has_value()) {  // IPC (worker/device_ipc.h).
        if (ipc == nullptr && ipc_ != nullptr) {
          // A reply's copies are acknowledged once they ended.
          ipc = ipc_->Receive(
              peer.name, header->events,
              request ? std::nullopt
                      : std::optional<GlobalId>(
                            GlobalId::FromValue(*header->ipc_reply)));
        }
        absl::StatusOr<Tensor> copied =
            ipc != nullptr
                ? ipc->Land(p, host, target.index, what, tensor)
                : absl::FailedPreconditionError(absl::StrCat(
                      what, ": ", tensor, " came by CUDA IPC, which this "
                      "worker's device API (", api_->name(), ") lacks"));
        if (copied.ok()) copied = WithCompute(*std::move(copied));
        if (!copied.ok()) {
          status = copied.status();  // Land's errors name `what`.
          break;
        }
        landed.emplace(p.position, *std::move(copied));
        continue;
      }
      // Pipelined: its chunks were queued as they arrived (the rest now).
      std::optional<AdoptedLanding> adopted =
          landing_->Adopt(host, target.index);
      const uint64_t early =
          adopted.has_value() ? adopted->early_chunks : uint64_t{0};
      // No event per copy: one wait per device follows.
      absl::StatusOr<Tensor> copy =
          adopted.has_value()
              ? Tensor::FromStorage(std::move(adopted->storage), host.dtype(),
                                    host.sizes(),
                                    ContiguousStrides(host.sizes()))
              : cuda::QueueCopyToDevice(host, target.index, kStream,
                                        *allocator_, *pinned_);
      if (!copy.ok()) {
        status = Annotate(copy.status(),
                          absl::StrCat(what, ": landing ", tensor, " on ",
                                       target.ToString()));
        break;
      }
      queued.insert(target.index);
      absl::StatusOr<Tensor> on_device = WithCompute(*std::move(copy));
      if (!on_device.ok()) {
        status = Annotate(on_device.status(), what);
        break;
      }
      ++counted.tensors_in;
      counted.bytes_in += host.nbytes();
      if (adopted.has_value()) {
        ++counted.pipelined_in;
        counted.early_chunks += early;
      }
      landed.emplace(p.position, *std::move(on_device));
    }
  }
  // One wait per device, also after a failure: the landed tensors are
  // released only once nothing queued writes them.
  absl::Status waited = WaitForDevices(queued, api_, what);
  if (status.ok()) status = waited;
  if (status.ok() && ipc != nullptr) status = ipc->Finish();
  // A reply whose IPC tensors were never reached (an earlier placement
  // failed): nothing reads the callee's memory, so it may go.
  if (!request && ipc == nullptr && ipc_ != nullptr && header.ok() &&
      header->ipc_reply.has_value()) {
    ipc_->OweAck(peer.name, GlobalId::FromValue(*header->ipc_reply));
  }
  // The peer can open this worker's handles: its returning gradients may
  // come by IPC too.
  if (status.ok() && request && ipc_ != nullptr && header->ipc_replies) {
    ipc_->AcceptsReturning(peer.name);
  }
  // The reply acknowledges IPC tensors, or may carry its own by IPC.
  if (status.ok() && request && ipc_ != nullptr &&
      (ipc != nullptr || header->ipc_replies)) {
    ipc_->ExpectReply(peer.name, m.id,
                      {.ack = ipc != nullptr,
                       .ipc = header->ipc_replies,
                       .deadline = m.deadline});
  }
  if (!status.ok()) {
    landed.clear();  // Back to the allocator before the error travels.
    Count(peer.name, StagedTraffic{.refused = 1});
    return status;
  }
  uint32_t position = 0;
  rpc::ForEachTensor(m.payload, [&](Tensor& t) {
    auto it = landed.find(position++);
    if (it != landed.end()) t = std::move(it->second);
  });
  m.ClearHeader(kDeviceHeaderLayer);
  if (counted.tensors_in > 0) Count(peer.name, counted);
  return absl::OkStatus();
}

StagedTraffic DeviceStage::Traffic(const std::string& peer) const {
  MutexLock lock(&mu_);
  auto it = traffic_.find(peer);
  return it == traffic_.end() ? StagedTraffic{} : it->second;
}

std::vector<rpc::InspectionRow> DeviceStage::Inspect() const {
  std::map<std::string, StagedTraffic> copy;
  {
    MutexLock lock(&mu_);
    copy = traffic_;
  }
  std::vector<rpc::InspectionRow> rows;
  for (const auto& [peer, t] : copy) {
    rows.push_back({"staged",
                    {{"peer", peer},
                     {"tensors_out", absl::StrCat(t.tensors_out)},
                     {"bytes_out", absl::StrCat(t.bytes_out)},
                     {"to_cpu_out", absl::StrCat(t.to_cpu_out)},
                     {"tensors_in", absl::StrCat(t.tensors_in)},
                     {"bytes_in", absl::StrCat(t.bytes_in)},
                     {"pipelined_in", absl::StrCat(t.pipelined_in)},
                     {"early_chunks", absl::StrCat(t.early_chunks)},
                     {"refused", absl::StrCat(t.refused)}}});
  }
  if (pinned_ != nullptr) {
    const cuda::AllocatorStats p = pinned_->Stats();
    rows.push_back({"pinned",
                    {{"allocated_bytes", absl::StrCat(p.allocated_bytes)},
                     {"cached_bytes", absl::StrCat(p.cached_bytes)},
                     {"pending_bytes", absl::StrCat(p.pending_bytes)},
                     {"allocations", absl::StrCat(p.allocations)},
                     {"cache_hits", absl::StrCat(p.cache_hits)},
                     {"host_allocs", absl::StrCat(p.device_mallocs)}}});
  }
  return rows;
}

}  // namespace ferry
