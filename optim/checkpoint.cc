#include "ferry/optim/checkpoint.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"
#include "ferry/optim/crc32c.h"

namespace ferry::optim {
namespace {

constexpr char kMagic[8] = {'F', 'E', 'R', 'R', 'Y', 'C', 'K', 'P'};
// magic[8] version:u32 flags:u32 body_len:u64 body_crc:u32 header_crc:u32
constexpr size_t kHeaderSize = 32;
// Section tags of body entries.
constexpr uint8_t kParamTensor = 0;
constexpr uint8_t kOptimizerTensor = 1;
// Bounds that keep a corrupt length from allocating absurdly.
constexpr uint64_t kMaxDims = 64;

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  const int e = errno;
  return absl::InternalError(
      absl::StrCat(what, " '", path, "': ", std::strerror(e)));
}

// --- Encoding ---------------------------------------------------------------
// The body is a list of pieces: metadata bytes owned here, tensor elements
// borrowed from the snapshot (no copy of the shard to encode or write it).

void PutU32(std::string& s, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(v >> (8 * i));
  s.append(b, 4);
}
void PutU64(std::string& s, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  s.append(b, 8);
}
void PutString(std::string& s, const std::string& v) {
  PutU32(s, static_cast<uint32_t>(v.size()));
  s.append(v);
}

class Body {
 public:
  std::string& meta() { return meta_; }
  // Borrows `t`'s elements (kept alive here).
  void AddElements(const Tensor& t) {
    Flush();
    if (t.nbytes() == 0) return;
    keep_.push_back(t);
    pieces_.emplace_back(static_cast<const char*>(t.data_ptr()), t.nbytes());
    size_ += t.nbytes();
  }
  void Finish() { Flush(); }
  const std::vector<std::pair<const char*, size_t>>& pieces() const {
    return pieces_;
  }
  uint64_t size() const { return size_; }
  uint32_t Crc() const {
    uint32_t crc = 0;
    for (const auto& [p, n] : pieces_) crc = Crc32c(crc, p, n);
    return crc;
  }

 private:
  void Flush() {
    if (meta_.empty()) return;
    owned_.push_back(std::move(meta_));
    meta_.clear();
    pieces_.emplace_back(owned_.back().data(), owned_.back().size());
    size_ += owned_.back().size();
  }
  std::string meta_;
  std::deque<std::string> owned_;  // Stable addresses.
  std::vector<Tensor> keep_;
  std::vector<std::pair<const char*, size_t>> pieces_;
  uint64_t size_ = 0;
};

absl::Status PutTensor(Body& body, uint8_t section, const std::string& key,
                       const Tensor& t) {
  if (!t.defined() || t.device().type != DeviceType::kCPU) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint: tensor '", key, "' is undefined or not on the CPU"));
  }
  Tensor c = t.contiguous();
  std::string& s = body.meta();
  s.push_back(static_cast<char>(section));
  PutString(s, key);
  s.push_back(static_cast<char>(c.dtype()));
  PutU32(s, static_cast<uint32_t>(c.dim()));
  for (int64_t d : c.sizes()) PutU64(s, static_cast<uint64_t>(d));
  PutU64(s, c.nbytes());
  body.AddElements(c);
  return absl::OkStatus();
}

absl::Status EncodeBody(const ShardCheckpoint& c, Body& body) {
  std::string& s = body.meta();
  PutU64(s, static_cast<uint64_t>(c.step));
  PutString(s, c.optimizer_kind);
  PutU32(s, static_cast<uint32_t>(c.tensors.size() +
                                  c.optimizer.tensors.size()));
  for (const auto& [k, t] : c.tensors) {
    if (k.empty()) {
      return absl::InvalidArgumentError("checkpoint: a tensor has no name");
    }
    absl::Status st = PutTensor(body, kParamTensor, k, t);
    if (!st.ok()) return st;
  }
  for (const auto& [k, t] : c.optimizer.tensors) {
    absl::Status st = PutTensor(body, kOptimizerTensor, k, t);
    if (!st.ok()) return st;
  }
  std::string& tail = body.meta();
  PutU32(tail, static_cast<uint32_t>(c.optimizer.ints.size()));
  for (const auto& [k, v] : c.optimizer.ints) {
    PutString(tail, k);
    PutU64(tail, static_cast<uint64_t>(v));
  }
  body.Finish();
  return absl::OkStatus();
}

