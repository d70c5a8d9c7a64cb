#include "ferry/ddp/quorum.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"

namespace ferry::ddp {
namespace {

constexpr char kApply[] = "apply";
constexpr char kReform[] = "reform";
constexpr char kDiscard[] = "discard";

bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

StepVerdict ParseVerdict(absl::string_view v) {
  if (v == kApply) return StepVerdict::kApply;
  if (v == kReform) return StepVerdict::kApplyAndReform;
  return StepVerdict::kDiscard;
}

// A non-blocking IPv4 TCP socket, or -1.
int NonBlockingSocket() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  return fd;
}

// Listens on host:0; returns the fd and sets *port.
absl::StatusOr<int> Listen(const std::string& host, int* port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    return absl::InvalidArgumentError(absl::StrCat(
        "quorum: probe_host '", host, "' is not an IPv4 address"));
  int fd = NonBlockingSocket();
  if (fd < 0)
    return absl::InternalError(
        absl::StrCat("quorum: probe socket: ", std::strerror(errno)));
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat(
        "quorum: probe listener on ", host, ": ", std::strerror(err)));
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

// Whether a connect() to host:port is refused within `timeout`.
bool Refused(const std::string& host, int port, absl::Duration timeout) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return false;
  int fd = NonBlockingSocket();
  if (fd < 0) return false;
  int err = 0;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
      if (poll(&p, 1, ms) == 1) {
        socklen_t len = sizeof(err);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = 0;
      } else {
        err = 0;  // No answer in time: decides nothing.
      }
    }
  }
  close(fd);
  return err == ECONNREFUSED;
}

}  // namespace

std::string EncodeMembers(const std::vector<std::string>& members) {
  return absl::StrJoin(members, ",");
}

std::vector<std::string> DecodeMembers(absl::string_view text) {
  if (text.empty()) return {};
  return absl::StrSplit(text, ',');
}

absl::StatusOr<std::unique_ptr<Quorum>> Quorum::Create(
    std::shared_ptr<Store> store, std::string id, QuorumOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("quorum: null store");
  if (id.empty() || id.find(',') != std::string::npos)
    return absl::InvalidArgumentError(
        absl::StrCat("quorum: member id '", id, "' is empty or has a ','"));
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_timeout <= options.heartbeat_interval ||
      options.tick <= absl::ZeroDuration())
    return absl::InvalidArgumentError(
        "quorum: need 0 < heartbeat_interval < heartbeat_timeout, tick > 0");
  ASSIGN_OR_RETURN(std::unique_ptr<Store> hb, store->Clone());
  std::unique_ptr<Quorum> q(new Quorum(std::move(store),
                                       std::shared_ptr<Store>(std::move(hb)),
                                       std::move(id), std::move(options)));
  // The first beat before returning: a member is alive once created.
  RETURN_IF_ERROR(q->heartbeat_store_->Set(
      q->Key(absl::StrCat("hb/", q->id_)),
      absl::StrCat(absl::ToUnixMillis(absl::Now()))));
  if (!q->options_.probe_host.empty()) {
    int port = 0;
    ASSIGN_OR_RETURN(q->probe_fd_, Listen(q->options_.probe_host, &port));
    RETURN_IF_ERROR(q->store_->Set(q->Key(absl::StrCat("probe/", q->id_)),
                                   absl::StrCat(q->options_.probe_host, ":",
                                                port)));
  }
  q->heartbeat_ = std::thread([raw = q.get()] { raw->HeartbeatLoop(); });
  return q;
}

Quorum::Quorum(std::shared_ptr<Store> store,
               std::shared_ptr<Store> heartbeat_store, std::string id,
               QuorumOptions options)
    : store_(std::move(store)),
      heartbeat_store_(std::move(heartbeat_store)),
      id_(std::move(id)),
      options_(std::move(options)) {}

Quorum::~Quorum() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  if (probe_fd_ >= 0) close(probe_fd_);
}

void Quorum::DrainProbe() {
  if (probe_fd_ < 0) return;
  for (int i = 0; i < 64; ++i) {  // Bounded: at most the backlog.
    int c = accept4(probe_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;  // EAGAIN: none pending.
    close(c);
  }
}

absl::StatusOr<bool> Quorum::Gone(const std::string& member) {
  if (options_.probe_host.empty()) return false;
  const std::string key = Key(absl::StrCat("probe/", member));
  ASSIGN_OR_RETURN(bool exists, store_->Check({key}));
  if (!exists) return false;
  ASSIGN_OR_RETURN(std::string v, store_->Get(key));
  const size_t colon = v.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(v).substr(colon + 1), &port))
    return absl::DataLossError(
        absl::StrCat("quorum: probe key '", key, "' holds '", v, "'"));
  return Refused(v.substr(0, colon), port, options_.probe_timeout);
}

