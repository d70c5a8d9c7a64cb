// init_method addressing, as in torch.distributed.init_process_group:
//
//   tcp://host:port[?rank=R&world_size=W]   a TCPStore; rank 0 serves it
//   tcp://[::1]:port                         (IPv6 literal in brackets)
//   file:///abs/path[?rank=R&world_size=W]  a FileStore on that file
//   env://[?rank=R&world_size=W]            MASTER_ADDR and MASTER_PORT
//                                           (required), RANK and WORLD_SIZE
//                                           (optional) from the environment
//
// env:// also understands the variables of existing launchers, used only
// when RANK and WORLD_SIZE are both absent (first match wins):
//   OpenMPI (mpirun):  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//                      OMPI_COMM_WORLD_LOCAL_RANK
//   Slurm (srun):      SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS),
//                      SLURM_LOCALID; without MASTER_ADDR the store host is
//                      the first host of SLURM_STEP_NODELIST (else
//                      SLURM_JOB_NODELIST), bracket ranges expanded
//                      ("node[03-05,9]" -> "node03").
// MASTER_PORT is always required. The source is recorded in
// InitMethod::env_source and logged (INFO).
//
// Query parameters take precedence over RANK/WORLD_SIZE. The environment is
// read through an EnvLookup so tests (and embedders) can supply their own.
// CreateStore turns a parsed InitMethod into a Store. The TCP case goes
// through a TcpStoreFactory the caller provides in StoreFactories (TCPStore
// lives in its own library; no global registry, so several jobs can live in
// one process with different factories); docs/guide/store.md has an example.
//
// Thread safety: the functions are stateless; ParseInitMethod with the
// default lookup reads the process environment (getenv).
#ifndef FERRY_STORE_INIT_METHOD_H_
#define FERRY_STORE_INIT_METHOD_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/common/env.h"
#include "ferry/store/store.h"

namespace ferry {

// A parsed init_method URL (ParseInitMethod).
struct InitMethod {
  // tcp://, file://, env://.
  enum class Scheme { kTcp, kFile, kEnv };

  Scheme scheme = Scheme::kTcp;  // The URL's scheme.
  // kTcp and kEnv: the server's host (brackets removed from IPv6 literals)
  // and port (0..65535; 0 lets a server pick a free port).
  std::string host;
  int port = 0;  // See host.
  // kFile: the absolute path of the store file.
  std::string path;
  // From the query string or RANK / WORLD_SIZE when present.
  std::optional<int> rank;
  std::optional<int> world_size;  // See rank.
  // env://: the rank within this host, when the launcher gives one
  // (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID).
  std::optional<int> local_rank;
  // env://: where rank / world size / host came from, e.g. "RANK/WORLD_SIZE",
  // "OpenMPI", "Slurm"; empty when the environment gave no rank.
  std::string env_source;

  // The canonical URL ("tcp://host:port", "file:///path", "env://").
  std::string ToString() const;
};

// Parses `url`. InvalidArgument (naming the URL and the problem: unknown
// scheme, missing or bad port, relative path, unknown query parameter,
// missing MASTER_ADDR/MASTER_PORT, non-numeric RANK...) on malformed input.
absl::StatusOr<InitMethod> ParseInitMethod(absl::string_view url,
                                           const EnvLookup& env = GetEnv);

// The first host of a Slurm host list ("gpu[07-09,12],cpu1" -> "gpu07").
// InvalidArgument naming the list when it is empty or malformed.
absl::StatusOr<std::string> FirstSlurmHost(absl::string_view nodelist);

// Makes a TCPStore client for host:port; when `is_server` it also serves the
// store (on `port`, 0 picking a free one) and waits for `world_size`
// clients. `timeout` bounds connecting and is the store's default timeout.
using TcpStoreFactory = std::function<absl::StatusOr<std::unique_ptr<Store>>(
    const std::string& host, int port, bool is_server, int world_size,
    absl::Duration timeout)>;

// The constructors CreateStore may call for schemes whose implementation is
// not linked into this library.
struct StoreFactories {
  TcpStoreFactory tcp;  // tcp://, env://; null: FailedPrecondition.
};

// Creates the store `method` names, for process `rank` of `world_size`.
// `rank` / `world_size` < 0 take the values from `method` (which must then
// have them); when both are given they must agree. file:// opens a
// FileStore; tcp:// and env:// call factories.tcp with is_server = (rank ==
// 0), FailedPrecondition when it is not set. The store's default timeout is
// set to `timeout`. InvalidArgument for a rank outside [0, world_size).
absl::StatusOr<std::unique_ptr<Store>> CreateStore(
    const InitMethod& method, int rank, int world_size, absl::Duration timeout,
    const StoreFactories& factories = {});

// ferry_run's restart generations. Under ferry_run (FERRY_USE_AGENT_STORE=1
// and `FERRY_RUN_GENERATION=<g>`), each attempt of the job gets its own key
// namespace `ferry_run/attempt_<g>/...` in the launcher's store, so keys of an
// earlier attempt never satisfy this attempt's waits. A worker whose
// generation is older than the job's ("ferry_run/generation", set by the
// launchers) is refused with FailedPrecondition naming both generations.
// Without FERRY_RUN_GENERATION `store` is returned unchanged; InvalidArgument
// when it is not a non-negative integer.
absl::StatusOr<std::unique_ptr<Store>> ScopeToLauncherGeneration(
    std::unique_ptr<Store> store, const EnvLookup& env = GetEnv);

// The PrefixStore prefix of attempt `generation` ("ferry_run/attempt_<g>").
std::string LauncherAttemptPrefix(int generation);

}  // namespace ferry

#endif  // FERRY_STORE_INIT_METHOD_H_