std::string Header(const Body& body) {
  std::string header(kMagic, sizeof(kMagic));
  PutU32(header, kCheckpointVersion);
  PutU32(header, 0);  // flags
  PutU64(header, body.size());
  PutU32(header, body.Crc());
  PutU32(header, Crc32c(0, header.data(), header.size()));
  return header;
}

// --- Decoding ---------------------------------------------------------------

// Where the bytes come from: memory or a file.
class Source {
 public:
  virtual ~Source() = default;
  // Reads exactly `n` bytes into `dst`; false at the end or on an error.
  virtual bool Read(void* dst, size_t n) = 0;
};

class MemorySource : public Source {
 public:
  MemorySource(const char* p, size_t n) : p_(p), left_(n) {}
  bool Read(void* dst, size_t n) override {
    if (n > left_) return false;
    std::memcpy(dst, p_, n);
    p_ += n;
    left_ -= n;
    return true;
  }

 private:
  const char* p_;
  size_t left_;
};

// Buffered reads of small fields; large reads go straight to their
// destination (a tensor's storage).
class FileSource : public Source {
 public:
  FileSource(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  bool Read(void* dst, size_t n) override {
    char* out = static_cast<char*>(dst);
    const size_t buffered = std::min(n, end_ - pos_);
    std::memcpy(out, buf_.data() + pos_, buffered);
    pos_ += buffered;
    out += buffered;
    n -= buffered;
    if (n == 0) return true;
    if (n >= buf_.size()) return ReadFully(out, n);
    size_t got = 0;
    if (!ReadSome(buf_.data(), buf_.size(), n, got)) return false;
    std::memcpy(out, buf_.data(), n);
    pos_ = n;
    end_ = got;
    return true;
  }
  const absl::Status& error() const { return error_; }

 private:
  bool ReadFully(char* out, size_t n) {
    size_t got = 0;
    return ReadSome(out, n, n, got);
  }
  // Reads up to `cap` bytes, at least `need`.
  bool ReadSome(char* out, size_t cap, size_t need, size_t& got) {
    got = 0;
    while (got < need) {
      ssize_t r = ::read(fd_, out + got, cap - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        error_ = ErrnoError("reading checkpoint", path_);
        return false;
      }
      if (r == 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }
  int fd_;
  std::string path_;
  std::vector<char> buf_ = std::vector<char>(1 << 16);
  size_t pos_ = 0, end_ = 0;
  absl::Status error_;
};

// The body's fields, bounded by its length, with its running CRC32C.
class BodyReader {
 public:
  BodyReader(Source& src, uint64_t len) : src_(src), left_(len) {}
  bool Bytes(void* dst, size_t n) {
    if (n > left_ || !src_.Read(dst, n)) return false;
    crc_ = Crc32c(crc_, dst, n);
    left_ -= n;
    return true;
  }
  bool U8(uint8_t& v) { return Bytes(&v, 1); }
  bool U32(uint32_t& v) {
    unsigned char b[4];
    if (!Bytes(b, 4)) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{b[i]} << (8 * i);
    return true;
  }
  bool U64(uint64_t& v) {
    unsigned char b[8];
    if (!Bytes(b, 8)) return false;
    v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{b[i]} << (8 * i);
    return true;
  }
  bool String(std::string& v) {
    uint32_t n;
    if (!U32(n) || n > left_) return false;
    v.resize(n);
    return Bytes(v.data(), n);
  }
  // Reads what is left (after a parse error), for the checksum.
  void Drain() {
    std::vector<char> scratch(1 << 16);
    while (left_ > 0) {
      if (!Bytes(scratch.data(), std::min<uint64_t>(left_, scratch.size()))) {
        return;
      }
    }
  }
  uint64_t left() const { return left_; }
  uint32_t crc() const { return crc_; }

 private:
  Source& src_;
  uint64_t left_;
  uint32_t crc_ = 0;
};

absl::Status Malformed(const std::string& file, const std::string& why) {
  return absl::DataLossError(
      absl::StrCat("checkpoint '", file, "': malformed body: ", why));
}

absl::StatusOr<Tensor> GetTensor(BodyReader& r, const std::string& key,
                                 const std::string& file) {
  uint8_t dtype_byte;
  uint32_t ndim;
  if (!r.U8(dtype_byte) || !r.U32(ndim) || ndim > kMaxDims) {
    return Malformed(file, absl::StrCat("tensor '", key, "' header"));
  }
  bool known = false;
  for (DType d : kAllDTypes) known |= static_cast<uint8_t>(d) == dtype_byte;
  if (!known) {
    return Malformed(file, absl::StrCat("tensor '", key, "' has unknown dtype ",
                                        int{dtype_byte}));
  }
  const DType dtype = static_cast<DType>(dtype_byte);
  std::vector<int64_t> sizes(ndim);
  uint64_t numel = 1;
  for (uint32_t i = 0; i < ndim; ++i) {
    uint64_t d;
    if (!r.U64(d) || d > (uint64_t{1} << 48)) {
      return Malformed(file, absl::StrCat("tensor '", key, "' shape"));
    }
    sizes[i] = static_cast<int64_t>(d);
    numel *= d;
    if (numel > (uint64_t{1} << 48)) {
      return Malformed(file, absl::StrCat("tensor '", key, "' shape"));
    }
  }
  uint64_t nbytes;
  // Bounded by the bytes left before anything is allocated.
  if (!r.U64(nbytes) || nbytes != numel * ItemSize(dtype) ||
      nbytes > r.left()) {
    return Malformed(file, absl::StrCat("tensor '", key, "' data length"));
  }
  absl::StatusOr<Tensor> t = Tensor::TryEmpty(sizes, dtype);
  if (!t.ok()) {
    return Malformed(file, absl::StrCat("tensor '", key, "': ",
                                        t.status().message()));
  }
  if (nbytes > 0 && !r.Bytes(t->data_ptr(), nbytes)) {
    return Malformed(file, absl::StrCat("tensor '", key, "' data"));
  }
  return t;
}

absl::StatusOr<ShardCheckpoint> ParseBody(BodyReader& r,
                                          const std::string& file) {
  ShardCheckpoint c;
  uint64_t step;
  uint32_t n;
  if (!r.U64(step) || !r.String(c.optimizer_kind) || !r.U32(n)) {
    return Malformed(file, "preamble");
  }
  c.step = static_cast<int64_t>(step);
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t section;
    std::string key;
    if (!r.U8(section) || !r.String(key) ||
        (section != kParamTensor && section != kOptimizerTensor)) {
      return Malformed(file, absl::StrCat("entry ", i));
    }
    absl::StatusOr<Tensor> t = GetTensor(r, key, file);
    if (!t.ok()) return t.status();
    if (section == kParamTensor) {
      c.tensors.emplace_back(std::move(key), *std::move(t));
    } else {
      c.optimizer.tensors[std::move(key)] = *std::move(t);
    }
  }
  uint32_t ints;
  if (!r.U32(ints)) return Malformed(file, "counter count");
  for (uint32_t i = 0; i < ints; ++i) {
    std::string key;
    uint64_t v;
    if (!r.String(key) || !r.U64(v)) {
      return Malformed(file, absl::StrCat("counter ", i));
    }
    c.optimizer.ints[std::move(key)] = static_cast<int64_t>(v);
  }
  if (r.left() != 0) return Malformed(file, "bytes after the last entry");
  return c;
}

// Decodes a file image of `total` bytes from `src`.
absl::StatusOr<ShardCheckpoint> Decode(Source& src, uint64_t total,
                                       const std::string& file) {
  auto refuse = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("checkpoint '", file, "': ", why));
  };
  char header[kHeaderSize];
  if (total < kHeaderSize || !src.Read(header, kHeaderSize)) {
    return refuse(absl::StrCat("truncated: ", total,
                               " bytes, shorter than the ", kHeaderSize,
                               "-byte header"));
  }
  if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0) {
    return refuse("bad magic (not a Ferry checkpoint)");
  }
  MemorySource hs(header + sizeof(kMagic), kHeaderSize - sizeof(kMagic));
  BodyReader h(hs, kHeaderSize - sizeof(kMagic));
  uint32_t version = 0, flags = 0, body_crc = 0, header_crc = 0;
  uint64_t body_len = 0;
  h.U32(version);
  h.U32(flags);
  h.U64(body_len);
  h.U32(body_crc);
  h.U32(header_crc);
  if (Crc32c(0, header, kHeaderSize - 4) != header_crc) {
    return refuse("header checksum mismatch");
  }
  if (version != kCheckpointVersion) {
    return refuse(absl::StrCat("unsupported version ", version,
                               " (this build reads ", kCheckpointVersion, ")"));
  }
  if (total - kHeaderSize < body_len) {
    return refuse(absl::StrCat("truncated: body has ", total - kHeaderSize,
                               " of ", body_len, " bytes"));
  }
  if (total - kHeaderSize > body_len) {
    return refuse(absl::StrCat(total - kHeaderSize - body_len,
                               " bytes after the body"));
  }
  BodyReader r(src, body_len);
  absl::StatusOr<ShardCheckpoint> c = ParseBody(r, file);
  // A damaged body usually fails to parse first: the checksum says which.
  if (!c.ok()) r.Drain();
  if (r.left() == 0 && r.crc() != body_crc) {
    return refuse(absl::StrCat("body checksum mismatch (CRC32C ", r.crc(),
                               ", header says ", body_crc, ")"));
  }
  return c;
}