void Quorum::HeartbeatLoop() {
  const std::string key = Key(absl::StrCat("hb/", id_));
  // Bounded by the owner: the destructor sets stopping_ and joins.
  while (true) {
    {
      MutexLock l(&mu_);
      if (!stopping_) cv_.WaitWithTimeout(&mu_, options_.heartbeat_interval);
      if (stopping_) return;
    }
    DrainProbe();
    absl::Status s = heartbeat_store_->Set(
        key, absl::StrCat(absl::ToUnixMillis(absl::Now())));
    // The latest heartbeat's outcome: a store error that passes (the next
    // Set succeeds) does not keep failing Form.
    MutexLock l(&mu_);
    heartbeat_error_ = s;
  }
}

std::string Quorum::Key(absl::string_view suffix) const {
  return absl::StrCat(options_.prefix, suffix);
}

std::string Quorum::GenKey(int64_t generation, absl::string_view suffix) const {
  return absl::StrCat(options_.prefix, "g/", generation, "/", suffix);
}

absl::StatusOr<bool> Quorum::Alive(const std::string& member) {
  const std::string key = Key(absl::StrCat("hb/", member));
  ASSIGN_OR_RETURN(bool exists, store_->Check({key}));
  if (!exists) return false;
  ASSIGN_OR_RETURN(std::string v, store_->Get(key));
  int64_t ms = 0;
  if (!absl::SimpleAtoi(v, &ms))
    return absl::DataLossError(
        absl::StrCat("quorum: heartbeat key '", key, "' holds '", v, "'"));
  return absl::ToUnixMillis(absl::Now()) - ms <=
         absl::ToInt64Milliseconds(options_.heartbeat_timeout);
}

