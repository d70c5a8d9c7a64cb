#include "ferry/common/host_address.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace ferry {
namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](absl::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(HostAddress, ExplicitAdvertiseAddressWins) {
  auto c =
      ChooseWorkerHost("127.0.0.1", Env({{"FERRY_ADVERTISE_ADDR", "[fd00::5]"},
                                         {"FERRY_SOCKET_IFNAME", "lo"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "fd00::5");
  EXPECT_EQ(c->source, "FERRY_ADVERTISE_ADDR");
}

TEST(HostAddress, InterfaceNameGivesItsAddress) {
  auto c = ChooseWorkerHost("", Env({{"FERRY_SOCKET_IFNAME", "lo"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "127.0.0.1");
  EXPECT_EQ(c->source, "interface lo");
}

TEST(HostAddress, UnknownInterfaceIsNamed) {
  auto c = ChooseWorkerHost("", Env({{"FERRY_SOCKET_IFNAME", "nosuch0"}}));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("'nosuch0'"), std::string::npos);
  EXPECT_NE(c.status().message().find("lo"), std::string::npos);
}

TEST(HostAddress, RouteTowardLoopbackIsLoopback) {
  auto c = ChooseWorkerHost("127.0.0.1", Env({}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "127.0.0.1");
  EXPECT_EQ(c->source, "route toward 127.0.0.1");
  auto local = LocalAddressToward("localhost");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE(*local == "127.0.0.1" || *local == "::1") << *local;
}

TEST(HostAddress, UnresolvablePeerIsAnError) {
  auto c = ChooseWorkerHost("no-such-host.invalid", Env({}));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("no-such-host.invalid"),
            std::string::npos);
  EXPECT_NE(c.status().message().find("FERRY_ADVERTISE_ADDR"),
            std::string::npos);
}

TEST(HostAddress, NumericHost) {
  EXPECT_EQ(*NumericHost("10.1.2.3"), "10.1.2.3");
  EXPECT_EQ(*NumericHost("[::1]"), "::1");
  auto local = NumericHost("localhost");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE(*local == "127.0.0.1" || *local == "::1") << *local;
  EXPECT_EQ(NumericHost("no-such-host.invalid").status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(HostAddress, JoinAndWildcard) {
  EXPECT_EQ(JoinHostPort("10.0.0.1", 80), "10.0.0.1:80");
  EXPECT_EQ(JoinHostPort("::1", 80), "[::1]:80");
  EXPECT_EQ(JoinHostPort("[::1]", 80), "[::1]:80");
  EXPECT_TRUE(IsWildcardHost("0.0.0.0"));
  EXPECT_TRUE(IsWildcardHost("[::]"));
  EXPECT_FALSE(IsWildcardHost("127.0.0.1"));
}

}  // namespace
}  // namespace ferry