absl::Status WriteAll(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("writing", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("opening directory", dir);
  int rc = ::fsync(fd);
  absl::Status s = rc == 0 ? absl::OkStatus() : ErrnoError("fsync of", dir);
  ::close(fd);
  return s;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

ShardCheckpoint SnapshotShard(int64_t step, const std::vector<Tensor>& params,
                              const Optimizer* optimizer,
                              const std::vector<std::string>& names) {
  ShardCheckpoint c;
  SnapshotShardInto(c, step, params, optimizer, names);
  return c;
}

namespace {

// A copy of `src` in `spare` when it fits (same dtype and shape), else a
// fresh clone.
Tensor CopyInto(Tensor spare, const Tensor& src) {
  if (spare.defined() && src.defined() && spare.dtype() == src.dtype() &&
      spare.sizes() == src.sizes() && spare.is_contiguous() &&
      spare.use_count() == 1) {
    spare.copy_(src);
    return spare;
  }
  return src.defined() ? src.clone() : Tensor();
}

}  // namespace

void SnapshotShardInto(ShardCheckpoint& out, int64_t step,
                       const std::vector<Tensor>& params,
                       const Optimizer* optimizer,
                       const std::vector<std::string>& names) {
  std::map<std::string, Tensor> spare;
  for (auto& [k, t] : out.tensors) spare[k] = std::move(t);
  out.tensors.clear();
  out.step = step;
  out.tensors.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    std::string name = i < names.size() ? names[i] : absl::StrCat(i);
    auto it = spare.find(name);
    Tensor t = CopyInto(it != spare.end() ? std::move(it->second) : Tensor(),
                        params[i]);
    out.tensors.emplace_back(std::move(name), std::move(t));
  }
  StateDict old = std::move(out.optimizer);
  out.optimizer = StateDict();
  out.optimizer_kind.clear();
  if (optimizer == nullptr) return;
  out.optimizer_kind = optimizer->kind();
  StateDict live = optimizer->StateView();
  out.optimizer.ints = std::move(live.ints);
  for (auto& [k, t] : live.tensors) {
    auto it = old.tensors.find(k);
    out.optimizer.tensors[k] =
        CopyInto(it != old.tensors.end() ? std::move(it->second) : Tensor(), t);
  }
}

absl::StatusOr<std::string> EncodeCheckpoint(const ShardCheckpoint& c) {
  Body body;
  absl::Status st = EncodeBody(c, body);
  if (!st.ok()) return st;
  std::string out = Header(body);
  out.reserve(kHeaderSize + body.size());
  for (const auto& [p, n] : body.pieces()) out.append(p, n);
  return out;
}

absl::StatusOr<ShardCheckpoint> DecodeCheckpoint(const std::string& bytes,
                                                 const std::string& file) {
  MemorySource src(bytes.data(), bytes.size());
  return Decode(src, bytes.size(), file);
}

std::string LatestCheckpointPath(const std::string& dir,
                                 const std::string& name) {
  return absl::StrCat(dir, "/", name, ".ckpt");
}

std::string PreviousCheckpointPath(const std::string& dir,
                                   const std::string& name) {
  return absl::StrCat(dir, "/", name, ".prev.ckpt");
}

absl::StatusOr<uint64_t> WriteCheckpoint(const std::string& dir,
                                         const std::string& name,
                                         const ShardCheckpoint& checkpoint) {
  Body body;
  absl::Status encoded = EncodeBody(checkpoint, body);
  if (!encoded.ok()) return encoded;
  const std::string header = Header(body);
  const std::string tmp = absl::StrCat(dir, "/", name, ".tmp");
  const std::string latest = LatestCheckpointPath(dir, name);
  const std::string prev = PreviousCheckpointPath(dir, name);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("creating", tmp);
  absl::Status s = WriteAll(fd, header.data(), header.size(), tmp);
  for (const auto& [p, n] : body.pieces()) {
    if (s.ok()) s = WriteAll(fd, p, n, tmp);
  }
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoError("fsync of", tmp);
  if (::close(fd) != 0 && s.ok()) s = ErrnoError("closing", tmp);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  if (FileExists(latest) && ::rename(latest.c_str(), prev.c_str()) != 0) {
    return ErrnoError(absl::StrCat("renaming '", latest, "' to"), prev);
  }
  if (::rename(tmp.c_str(), latest.c_str()) != 0) {
    return ErrnoError(absl::StrCat("renaming '", tmp, "' to"), latest);
  }
  absl::Status synced = FsyncDir(dir);
  if (!synced.ok()) return synced;
  return static_cast<uint64_t>(header.size() + body.size());
}

absl::StatusOr<ShardCheckpoint> ReadCheckpointFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint '", path, "' does not exist"));
    }
    return ErrnoError("opening checkpoint", path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status e = ErrnoError("stat of checkpoint", path);
    ::close(fd);
    return e;
  }
  FileSource src(fd, path);
  absl::StatusOr<ShardCheckpoint> c =
      Decode(src, static_cast<uint64_t>(st.st_size), path);
  ::close(fd);
  if (!src.error().ok()) return src.error();
  return c;
}

