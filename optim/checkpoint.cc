#include "ferry/optim/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
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

absl::Status PutTensor(std::string& s, uint8_t section, const std::string& key,
                       const Tensor& t) {
  if (!t.defined() || t.device().type != DeviceType::kCPU) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint: tensor '", key, "' is undefined or not on the CPU"));
  }
  Tensor c = t.contiguous();
  s.push_back(static_cast<char>(section));
  PutString(s, key);
  s.push_back(static_cast<char>(c.dtype()));
  PutU32(s, static_cast<uint32_t>(c.dim()));
  for (int64_t d : c.sizes()) PutU64(s, static_cast<uint64_t>(d));
  PutU64(s, c.nbytes());
  s.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
  return absl::OkStatus();
}

// --- Decoding ---------------------------------------------------------------

class Reader {
 public:
  Reader(const char* p, size_t n) : p_(p), end_(p + n) {}
  bool U8(uint8_t& v) {
    if (end_ - p_ < 1) return false;
    v = static_cast<uint8_t>(*p_++);
    return true;
  }
  bool U32(uint32_t& v) {
    if (end_ - p_ < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(p_[i])} << (8 * i);
    p_ += 4;
    return true;
  }
  bool U64(uint64_t& v) {
    if (end_ - p_ < 8) return false;
    v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(p_[i])} << (8 * i);
    p_ += 8;
    return true;
  }
  bool Bytes(size_t n, const char*& out) {
    if (static_cast<size_t>(end_ - p_) < n) return false;
    out = p_;
    p_ += n;
    return true;
  }
  bool String(std::string& v) {
    uint32_t n;
    const char* b;
    if (!U32(n) || !Bytes(n, b)) return false;
    v.assign(b, n);
    return true;
  }
  bool done() const { return p_ == end_; }

 private:
  const char* p_;
  const char* end_;
};

absl::Status Malformed(const std::string& file, const std::string& why) {
  return absl::DataLossError(
      absl::StrCat("checkpoint '", file, "': malformed body: ", why));
}

absl::StatusOr<Tensor> GetTensor(Reader& r, const std::string& key,
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
  const char* data;
  if (!r.U64(nbytes) || nbytes != numel * ItemSize(dtype) ||
      !r.Bytes(nbytes, data)) {
    return Malformed(file, absl::StrCat("tensor '", key, "' data"));
  }
  absl::StatusOr<Tensor> t = Tensor::TryEmpty(sizes, dtype);
  if (!t.ok()) {
    return Malformed(file, absl::StrCat("tensor '", key, "': ",
                                        t.status().message()));
  }
  if (nbytes > 0) std::memcpy(t->data_ptr(), data, nbytes);
  return t;
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
  c.step = step;
  c.tensors.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    c.tensors.emplace_back(i < names.size() ? names[i] : absl::StrCat(i),
                           params[i].clone());
  }
  if (optimizer != nullptr) {
    c.optimizer_kind = optimizer->kind();
    c.optimizer = optimizer->ExportStateDict();
  }
  return c;
}

