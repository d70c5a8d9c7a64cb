#include "ferry/store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"
#include "ferry/store/store_util.h"

namespace ferry {
namespace {

// File layout: kMagic, then records. A record is a type byte, a 32-bit
// little-endian key length, the key, a 32-bit value length, the value.
constexpr absl::string_view kMagic = "FERRYFS1";
constexpr size_t kRecordHeader = 1 + 4;
constexpr uint64_t kMaxField = 0xffffffffu;
constexpr int kAttachAttempts = 100;
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(1);
constexpr absl::Duration kMaxBackoff = absl::Milliseconds(10);

enum RecordType : uint8_t {
  kSet = 1,
  kAppend = 2,
  kDelete = 3,
  kPush = 4,
  kPop = 5,
  kJoin = 6,   // a user joined: live + 1, joined + 1
  kRef = 7,    // a clone: live + 1
  kLeave = 8,  // a handle closed: live - 1
};

void PutField(std::string* out, absl::string_view field) {
  char len[4];
  absl::little_endian::Store32(len, static_cast<uint32_t>(field.size()));
  out->append(len, 4);
  out->append(field.data(), field.size());
}

void PutRecord(std::string* out, RecordType type, absl::string_view key,
               absl::string_view value = {}) {
  out->push_back(static_cast<char>(type));
  PutField(out, key);
  PutField(out, value);
}

absl::Status ErrnoError(int err, absl::string_view what,
                        absl::string_view path) {
  std::string message =
      absl::StrCat("FileStore ", what, " file://", path, ": ", strerror(err));
  switch (err) {
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::UnavailableError(message);
  }
}

// Holds flock(2) on an fd for its lifetime.
class FileLock {
 public:
  static absl::StatusOr<FileLock> Acquire(int fd, bool exclusive,
                                          absl::string_view path) {
    while (flock(fd, exclusive ? LOCK_EX : LOCK_SH) != 0) {
      if (errno != EINTR) return ErrnoError(errno, "cannot lock", path);
    }
    return FileLock(fd);
  }
  FileLock(FileLock&& other) : fd_(std::exchange(other.fd_, -1)) {}
  FileLock& operator=(FileLock&&) = delete;
  ~FileLock() {
    if (fd_ >= 0) flock(fd_, LOCK_UN);
  }

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

absl::Status WriteAll(int fd, absl::string_view data, int64_t offset,
                      absl::string_view path) {
  while (!data.empty()) {
    ssize_t n = pwrite(fd, data.data(), data.size(), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot write", path);
    }
    data.remove_prefix(n);
    offset += n;
  }
  return absl::OkStatus();
}

}  // namespace

FileStore::FileStore(std::string path, int world_size)
    : path_(std::move(path)),
      name_(absl::StrCat("file://", path_)),
      world_size_(world_size) {}

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Open(std::string path,
                                                           int world_size) {
  if (path.empty()) {
    return absl::InvalidArgumentError("FileStore::Open: empty path");
  }
  auto store =
      std::unique_ptr<FileStore>(new FileStore(std::move(path), world_size));
  RETURN_IF_ERROR(store->Attach(/*join=*/true));
  return store;
}

absl::Status FileStore::Attach(bool join) {
  MutexLock lock(&mu_);
  for (int attempt = 0; attempt < kAttachAttempts; ++attempt) {
    int fd = open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError(errno, "cannot open", path_);
    // Returns false when the file was replaced before we locked it.
    auto attach =
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<bool> {
      ASSIGN_OR_RETURN(FileLock file_lock,
                       FileLock::Acquire(fd, /*exclusive=*/true, path_));
      // The last user of a previous generation may have removed the file
      // between our open and lock: then start over on the new file.
      struct stat by_fd, by_path;
      if (fstat(fd, &by_fd) != 0)
        return ErrnoError(errno, "cannot stat", path_);
      if (stat(path_.c_str(), &by_path) != 0 ||
          by_path.st_ino != by_fd.st_ino || by_path.st_dev != by_fd.st_dev) {
        return false;
      }
      fd_ = fd;
      offset_ = 0;
      if (by_fd.st_size == 0) {
        RETURN_IF_ERROR(WriteAll(fd_, kMagic, 0, path_));
      }
      RETURN_IF_ERROR(CatchUpLocked());
      std::string record;
      PutRecord(&record, join ? kJoin : kRef, "", absl::StrCat(world_size_));
      RETURN_IF_ERROR(AppendLocked(record));
      return true;
    };
    absl::StatusOr<bool> attached = attach();
    if (attached.ok() && *attached) return absl::OkStatus();
    close(fd);
    fd_ = -1;
    if (!attached.ok()) return attached.status();
  }
  return absl::UnavailableError(
      absl::StrCat("FileStore cannot attach to ", name_,
                   ": the file was "
                   "replaced ",
                   kAttachAttempts, " times while opening"));
}

FileStore::~FileStore() {
  MutexLock lock(&mu_);
  if (fd_ < 0) return;
  {
    absl::StatusOr<FileLock> file_lock =
        FileLock::Acquire(fd_, /*exclusive=*/true, path_);
    absl::Status status = file_lock.status();
    if (status.ok()) status = CatchUpLocked();
    if (status.ok()) {
      std::string record;
      PutRecord(&record, kLeave, "");
      status = AppendLocked(record);
    }
    if (status.ok() && live_ <= 0 &&
        (world_size_ <= 0 || joined_ >= world_size_)) {
      // Removed while still locked, so a process that opened the file but
      // has not locked it yet notices (Attach compares inodes).
      if (unlink(path_.c_str()) != 0 && errno != ENOENT) {
        status = ErrnoError(errno, "cannot remove", path_);
      }
    }
    if (!status.ok()) {
      FERRY_LOG(WARNING) << "FileStore " << name_
                         << ": leaving failed: " << status;
    }
  }
  close(fd_);
  fd_ = -1;
}

std::string FileStore::Describe() const { return name_; }

absl::Status FileStore::CatchUpLocked() {
  struct stat st;
  if (fstat(fd_, &st) != 0) return ErrnoError(errno, "cannot stat", path_);
  if (st.st_size < offset_) {
    return absl::DataLossError(absl::StrCat(name_, ": the log shrank from ",
                                            offset_, " to ", st.st_size,
                                            " bytes; it is not append-only"));
  }
  if (st.st_size == offset_) return absl::OkStatus();
  std::string buffer(st.st_size - offset_, '\0');
  size_t got = 0;
  while (got < buffer.size()) {
    ssize_t n =
        pread(fd_, buffer.data() + got, buffer.size() - got, offset_ + got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read", path_);
    }
    if (n == 0) break;
    got += n;
  }
  buffer.resize(got);
  absl::string_view bytes = buffer;
  if (offset_ == 0) {
    if (bytes.size() < kMagic.size() ||
        bytes.substr(0, kMagic.size()) != kMagic) {
      return absl::DataLossError(
          absl::StrCat(name_, " is not a FileStore log (bad header)"));
    }
    bytes.remove_prefix(kMagic.size());
    offset_ = kMagic.size();
  }
  size_t consumed = 0;
  absl::Status status = ApplyLocked(bytes, offset_, &consumed);
  offset_ += consumed;
  return status;
}

absl::Status FileStore::ApplyLocked(absl::string_view bytes,
                                    int64_t base_offset, size_t* consumed) {
  *consumed = 0;
  while (*consumed < bytes.size()) {
    absl::string_view rest = bytes.substr(*consumed);
    absl::string_view fields[2];
    size_t pos = 1;
    bool complete = rest.size() >= kRecordHeader;
    for (int i = 0; complete && i < 2; ++i) {
      if (rest.size() - pos < 4) {
        complete = false;
        break;
      }
      uint64_t len = absl::little_endian::Load32(rest.data() + pos);
      pos += 4;
      if (rest.size() - pos < len) {
        complete = false;
        break;
      }
      fields[i] = rest.substr(pos, len);
      pos += len;
    }
    if (!complete) {
      // Writers append whole records under the exclusive lock, so a partial
      // record means a writer died mid-write or someone else wrote the file.
      return absl::DataLossError(absl::StrCat(
          name_, ": truncated record at offset ", base_offset + *consumed));
    }
    const std::string key(fields[0]);
    switch (static_cast<uint8_t>(rest[0])) {
      case kSet:
        kv_[key] = std::string(fields[1]);
        break;
      case kAppend:
        absl::StrAppend(&kv_[key], fields[1]);
        break;
      case kDelete:
        kv_.erase(key);
        break;
      case kPush:
        queues_[key].emplace_back(fields[1]);
        break;
      case kPop: {
        auto it = queues_.find(key);
        if (it != queues_.end()) {
          it->second.pop_front();
          if (it->second.empty()) queues_.erase(it);
        }
        break;
      }
      case kJoin:
        ++live_;
        ++joined_;
        break;
      case kRef:
        ++live_;
        break;
      case kLeave:
        --live_;
        break;
      default:
        return absl::DataLossError(
            absl::StrCat(name_, ": unknown record type ",
                         static_cast<int>(static_cast<uint8_t>(rest[0])),
                         " at offset ", base_offset + *consumed));
    }
    *consumed += pos;
  }
  return absl::OkStatus();
}

absl::Status FileStore::AppendLocked(absl::string_view records) {
  RETURN_IF_ERROR(WriteAll(fd_, records, offset_, path_));
  size_t consumed = 0;
  absl::Status status = ApplyLocked(records, offset_, &consumed);
  offset_ += records.size();
  return status;
}

absl::StatusOr<bool> FileStore::RunLocked(LockMode mode, const Attempt& fn) {
  MutexLock lock(&mu_);
  if (fd_ < 0) return absl::FailedPreconditionError(name_ + " is closed");
  ASSIGN_OR_RETURN(FileLock file_lock,
                   FileLock::Acquire(fd_, mode == LockMode::kExclusive, path_));
  RETURN_IF_ERROR(CatchUpLocked());
  std::vector<std::string> missing;
  return fn(&missing);
}

absl::Status FileStore::Poll(absl::string_view op, LockMode mode,
                             absl::Duration timeout, const Attempt& fn) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  absl::Duration backoff = kFirstBackoff;
  bool counted = false;  // in blocked_
  absl::Cleanup uncount = [&] {
    if (counted) blocked_.fetch_sub(1, std::memory_order_relaxed);
  };
  while (true) {
    std::vector<std::string> missing;
    {
      MutexLock lock(&mu_);
      if (fd_ < 0) return absl::FailedPreconditionError(name_ + " is closed");
      ASSIGN_OR_RETURN(
          FileLock file_lock,
          FileLock::Acquire(fd_, mode == LockMode::kExclusive, path_));
      RETURN_IF_ERROR(CatchUpLocked());
      ASSIGN_OR_RETURN(bool done, fn(&missing));
      if (done) return absl::OkStatus();
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return StoreTimeoutError(name_, op, missing, now - start, timeout);
    }
    if (!counted) {
      counted = true;
      blocked_.fetch_add(1, std::memory_order_relaxed);
    }
    absl::SleepFor(std::min(backoff, deadline - now));  // Polling the file.
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

namespace {

absl::Status CheckFieldSize(absl::string_view store, absl::string_view what,
                            absl::string_view field) {
  if (field.size() > kMaxField) {
    return absl::InvalidArgumentError(
        absl::StrCat(store, ": ", what, " of ", field.size(),
                     " bytes exceeds the FileStore limit of ", kMaxField));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FileStore::Set(absl::string_view key, absl::string_view value) {
  RETURN_IF_ERROR(CheckFieldSize(name_, "key", key));
  RETURN_IF_ERROR(CheckFieldSize(name_, "value", value));
  std::string record;
  PutRecord(&record, kSet, key, value);
  return RunLocked(LockMode::kExclusive,
                   [&](std::vector<std::string>*)
                       ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
                         RETURN_IF_ERROR(AppendLocked(record));
                         return true;
                       })
      .status();
}

absl::StatusOr<std::string> FileStore::Get(absl::string_view key) {
  std::string value;
  RETURN_IF_ERROR(
      Poll("Get", LockMode::kShared, Timeout(),
           [&](std::vector<std::string>* missing)
               ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
                 auto it = kv_.find(key);
                 if (it == kv_.end()) {
                   missing->emplace_back(key);
                   return false;
                 }
                 value = it->second;
                 return true;
               }));
  return value;
}

absl::StatusOr<int64_t> FileStore::Add(absl::string_view key, int64_t delta) {
  int64_t sum = 0;
  RETURN_IF_ERROR(
      RunLocked(LockMode::kExclusive,
                [&](std::vector<std::string>*)
                    ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
                      auto it = kv_.find(key);
                      ASSIGN_OR_RETURN(
                          sum,
                          AddToDecimal(name_, key,
                                       it == kv_.end() ? nullptr : &it->second,
                                       delta));
                      std::string record;
                      PutRecord(&record, kSet, key, absl::StrCat(sum));
                      RETURN_IF_ERROR(AppendLocked(record));
                      return true;
                    })
          .status());
  return sum;
}

absl::StatusOr<std::string> FileStore::CompareSet(absl::string_view key,
                                                  absl::string_view expected,
                                                  absl::string_view desired) {
  RETURN_IF_ERROR(CheckFieldSize(name_, "value", desired));
  std::string result;
  RETURN_IF_ERROR(
      RunLocked(LockMode::kExclusive,
                [&](std::vector<std::string>*)
                    ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
                      auto it = kv_.find(key);
                      bool store_desired = false;
                      result = CompareSetResult(
                          it == kv_.end() ? nullptr : &it->second, expected,
                          desired, &store_desired);
                      if (store_desired) {
                        std::string record;
                        PutRecord(&record, kSet, key, desired);
                        RETURN_IF_ERROR(AppendLocked(record));
                      }
                      return true;
                    })
          .status());
  return result;
}

absl::StatusOr<bool> FileStore::Check(absl::Span<const std::string> keys) {
  bool all = true;
  RETURN_IF_ERROR(
      RunLocked(LockMode::kShared,
                [&](std::vector<std::string>*)
                    ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
                      for (const std::string& key : keys) {
                        if (!kv_.contains(key)) all = false;
                      }
                      return true;
                    })
          .status());
  return all;
}

absl::Status FileStore::Wait(absl::Span<const std::string> keys,
                             std::optional<absl::Duration> timeout) {
  return Poll("Wait", LockMode::kShared, timeout.value_or(Timeout()),
              [&](std::vector<std::string>* missing)
                  ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
                    for (const std::string& key : keys) {
                      if (!kv_.contains(key)) missing->push_back(key);
                    }
                    return missing->empty();
                  });
}

