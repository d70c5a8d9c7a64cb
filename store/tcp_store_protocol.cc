#include "ferry/store/tcp_store_protocol.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ferry {
namespace tcpstore {
namespace {

// Current-generation codes are the Op values themselves (VALIDATE = 0 ...
// QUEUE_LEN = 16). Legacy codes, indexed by wire byte:
constexpr Op kLegacyOps[] = {
    Op::kSet,        Op::kCompareSet, Op::kGet,        Op::kAdd,
    Op::kCheck,      Op::kWait,       Op::kGetNumKeys, Op::kWatchKey,
    Op::kDeleteKey,  Op::kAppend,     Op::kMultiGet,   Op::kMultiSet,
    Op::kCancelWait,
};
constexpr size_t kNumLegacyOps = sizeof(kLegacyOps) / sizeof(kLegacyOps[0]);

// Reads fields from a frame prefix; `need_more` is set (and every later read
// fails) once the data runs out.
class Cursor {
 public:
  explicit Cursor(absl::string_view data) : data_(data) {}

  bool U8(uint8_t* v) {
    if (!Have(1)) return false;
    *v = static_cast<uint8_t>(data_[pos_++]);
    return true;
  }
  bool U32(uint32_t* v) {
    if (!Have(4)) return false;
    *v = LoadU32(data_.data() + pos_);
    pos_ += 4;
    return true;
  }
  bool U64(uint64_t* v) {
    if (!Have(8)) return false;
    *v = LoadU64(data_.data() + pos_);
    pos_ += 8;
    return true;
  }
  bool Bytes(uint64_t n, std::string* out) {
    if (!Have(n)) return false;
    out->assign(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool need_more() const { return need_more_; }
  size_t pos() const { return pos_; }

 private:
  bool Have(uint64_t n) {
    if (need_more_ || data_.size() - pos_ < n) {
      need_more_ = true;
      return false;
    }
    return true;
  }

  absl::string_view data_;
  size_t pos_ = 0;
  bool need_more_ = false;
};

}  // namespace

const char* OpName(Op op) {
  switch (op) {
    case Op::kValidate:
      return "VALIDATE";
    case Op::kSet:
      return "SET";
    case Op::kCompareSet:
      return "COMPARE_SET";
    case Op::kGet:
      return "GET";
    case Op::kAdd:
      return "ADD";
    case Op::kCheck:
      return "CHECK";
    case Op::kWait:
      return "WAIT";
    case Op::kGetNumKeys:
      return "GETNUMKEYS";
    case Op::kDeleteKey:
      return "DELETE_KEY";
    case Op::kAppend:
      return "APPEND";
    case Op::kMultiGet:
      return "MULTI_GET";
    case Op::kMultiSet:
      return "MULTI_SET";
    case Op::kCancelWait:
      return "CANCEL_WAIT";
    case Op::kPing:
      return "PING";
    case Op::kQueuePush:
      return "QUEUE_PUSH";
    case Op::kQueuePop:
      return "QUEUE_POP";
    case Op::kQueueLen:
      return "QUEUE_LEN";
    case Op::kWatchKey:
      return "WATCH_KEY";
    case Op::kAuthChallenge:
      return "AUTH_CHALLENGE";
    case Op::kAuthProof:
      return "AUTH_PROOF";
  }
  return "?";
}

std::optional<uint8_t> WireCode(Generation generation, Op op) {
  if (op == Op::kAuthChallenge) return kAuthChallengeCode;
  if (op == Op::kAuthProof) return kAuthProofCode;
  if (generation == Generation::kLegacy) {
    for (size_t i = 0; i < kNumLegacyOps; ++i) {
      if (kLegacyOps[i] == op) return static_cast<uint8_t>(i);
    }
    return std::nullopt;
  }
  if (op == Op::kWatchKey) return std::nullopt;
  return static_cast<uint8_t>(op);
}

std::optional<Op> OpFromWire(Generation generation, uint8_t code) {
  if (code == kAuthChallengeCode) return Op::kAuthChallenge;
  if (code == kAuthProofCode) return Op::kAuthProof;
  if (generation == Generation::kLegacy) {
    if (code < kNumLegacyOps) return kLegacyOps[code];
    return std::nullopt;
  }
  if (code <= static_cast<uint8_t>(Op::kQueueLen)) return static_cast<Op>(code);
  return std::nullopt;
}

void Request::Clear() {
  op = Op::kValidate;
  keys.clear();
  values.clear();
  delta = 0;
  nonce = 0;
}

FrameParser::Result FrameParser::Fail(absl::Status status) {
  error_ = std::move(status);
  return Result::kError;
}

// The first frame decides. A current client opens with VALIDATE: byte 0 then
// the magic. A legacy client opens with any query; only its SET also starts
// with byte 0, and then bytes 1..8 are a key length. So: byte 0 + magic is
// current; byte 0 + a key length within limits is a legacy SET; byte 0 with
// anything else is a bad handshake (a wrong magic lands here: the magic's
// bytes read as a length are far beyond any key limit). A non-zero first byte
// is legacy.
FrameParser::Result FrameParser::DetectGeneration(absl::string_view data) {
  if (data.empty()) return Result::kNeedMore;
  if (data[0] != 0) {
    generation_ = Generation::kLegacy;
    return Result::kFrame;
  }
  if (data.size() < 5) return Result::kNeedMore;
  if (LoadU32(data.data() + 1) == kValidationMagic) {
    generation_ = Generation::kCurrent;
    return Result::kFrame;
  }
  if (data.size() < 9) return Result::kNeedMore;
  const uint64_t len = LoadU64(data.data() + 1);
  if (len <= limits_.max_key_bytes) {
    generation_ = Generation::kLegacy;
    return Result::kFrame;
  }
  return Fail(absl::InvalidArgumentError(absl::StrFormat(
      "bad handshake: first frame is neither VALIDATE with magic 0x%08X "
      "(got 0x%08X) nor a legacy (PyTorch 1.13) frame",
      kValidationMagic, LoadU32(data.data() + 1))));
}

FrameParser::Result FrameParser::Parse(absl::string_view data, Request* out,
                                       size_t* consumed) {
  if (!error_.ok()) return Result::kError;
  *consumed = 0;
  if (generation_ == Generation::kUnknown) {
    Result r = DetectGeneration(data);
    if (r != Result::kFrame) return r;
  }
  out->Clear();
  Cursor c(data);
  uint8_t code;
  if (!c.U8(&code)) return Result::kNeedMore;
  std::optional<Op> op = OpFromWire(generation_, code);
  if (!op.has_value()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("unknown query type ", code, " (",
                     generation_ == Generation::kLegacy ? "legacy" : "current",
                     " protocol)")));
  }
  out->op = *op;
  uint64_t total = 1;  // frame bytes declared so far

