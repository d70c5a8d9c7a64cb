// A worker process for the multi-process TCPStore test: joins the store as
// one rank of --world_size (PyTorch's init/ accounting), runs --rounds of the
// store-based barrier (add + wait on a last-worker key, as
// torch.distributed's store_based_barrier), publishes its rank and reads
// every other rank's. Exits 0 on success, 1 with the error on stderr.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "ferry/store/tcp_store.h"

ABSL_FLAG(int, port, 0, "Store port on 127.0.0.1.");
ABSL_FLAG(int, rank, 1, "This worker's rank (1..world_size-1).");
ABSL_FLAG(int, world_size, 2, "Handles joining, including the server's.");
ABSL_FLAG(int, rounds, 3, "Barrier rounds.");
ABSL_FLAG(bool, legacy, false, "Speak the PyTorch 1.13 protocol.");

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "worker: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int world = absl::GetFlag(FLAGS_world_size);
  const int rank = absl::GetFlag(FLAGS_rank);
  ferry::TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = absl::GetFlag(FLAGS_port);
  o.world_size = world;
  o.timeout = absl::Seconds(60);
  o.legacy_protocol = absl::GetFlag(FLAGS_legacy);
  auto store = ferry::TcpStore::Create(o);
  if (!store.ok()) return Fail(store.status());
  ferry::Store& s = **store;
  if (auto st = s.Set(absl::StrCat("rank/", rank), absl::StrCat(rank * 10));
      !st.ok()) {
    return Fail(st);
  }
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    auto n = s.Add(absl::StrCat("barrier/", r), 1);
    if (!n.ok()) return Fail(n.status());
    if (*n == world) {
      if (auto st = s.Set(absl::StrCat("barrier/", r, "/last"), "1");
          !st.ok()) {
        return Fail(st);
      }
    }
    if (auto st = s.Wait({absl::StrCat("barrier/", r, "/last")}); !st.ok()) {
      return Fail(st);
    }
  }
  for (int peer = 0; peer < world; ++peer) {
    auto v = s.Get(absl::StrCat("rank/", peer));
    if (!v.ok()) return Fail(v.status());
    if (*v != absl::StrCat(peer * 10)) {
      return Fail(absl::InternalError(absl::StrCat("rank/", peer, " = ", *v)));
    }
  }
  return 0;
}