absl::StatusOr<LoadedCheckpoint> LoadLatest(const std::string& dir,
                                            const std::string& name) {
  LoadedCheckpoint out;
  int missing = 0;
  for (const std::string& path :
       {LatestCheckpointPath(dir, name), PreviousCheckpointPath(dir, name)}) {
    absl::StatusOr<ShardCheckpoint> c = ReadCheckpointFile(path);
    if (c.ok()) {
      out.checkpoint = *std::move(c);
      out.path = path;
      return out;
    }
    if (absl::IsNotFound(c.status())) {
      ++missing;
      continue;
    }
    out.refused.push_back(std::string(c.status().message()));
  }
  if (missing == 2) {
    return absl::NotFoundError(absl::StrCat("no checkpoint of '", name,
                                            "' in '", dir, "'"));
  }
  return absl::DataLossError(absl::StrCat(
      "no valid checkpoint of '", name, "' in '", dir,
      "': ", absl::StrJoin(out.refused, "; ")));
}

// --- Checkpointer -------------------------------------------------------------

Checkpointer::Checkpointer(CheckpointerOptions options)
    : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Create(
    CheckpointerOptions options) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("Checkpointer: dir is empty");
  }
  if (options.name.empty() || options.name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Checkpointer: name '", options.name, "' is empty or has a '/'"));
  }
  if (options.writer_nice < 0 || options.writer_nice > 19) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Checkpointer: writer_nice ", options.writer_nice, " is not in 0..19"));
  }
  if (options.every_steps < 0 || options.every < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "Checkpointer: every_steps and every must not be negative");
  }
  if (::mkdir(options.dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoError("Checkpointer: creating directory", options.dir);
  }
  std::unique_ptr<Checkpointer> c(new Checkpointer(std::move(options)));
  c->writer_ = std::thread([raw = c.get()] { raw->WriterLoop(); });
  return c;
}