  auto check_total = [&](uint64_t add) {
    total += add;
    return total <= limits_.max_frame_bytes;
  };
  auto frame_too_big = [&]() {
    return Fail(absl::ResourceExhaustedError(
        absl::StrCat(OpName(*op), " frame exceeds the limit of ",
                     limits_.max_frame_bytes, " bytes")));
  };
  // Reads one key (length checked before its bytes are awaited).
  auto read_key = [&](Result* r) -> bool {
    uint64_t len;
    if (!c.U64(&len)) {
      *r = Result::kNeedMore;
      return false;
    }
    if (len > limits_.max_key_bytes) {
      *r = Fail(absl::InvalidArgumentError(absl::StrCat(
          OpName(*op), ": key of ", len, " bytes exceeds the limit of ",
          limits_.max_key_bytes, " bytes")));
      return false;
    }
    if (!check_total(8 + len)) {
      *r = frame_too_big();
      return false;
    }
    std::string& key = out->keys.emplace_back();
    if (!c.Bytes(len, &key)) {
      *r = Result::kNeedMore;
      return false;
    }
    return true;
  };
  auto read_value = [&](Result* r) -> bool {
    uint64_t len;
    if (!c.U64(&len)) {
      *r = Result::kNeedMore;
      return false;
    }
    if (len > limits_.max_value_bytes) {
      *r = Fail(absl::InvalidArgumentError(absl::StrCat(
          OpName(*op), ": value of ", len, " bytes exceeds the limit of ",
          limits_.max_value_bytes, " bytes")));
      return false;
    }
    if (!check_total(8 + len)) {
      *r = frame_too_big();
      return false;
    }
    std::string& value = out->values.emplace_back();
    if (!c.Bytes(len, &value)) {
      *r = Result::kNeedMore;
      return false;
    }
    return true;
  };
  auto read_count = [&](uint64_t* n, Result* r) -> bool {
    if (!c.U64(n)) {
      *r = Result::kNeedMore;
      return false;
    }
    if (*n > limits_.max_keys_per_request) {
      *r = Fail(absl::InvalidArgumentError(
          absl::StrCat(OpName(*op), ": ", *n, " keys exceed the limit of ",
                       limits_.max_keys_per_request, " keys per request")));
      return false;
    }
    return true;
  };

