// Transport security of the gRPC agent: TLS and mutual TLS.
//
// Off by default (plaintext). With TlsOptions set, every worker serves TLS
// with its certificate and key, and dials peers over TLS, verifying their
// certificates against the CA bundle (the peer's certificate must name the
// address it is dialled at, e.g. SAN IP:127.0.0.1, unless `server_name`
// overrides the name checked). With require_client_cert, a client that shows
// no certificate signed by the CA is refused during the handshake; without
// it, a client certificate is verified when one is presented.
//
// Refusals: the caller's error says the handshake failed and names the CA
// file (rpc/grpc/agent.cc adds TlsFailureHint); the server logs gRPC's
// handshake error (gRPC writes it to stderr at ERROR).
//
// Thread safety: plain values and stateless functions.
#ifndef FERRY_RPC_GRPC_TLS_H_
#define FERRY_RPC_GRPC_TLS_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ferry/common/env.h"

namespace ferry::rpc {

struct TlsOptions {
  // PEM files. All three set: TLS; all three empty: plaintext.
  std::string ca_file;    // CA bundle that peers' certificates must chain to
  std::string cert_file;  // this worker's certificate (chain)
  std::string key_file;   // its private key
  // Refuse clients (peers, grpcurl...) without a certificate from the CA.
  bool require_client_cert = false;
  // Name checked in the servers' certificates instead of the dialled host.
  std::string server_name;

  bool enabled() const {
    return !ca_file.empty() || !cert_file.empty() || !key_file.empty();
  }
};

namespace grpc_agent {

// Loaded credentials for both directions.
struct Credentials {
  std::shared_ptr<grpc::ServerCredentials> server;
  std::shared_ptr<grpc::ChannelCredentials> channel;
  // Channel arguments the client side needs (the name override).
  std::function<void(grpc::ChannelArguments&)> apply_channel_args;
};

// Reads the PEM files of `tls` (plaintext credentials when disabled).
// InvalidArgument naming `worker` and the option or file when one of the
// three files is missing, unreadable or not PEM.
absl::StatusOr<Credentials> LoadCredentials(const TlsOptions& tls,
                                            absl::string_view worker);

// TlsOptions from FERRY_TLS_CA, FERRY_TLS_CERT, FERRY_TLS_KEY,
// FERRY_TLS_REQUIRE_CLIENT_CERT (1/true) and FERRY_TLS_SERVER_NAME, through
// `env` (name -> value or nullopt). InvalidArgument for a bad boolean.
absl::StatusOr<TlsOptions> TlsOptionsFromEnv(const EnvLookup& env);

// True for 127.0.0.0/8, ::1 and localhost listen addresses ("host:port").
bool IsLoopbackAddress(absl::string_view address);

// Logs a warning when `worker` listens on a non-loopback address without
// TLS. Returns whether it warned.
bool WarnIfPlaintextExposed(const TlsOptions& tls, absl::string_view address,
                            absl::string_view worker);

// For an Unavailable error seen by a TLS-enabled caller: a sentence saying
// the handshake failed and what the peer must present, or "" when
// `grpc_message` does not look like a handshake failure.
std::string TlsFailureHint(const TlsOptions& tls,
                           absl::string_view grpc_message);

}  // namespace grpc_agent
}  // namespace ferry::rpc

#endif  // FERRY_RPC_GRPC_TLS_H_
