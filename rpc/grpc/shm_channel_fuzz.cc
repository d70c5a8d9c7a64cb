// libFuzzer target: a same-host payload descriptor (v1::SameHostPayload) as
// a peer sends it, fetched by SameHostChannel::Fetch (shm_channel.h) and
// decoded. Three channels of this process are negotiated as workers w0, w1
// and w2 (w2 with max_message_bytes 4096); per input, w0 leases a known
// Value, and the fuzzer's descriptor is read by w1 or w2. The "peer" is this
// process, so every address the descriptor names is this process's memory.
//
// Addresses are symbolic, so the fuzzer can aim at real objects: a region
// address is a base (w0's two leased tensors, the end of the first, 0, a
// kernel address, the top of the address space, an absolute value, a
// buffer that is not leased) plus a signed offset; the slot is the live
// lease's plus a signed offset; the nonce is the live lease's plus an
// offset, or absolute. The MAC is the one w0 made for its real descriptor
// (an empty `mac` in the input), the input's bytes (a forgery), or, with
// settings bit 7, w0's MAC over the changed descriptor (a sender that signs
// what its lease does not hold: the lease table must refuse it).
//
// Input: byte 0 settings (bit 0 reply lease, bits 1-2 reader and peer,
// bits 3-4 limits, bit 5 checking allocator, bit 6 lease released before
// the read, bit 7 re-signed), then the serialized descriptor.
//
// Checks, for any input:
//  * errors are InvalidArgument, Aborted (no live lease under that nonce),
//    PermissionDenied (MAC or lease table) or ResourceExhausted over the
//    reader's max_message_bytes, and name the worker; never a crash, never
//    an out-of-bounds write (ASan checks the kernel's writes into the
//    receive buffer);
//  * a descriptor without a valid MAC is never read: it fails, and not with
//    Aborted (which would mean the sender's lease was looked at); w0's own
//    descriptor is never refused as forged;
//  * an allocation is never over WireLimits::max_total_bytes or the
//    reader's max_message_bytes;
//  * a fetch succeeds only for a valid MAC, the live lease's slot and nonce
//    and exactly the regions its lease lists, and then holds the head, each
//    region's bytes and zeroed padding, and decodes (or is InvalidArgument);
//    the real descriptor decodes to the Value sent;
//  * the sender's memory (its tensors, the unleased buffer) never changes;
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
#include "ferry/rpc/grpc/keyed_mac.h"
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
  bool real_nonce = false;
  bool real_slot = false;
  bool real_regions = false;
  bool real_fields = false;  // Every signed field as w0 signed it.
};

