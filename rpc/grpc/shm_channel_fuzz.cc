// libFuzzer target: a same-host payload descriptor (v1::SameHostPayload) as
// a peer sends it, fetched by SameHostChannel::Fetch (shm_channel.h) and
// decoded. Three channels of this process are negotiated as workers w0, w1
// and w2 (w2 with max_message_bytes 4096); per input, w0 leases a known
// Value, and the fuzzer's descriptor is read by w1 or w2. The "peer" is this
// process, so every address the descriptor names is this process's memory.
//
// Addresses are symbolic, so the fuzzer can aim at real objects: a region
// address is a base (w0's two leased tensors, the end of the first, 0, a
// kernel address, the top of the address space, an absolute value, the
// lease's token word) plus a signed offset; the token address is the real
// token or ack word, 0 or absolute, plus an offset; the nonce is the live
// lease's plus an offset, or absolute. The ack address (which Fetch writes)
// is one of: the real ack word, a scratch word, 0, a kernel address: a
// descriptor may write only where its sender could.
//
// Input: byte 0 settings (bit 0 reply lease, bits 1-2 reader and peer,
// bits 3-4 limits, bit 5 checking allocator, bit 6 lease released before
// the read), then the serialized descriptor.
//
// Checks, for any input:
//  * errors are InvalidArgument, Aborted (no live lease at that token), or
//    ResourceExhausted over the reader's max_message_bytes, and name the
//    worker; never a crash, never an out-of-bounds write (ASan checks the
//    kernel's writes into the receive buffer);
//  * an allocation is never over WireLimits::max_total_bytes or the
//    reader's max_message_bytes;
//  * a fetch succeeds only for the live lease's token and nonce, and then
//    holds the head, each region's bytes (where it lies in a known object)
//    and zeroed padding, acknowledges the lease where the descriptor's ack
//    word is the real one, and decodes (or is InvalidArgument); the real
//    descriptor decodes to the Value sent;
//  * only a reply's descriptor has an ack address (a request's lease ends
//    with its call);
//  * no lease outlives its call (request) or its timeout (reply).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ferry/proto/rpc.pb.h"
#include "ferry/rpc/grpc/fuzz_support.h"
#include "ferry/rpc/grpc/shm_channel.h"
#include "ferry/store/hash_store.h"
#include "ferry/tensor/storage.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tensor/wire.h"

