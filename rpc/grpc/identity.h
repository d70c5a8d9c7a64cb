// Who is calling: the identity a connection proves, bound to the caller a
// request declares (issue #38; the threat model per mode is docs/security.md,
// the reasoning docs/design/same_host_security.md).
//
// A connection proves worker names in two ways:
//  * TLS: the client certificate the handshake verified; its names are its
//    subject alternative names and common name (grpc::AuthContext).
//  * Store secret (GrpcAgentOptions::secret): every call on a channel
//    carries the channel's proof in metadata (kProofMetadata): the caller's
//    name, the callee's name, a fresh nonce and an HMAC-SHA256 of the three
//    under a key derived from the secret. It is made once per channel, so a
//    call costs a metadata entry (HPACK-indexed after the first) and, on
//    the server, a lookup of proofs already verified.
// With neither (plaintext, no secret) nothing is proven and nothing is
// checked: a local client can send any message as any worker (documented).
//
// CheckCaller's rule, when TLS or a secret is on: a request is accepted if
// the connection proved the name it declares; a CALL is also accepted from
// a connection that proved no worker's name (a stranger may call registered
// functions, as in plaintext); anything else is PermissionDenied naming the
// claimed worker and the proven identity.
//
// Thread safety: all methods may be called from any thread.
#ifndef FERRY_RPC_GRPC_IDENTITY_H_
#define FERRY_RPC_GRPC_IDENTITY_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/grpc/keyed_mac.h"
#include "ferry/rpc/message.h"

namespace ferry::rpc::grpc_agent {

// Binary metadata (gRPC base64-encodes "-bin" values on the wire).
inline constexpr char kProofMetadata[] = "ferry-identity-bin";

// What a connection proved.
struct ProvenIdentity {
  std::vector<std::string> names;
  // How, for errors: "TLS certificate", "store-secret proof".
  std::string how;
};

class CallerVerifier {
 public:
  // `self`: this worker's name (proofs must be addressed to it). `secret`:
  // the store secret, "" for none. `tls`: whether the server serves TLS.
  CallerVerifier(std::string self, absl::string_view secret, bool tls);

  // Whether anything is checked (TLS or a secret).
  bool enforcing() const { return tls_ || key_ != nullptr; }

  // The proof worker `from` attaches to its calls to worker `to` on one
  // channel (a fresh nonce each time); "" without a secret.
  std::string MakeProof(absl::string_view from, absl::string_view to) const;

  // The names the call's connection proved (certificate, proof metadata).
  ProvenIdentity Identify(const grpc::ServerContextBase& context);

  // OK, or PermissionDenied naming `claimed` and what was proven.
  // `is_worker(name)`: whether `name` is a member of the group.
  absl::Status CheckCaller(
      const ProvenIdentity& proven, MessageType type,
      const std::string& claimed,
      const std::function<bool(const std::string&)>& is_worker) const;

 private:
  // The name a proof proves, "" when it is not valid for this worker.
  std::string Verify(absl::string_view proof) const;

  static constexpr size_t kMaxRemembered = 4096;
  const std::string self_;
  const bool tls_;
  std::unique_ptr<const KeyedMac> key_;  // Null without a secret.
  mutable Mutex mu_;
  // Verified proofs -> the name they prove. Cleared when full: a proof
  // forgotten is verified again.
  absl::flat_hash_map<std::string, std::string> remembered_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_IDENTITY_H_