Aimed Aim(const v1::SameHostPayload& in, const v1::SameHostPayload& real,
          const std::string& unleased) {
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
                             reinterpret_cast<uintptr_t>(unleased.data())};
  for (v1::SameHostPayload::Region& r : *out.d.mutable_regions()) {
    const uint64_t v = r.address();
    r.set_address((v % 8 == 6 ? v / 8 : bases[v % 8]) + Signed(v / 8));
  }
  out.d.set_slot(static_cast<uint32_t>(real.slot() + Signed(in.slot())));
  out.real_slot = out.d.slot() == real.slot();
  const uint64_t n = in.nonce();
  out.d.set_nonce((n & 1) ? real.nonce() + (n >> 1) : n >> 1);
  out.real_nonce = out.d.nonce() == real.nonce();
  // Compared by value, field by field: the MAC and the lease table cover
  // these values, not the message's bytes (a mutation may add unknown
  // fields, which the channel rightly ignores).
  out.real_regions = out.d.regions_size() == real.regions_size();
  for (int i = 0; out.real_regions && i < real.regions_size(); ++i) {
    const v1::SameHostPayload::Region& a = out.d.regions(i);
    const v1::SameHostPayload::Region& b = real.regions(i);
    out.real_regions = a.address() == b.address() && a.size() == b.size() &&
                       a.padding() == b.padding();
  }
  out.real_fields = out.real_regions && out.d.slot() == real.slot() &&
                    out.d.nonce() == real.nonce() &&
                    out.d.head() == real.head();
  if (in.mac().empty()) out.d.set_mac(real.mac());
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
  const bool resigned = (settings & 128) != 0;

  SameHostChannel& sender = *group->c[0];
  Sent sent;
  static const std::string* const unleased = new std::string(4096, 'u');
  absl::StatusOr<EncodedValue> encoded = EncodeValue(sent.value);
  if (!encoded.ok()) Fail("encode", encoded.status());
  v1::SameHostPayload real;
  std::shared_ptr<void> lease;
  if (!sender.Offer(reader, *encoded, &real, reply ? nullptr : &lease)) {
    Fail("w0 did not lease the payload");
  }
  if (real.mac().size() != KeyedMac::kTagBytes) Fail("w0 signed nothing");
  if (released) {
    lease.reset();
    (void)sender.live_leases();  // Ends a reply lease (timeout 0).
  }
  Aimed aimed = Aim(in, real, *unleased);
  if (resigned) sender.SignForTesting(reader, &aimed.d);
  const v1::SameHostPayload& d = aimed.d;
  // w0's key for this reader is the pair's only when w0 is the claimed peer.
  const bool valid_mac =
      peer == 0 && (resigned || (in.mac().empty() && aimed.real_fields));
  const std::vector<Known> known = {
      {reinterpret_cast<uintptr_t>(sent.a.data_ptr()),
       reinterpret_cast<uintptr_t>(sent.a.data_ptr()) + sent.a.nbytes()},
      {reinterpret_cast<uintptr_t>(sent.b.data_ptr()),
       reinterpret_cast<uintptr_t>(sent.b.data_ptr()) + sent.b.nbytes()}};
  const std::string sent_bytes = Encoded(sent.value);

  absl::StatusOr<WireChunk> got = group->c[reader]->Fetch(peer, d, limits);
  const std::string named = peer == 7 ? "rank 7"
                                      : absl::StrCat("worker 'w", peer, "'");
  if (!got.ok()) {
    const absl::StatusCode code = got.status().code();
    const bool allowed =
        code == absl::StatusCode::kInvalidArgument ||
        code == absl::StatusCode::kAborted ||
        code == absl::StatusCode::kPermissionDenied ||
        (code == absl::StatusCode::kResourceExhausted && reader == 2);
    if (!allowed) Fail("unexpected error code", got.status());
    if (valid_mac && aimed.real_fields &&
        code == absl::StatusCode::kPermissionDenied) {
      Fail("w0's own descriptor was refused", got.status());
    }
    if (!valid_mac && code == absl::StatusCode::kAborted) {
      Fail("a descriptor without a valid MAC was looked up", got.status());
    }
    if (!absl::StrContains(got.status().message(), named)) {
      Fail("the error does not name " + named, got.status());
    }
  } else {
    if (!valid_mac) Fail("fetched a descriptor without a valid MAC");
    if (released || !aimed.real_slot || !aimed.real_nonce) {
      Fail("fetched without a live lease");
    }
    if (!aimed.real_regions) Fail("read regions the lease does not list");
    if (got->size > allocator.limit) Fail("fetched more than the limit");
    CheckFetched(*got, d, known);
    WireStats stats;
    absl::StatusOr<Value> v =
        DecodeValue(absl::MakeConstSpan(&*got, 1), limits, &stats);
    if (!v.ok() && v.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("decoding: unexpected error code", v.status());
    }
    if (aimed.real_fields) {
      if (!v.ok()) Fail("the real descriptor does not decode", v.status());
      if (Encoded(*v) != sent_bytes) Fail("decoded a different Value");
    }
  }
  if (Encoded(sent.value) != sent_bytes ||
      *unleased != std::string(4096, 'u')) {
    Fail("the sender's memory changed");
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