Checkpointer::~Checkpointer() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  writer_.join();
}

bool Checkpointer::Due(int64_t step) {
  MutexLock lock(&mu_);
  if (!last_step_) {
    last_step_ = step;
    last_time_ = absl::Now();
    return false;
  }
  if (options_.every_steps > 0 && step - *last_step_ >= options_.every_steps) {
    return true;
  }
  return options_.every > absl::ZeroDuration() &&
         absl::Now() - last_time_ >= options_.every && step != *last_step_;
}

void Checkpointer::Submit(ShardCheckpoint snapshot) {
  MutexLock lock(&mu_);
  last_step_ = snapshot.step;
  last_time_ = absl::Now();
  ++stats_.submitted;
  if (pending_) ++stats_.superseded;
  pending_ = std::move(snapshot);
}

bool Checkpointer::MaybeCheckpoint(
    int64_t step, absl::FunctionRef<void(ShardCheckpoint&)> copy) {
  if (!Due(step)) return false;
  ShardCheckpoint snapshot;
  {
    MutexLock lock(&mu_);
    if (spare_) {
      snapshot = *std::move(spare_);
      spare_.reset();
    }
  }
  copy(snapshot);
  Submit(std::move(snapshot));
  return true;
}

absl::Status Checkpointer::Flush(absl::Duration timeout) {
  MutexLock lock(&mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !pending_ && state_ == State::kIdle;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&settled), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "checkpoint of '", options_.name, "': writes not done after ",
        absl::FormatDuration(timeout)));
  }
  return last_status_;
}