absl::StatusOr<bool> FileStore::DeleteKey(absl::string_view key) {
  bool existed = false;
  RETURN_IF_ERROR(
      RunLocked(LockMode::kExclusive,
                [&](std::vector<std::string>*)
                    ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
                      existed = kv_.contains(key);
                      if (existed) {
                        std::string record;
                        PutRecord(&record, kDelete, key);
                        RETURN_IF_ERROR(AppendLocked(record));
                      }
                      return true;
                    })
          .status());
  return existed;
}

absl::StatusOr<int64_t> FileStore::NumKeys() {
  int64_t n = 0;
  RETURN_IF_ERROR(
      RunLocked(LockMode::kShared,
                [&](std::vector<std::string>*)
                    ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
                      n = static_cast<int64_t>(kv_.size());
                      return true;
                    })
          .status());
  return n;
}

absl::StatusOr<std::vector<std::string>> FileStore::MultiGet(
    absl::Span<const std::string> keys) {
  std::vector<std::string> values;
  RETURN_IF_ERROR(
      Poll("MultiGet", LockMode::kShared, Timeout(),
           [&](std::vector<std::string>* missing)
               ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
                 for (const std::string& key : keys) {
                   if (!kv_.contains(key)) missing->push_back(key);
                 }
                 if (!missing->empty()) return false;
                 values.clear();
                 for (const std::string& key : keys) {
                   values.push_back(kv_.find(key)->second);
                 }
                 return true;
               }));
  return values;
}

