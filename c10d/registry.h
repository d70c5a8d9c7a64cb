// BackendRegistry: backends by name, the C++ counterpart of
// torch.distributed.Backend.register_backend.
//
//   BackendRegistry registry;
//   RETURN_IF_ERROR(registry.RegisterBackend(
//       "mine", [](const BackendConfig& c) ->
//       absl::StatusOr<std::unique_ptr<Backend>> {
//         return std::make_unique<MyBackend>(c.store, c.rank, c.size,
//         c.timeout);
//       }));
//   ASSIGN_OR_RETURN(auto pg, ProcessGroup::Create(store, rank, size, "mine",
//                                                  registry));
//
// A registry is an ordinary object: several can coexist (tests make their
// own). MakeDefaultBackendRegistry() (//c10d:default_registry) returns a new
// one with "gloo", "shm", "auto" (and "nccl" where CUDA is built)
// registered.
//
// Thread safety: all methods are safe from any thread. Factories run on the
// caller's thread, without the registry's lock held.
#ifndef FERRY_C10D_REGISTRY_H_
#define FERRY_C10D_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/c10d/backend.h"
#include "ferry/common/sync.h"
#include "ferry/store/store.h"
#include "ferry/tensor/storage.h"

namespace ferry {
namespace c10d {

// What a factory receives.
struct BackendConfig {
  // A store namespace private to this backend instance (already prefixed);
  // the backend may keep it.
  std::shared_ptr<Store> store;
  int rank = 0;  // This process's rank.
  int size = 1;  // The group's size.
  // Default timeout for rendezvous and operations.
  absl::Duration timeout = absl::Minutes(30);
  // Free-form, backend-specific settings (e.g. gloo's "hostname").
  std::map<std::string, std::string> options;
  // The host the group's store was reached at, when known: a backend that
  // listens for peers picks the local address routing toward it (peers
  // reach the store, so they can reach that address). Empty: unknown.
  std::string rendezvous_host;
};

// Makes one backend instance for a process group.
using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<Backend>>(
    const BackendConfig&)>;

// Backend factories by name: what process groups are built from.
class BackendRegistry {
 public:
  BackendRegistry();
  ~BackendRegistry();

  BackendRegistry(const BackendRegistry&) = delete;
  BackendRegistry& operator=(const BackendRegistry&) = delete;

  // Registers `factory` under `name` for the device types it serves (used
  // when a process group spec names only the backend). InvalidArgument for
  // an empty name, one containing ':' or ',' or whitespace, a null factory
  // or no devices; AlreadyExists when the name is taken.
  absl::Status RegisterBackend(std::string name, BackendFactory factory,
                               std::vector<DeviceType> devices = {
                                   DeviceType::kCPU});

  // Whether `name` has a factory.
  bool IsRegistered(absl::string_view name) const;
  // Registered names, sorted.
  std::vector<std::string> Names() const;
  // The device types `name` serves; NotFound as for Create.
  absl::StatusOr<std::vector<DeviceType>> Devices(absl::string_view name) const;

  // Runs the factory registered as `name`. NotFound "unknown backend 'x';
  // registered backends: gloo, nccl" when there is none; the factory's own
  // error (annotated with the name) when it fails; Internal if it returns
  // null or a backend whose rank/size differ from the config.
  absl::StatusOr<std::unique_ptr<Backend>> Create(
      absl::string_view name, const BackendConfig& config) const;

 private:
  struct Entry {
    BackendFactory factory;
    std::vector<DeviceType> devices;
  };
  absl::Status UnknownLocked(absl::string_view name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  std::map<std::string, Entry, std::less<>> entries_ ABSL_GUARDED_BY(mu_);
};

// "cpu" / "cuda".
absl::string_view DeviceTypeName(DeviceType type);

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_REGISTRY_H_