absl::StatusOr<std::vector<std::string>> Quorum::Joiners() {
  const std::string count_key = Key("joiners");
  ASSIGN_OR_RETURN(bool exists, store_->Check({count_key}));
  if (!exists) return std::vector<std::string>{};
  ASSIGN_OR_RETURN(std::string v, store_->Get(count_key));
  int64_t n = 0;
  if (!absl::SimpleAtoi(v, &n)) n = 0;
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i) {
    const std::string slot = Key(absl::StrCat("joiner/", i));
    // A slot is claimed (Add) before it is written: skip one not yet set.
    ASSIGN_OR_RETURN(bool set, store_->Check({slot}));
    if (!set) continue;
    ASSIGN_OR_RETURN(std::string id, store_->Get(slot));
    out.push_back(std::move(id));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> Quorum::Members(int64_t generation) {
  const std::string key = GenKey(generation, "members");
  ASSIGN_OR_RETURN(bool exists, store_->Check({key}));
  if (!exists)
    return absl::NotFoundError(
        absl::StrCat("quorum: generation ", generation, " not committed"));
  ASSIGN_OR_RETURN(std::string v, store_->Get(key));
  return DecodeMembers(v);
}

absl::StatusOr<bool> Quorum::Wants(int64_t generation,
                                   const std::string& member) {
  return store_->Check({GenKey(generation, absl::StrCat("want/", member))});
}

absl::StatusOr<int64_t> Quorum::CurrentGeneration() {
  const std::string key = Key("current");
  ASSIGN_OR_RETURN(bool exists, store_->Check({key}));
  if (!exists) return 0;
  ASSIGN_OR_RETURN(std::string v, store_->Get(key));
  int64_t g = 0;
  if (!absl::SimpleAtoi(v, &g))
    return absl::DataLossError(
        absl::StrCat("quorum: key '", key, "' holds '", v, "'"));
  return g;
}

absl::StatusOr<bool> Quorum::JoinerPending() {
  const int64_t next = view_.generation + 1;
  ASSIGN_OR_RETURN(std::vector<std::string> joiners, Joiners());
  for (const std::string& j : joiners) {
    if (Contains(view_.members, j)) continue;
    ASSIGN_OR_RETURN(bool wants, Wants(next, j));
    if (!wants) continue;
    ASSIGN_OR_RETURN(bool alive, Alive(j));
    if (alive) return true;
  }
  return false;
}

absl::StatusOr<bool> Quorum::TryPropose(int64_t generation, int min_size,
                                        std::vector<std::string>* awaited) {
  awaited->clear();
  std::vector<std::string> prev;
  if (generation > 1) {
    ASSIGN_OR_RETURN(prev, Members(generation - 1));
  }
  std::vector<std::string> list;
  for (const std::string& m : prev) {
    ASSIGN_OR_RETURN(bool alive, Alive(m));
    if (!alive) continue;  // Dead: left out.
    ASSIGN_OR_RETURN(bool wants, Wants(generation, m));
    if (wants) {
      list.push_back(m);
      continue;
    }
    ASSIGN_OR_RETURN(bool gone, Gone(m));
    if (!gone) awaited->push_back(m);  // Alive, not there yet: wait for it.
  }
  if (!awaited->empty()) return false;
  ASSIGN_OR_RETURN(std::vector<std::string> joiners, Joiners());
  for (const std::string& j : joiners) {
    if (Contains(list, j) || Contains(prev, j)) continue;
    ASSIGN_OR_RETURN(bool wants, Wants(generation, j));
    if (!wants) continue;
    ASSIGN_OR_RETURN(bool alive, Alive(j));
    if (alive) list.push_back(j);
  }
  if (static_cast<int>(list.size()) < min_size) {
    awaited->push_back(absl::StrCat("(", min_size - list.size(),
                                    " more to reach min_size ", min_size, ")"));
    return false;
  }
  // First proposal wins: a second proposer's CompareSet leaves it as is.
  RETURN_IF_ERROR(store_
                      ->CompareSet(GenKey(generation, "members"), "",
                                   EncodeMembers(list))
                      .status());
  return true;
}

absl::StatusOr<QuorumView> Quorum::Form(int min_size) {
  const bool joiner = view_.generation == 0;
  int64_t generation = view_.generation + 1;
  if (joiner) {
    ASSIGN_OR_RETURN(int64_t current, CurrentGeneration());
    generation = current + 1;
    if (!registered_as_joiner_) {
      ASSIGN_OR_RETURN(int64_t slot, store_->Add(Key("joiners"), 1));
      RETURN_IF_ERROR(
          store_->Set(Key(absl::StrCat("joiner/", slot - 1)), id_));
      registered_as_joiner_ = true;
    }
  }
  const absl::Time started = absl::Now();
  const absl::Time deadline = started + options_.form_timeout;
  std::vector<std::string> awaited;
  std::string proposer;
  bool posted = false;
  for (int64_t iter = 0;; ++iter) {
    if (iter > 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "quorum: member '", id_, "': generation ", generation,
          " not committed after ", absl::FormatDuration(options_.form_timeout),
          " (key '", GenKey(generation, "members"), "'; proposer '", proposer,
          "'", awaited.empty() ? "" : "; awaiting ",
          absl::StrJoin(awaited, ","), ")"));
    }
    {
      MutexLock l(&mu_);
      if (!heartbeat_error_.ok())
        return Annotate(heartbeat_error_,
                        absl::StrCat("quorum: member '", id_, "' heartbeat"));
    }
    absl::StatusOr<std::vector<std::string>> committed = Members(generation);
    if (committed.ok()) {
      // Keep "current" up to date even if the proposer died after committing.
      const std::string prev_text =
          generation > 1 ? absl::StrCat(generation - 1) : std::string();
      RETURN_IF_ERROR(store_
                          ->CompareSet(Key("current"), prev_text,
                                       absl::StrCat(generation))
                          .status());
      auto it = std::find(committed->begin(), committed->end(), id_);
      if (it == committed->end()) {
        if (joiner) {  // Committed before our request was seen: next one.
          ++generation;
          posted = false;
          continue;
        }
        absl::Status refused = absl::FailedPreconditionError(absl::StrCat(
            "quorum: member '", id_, "' of generation ", view_.generation,
            " was left out of generation ", generation, " (key '",
            GenKey(generation, "members"), "' = '", EncodeMembers(*committed),
            "'): stale member refused"));
        FERRY_LOG(WARNING) << refused.message();
        return refused;
      }
      QuorumView v;
      v.generation = generation;
      v.members = *committed;
      v.rank = static_cast<int>(it - committed->begin());
      std::vector<std::string> prev;
      if (generation > 1) {
        ASSIGN_OR_RETURN(prev, Members(generation - 1));
      }
      for (const std::string& m : v.members)
        if (!Contains(prev, m)) v.joined.push_back(m);
      FERRY_LOG(INFO) << "quorum: member '" << id_ << "' is rank " << v.rank
                      << " of " << v.size() << " in generation "
                      << generation << " (members "
                      << EncodeMembers(v.members) << "; joined "
                      << EncodeMembers(v.joined) << "; formed in "
                      << absl::FormatDuration(absl::Now() - started) << ")";
      view_ = std::move(v);
      return view_;
    }
    if (!absl::IsNotFound(committed.status())) return committed.status();
    // Asked only while the generation is open: a stale member writes
    // nothing under a committed generation's keys.
    if (!posted) {
      RETURN_IF_ERROR(
          store_->Set(GenKey(generation, absl::StrCat("want/", id_)), "1"));
      posted = true;
      continue;
    }

    // Am I the proposer? The first live member of the previous generation
    // that asked for this one, else (no such member) the first live joiner.
    std::vector<std::string> order;
    if (generation > 1) {
      absl::StatusOr<std::vector<std::string>> prev = Members(generation - 1);
      if (prev.ok()) order = *prev;
    }
    ASSIGN_OR_RETURN(std::vector<std::string> joiners, Joiners());
    for (const std::string& j : joiners)
      if (!Contains(order, j)) order.push_back(j);
    proposer.clear();
    for (const std::string& m : order) {
      ASSIGN_OR_RETURN(bool wants, Wants(generation, m));
      if (!wants) continue;
      ASSIGN_OR_RETURN(bool alive, Alive(m));
      if (alive) {
        proposer = m;
        break;
      }
    }
    if (proposer == id_) {
      ASSIGN_OR_RETURN(bool done, TryPropose(generation, min_size, &awaited));
      if (done) continue;  // Read back what was committed (maybe not ours).
    }
    // One tick: returns early once the generation is committed.
    absl::Status w =
        store_->Wait({GenKey(generation, "members")}, options_.tick);
    if (!w.ok() && !absl::IsDeadlineExceeded(w)) return w;
  }
}