absl::StatusOr<std::string> EncodeCheckpoint(const ShardCheckpoint& c) {
  uint64_t payload = 0;
  for (const auto& [k, t] : c.tensors) payload += t.defined() ? t.nbytes() : 0;
  for (const auto& [k, t] : c.optimizer.tensors) {
    payload += t.defined() ? t.nbytes() : 0;
  }
  std::string out(kHeaderSize, '\0');
  out.reserve(kHeaderSize + payload + 4096);
  PutU64(out, static_cast<uint64_t>(c.step));
  PutString(out, c.optimizer_kind);
  PutU32(out, static_cast<uint32_t>(c.tensors.size() +
                                    c.optimizer.tensors.size()));
  for (const auto& [k, t] : c.tensors) {
    if (k.empty()) {
      return absl::InvalidArgumentError("checkpoint: a tensor has no name");
    }
    absl::Status s = PutTensor(out, kParamTensor, k, t);
    if (!s.ok()) return s;
  }
  for (const auto& [k, t] : c.optimizer.tensors) {
    absl::Status s = PutTensor(out, kOptimizerTensor, k, t);
    if (!s.ok()) return s;
  }
  PutU32(out, static_cast<uint32_t>(c.optimizer.ints.size()));
  for (const auto& [k, v] : c.optimizer.ints) {
    PutString(out, k);
    PutU64(out, static_cast<uint64_t>(v));
  }
  const uint64_t body_len = out.size() - kHeaderSize;
  const uint32_t body_crc = Crc32c(0, out.data() + kHeaderSize, body_len);
  std::string header(kMagic, sizeof(kMagic));
  PutU32(header, kCheckpointVersion);
  PutU32(header, 0);  // flags
  PutU64(header, body_len);
  PutU32(header, body_crc);
  PutU32(header, Crc32c(0, header.data(), header.size()));
  std::memcpy(out.data(), header.data(), kHeaderSize);
  return out;
}

absl::StatusOr<ShardCheckpoint> DecodeCheckpoint(const std::string& bytes,
                                                 const std::string& file) {
  auto refuse = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("checkpoint '", file, "': ", why));
  };
  if (bytes.size() < kHeaderSize) {
    return refuse(absl::StrCat("truncated: ", bytes.size(),
                               " bytes, shorter than the ", kHeaderSize,
                               "-byte header"));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return refuse("bad magic (not a Ferry checkpoint)");
  }
  Reader h(bytes.data() + sizeof(kMagic), kHeaderSize - sizeof(kMagic));
  uint32_t version, flags, body_crc, header_crc;
  uint64_t body_len;
  h.U32(version);
  h.U32(flags);
  h.U64(body_len);
  h.U32(body_crc);
  h.U32(header_crc);
  if (Crc32c(0, bytes.data(), kHeaderSize - 4) != header_crc) {
    return refuse("header checksum mismatch");
  }
  if (version != kCheckpointVersion) {
    return refuse(absl::StrCat("unsupported version ", version, " (this build reads ",
                               kCheckpointVersion, ")"));
  }
  if (bytes.size() - kHeaderSize < body_len) {
    return refuse(absl::StrCat("truncated: body has ",
                               bytes.size() - kHeaderSize, " of ", body_len,
                               " bytes"));
  }
  if (bytes.size() - kHeaderSize > body_len) {
    return refuse(absl::StrCat(bytes.size() - kHeaderSize - body_len,
                               " bytes after the body"));
  }
  const char* body = bytes.data() + kHeaderSize;
  const uint32_t crc = Crc32c(0, body, body_len);
  if (crc != body_crc) {
    return refuse(absl::StrCat("body checksum mismatch (CRC32C ", crc,
                               ", header says ", body_crc, ")"));
  }
  Reader r(body, body_len);
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
  if (!r.done()) return Malformed(file, "bytes after the last entry");
  return c;
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
  absl::StatusOr<std::string> bytes = EncodeCheckpoint(checkpoint);
  if (!bytes.ok()) return bytes.status();
  const std::string tmp = absl::StrCat(dir, "/", name, ".tmp");
  const std::string latest = LatestCheckpointPath(dir, name);
  const std::string prev = PreviousCheckpointPath(dir, name);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("creating", tmp);
  absl::Status s = WriteAll(fd, bytes->data(), bytes->size(), tmp);
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
  return static_cast<uint64_t>(bytes->size());
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
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      absl::Status e = ErrnoError("reading checkpoint", path);
      ::close(fd);
      return e;
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  bytes.resize(got);
  return DecodeCheckpoint(bytes, path);
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

bool Checkpointer::MaybeCheckpoint(int64_t step,
                                   absl::FunctionRef<ShardCheckpoint()> copy) {
  if (!Due(step)) return false;
  Submit(copy());
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
    snapshot = ShardCheckpoint();  // Frees the copy outside the lock.
    mu_.Lock();
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
