#include "ferry/store/init_method.h"

#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"
#include "ferry/store/file_store.h"
#include "ferry/store/prefix_store.h"

namespace ferry {
namespace {

absl::Status Invalid(absl::string_view url, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("init_method '", url, "': ", problem));
}

bool AllDigits(absl::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// `what` names the source in errors ("port", "MASTER_PORT").
absl::StatusOr<int> ParsePort(absl::string_view url, absl::string_view what,
                              absl::string_view text) {
  int port = 0;
  if (!AllDigits(text) || text.size() > 5 || !absl::SimpleAtoi(text, &port) ||
      port > 65535) {
    return Invalid(url, absl::StrCat(what, " '", text,
                                     "' is not a port number in 0..65535"));
  }
  return port;
}

absl::StatusOr<int> ParseCount(absl::string_view url, absl::string_view what,
                               absl::string_view text, int min) {
  int value = 0;
  if (!AllDigits(text) || text.size() > 9 || !absl::SimpleAtoi(text, &value) ||
      value < min) {
    return Invalid(
        url, absl::StrCat(what, " '", text, "' is not an integer >= ", min));
  }
  return value;
}

absl::Status ParseHostPort(absl::string_view url, absl::string_view authority,
                           InitMethod* method) {
  absl::string_view port_text;
  if (absl::StartsWith(authority, "[")) {
    size_t close = authority.find(']');
    if (close == absl::string_view::npos) {
      return Invalid(url, "unterminated '[' in IPv6 host");
    }
    method->host = std::string(authority.substr(1, close - 1));
    absl::string_view rest = authority.substr(close + 1);
    if (!absl::StartsWith(rest, ":")) {
      return Invalid(url, "missing ':port' after the host");
    }
    port_text = rest.substr(1);
  } else {
    size_t colon = authority.rfind(':');
    if (colon == absl::string_view::npos) {
      return Invalid(url, "missing ':port' after the host");
    }
    method->host = std::string(authority.substr(0, colon));
    if (absl::StrContains(method->host, ':')) {
      return Invalid(url, "an IPv6 host must be in brackets: tcp://[::1]:port");
    }
    port_text = authority.substr(colon + 1);
  }
  if (method->host.empty()) return Invalid(url, "empty host");
  ASSIGN_OR_RETURN(method->port, ParsePort(url, "port", port_text));
  return absl::OkStatus();
}

absl::Status ParseQuery(absl::string_view url, absl::string_view query,
                        InitMethod* method) {
  if (query.empty()) return absl::OkStatus();
  for (absl::string_view param : absl::StrSplit(query, '&')) {
    if (param.empty()) continue;
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(param, absl::MaxSplits('=', 1));
    if (kv.first == "rank") {
      ASSIGN_OR_RETURN(method->rank, ParseCount(url, "rank", kv.second, 0));
    } else if (kv.first == "world_size") {
      ASSIGN_OR_RETURN(method->world_size,
                       ParseCount(url, "world_size", kv.second, 1));
    } else {
      return Invalid(url, absl::StrCat("unknown query parameter '", kv.first,
                                       "' (known: rank, world_size)"));
    }
  }
  return absl::OkStatus();
}

// The launcher whose variables give rank and world size.
struct LauncherVars {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* world_size_alt;  // Another name for the same value, or null.
  const char* local_rank;
};
constexpr LauncherVars kLaunchers[] = {
    {"RANK/WORLD_SIZE", "RANK", "WORLD_SIZE", nullptr, "LOCAL_RANK"},
    {"OpenMPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", nullptr,
     "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID"},
};

// Rank, world size and local rank from the first launcher whose variables
// are present; RANK/WORLD_SIZE may be given one without the other.
absl::Status ParseLauncherVars(absl::string_view url, const EnvLookup& env,
                               InitMethod* method) {
  for (const LauncherVars& l : kLaunchers) {
    std::optional<std::string> rank = env(l.rank);
    std::optional<std::string> ws = env(l.world_size);
    if (!ws.has_value() && l.world_size_alt != nullptr) {
      ws = env(l.world_size_alt);
    }
    if (!rank.has_value() && !ws.has_value()) continue;
    if (rank.has_value()) {
      ASSIGN_OR_RETURN(method->rank, ParseCount(url, l.rank, *rank, 0));
    }
    if (ws.has_value()) {
      ASSIGN_OR_RETURN(method->world_size,
                       ParseCount(url, l.world_size, *ws, 1));
    }
    if (std::optional<std::string> lr = env(l.local_rank); lr.has_value()) {
      ASSIGN_OR_RETURN(method->local_rank,
                       ParseCount(url, l.local_rank, *lr, 0));
    }
    method->env_source = l.source;
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

// env://: the store's address and the launcher's rank variables.
absl::Status ParseEnv(absl::string_view url, const EnvLookup& env,
                      InitMethod* method) {
  RETURN_IF_ERROR(ParseLauncherVars(url, env, method));
  std::optional<std::string> addr = env("MASTER_ADDR");
  std::string addr_source = "MASTER_ADDR";
  if ((!addr.has_value() || addr->empty()) && method->env_source == "Slurm") {
    for (const char* list : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}) {
      std::optional<std::string> nodes = env(list);
      if (!nodes.has_value()) continue;
      absl::StatusOr<std::string> first = FirstSlurmHost(*nodes);
      if (!first.ok()) return Invalid(url, first.status().message());
      addr = *first;
      addr_source = absl::StrCat("first host of ", list);
      break;
    }
  }
  if (!addr.has_value() || addr->empty()) {
    return Invalid(url, "environment variable MASTER_ADDR is not set");
  }
  method->host = *addr;
  if (absl::StartsWith(method->host, "[") &&
      absl::EndsWith(method->host, "]")) {
    method->host = method->host.substr(1, method->host.size() - 2);
  }
  std::optional<std::string> port = env("MASTER_PORT");
  if (!port.has_value() || port->empty()) {
    return Invalid(url, "environment variable MASTER_PORT is not set");
  }
  ASSIGN_OR_RETURN(method->port, ParsePort(url, "MASTER_PORT", *port));
  if (!method->env_source.empty()) {
    FERRY_LOG(INFO) << "env://: rank "
                    << (method->rank ? absl::StrCat(*method->rank) : "?")
                    << ", world size "
                    << (method->world_size ? absl::StrCat(*method->world_size)
                                           : "?")
                    << " from " << method->env_source << "; store "
                    << method->host << ":" << method->port << " from "
                    << addr_source;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> FirstSlurmHost(absl::string_view nodelist) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("Slurm node list '", nodelist, "': ", why));
  };
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] != '[') {
      if (nodelist[i] == ']') return bad("unmatched ']'");
      host.push_back(nodelist[i++]);
      continue;
    }
    size_t close = nodelist.find(']', i);
    if (close == absl::string_view::npos) return bad("unterminated '['");
    absl::string_view range = nodelist.substr(i + 1, close - i - 1);
    // The first element of "03-05,9" is "03": the range's start keeps its
    // zero padding, as Slurm writes host names.
    absl::string_view first = range.substr(0, range.find_first_of(",-"));
    if (!AllDigits(first)) return bad("a bracket range must start with digits");
    absl::StrAppend(&host, first);
    i = close + 1;
  }
  if (host.empty()) return bad("no host");
  return host;
}