absl::StatusOr<StepVerdict> Quorum::Commit(int64_t step, bool ok) {
  const int64_t g = view_.generation;
  if (g == 0)
    return absl::FailedPreconditionError(
        absl::StrCat("quorum: member '", id_, "' has no generation"));
  const std::string base = absl::StrCat("step/", step, "/");
  const std::string fail_key = GenKey(g, base + "fail");
  const std::string verdict_key = GenKey(g, base + "verdict");
  auto decide = [&](absl::string_view v) -> absl::StatusOr<StepVerdict> {
    ASSIGN_OR_RETURN(std::string now, store_->CompareSet(verdict_key, "", v));
    return ParseVerdict(now);
  };
  if (!ok) RETURN_IF_ERROR(store_->Set(fail_key, id_));
  ASSIGN_OR_RETURN(int64_t n, store_->Add(GenKey(g, base + "count"), 1));
  if (n == view_.size()) {
    // The last to report: every member's fail mark is already visible.
    ASSIGN_OR_RETURN(bool failed, store_->Check({fail_key}));
    if (failed) return decide(kDiscard);
    ASSIGN_OR_RETURN(bool pending, JoinerPending());
    return decide(pending ? kReform : kApply);
  }
  const absl::Time deadline = absl::Now() + options_.commit_timeout;
  for (int64_t iter = 0;; ++iter) {
    absl::Status w = store_->Wait({verdict_key}, options_.tick);
    if (w.ok()) {
      ASSIGN_OR_RETURN(std::string v, store_->Get(verdict_key));
      return ParseVerdict(v);
    }
    if (!absl::IsDeadlineExceeded(w)) return w;
    ASSIGN_OR_RETURN(int64_t current, CurrentGeneration());
    if (current > g)
      return absl::FailedPreconditionError(absl::StrCat(
          "quorum: member '", id_, "' of generation ", g, " is stale (key '",
          Key("current"), "' = ", current, "): step ", step, " refused"));
    ASSIGN_OR_RETURN(bool failed, store_->Check({fail_key}));
    if (failed) return decide(kDiscard);
    for (const std::string& m : view_.members) {
      if (m == id_) continue;
      ASSIGN_OR_RETURN(bool alive, Alive(m));
      bool gone = false;
      if (alive) {
        ASSIGN_OR_RETURN(gone, Gone(m));
      }
      if (!alive || gone) {
        FERRY_LOG(WARNING) << "quorum: member '" << m << "' of generation "
                           << g
                           << (alive ? " has exited (probe refused)"
                                     : " missed its heartbeat")
                           << ": step " << step << " discarded";
        return decide(kDiscard);
      }
    }
    if (absl::Now() >= deadline)
      return absl::DeadlineExceededError(absl::StrCat(
          "quorum: member '", id_, "' generation ", g, " step ", step,
          ": no verdict at key '", verdict_key, "' after ",
          absl::FormatDuration(options_.commit_timeout)));
  }
}

}  // namespace ferry::ddp
