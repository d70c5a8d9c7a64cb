// The nccl backend as the c10d conformance suite sees it
// (c10d/testing/backend_conformance.h), for nccl_backend_test (ranks as
// threads, one GPU each) and tests/c10d:nccl_test (ranks as processes).
#ifndef FERRY_C10D_NCCL_NCCL_UNDER_TEST_H_
#define FERRY_C10D_NCCL_NCCL_UNDER_TEST_H_

#include "ferry/c10d/testing/backend_conformance.h"

namespace ferry {
namespace c10d {

// Rank r's tensors live on CUDA device r % (devices); groups are capped at
// one rank per device (callers running ranks as processes raise the cap).
// Point to point is left out: the suite's Send/Recv test posts receives out
// of tag order, which NCCL (no tags) cannot match; the nccl tests cover
// Send/Recv in issue order.
BackendUnderTest NcclUnderTest();

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_NCCL_NCCL_UNDER_TEST_H_
