// A program that never linked the "store" backend: it forms a 2-rank process
// group on it by name, the backend coming from the plugin listed in
// FERRY_C10D_PLUGINS, and all-reduces one tensor.
//
//   FERRY_C10D_PLUGINS=/path/libferry_store_backend.so \
//     ferry_run --nproc 2 -- ./plugin_host
#include <cstdio>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/c10d.h"
#include "ferry/ferry.h"  // ASSIGN_OR_RETURN, RETURN_IF_ERROR

namespace {

absl::Status Run() {
  std::shared_ptr<ferry::c10d::BackendRegistry> registry =
      ferry::c10d::MakeDefaultBackendRegistry();
  if (!registry->IsRegistered("store")) {
    return absl::NotFoundError(absl::StrCat(
        "no \"store\" backend (set FERRY_C10D_PLUGINS to the plugin); "
        "registered: ",
        absl::StrJoin(registry->Names(), ", ")));
  }
  ferry::c10d::InitProcessGroupOptions o;
  o.init_method = "env://";
  o.group.backend = "store";
  o.registry = registry;
  ASSIGN_OR_RETURN(std::shared_ptr<ferry::c10d::ProcessGroup> pg,
                   ferry::c10d::InitProcessGroup(o));
  // Rank r contributes r + 1: the sum over 2 ranks is 3.
  ferry::Tensor t = ferry::full({1}, pg->rank() + 1.0);
  RETURN_IF_ERROR(pg->Allreduce(t)->Wait());
  const double total = t.item();
  if (total != 3.0) {
    return absl::InternalError(absl::StrCat("allreduce gave sum ", total));
  }
  std::printf("plugin_host rank %d: ok (\"store\" backend from the plugin, allreduce)\n",
              pg->rank());
  return absl::OkStatus();
}

}  // namespace

int main() {
  absl::Status s = Run();
  if (!s.ok()) {
    std::fprintf(stderr, "plugin_host: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
