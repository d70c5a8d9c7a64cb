#include "ferry/rpc/grpc/keyed_mac.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <string>

#include "gtest/gtest.h"

namespace ferry::rpc::grpc_agent {
namespace {

std::string Reference(const std::string& key, const std::string& message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), len);
}

// The pre-keyed states give OpenSSL's HMAC-SHA256, for keys shorter and
// longer than a block and messages added in pieces.
TEST(KeyedMac, IsHmacSha256) {
  for (const std::string& key :
       {std::string(), std::string("k"), std::string(64, 'x'),
        std::string(100, 'y')}) {
    KeyedMac mac(key);
    for (const std::string& message :
         {std::string(), std::string("abc"), std::string(1000, 'm')}) {
      KeyedMac::Builder b = mac.Begin();
      b.Add(message.substr(0, message.size() / 2))
          .Add(message.substr(message.size() / 2));
      const KeyedMac::Tag tag = b.Finish();
      EXPECT_EQ(KeyedMac::ToString(tag), Reference(key, message))
          << key.size() << " " << message.size();
      EXPECT_TRUE(KeyedMac::Equal(tag, Reference(key, message)));
    }
  }
}

TEST(KeyedMac, EqualRefusesOtherTagsAndLengths) {
  KeyedMac mac("key");
  const KeyedMac::Tag tag = mac.Begin().AddU64(7).Finish();
  std::string other = KeyedMac::ToString(tag);
  EXPECT_TRUE(KeyedMac::Equal(tag, other));
  other[5] ^= 1;
  EXPECT_FALSE(KeyedMac::Equal(tag, other));
  EXPECT_FALSE(KeyedMac::Equal(tag, KeyedMac::ToString(tag).substr(0, 31)));
  EXPECT_FALSE(KeyedMac::Equal(tag, ""));
  EXPECT_NE(KeyedMac::ToString(mac.Begin().AddU64(8).Finish()),
            KeyedMac::ToString(tag));
}

}  // namespace
}  // namespace ferry::rpc::grpc_agent