std::string InitMethod::ToString() const {
  std::string url;
  switch (scheme) {
    case Scheme::kTcp:
      url = absl::StrContains(host, ':')
                ? absl::StrCat("tcp://[", host, "]:", port)
                : absl::StrCat("tcp://", host, ":", port);
      break;
    case Scheme::kFile:
      url = absl::StrCat("file://", path);
      break;
    case Scheme::kEnv:
      url = "env://";
      break;
  }
  const char* sep = "?";
  if (rank.has_value()) {
    absl::StrAppend(&url, sep, "rank=", *rank);
    sep = "&";
  }
  if (world_size.has_value()) {
    absl::StrAppend(&url, sep, "world_size=", *world_size);
  }
  return url;
}

absl::StatusOr<InitMethod> ParseInitMethod(absl::string_view url,
                                           const EnvLookup& env) {
  size_t sep = url.find("://");
  if (sep == absl::string_view::npos) {
    return Invalid(url,
                   "expected scheme://..., one of tcp://, file://, env://");
  }
  const absl::string_view scheme = url.substr(0, sep);
  absl::string_view rest = url.substr(sep + 3);
  absl::string_view query;
  if (size_t q = rest.find('?'); q != absl::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  InitMethod method;
  if (scheme == "tcp") {
    method.scheme = InitMethod::Scheme::kTcp;
    if (absl::EndsWith(rest, "/")) rest.remove_suffix(1);
    if (rest.empty()) return Invalid(url, "missing host:port");
    if (absl::StrContains(rest, '/')) {
      return Invalid(url, "unexpected path after host:port");
    }
    RETURN_IF_ERROR(ParseHostPort(url, rest, &method));
    RETURN_IF_ERROR(ParseQuery(url, query, &method));
  } else if (scheme == "file") {
    method.scheme = InitMethod::Scheme::kFile;
    if (absl::StartsWith(rest, "localhost/")) rest.remove_prefix(9);
    if (!absl::StartsWith(rest, "/")) {
      return Invalid(url,
                     "expected an absolute path, e.g. file:///tmp/store "
                     "(a host other than localhost is not supported)");
    }
    if (rest.size() < 2 || absl::EndsWith(rest, "/")) {
      return Invalid(url, "the path must name a file, not a directory");
    }
    method.path = std::string(rest);
    RETURN_IF_ERROR(ParseQuery(url, query, &method));
  } else if (scheme == "env") {
    method.scheme = InitMethod::Scheme::kEnv;
    if (!rest.empty() && rest != "/") {
      return Invalid(url,
                     "env:// takes no host or path (it reads "
                     "MASTER_ADDR and MASTER_PORT)");
    }
    RETURN_IF_ERROR(ParseEnv(url, env, &method));
    RETURN_IF_ERROR(ParseQuery(url, query, &method));
  } else {
    return Invalid(url, absl::StrCat("unknown scheme '", scheme,
                                     "' (expected tcp, file or env)"));
  }
  if (method.rank.has_value() && method.world_size.has_value() &&
      *method.rank >= *method.world_size) {
    return Invalid(
        url, absl::StrCat("rank ", *method.rank, " is not below world_size ",
                          *method.world_size));
  }
  return method;
}

absl::StatusOr<std::unique_ptr<Store>> CreateStore(
    const InitMethod& method, int rank, int world_size, absl::Duration timeout,
    const StoreFactories& factories) {
  const std::string url = method.ToString();
  auto resolve =
      [&](const char* what, int given,
          const std::optional<int>& from_method) -> absl::StatusOr<int> {
    if (given < 0) {
      if (!from_method.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("CreateStore(", url, "): no ", what,
                         " given and the init_method does not carry one"));
      }
      return *from_method;
    }
    if (from_method.has_value() && *from_method != given) {
      return absl::InvalidArgumentError(
          absl::StrCat("CreateStore(", url, "): ", what, " ", given,
                       " disagrees with the init_method's ", *from_method));
    }
    return given;
  };
  ASSIGN_OR_RETURN(rank, resolve("rank", rank, method.rank));
  ASSIGN_OR_RETURN(world_size,
                   resolve("world_size", world_size, method.world_size));
  if (world_size < 1 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateStore(", url, "): rank ", rank,
                     " is outside [0, world_size ", world_size, ")"));
  }
  std::unique_ptr<Store> store;
  switch (method.scheme) {
    case InitMethod::Scheme::kFile: {
      ASSIGN_OR_RETURN(store, FileStore::Open(method.path, world_size));
      break;
    }
    case InitMethod::Scheme::kTcp:
    case InitMethod::Scheme::kEnv: {
      if (!factories.tcp) {
        return absl::FailedPreconditionError(absl::StrCat(
            "CreateStore(", url,
            "): no TCPStore factory was provided (StoreFactories::tcp)"));
      }
      if (rank != 0 && method.port == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "CreateStore(", url, "): rank ", rank,
            " cannot connect to port 0; only the server (rank 0) may use it"));
      }
      ASSIGN_OR_RETURN(store, factories.tcp(method.host, method.port, rank == 0,
                                            world_size, timeout));
      if (store == nullptr) {
        return absl::InternalError(absl::StrCat(
            "CreateStore(", url, "): the TCPStore factory returned null"));
      }
      break;
    }
  }
  store->SetTimeout(timeout);
  return store;
}

std::string LauncherAttemptPrefix(int generation) {
  return absl::StrCat("ferry_run/attempt_", generation);
}

absl::StatusOr<std::unique_ptr<Store>> ScopeToLauncherGeneration(
    std::unique_ptr<Store> store, const EnvLookup& env) {
  std::optional<std::string> text = env("FERRY_RUN_GENERATION");
  if (!text.has_value()) return store;
  int generation = 0;
  if (!AllDigits(*text) || text->size() > 9 ||
      !absl::SimpleAtoi(*text, &generation)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FERRY_RUN_GENERATION '", *text, "' is not a non-negative integer"));
  }
  const std::string key = "ferry_run/generation";
  ASSIGN_OR_RETURN(bool published, store->Check({key}));
  if (published) {
    ASSIGN_OR_RETURN(std::string current, store->Get(key));
    int job = 0;
    if (absl::SimpleAtoi(current, &job) && job > generation) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker of launcher generation ", generation,
                       " refused: the job has restarted and is at generation ",
                       job, " (", store->Describe(), ")"));
    }
  }
  return std::unique_ptr<Store>(std::make_unique<PrefixStore>(
      LauncherAttemptPrefix(generation), std::move(store)));
}

}  // namespace ferry
