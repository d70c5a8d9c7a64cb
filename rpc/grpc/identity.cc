#include "ferry/rpc/grpc/identity.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/store/store_auth.h"

namespace ferry::rpc::grpc_agent {
namespace {

constexpr char kKeyLabel[] = "ferry-rpc-identity-v1";
constexpr size_t kNonceBytes = 16;
// Longest name a proof may carry (worker names are short).
constexpr size_t kMaxNameBytes = 4096;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

bool GetU32(absl::string_view* in, uint32_t* v) {
  if (in->size() < 4) return false;
  *v = 0;
  for (int i = 0; i < 4; ++i) {
    *v |= uint32_t{static_cast<uint8_t>((*in)[i])} << (8 * i);
  }
  in->remove_prefix(4);
  return true;
}

// Proof layout: u32 length, `from`; u32 length, `to`; nonce; tag.
KeyedMac::Tag ProofTag(const KeyedMac& key, absl::string_view from,
                       absl::string_view to, absl::string_view nonce) {
  return key.Begin().AddBytes(from).AddBytes(to).AddBytes(nonce).Finish();
}

}  // namespace

CallerVerifier::CallerVerifier(std::string self, absl::string_view secret,
                               bool tls)
    : self_(std::move(self)), tls_(tls) {
  if (!secret.empty()) {
    // A key of its own, so a proof is never a valid store-auth answer.
    const KeyedMac::Tag k = KeyedMac(secret).Begin().Add(kKeyLabel).Finish();
    key_ = std::make_unique<const KeyedMac>(KeyedMac::ToString(k));
  }
}

std::string CallerVerifier::MakeProof(absl::string_view from,
                                      absl::string_view to) const {
  if (key_ == nullptr) return "";
  const std::string nonce =
      tcpstore::RandomNonce().substr(0, kNonceBytes);
  std::string proof;
  PutU32(&proof, static_cast<uint32_t>(from.size()));
  absl::StrAppend(&proof, from);
  PutU32(&proof, static_cast<uint32_t>(to.size()));
  absl::StrAppend(&proof, to, nonce,
                  KeyedMac::ToString(ProofTag(*key_, from, to, nonce)));
  return proof;
}

std::string CallerVerifier::Verify(absl::string_view proof) const {
  absl::string_view in = proof;
  uint32_t n = 0;
  if (!GetU32(&in, &n) || n > kMaxNameBytes || in.size() < n) return "";
  const absl::string_view from = in.substr(0, n);
  in.remove_prefix(n);
  if (!GetU32(&in, &n) || n > kMaxNameBytes || in.size() < n) return "";
  const absl::string_view to = in.substr(0, n);
  in.remove_prefix(n);
  if (to != self_ || from.empty() ||
      in.size() != kNonceBytes + KeyedMac::kTagBytes) {
    return "";
  }
  const absl::string_view nonce = in.substr(0, kNonceBytes);
  if (!KeyedMac::Equal(ProofTag(*key_, from, to, nonce),
                       in.substr(kNonceBytes))) {
    return "";
  }
  return std::string(from);
}

ProvenIdentity CallerVerifier::Identify(
    const grpc::ServerContextBase& context) {
  ProvenIdentity proven;
  if (tls_) {
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    if (auth != nullptr && auth->IsPeerAuthenticated()) {
      for (const char* property :
           {"x509_subject_alternative_name", "x509_common_name"}) {
        for (const grpc::string_ref& v : auth->FindPropertyValues(property)) {
          proven.names.emplace_back(v.data(), v.size());
        }
      }
      if (!proven.names.empty()) proven.how = "TLS certificate";
    }
  }
  if (key_ == nullptr) return proven;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kProofMetadata);
  if (it == metadata.end()) return proven;
  const absl::string_view proof(it->second.data(), it->second.size());
  std::string name;
  {
    MutexLock lock(&mu_);
    auto known = remembered_.find(proof);
    if (known != remembered_.end()) name = known->second;
  }
  if (name.empty()) {
    name = Verify(proof);
    if (name.empty()) {
      proven.how = absl::StrCat(proven.how, proven.how.empty() ? "" : ", ",
                                "an invalid store-secret proof");
      return proven;
    }
    MutexLock lock(&mu_);
    if (remembered_.size() >= kMaxRemembered) remembered_.clear();
    remembered_.emplace(std::string(proof), name);
  }
  proven.names.push_back(std::move(name));
  proven.how = absl::StrCat(proven.how, proven.how.empty() ? "" : ", ",
                            "store-secret proof");
  return proven;
}

absl::Status CallerVerifier::CheckCaller(
    const ProvenIdentity& proven, MessageType type, const std::string& claimed,
    const std::function<bool(const std::string&)>& is_worker) const {
  if (!enforcing()) return absl::OkStatus();
  const auto& names = proven.names;
  if (std::find(names.begin(), names.end(), claimed) != names.end()) {
    return absl::OkStatus();
  }
  // A stranger's CALL (its connection names no worker) is a plain call.
  const bool names_a_worker =
      std::any_of(names.begin(), names.end(), is_worker);
  if (type == MessageType::kCall && !names_a_worker) return absl::OkStatus();
  const std::string proved =
      names.empty()
          ? absl::StrCat("the connection proved no worker's identity (",
                         proven.how.empty() ? "no client certificate" : proven.how,
                         key_ != nullptr && proven.how.empty()
                             ? ", no store-secret proof"
                             : "",
                         ")")
          : absl::StrCat("the connection is authenticated as '",
                         absl::StrJoin(names, "', '"), "' (", proven.how, ")");
  return absl::PermissionDeniedError(absl::StrCat(
      "worker '", self_, "' refused ", MessageTypeName(type),
      " from a caller claiming to be worker '", claimed, "': ", proved));
}

}  // namespace ferry::rpc::grpc_agent