namespace ferry::rpc::grpc_agent {
namespace {

namespace v1 = ::ferry::rpc::v1;

constexpr int64_t kReaderMaxMessageBytes = 4096;
constexpr uint64_t kKernelAddress = 0xffff800000000000;

[[noreturn]] void Fail(const std::string& what, const absl::Status& s = {}) {
  FuzzFail("shm_channel_fuzz", what, s);
}

// w0 sends; w1 and w2 read (w2 with a message size limit).
struct Group {
  Group() {
    auto store = std::make_shared<HashStore>();
    std::vector<WorkerInfo> group;
    for (int i = 0; i < 3; ++i) {
      SameHostOptions o;
      o.min_bytes = 1;
      o.lease_timeout = absl::ZeroDuration();  // Reply leases end at once.
      if (i == 2) o.max_message_bytes = kReaderMaxMessageBytes;
      c[i] = std::make_shared<SameHostChannel>(o, absl::StrCat("w", i));
      group.push_back(WorkerInfo{absl::StrCat("w", i), i, ""});
      if (!c[i]->Publish(*store, i).ok()) Fail("publish");
    }
    std::vector<std::thread> ts;
    absl::Status status[3];
    for (int i = 0; i < 3; ++i) {
      ts.emplace_back([&, i] {
        status[i] = c[i]->Negotiate(*store, group, i, absl::Seconds(30));
      });
    }
    for (auto& t : ts) t.join();
    for (int i = 0; i < 3; ++i) {
      if (!status[i].ok()) Fail("negotiate", status[i]);
    }
    if (!c[0]->UsableTo(1) || !c[0]->UsableTo(2)) {
      Fail("cross-memory attach is refused on this machine");
    }
  }
  std::shared_ptr<SameHostChannel> c[3];
};

// What w0 leases for each input: two tensors and an int.
struct Sent {
  Tensor a = arange(300, DType::kFloat32);
  Tensor b = full({3, 5}, 2.5, DType::kInt64);
  Value value = Value::FromList(
      {Value::FromTensor(a), Value::Int(7), Value::FromTensor(b)});
};

std::string Encoded(const Value& v) {
  absl::StatusOr<EncodedValue> e = EncodeValue(v);
  if (!e.ok()) Fail("encode", e.status());
  return e->Flatten();
}

// Fails the target on an allocation over the limits.
class CheckingAllocator final : public Allocator {
 public:
  Device device() const override { return Device::CPU(); }
  absl::StatusOr<Storage> Allocate(size_t n) override {
    if (n > limit) Fail(absl::StrCat("allocated ", n, " bytes, over ", limit));
    return GetCpuAllocator()->Allocate(n);
  }
  uint64_t limit = 0;
};

uint64_t Signed(uint64_t v) { return (v >> 1) ^ (~(v & 1) + 1); }

struct Known {  // An object of this process a region may lie in.
  uint64_t begin, end;
};

// The descriptor as the fuzzer described it, with real addresses.
struct Aimed {
  v1::SameHostPayload d;
  bool real_token = false;
  bool real_ack = false;
  bool real_nonce = false;
};

Aimed Aim(const v1::SameHostPayload& in, const v1::SameHostPayload& real,
          uint64_t* scratch) {
  Aimed out;
  out.d = in;
  const uint64_t a0 = real.regions(0).address();
  const uint64_t bases[8] = {a0,
                             real.regions(1).address(),
                             a0 + real.regions(0).size(),
                             0,
                             kKernelAddress,
                             ~uint64_t{0},
                             0,
                             real.token_address()};
  for (v1::SameHostPayload::Region& r : *out.d.mutable_regions()) {
    const uint64_t v = r.address();
    r.set_address((v % 8 == 6 ? v / 8 : bases[v % 8]) + Signed(v / 8));
  }
  const uint64_t t = in.token_address();
  const uint64_t token_bases[4] = {real.token_address(), real.ack_address(), 0,
                                   t / 4};
  out.d.set_token_address(token_bases[t % 4] + Signed(t / 4));
  out.real_token = out.d.token_address() == real.token_address();
  const uint64_t ack_choices[4] = {real.ack_address(),
                                   reinterpret_cast<uintptr_t>(scratch), 0,
                                   kKernelAddress};
  out.d.set_ack_address(ack_choices[in.ack_address() % 4]);
  // A request's descriptor has no ack address (its lease ends with the call).
  out.real_ack = in.ack_address() % 4 == 0 && real.ack_address() != 0;
  const uint64_t n = in.nonce();
  out.d.set_nonce((n & 1) ? real.nonce() + (n >> 1) : n >> 1);
  out.real_nonce = out.d.nonce() == real.nonce();
  return out;
}

// A successful fetch: the head, then each region padded with zeros.
void CheckFetched(const WireChunk& got, const v1::SameHostPayload& d,
                  const std::vector<Known>& known) {
  uint64_t total = d.head().size();
  for (const auto& r : d.regions()) total += r.size() + r.padding();
  if (got.size != total) Fail("fetched size is not the descriptor's");
  if (std::memcmp(got.data, d.head().data(), d.head().size()) != 0) {
    Fail("fetched head differs");
  }
  const char* at = got.data + d.head().size();
  for (const auto& r : d.regions()) {
    for (const Known& k : known) {
      if (r.address() >= k.begin && r.address() + r.size() <= k.end &&
          std::memcmp(at, reinterpret_cast<const void*>(r.address()),
                      r.size()) != 0) {
        Fail("fetched region differs from the sender's bytes");
      }
    }
    at += r.size();
    for (uint64_t i = 0; i < r.padding(); ++i) {
      if (at[i] != 0) Fail("padding is not zeroed");
    }
    at += r.padding();
  }
}

void FuzzOne(const uint8_t* data, size_t size) {
  static Group* const group = new Group();
  if (size < 1) return;
  const uint8_t settings = data[0];
  v1::SameHostPayload in;
  if (!in.ParseFromArray(data + 1, static_cast<int>(size - 1))) return;
  const bool reply = (settings & 1) != 0;
  const int choice = (settings >> 1) & 3;
  const int reader = choice == 1 ? 2 : 1;
  const int peer = choice == 2 ? 7 : choice == 3 ? reader : 0;
  WireLimits limits;
  const uint64_t limit_choices[4] = {uint64_t{1} << 20, 4096, 100,
                                     uint64_t{1} << 24};
  limits.max_total_bytes = limit_choices[(settings >> 3) & 3];
  CheckingAllocator allocator;
  allocator.limit = limits.max_total_bytes;
  if (reader == 2) {
    allocator.limit =
        std::min<uint64_t>(allocator.limit, kReaderMaxMessageBytes);
  }
  if (settings & 32) limits.allocator = &allocator;
  const bool released = (settings & 64) != 0;

  SameHostChannel& sender = *group->c[0];
  Sent sent;
  absl::StatusOr<EncodedValue> encoded = EncodeValue(sent.value);
  if (!encoded.ok()) Fail("encode", encoded.status());
  v1::SameHostPayload real;
  std::shared_ptr<void> lease;
  if (!sender.Offer(reader, *encoded, &real, reply ? nullptr : &lease)) {
    Fail("w0 did not lease the payload");
  }
  if ((real.ack_address() != 0) != reply) {
    Fail("only a reply's descriptor asks for an acknowledgement");
  }
  if (released) {
    lease.reset();
    (void)sender.live_leases();  // Ends a reply lease (timeout 0).
  }
  static uint64_t scratch = 0;
  const Aimed aimed = Aim(in, real, &scratch);
  const v1::SameHostPayload& d = aimed.d;
  const std::vector<Known> known = {
      {reinterpret_cast<uintptr_t>(sent.a.data_ptr()),
       reinterpret_cast<uintptr_t>(sent.a.data_ptr()) + sent.a.nbytes()},
      {reinterpret_cast<uintptr_t>(sent.b.data_ptr()),
       reinterpret_cast<uintptr_t>(sent.b.data_ptr()) + sent.b.nbytes()}};

  absl::StatusOr<WireChunk> got = group->c[reader]->Fetch(peer, d, limits);
  const std::string named = peer == 7 ? absl::StrCat("worker 'w", reader, "'")
                                      : absl::StrCat("worker 'w", peer, "'");
  if (!got.ok()) {
    const absl::StatusCode code = got.status().code();
    const bool allowed =
        code == absl::StatusCode::kInvalidArgument ||
        code == absl::StatusCode::kAborted ||
        (code == absl::StatusCode::kResourceExhausted && reader == 2);
    if (!allowed) Fail("unexpected error code", got.status());
    if (!absl::StrContains(got.status().message(), named)) {
      Fail("the error does not name " + named, got.status());
    }
  } else {
    if (peer == 7 || released || !aimed.real_token || !aimed.real_nonce) {
      Fail("fetched without a live lease");
    }
    if (got->size > allocator.limit) Fail("fetched more than the limit");
    CheckFetched(*got, d, known);
    if (aimed.real_ack) {
      uint64_t ack = 0;
      std::memcpy(&ack, reinterpret_cast<const void*>(real.ack_address()),
                  sizeof ack);
      if (ack != real.nonce()) Fail("the real ack word was not written");
    }
    WireStats stats;
    absl::StatusOr<Value> v =
        DecodeValue(absl::MakeConstSpan(&*got, 1), limits, &stats);
    if (!v.ok() && v.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("decoding: unexpected error code", v.status());
    }
    if (d.SerializeAsString() == real.SerializeAsString()) {
      if (!v.ok()) Fail("the real descriptor does not decode", v.status());
      if (Encoded(*v) != Encoded(sent.value)) Fail("decoded a different Value");
    }
  }
  lease.reset();
  if (sender.live_leases() != 0) Fail("a lease outlived its call or timeout");
}

}  // namespace
}  // namespace ferry::rpc::grpc_agent

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ferry::rpc::grpc_agent::QuietProtobufLogs();
  ferry::rpc::grpc_agent::FuzzOne(data, size);
  return 0;
}