  Result r = Result::kFrame;
  bool ok = true;
  switch (*op) {
    case Op::kValidate:
      ok = c.U32(&out->nonce);
      if (ok && out->nonce != kValidationMagic) {
        return Fail(absl::InvalidArgumentError(
            absl::StrFormat("VALIDATE: wrong magic 0x%08X (expected 0x%08X)",
                            out->nonce, kValidationMagic)));
      }
      if (!ok) r = Result::kNeedMore;
      break;
    case Op::kPing:
      ok = c.U32(&out->nonce);
      if (!ok) r = Result::kNeedMore;
      break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      ok = read_key(&r) && read_value(&r);
      break;
    case Op::kCompareSet:
      ok = read_key(&r) && read_value(&r) && read_value(&r);
      break;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
    case Op::kWatchKey:
    case Op::kAuthChallenge:  // the nonce / proof travels as a key
    case Op::kAuthProof:
      ok = read_key(&r);
      break;
    case Op::kAdd: {
      ok = read_key(&r);
      uint64_t v;
      if (ok && !c.U64(&v)) {
        ok = false;
        r = Result::kNeedMore;
      }
      if (ok) out->delta = static_cast<int64_t>(v);
      break;
    }
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet: {
      uint64_t n;
      ok = read_count(&n, &r);
      if (ok && !check_total(8)) {
        r = frame_too_big();
        ok = false;
      }
      for (uint64_t i = 0; ok && i < n; ++i) ok = read_key(&r);
      break;
    }
    case Op::kMultiSet: {
      uint64_t n;
      ok = read_count(&n, &r);
      if (ok && !check_total(8)) {
        r = frame_too_big();
        ok = false;
      }
      for (uint64_t i = 0; ok && i < n; ++i)
        ok = read_key(&r) && read_value(&r);
      break;
    }
    case Op::kGetNumKeys:
    case Op::kCancelWait:
      break;
  }
  if (!ok) return r;
  *consumed = c.pos();
  return Result::kFrame;
}

bool EncodeRequest(Generation generation, const Request& r, std::string* out) {
  std::optional<uint8_t> code = WireCode(generation, r.op);
  if (!code.has_value()) return false;
  PutU8(out, *code);
  switch (r.op) {
    case Op::kValidate:
    case Op::kPing:
      PutU32(out, r.nonce);
      break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
    case Op::kCompareSet:
      PutBytes(out, r.keys[0]);
      for (const std::string& v : r.values) PutBytes(out, v);
      break;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
    case Op::kWatchKey:
    case Op::kAuthChallenge:
    case Op::kAuthProof:
      PutBytes(out, r.keys[0]);
      break;
    case Op::kAdd:
      PutBytes(out, r.keys[0]);
      PutU64(out, static_cast<uint64_t>(r.delta));
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      PutU64(out, r.keys.size());
      for (const std::string& k : r.keys) PutBytes(out, k);
      break;
    case Op::kMultiSet:
      PutU64(out, r.keys.size());
      for (size_t i = 0; i < r.keys.size(); ++i) {
        PutBytes(out, r.keys[i]);
        PutBytes(out, r.values[i]);
      }
      break;
    case Op::kGetNumKeys:
    case Op::kCancelWait:
      break;
  }
  return true;
}

size_t ResponseSize(Op op, size_t num_keys, absl::string_view data,
                    uint64_t max_value_bytes) {
  constexpr size_t kBroken = SIZE_MAX;
  // Size of `n` byte vectors from `pos`; 0 when incomplete.
  auto vectors = [&](size_t pos, size_t n) -> size_t {
    for (size_t i = 0; i < n; ++i) {
      if (data.size() - pos < 8) return 0;
      const uint64_t len = LoadU64(data.data() + pos);
      if (len > max_value_bytes) return kBroken;
      pos += 8;
      if (data.size() - pos < len) return 0;
      pos += len;
    }
    return pos;
  };
  auto fixed = [&](size_t n) -> size_t { return data.size() >= n ? n : 0; };
  switch (op) {
    case Op::kGet:
    case Op::kCompareSet:
      return vectors(0, 1);
    case Op::kMultiGet:
      if (num_keys == 0) return 0;  // never sent empty (see the relay)
      return vectors(0, num_keys);
    case Op::kAdd:
    case Op::kGetNumKeys:
    case Op::kDeleteKey:
    case Op::kQueueLen:
      return fixed(8);
    case Op::kCheck:
    case Op::kWait:
    case Op::kCancelWait:
    case Op::kAuthProof:
      return fixed(1);
    case Op::kPing:
      return fixed(4);
    case Op::kQueuePop: {
      if (data.size() < 8) return 0;
      if (LoadU64(data.data()) == 0) return 8;
      return vectors(8, 1);
    }
    case Op::kAuthChallenge:
      return vectors(0, 2);
    default:
      return kBroken;  // no response expected
  }
}

void PutU8(std::string* out, uint8_t v) {
  out->push_back(static_cast<char>(v));
}

void PutU32(std::string* out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out->append(b, 4);
}

void PutU64(std::string* out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out->append(b, 8);
}

void PutBytes(std::string* out, absl::string_view bytes) {
  PutU64(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

uint64_t LoadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace tcpstore
}  // namespace ferry
