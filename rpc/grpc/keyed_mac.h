// HMAC-SHA256 under one fixed key, cheap to compute many times: the key's
// inner and outer states are hashed once at construction, so a tag costs
// the message's own compression rounds plus two (about 0.5 us for a
// same-host descriptor; figures in docs/design/same_host_security.md).
// Used for the same-host channel's per-pair descriptor tags and the
// per-channel identity proofs (rpc/grpc/identity.h).
//
// Thread safety: a KeyedMac is immutable after construction; Begin may be
// called from any thread, and each Builder belongs to one thread.
#ifndef FERRY_RPC_GRPC_KEYED_MAC_H_
#define FERRY_RPC_GRPC_KEYED_MAC_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"

typedef struct evp_md_ctx_st EVP_MD_CTX;

namespace ferry::rpc::grpc_agent {

class KeyedMac {
 public:
  static constexpr size_t kTagBytes = 32;
  using Tag = std::array<uint8_t, kTagBytes>;

  explicit KeyedMac(absl::string_view key);
  ~KeyedMac();
  KeyedMac(const KeyedMac&) = delete;
  KeyedMac& operator=(const KeyedMac&) = delete;

  // One tag: Add the message's pieces, then Finish (once).
  class Builder {
   public:
    Builder(Builder&&) noexcept;
    ~Builder();
    Builder& Add(const void* data, size_t size);
    Builder& Add(absl::string_view s) { return Add(s.data(), s.size()); }
    // Fixed width, little-endian: fields never run into each other.
    Builder& AddU64(uint64_t v);
    // Length-prefixed.
    Builder& AddBytes(absl::string_view s);
    Tag Finish();

   private:
    friend class KeyedMac;
    explicit Builder(const KeyedMac* mac);
    const KeyedMac* mac_;
    EVP_MD_CTX* ctx_;
  };
  Builder Begin() const;

  // Constant-time comparison of `tag` with a received one.
  static bool Equal(const Tag& tag, absl::string_view received);
  static std::string ToString(const Tag& tag) {
    return std::string(reinterpret_cast<const char*>(tag.data()), tag.size());
  }

 private:
  EVP_MD_CTX* inner_;  // SHA-256 after (key ^ ipad)
  EVP_MD_CTX* outer_;  // SHA-256 after (key ^ opad)
};

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_KEYED_MAC_H_