absl::Status FileStore::MultiSet(absl::Span<const std::string> keys,
                                 absl::Span<const std::string> values) {
  if (keys.size() != values.size()) {
    return MultiSetLengthError(name_, keys.size(), values.size());
  }
  std::string records;
  for (size_t i = 0; i < keys.size(); ++i) {
    RETURN_IF_ERROR(CheckFieldSize(name_, "key", keys[i]));
    RETURN_IF_ERROR(CheckFieldSize(name_, "value", values[i]));
    PutRecord(&records, kSet, keys[i], values[i]);
  }
  if (records.empty()) return absl::OkStatus();
  return RunLocked(LockMode::kExclusive,
                   [&](std::vector<std::string>*)
                       ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
                         RETURN_IF_ERROR(AppendLocked(records));
                         return true;
                       })
      .status();
}

absl::Status FileStore::Append(absl::string_view key, absl::string_view value) {
  RETURN_IF_ERROR(CheckFieldSize(name_, "key", key));
  RETURN_IF_ERROR(CheckFieldSize(name_, "value", value));
  std::string record;
  PutRecord(&record, kAppend, key, value);
  return RunLocked(LockMode::kExclusive,
                   [&](std::vector<std::string>*)
                       ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
                         RETURN_IF_ERROR(AppendLocked(record));
                         return true;
                       })
      .status();
}

