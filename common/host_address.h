// Choosing the address a worker binds and publishes to its peers.
//
// On one machine every worker can use 127.0.0.1. Across hosts a worker must
// listen on an address its peers can reach and publish that address through
// the store. ChooseWorkerHost decides, in this order:
//
//   1. FERRY_ADVERTISE_ADDR   an explicit address (or host name) to publish
//   2. FERRY_SOCKET_IFNAME    an interface name ("eth0"): its first IPv4
//                             address (else its first IPv6 address)
//   3. the local address the kernel routes toward `peer` (the store host):
//      127.0.0.1 when the store is on loopback, the host's address on the
//      store's network otherwise. No packet is sent.
//
// Thread safety: the functions are stateless and thread-safe.
#ifndef FERRY_COMMON_HOST_ADDRESS_H_
#define FERRY_COMMON_HOST_ADDRESS_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ferry/common/env.h"

namespace ferry {

// The chosen host and why ("FERRY_ADVERTISE_ADDR", "interface eth0",
// "route toward 10.0.0.1"), for log lines.
struct HostChoice {
  std::string host;
  std::string source;
};

// The numeric address of interface `name`. NotFound naming the interface and
// listing the interfaces that have an address.
absl::StatusOr<std::string> InterfaceAddress(absl::string_view name);

// `host` as a numeric address: itself when already numeric (brackets
// removed), else its first resolved address (IPv4 preferred). Unavailable
// naming the host when it does not resolve.
absl::StatusOr<std::string> NumericHost(absl::string_view host);

// The local address a packet to `peer` (numeric or resolvable) would leave
// from. Unavailable naming the peer when it cannot be resolved or routed.
absl::StatusOr<std::string> LocalAddressToward(absl::string_view peer);

// See the file comment. `peer` empty means loopback. Errors name the
// variable or peer that could not be used.
absl::StatusOr<HostChoice> ChooseWorkerHost(
    absl::string_view peer, const EnvLookup& env = GetEnv);

// "host:port", bracketing IPv6 literals ("[::1]:80").
std::string JoinHostPort(absl::string_view host, int port);

// True for "0.0.0.0", "::", "[::]" and "" (listen on every interface).
bool IsWildcardHost(absl::string_view host);

}  // namespace ferry

#endif  // FERRY_COMMON_HOST_ADDRESS_H_
