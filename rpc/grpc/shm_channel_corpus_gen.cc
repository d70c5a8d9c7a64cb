// Writes the seed corpus for shm_channel_fuzz: the descriptor w0 sends for
// its leased Value, in the target's symbolic addresses, and hostile
// variants of it.
// Usage: bazel run //rpc/grpc:shm_channel_corpus_gen --
// $PWD/rpc/grpc/testdata/shm_channel_corpus
#include <cstdint>
#include <string>

#include "ferry/proto/rpc.pb.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tensor/wire.h"
#include "ferry/tools/fuzz/corpus_writer.h"

namespace ferry::rpc::grpc_agent {
namespace {

namespace v1 = ::ferry::rpc::v1;

// Settings byte and symbolic values (shm_channel_fuzz.cc).
enum Settings : uint8_t {
  kRequest = 0,
  kReply = 1,
  kReaderW2 = 1 << 1,
  kPeerOutOfRange = 2 << 1,
  kPeerIsReader = 3 << 1,
  kLimit4K = 1 << 3,
  kLimit100 = 2 << 3,
  kCheckingAllocator = 32,
  kReleased = 64,
  kResigned = 128,
};
constexpr uint64_t kLiveNonce = 1;     // The live lease's nonce.
constexpr uint32_t kNextSlot = 2;      // The live lease's slot + 1.
constexpr uint64_t kKernelRegion = 4;  // Region: a kernel address.
constexpr uint64_t kTopRegion = 5;     // Region: the top of memory.
constexpr uint64_t kUnleased = 7;      // Region: a buffer not leased.
constexpr uint64_t kEndOfFirstRegion = 2;

// The descriptor w0 sends for the Value the target leases.
v1::SameHostPayload Real() {
  Value value = Value::FromList(
      {Value::FromTensor(arange(300, DType::kFloat32)), Value::Int(7),
       Value::FromTensor(full({3, 5}, 2.5, DType::kInt64))});
  EncodedValue e = *EncodeValue(value);
  v1::SameHostPayload d;
  d.set_head(e.head);
  for (size_t i = 0; i < e.payloads.size(); ++i) {
    v1::SameHostPayload::Region* r = d.add_regions();
    r->set_address(i);  // Base i (the i-th tensor), offset 0.
    r->set_size(e.payloads[i].size);
    r->set_padding(e.payloads[i].padding);
  }
  d.set_nonce(kLiveNonce);  // Slot 0: the live lease's; no mac: w0's.
  return d;
}

std::string Input(uint8_t settings, const v1::SameHostPayload& d) {
  return std::string(1, static_cast<char>(settings)) + d.SerializeAsString();
}

fuzz::CorpusFiles Files() {
  fuzz::CorpusFiles files;
  const v1::SameHostPayload real = Real();
  files.emplace_back("real_request", Input(kRequest, real));
  files.emplace_back("real_reply", Input(kReply, real));
  files.emplace_back("real_checked_allocation",
                     Input(kRequest | kReaderW2 | kCheckingAllocator, real));
  files.emplace_back("real_to_self", Input(kReply | kPeerIsReader, real));
  files.emplace_back("real_resigned", Input(kRequest | kResigned, real));
  v1::SameHostPayload d = real;
  d.set_mac(std::string(32, 'm'));
  files.emplace_back("hostile_forged_mac", Input(kRequest, d));
  d.set_mac("short");
  files.emplace_back("hostile_short_mac", Input(kReply, d));
  d = real;
  d.mutable_regions(0)->set_address(kUnleased);
  files.emplace_back("hostile_unleased_region", Input(kRequest, d));
  files.emplace_back("hostile_signed_unleased_region",
                     Input(kRequest | kResigned, d));
  d = real;
  d.set_slot(kNextSlot);
  files.emplace_back("hostile_signed_other_slot",
                     Input(kRequest | kResigned, d));
  d = real;
  d.mutable_regions(1)->set_size(8);
  files.emplace_back("hostile_signed_shorter_region",
                     Input(kReply | kResigned, d));

  files.emplace_back("hostile_released", Input(kRequest | kReleased, real));
  files.emplace_back("hostile_released_reply", Input(kReply | kReleased, real));
  files.emplace_back("hostile_peer_out_of_range",
                     Input(kRequest | kPeerOutOfRange, real));
  files.emplace_back("hostile_over_limit",
                     Input(kRequest | kLimit100 | kCheckingAllocator, real));
  d = real;
  d.set_nonce(3);  // The live nonce + 1.
  files.emplace_back("hostile_stale_nonce", Input(kRequest, d));
  files.emplace_back("hostile_signed_stale_nonce",
                     Input(kRequest | kResigned, d));
  d.set_nonce(0);
  files.emplace_back("hostile_zero_nonce", Input(kRequest, d));
  d = real;
  d.mutable_regions(1)->set_address(kKernelRegion);
  files.emplace_back("hostile_kernel_region", Input(kRequest, d));
  d.mutable_regions(1)->set_address(kTopRegion);
  d.mutable_regions(1)->set_size(4096);
  files.emplace_back("hostile_wrapping_region", Input(kRequest, d));
  d = real;
  d.mutable_regions(0)->set_address(kEndOfFirstRegion);
  files.emplace_back("hostile_past_the_tensor", Input(kRequest, d));
  d = real;
  d.mutable_regions(0)->set_size(uint64_t{1} << 40);
  files.emplace_back("hostile_huge_region", Input(kRequest, d));
  d = real;
  d.mutable_regions(0)->set_size(8192);
  files.emplace_back("hostile_over_max_message",
                     Input(kRequest | kReaderW2 | kCheckingAllocator, d));
  d = real;
  d.mutable_regions(1)->set_padding(64);
  files.emplace_back("hostile_padding", Input(kRequest, d));
  d = real;
  d.clear_regions();
  d.set_head(real.head() + "garbage");
  files.emplace_back("hostile_head_only", Input(kRequest | kLimit4K, d));
  // Found by this target: a descriptor without regions allocated its head
  // unchecked against WireLimits::max_total_bytes.
  d.set_head(std::string(200, 'A'));
  files.emplace_back("regress_head_over_limit_without_regions",
                     Input(kRequest | kLimit100 | kCheckingAllocator, d));
  return files;
}

}  // namespace
}  // namespace ferry::rpc::grpc_agent

int main(int argc, char** argv) {
  return ferry::fuzz::CorpusMain(argc, argv, ferry::rpc::grpc_agent::Files);
}