absl::Status FileStore::QueuePush(absl::string_view key,
                                  absl::string_view value) {
  RETURN_IF_ERROR(CheckFieldSize(name_, "key", key));
  RETURN_IF_ERROR(CheckFieldSize(name_, "value", value));
  std::string record;
  PutRecord(&record, kPush, key, value);
  return RunLocked(LockMode::kExclusive,
                   [&](std::vector<std::string>*)
                       ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
                         RETURN_IF_ERROR(AppendLocked(record));
                         return true;
                       })
      .status();
}

absl::StatusOr<std::string> FileStore::QueuePop(
    absl::string_view key, bool block, std::optional<absl::Duration> timeout) {
  std::string value;
  bool found = false;
  Attempt pop = [&](std::vector<std::string>* missing)
                    ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
    auto it = queues_.find(key);
    if (it == queues_.end()) {
      missing->emplace_back(key);
      return false;
    }
    value = it->second.front();
    std::string record;
    PutRecord(&record, kPop, key);
    RETURN_IF_ERROR(AppendLocked(record));
    found = true;
    return true;
  };
  if (block) {
    RETURN_IF_ERROR(Poll("QueuePop", LockMode::kExclusive,
                         timeout.value_or(Timeout()), pop));
  } else {
    RETURN_IF_ERROR(RunLocked(LockMode::kExclusive, pop).status());
    if (!found) return QueueEmptyError(name_, key);
  }
  return value;
}

absl::StatusOr<int64_t> FileStore::QueueLen(absl::string_view key) {
  int64_t n = 0;
  RETURN_IF_ERROR(
      RunLocked(LockMode::kShared,
                [&](std::vector<std::string>*)
                    ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<bool> {
                      auto it = queues_.find(key);
                      if (it != queues_.end()) {
                        n = static_cast<int64_t>(it->second.size());
                      }
                      return true;
                    })
          .status());
  return n;
}

absl::StatusOr<std::unique_ptr<Store>> FileStore::Clone() {
  auto clone = std::unique_ptr<FileStore>(new FileStore(path_, world_size_));
  RETURN_IF_ERROR(clone->Attach(/*join=*/false));
  clone->SetTimeout(Timeout());
  return clone;
}

}  // namespace ferry
