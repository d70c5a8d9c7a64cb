// One process of the c10d conformance suite on the "mpi" backend: started by
// mpi_test.cc through `mpirun -np N`. Every process runs the whole suite as
// its MPI world rank (BackendUnderTest::process_rank); groups meet through
// the TCPStore the test hosts at 127.0.0.1:$FERRY_TEST_STORE_PORT. Exits
// non-zero when any test fails in this process.
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/strings/numbers.h"
#include "ferry/c10d/mpi/mpi_backend.h"
#include "ferry/c10d/testing/backend_conformance.h"
#include "ferry/common/status.h"
#include "gtest/gtest.h"
#include "ferry/store/tcp_store.h"

namespace ferry {
namespace c10d {
namespace {

BackendUnderTest g_mpi;

BackendUnderTest MpiUnderTest(int rank, int size, std::shared_ptr<Store> s) {
  BackendUnderTest b;
  b.name = "Mpi";
  b.create =
      [](std::shared_ptr<Store> store, int r, int n,
         absl::Duration timeout) -> absl::StatusOr<std::unique_ptr<Backend>> {
    ASSIGN_OR_RETURN(auto mpi, MpiBackend::Create(store, r, n, timeout));
    return std::unique_ptr<Backend>(std::move(mpi));
  };
  b.max_ranks = [size] { return size; };
  b.ops.insert(b.ops.end(),
               {OpType::kAllgatherIntoTensor, OpType::kReduceScatterTensor,
                OpType::kAlltoallSingle, OpType::kRecvAnysource,
                OpType::kMonitoredBarrier});
  b.process_rank = rank;
  b.process_count = size;
  b.shared_store = std::move(s);
  return b;
}

INSTANTIATE_TEST_SUITE_P(Mpi, BackendConformanceTest, ::testing::Values(g_mpi),
                         BackendUnderTestName);

int Main(int argc, char** argv) {
  absl::StatusOr<std::pair<int, int>> world = MpiBackend::WorldRankAndSize();
  if (!world.ok()) {
    std::fprintf(stderr, "MPI: %s\n", world.status().ToString().c_str());
    return 1;
  }
  const char* port_env = std::getenv("FERRY_TEST_STORE_PORT");
  int port = 0;
  if (port_env == nullptr || !absl::SimpleAtoi(port_env, &port)) {
    std::fprintf(stderr, "FERRY_TEST_STORE_PORT is not set\n");
    return 2;
  }
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout = absl::Seconds(60);
  auto store = TcpStore::Create(o);
  if (!store.ok()) {
    std::fprintf(stderr, "store: %s\n", store.status().ToString().c_str());
    return 1;
  }
  g_mpi = MpiUnderTest(world->first, world->second,
                       std::shared_ptr<Store>(std::move(*store)));
  // The generator above reads g_mpi when InitGoogleTest registers tests.
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace
}  // namespace c10d
}  // namespace ferry

int main(int argc, char** argv) { return ferry::c10d::Main(argc, argv); }
