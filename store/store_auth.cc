#include "ferry/store/store_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ferry::tcpstore {
namespace {

constexpr char kLabel[] = "ferry-store-auth-v1";

}  // namespace

std::string RandomNonce() {
  std::string nonce(kAuthNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()),
                 static_cast<int>(nonce.size())) != 1) {
    // OpenSSL's generator fails only when it cannot seed; a predictable nonce
    // would void the challenge, so there is no safe fallback.
    std::abort();
  }
  return nonce;
}

std::string AuthProof(absl::string_view secret, absl::string_view role,
                      absl::string_view client_nonce,
                      absl::string_view server_nonce) {
  // Length-prefixed fields, so no two inputs concatenate alike.
  std::string message;
  for (absl::string_view part :
       {absl::string_view(kLabel), role, client_nonce, server_nonce}) {
    absl::StrAppend(&message, part.size(), ":", part);
  }
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), len);
}

bool ProofsEqual(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() &&
         CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<std::string> StoreSecretFromEnv(const EnvLookup& env) {
  std::optional<std::string> file = env("FERRY_STORE_SECRET_FILE");
  if (file.has_value() && !file->empty()) {
    std::ifstream in(*file, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("FERRY_STORE_SECRET_FILE: cannot read '", *file, "'"));
    }
    std::ostringstream text;
    text << in.rdbuf();
    std::string secret = text.str();
    while (!secret.empty() &&
           (secret.back() == '\n' || secret.back() == '\r')) {
      secret.pop_back();
    }
    if (secret.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("FERRY_STORE_SECRET_FILE: '", *file, "' is empty"));
    }
    return secret;
  }
  return env("FERRY_STORE_SECRET").value_or("");
}

absl::StatusOr<std::string> StoreSecretFromEnv() {
  return StoreSecretFromEnv(GetEnv);
}

}  // namespace ferry::tcpstore
