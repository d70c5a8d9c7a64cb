#include "ferry/common/host_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ferry {
namespace {

std::string Numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf,
              sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr,
              buf, sizeof(buf));
  }
  return buf;
}

std::string Unbracket(absl::string_view host) {
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host.remove_prefix(1);
    host.remove_suffix(1);
  }
  return std::string(host);
}

using AddrList = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

// getaddrinfo for `host` (port 9, never contacted), any family.
absl::StatusOr<AddrList> Resolve(const std::string& host, int socktype) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), "9", &hints, &res);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  return AddrList(res, &freeaddrinfo);
}

}  // namespace

absl::StatusOr<std::string> InterfaceAddress(absl::string_view name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::UnavailableError(
        absl::StrCat("getifaddrs: ", std::strerror(errno)));
  }
  std::string v4, v6;
  std::set<std::string> names;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    names.insert(i->ifa_name);
    if (name != i->ifa_name) continue;
    if (family == AF_INET && v4.empty()) v4 = Numeric(i->ifa_addr);
    // Link-local IPv6 needs a scope id peers cannot use; skip it.
    if (family == AF_INET6 && v6.empty() &&
        !IN6_IS_ADDR_LINKLOCAL(
            &reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr)) {
      v6 = Numeric(i->ifa_addr);
    }
  }
  freeifaddrs(list);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return absl::NotFoundError(
      absl::StrCat("network interface '", name,
                   "' has no usable address (interfaces with "
                   "one: ",
                   absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<std::string> NumericHost(absl::string_view host_text) {
  const std::string host = Unbracket(host_text);
  absl::StatusOr<AddrList> res = Resolve(host, SOCK_STREAM);
  if (!res.ok()) return res.status();
  std::string v4, v6;
  for (addrinfo* a = res->get(); a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET && v4.empty()) v4 = Numeric(a->ai_addr);
    if (a->ai_family == AF_INET6 && v6.empty()) v6 = Numeric(a->ai_addr);
  }
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return absl::UnavailableError(
      absl::StrCat("'", host, "' has no IPv4 or IPv6 address"));
}

absl::StatusOr<std::string> LocalAddressToward(absl::string_view peer) {
  const std::string host = Unbracket(peer);
  absl::StatusOr<AddrList> res = Resolve(host, SOCK_DGRAM);
  if (!res.ok()) return res.status();
  std::string local;
  std::string error = "no address";
  for (addrinfo* a = res->get(); a != nullptr && local.empty();
       a = a->ai_next) {
    int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // A UDP connect only picks the route and source address.
    sockaddr_storage self{};
    socklen_t len = sizeof(self);
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) == 0) {
      local = Numeric(reinterpret_cast<sockaddr*>(&self));
    } else {
      error = std::strerror(errno);
    }
    close(fd);
  }
  if (local.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no route toward '", host, "': ", error));
  }
  return local;
}

absl::StatusOr<HostChoice> ChooseWorkerHost(absl::string_view peer,
                                            const EnvLookup& env) {
  if (std::optional<std::string> a = env("FERRY_ADVERTISE_ADDR");
      a.has_value() && !a->empty()) {
    return HostChoice{Unbracket(*a), "FERRY_ADVERTISE_ADDR"};
  }
  if (std::optional<std::string> ifname = env("FERRY_SOCKET_IFNAME");
      ifname.has_value() && !ifname->empty()) {
    absl::StatusOr<std::string> addr = InterfaceAddress(*ifname);
    if (!addr.ok()) {
      return absl::Status(
          addr.status().code(),
          absl::StrCat("FERRY_SOCKET_IFNAME: ", addr.status().message()));
    }
    return HostChoice{*addr, absl::StrCat("interface ", *ifname)};
  }
  if (peer.empty()) return HostChoice{"127.0.0.1", "default (loopback)"};
  absl::StatusOr<std::string> local = LocalAddressToward(peer);
  if (!local.ok()) {
    return absl::Status(
        local.status().code(),
        absl::StrCat("choosing the address to publish (set "
                     "FERRY_ADVERTISE_ADDR or FERRY_SOCKET_IFNAME): ",
                     local.status().message()));
  }
  return HostChoice{*local, absl::StrCat("route toward ", Unbracket(peer))};
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

}  // namespace ferry