Checkpointer::Stats Checkpointer::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void Checkpointer::WriterLoop() {
  // Lower this thread's priority (Linux: per thread): the server's own
  // threads go first; a slow write only delays the checkpoint.
  if (options_.writer_nice > 0) {
    errno = 0;
    if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()),
                      options_.writer_nice) != 0) {
      FERRY_LOG(WARNING) << "checkpoint of '" << options_.name
                         << "': writer priority unchanged: "
                         << std::strerror(errno);
    }
  }
  MutexLock lock(&mu_);
  auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_.has_value() || stop_;
  };
  for (;;) {
    mu_.Await(absl::Condition(&work));
    if (!pending_) break;  // stop_ and nothing waits.
    ShardCheckpoint snapshot = *std::move(pending_);
    pending_.reset();
    state_ = stop_ ? State::kStopping : State::kWriting;
    mu_.Unlock();
    const absl::Time start = absl::Now();
    absl::StatusOr<uint64_t> written =
        WriteCheckpoint(options_.dir, options_.name, snapshot);
    const absl::Duration took = absl::Now() - start;
    const int64_t step = snapshot.step;
    mu_.Lock();
    spare_ = std::move(snapshot);  // Its buffers serve the next snapshot.
    if (written.ok()) {
      ++stats_.written;
      stats_.last_written_step = step;
      stats_.last_bytes = *written;
      stats_.last_write_time = took;
      last_status_ = absl::OkStatus();
    } else {
      ++stats_.failed;
      stats_.last_error = Annotate(
          written.status(), absl::StrCat("checkpoint of '", options_.name,
                                         "' at step ", step));
      last_status_ = stats_.last_error;
    }
    state_ = State::kIdle;
  }
}

}  // namespace ferry::optim
