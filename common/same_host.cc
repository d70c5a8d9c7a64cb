#include "ferry/common/same_host.h"

#include <sys/stat.h>

#include <fstream>

#include "absl/strings/str_cat.h"

namespace ferry {

std::string HostIdentity() {
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  struct stat shm {
  }, net{};
  if (boot.empty() || ::stat("/dev/shm", &shm) != 0 ||
      ::stat("/proc/self/ns/net", &net) != 0) {
    return "";
  }
  return absl::StrCat(boot, "/", shm.st_dev, ":", shm.st_ino,
                      "/net:", net.st_ino);
}

bool ProcessAlive(int64_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return true;
  const char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

}  // namespace ferry
