// Shared-secret authentication of TCPStore connections (a Ferry extension
// to PyTorch's protocol; see tcp_store_protocol.h for the frames).
//
// When the server has a secret, a connection must prove it before any other
// query (VALIDATE excepted); a query sent before that drops the connection
// without touching a key. The proof is a challenge-response, so the secret
// never crosses the wire, and it is mutual (the client checks that the
// server knows the secret too):
//
//   client -> AUTH_CHALLENGE(client_nonce)            32 random bytes
//   server -> server_nonce, Proof(secret, "server", client_nonce, server_nonce)
//   client -> AUTH_PROOF(Proof(secret, "client", client_nonce, server_nonce))
//   server -> 0 (accepted), or 1 and it closes the connection
//
// Proof is HMAC-SHA256 keyed with the secret over a label, the role and the
// two nonces, so neither answer can be replayed as the other.
//
// PyTorch's clients cannot authenticate: a store with a secret refuses them.
//
// Thread safety: stateless functions.
#ifndef FERRY_STORE_STORE_AUTH_H_
#define FERRY_STORE_STORE_AUTH_H_

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ferry/common/env.h"

namespace ferry::tcpstore {

inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr uint8_t kAuthAccepted = 0;
inline constexpr uint8_t kAuthRefused = 1;

// kAuthNonceBytes from the system's secure random generator.
std::string RandomNonce();

// HMAC-SHA256(secret, label | role | client_nonce | server_nonce).
std::string AuthProof(absl::string_view secret, absl::string_view role,
                      absl::string_view client_nonce,
                      absl::string_view server_nonce);

// Constant-time comparison.
bool ProofsEqual(absl::string_view a, absl::string_view b);

// The store secret from FERRY_STORE_SECRET_FILE (a file's contents, trailing
// newline stripped) or else FERRY_STORE_SECRET; "" when neither is set (no
// authentication). InvalidArgument when the file cannot be read or is empty.
absl::StatusOr<std::string> StoreSecretFromEnv(const EnvLookup& env);
// The same from this process's environment.
absl::StatusOr<std::string> StoreSecretFromEnv();

}  // namespace ferry::tcpstore

#endif  // FERRY_STORE_STORE_AUTH_H_
