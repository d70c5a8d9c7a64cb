#include "ferry/rpc/grpc/keyed_mac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <cstdlib>
#include <cstring>

namespace ferry::rpc::grpc_agent {
namespace {

constexpr size_t kBlock = 64;  // SHA-256's block size

// OpenSSL fails these only when out of memory or misconfigured: a MAC that
// silently did not run would accept forged descriptors, so there is no
// fallback.
void Check(int ok) {
  if (ok != 1) std::abort();
}

EVP_MD_CTX* Keyed(const unsigned char* block, unsigned char pad) {
  unsigned char padded[kBlock];
  for (size_t i = 0; i < kBlock; ++i) padded[i] = block[i] ^ pad;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr) std::abort();
  Check(EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr));
  Check(EVP_DigestUpdate(ctx, padded, kBlock));
  OPENSSL_cleanse(padded, sizeof(padded));
  return ctx;
}

}  // namespace

KeyedMac::KeyedMac(absl::string_view key) {
  // RFC 2104: a key longer than a block is hashed first; shorter ones are
  // padded with zeros.
  unsigned char block[kBlock] = {};
  if (key.size() > kBlock) {
    unsigned int n = 0;
    Check(EVP_Digest(key.data(), key.size(), block, &n, EVP_sha256(), nullptr));
  } else {
    std::memcpy(block, key.data(), key.size());
  }
  inner_ = Keyed(block, 0x36);
  outer_ = Keyed(block, 0x5c);
  OPENSSL_cleanse(block, sizeof(block));
}

KeyedMac::~KeyedMac() {
  EVP_MD_CTX_free(inner_);
  EVP_MD_CTX_free(outer_);
}

KeyedMac::Builder KeyedMac::Begin() const { return Builder(this); }

KeyedMac::Builder::Builder(const KeyedMac* mac)
    : mac_(mac), ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr) std::abort();
  Check(EVP_MD_CTX_copy_ex(ctx_, mac_->inner_));
}

KeyedMac::Builder::Builder(Builder&& other) noexcept
    : mac_(other.mac_), ctx_(other.ctx_) {
  other.ctx_ = nullptr;
}

KeyedMac::Builder::~Builder() { EVP_MD_CTX_free(ctx_); }

KeyedMac::Builder& KeyedMac::Builder::Add(const void* data, size_t size) {
  Check(EVP_DigestUpdate(ctx_, data, size));
  return *this;
}

KeyedMac::Builder& KeyedMac::Builder::AddU64(uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  return Add(b, sizeof(b));
}

KeyedMac::Builder& KeyedMac::Builder::AddBytes(absl::string_view s) {
  AddU64(s.size());
  return Add(s);
}

KeyedMac::Tag KeyedMac::Builder::Finish() {
  unsigned char inner[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  Check(EVP_DigestFinal_ex(ctx_, inner, &n));
  Check(EVP_MD_CTX_copy_ex(ctx_, mac_->outer_));
  Check(EVP_DigestUpdate(ctx_, inner, n));
  Tag tag;
  Check(EVP_DigestFinal_ex(ctx_, tag.data(), &n));
  return tag;
}

bool KeyedMac::Equal(const Tag& tag, absl::string_view received) {
  return received.size() == tag.size() &&
         CRYPTO_memcmp(tag.data(), received.data(), tag.size()) == 0;
}

}  // namespace ferry::rpc::grpc_agent
