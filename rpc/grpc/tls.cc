#include "ferry/rpc/grpc/tls.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "ferry/common/logging.h"

namespace ferry::rpc::grpc_agent {
namespace {

absl::StatusOr<std::string> ReadPem(absl::string_view worker,
                                    absl::string_view option,
                                    const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker '", worker, "': TLS needs ca_file, cert_file and ",
                     "key_file; ", option, " is not set"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker '", worker, "': cannot read TLS ", option, " '", path, "'"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  std::string pem = text.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker '", worker, "': TLS ", option, " '", path, "' is not PEM"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<Credentials> LoadCredentials(const TlsOptions& tls,
                                            absl::string_view worker) {
  Credentials creds;
  if (!tls.enabled()) {
    if (tls.require_client_cert) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker '", worker,
          "': require_client_cert needs TLS (ca_file, cert_file, key_file)"));
    }
    creds.server = grpc::InsecureServerCredentials();
    creds.channel = grpc::InsecureChannelCredentials();
    creds.apply_channel_args = [](grpc::ChannelArguments&) {};
    return creds;
  }
  absl::StatusOr<std::string> ca = ReadPem(worker, "ca_file", tls.ca_file);
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> cert =
      ReadPem(worker, "cert_file", tls.cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(worker, "key_file", tls.key_file);
  if (!key.ok()) return key.status();

  grpc::SslServerCredentialsOptions server(
      tls.require_client_cert
          ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
          : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  server.pem_root_certs = *ca;
  server.pem_key_cert_pairs.push_back({*key, *cert});
  creds.server = grpc::SslServerCredentials(server);

  grpc::SslCredentialsOptions channel;
  channel.pem_root_certs = *ca;
  channel.pem_private_key = *key;
  channel.pem_cert_chain = *cert;
  creds.channel = grpc::SslCredentials(channel);
  creds.apply_channel_args =
      [name = tls.server_name](grpc::ChannelArguments& args) {
        if (!name.empty()) args.SetSslTargetNameOverride(name);
      };
  return creds;
}

absl::StatusOr<TlsOptions> TlsOptionsFromEnv(const EnvLookup& env) {
  TlsOptions tls;
  tls.ca_file = env("FERRY_TLS_CA").value_or("");
  tls.cert_file = env("FERRY_TLS_CERT").value_or("");
  tls.key_file = env("FERRY_TLS_KEY").value_or("");
  tls.server_name = env("FERRY_TLS_SERVER_NAME").value_or("");
  std::string require =
      absl::AsciiStrToLower(env("FERRY_TLS_REQUIRE_CLIENT_CERT").value_or("0"));
  if (require == "1" || require == "true") {
    tls.require_client_cert = true;
  } else if (require != "0" && require != "false" && !require.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FERRY_TLS_REQUIRE_CLIENT_CERT='", require,
                     "' is not 0, 1, true or false"));
  }
  return tls;
}

bool IsLoopbackAddress(absl::string_view address) {
  size_t colon = address.rfind(':');
  absl::string_view host =
      colon == absl::string_view::npos ? address : address.substr(0, colon);
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  return host == "localhost" || host == "::1" ||
         absl::StartsWith(host, "127.") || absl::StartsWith(host, "ipv4:127.");
}

bool WarnIfPlaintextExposed(const TlsOptions& tls, absl::string_view address,
                            absl::string_view worker) {
  if (tls.enabled() || IsLoopbackAddress(address)) return false;
  FERRY_LOG(WARNING) << "worker '" << worker << "' serves plaintext gRPC on "
                     << address
                     << ", which is not a loopback address: anyone who can "
                        "reach it can call its functions; set TLS options "
                        "(FERRY_TLS_CA, FERRY_TLS_CERT, FERRY_TLS_KEY)";
  return true;
}

std::string TlsFailureHint(const TlsOptions& tls,
                           absl::string_view grpc_message) {
  if (!tls.enabled()) return "";
  const std::string lower = absl::AsciiStrToLower(grpc_message);
  for (absl::string_view marker : {"handshake", "ssl", "certificate", "tls"}) {
    if (absl::StrContains(lower, marker)) {
      return absl::StrCat(
          " (TLS handshake failed: the peer must serve TLS with a certificate "
          "from CA '",
          tls.ca_file, "' naming the address dialled",
          tls.server_name.empty() ? ""
                                  : absl::StrCat(" or '", tls.server_name, "'"),
          ", and accept this worker's certificate '", tls.cert_file, "')");
    }
  }
  return "";
}

}  // namespace ferry::rpc::grpc_agent
