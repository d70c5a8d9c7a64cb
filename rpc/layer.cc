#include "ferry/rpc/layer.h"

#include "absl/strings/str_cat.h"
#include "ferry/common/sync.h"

namespace ferry::rpc {
namespace {

bool Overlaps(const std::pair<uint32_t, uint32_t>& a,
              const std::pair<uint32_t, uint32_t>& b) {
  return a.first <= b.second && b.first <= a.second;
}

bool Inside(uint32_t type, const LayerClaim& claim) {
  for (const auto& [first, last] : claim.ranges) {
    if (first <= type && type <= last) return true;
  }
  return false;
}

bool SameClaim(const LayerClaim& a, const LayerClaim& b) {
  if (a.layer != b.layer || a.header_id != b.header_id ||
      a.ranges != b.ranges || a.names.size() != b.names.size()) {
    return false;
  }
  for (size_t i = 0; i < a.names.size(); ++i) {
    if (a.names[i].type != b.names[i].type ||
        a.names[i].name != b.names[i].name ||
        a.names[i].names_function != b.names[i].names_function) {
      return false;
    }
  }
  return true;
}

// rpc/'s own numbers (message.h MessageType).
LayerClaim RpcClaim() {
  return LayerClaim{"rpc",
                    0,
                    {{0, 1}, {30, 31}},
                    {{0, "UNSPECIFIED"},
                     {1, "CALL", true},
                     {30, "PING"},
                     {31, "MEMBERSHIP"}}};
}

class Registry {
 public:
  static Registry& Get() {
    static Registry* r = new Registry();  // Never destroyed: used at exit.
    return *r;
  }

  absl::Status Claim(const LayerClaim& claim) {
    MutexLock lock(&mu_);
    return ClaimLocked(claim);
  }

  template <typename Fn>
  auto With(Fn fn) {
    MutexLock lock(&mu_);
    return fn(claims_);
  }

 private:
  Registry() {
    MutexLock lock(&mu_);
    ClaimLocked(RpcClaim()).IgnoreError();
  }

  absl::Status ClaimLocked(const LayerClaim& c)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (c.layer.empty()) {
      return absl::InvalidArgumentError("layer claim without a layer name");
    }
    for (const auto& [first, last] : c.ranges) {
      if (first > last) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer '", c.layer, "' claims the empty range ",
                         first, "-", last));
      }
    }
    for (const LayerTypeName& n : c.names) {
      if (!Inside(n.type, c) || n.name.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer '", c.layer, "' names message type ", n.type,
                         " ('", n.name, "') outside its ranges"));
      }
    }
    for (const LayerClaim& other : claims_) {
      if (other.layer == c.layer) {
        if (SameClaim(other, c)) return absl::OkStatus();
        return absl::AlreadyExistsError(absl::StrCat(
            "layer '", c.layer, "' already claimed other message types"));
      }
      if (c.header_id != 0 && other.header_id == c.header_id) {
        return absl::AlreadyExistsError(absl::StrCat(
            "layer '", c.layer, "' claims header id ", c.header_id,
            ", already layer '", other.layer, "''s"));
      }
      for (const auto& mine : c.ranges) {
        for (const auto& theirs : other.ranges) {
          if (Overlaps(mine, theirs)) {
            return absl::AlreadyExistsError(absl::StrCat(
                "layer '", c.layer, "' claims message types ", mine.first,
                "-", mine.second, ", overlapping layer '", other.layer,
                "''s ", theirs.first, "-", theirs.second));
          }
        }
      }
    }
    claims_.push_back(c);
    return absl::OkStatus();
  }

  Mutex mu_;
  std::vector<LayerClaim> claims_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status ClaimLayer(const LayerClaim& claim) {
  return Registry::Get().Claim(claim);
}

std::optional<LayerTypeName> ClaimedTypeName(uint32_t type) {
  return Registry::Get().With([type](const std::vector<LayerClaim>& claims) {
    for (const LayerClaim& c : claims) {
      for (const LayerTypeName& n : c.names) {
        if (n.type == type) return std::optional<LayerTypeName>(n);
      }
    }
    return std::optional<LayerTypeName>();
  });
}

std::optional<std::string> LayerOfType(uint32_t type) {
  return Registry::Get().With([type](const std::vector<LayerClaim>& claims) {
    for (const LayerClaim& c : claims) {
      if (Inside(type, c)) return std::optional<std::string>(c.layer);
    }
    return std::optional<std::string>();
  });
}

std::optional<std::string> LayerOfHeader(uint32_t header_id) {
  return Registry::Get().With(
      [header_id](const std::vector<LayerClaim>& claims) {
        for (const LayerClaim& c : claims) {
          if (header_id != 0 && c.header_id == header_id) {
            return std::optional<std::string>(c.layer);
          }
        }
        return std::optional<std::string>();
      });
}

}  // namespace ferry::rpc
