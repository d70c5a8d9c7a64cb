// A throwaway public-key infrastructure for TLS tests, made at test time
// with the openssl command-line tool (nothing secret is committed).
//
//   ASSIGN_OR_RETURN(TestPki pki, MakeTestPki(testing::TempDir() + "/pki"));
//
// Two CAs: `ca` (trusted by the workers under test) and `rogue_ca` (trusted
// by nobody). Leaf certificates carry SAN IP:127.0.0.1 and DNS:localhost and
// are valid for client and server use. Keys are P-256 (fast to make).
#ifndef FERRY_TESTS_UTIL_TEST_PKI_H_
#define FERRY_TESTS_UTIL_TEST_PKI_H_

#include <string>

#include "absl/status/statusor.h"

namespace ferry::testutil {

struct TestIdentity {
  std::string cert;  // PEM file paths
  std::string key;
};

struct TestPki {
  std::string ca;        // CA certificate (PEM file)
  std::string rogue_ca;  // another CA's certificate
  TestIdentity alice;    // signed by `ca`
  TestIdentity bob;      // signed by `ca`
  TestIdentity rogue;    // signed by `rogue_ca`, same names as alice
};

// Creates `dir` and the files in it. Unavailable when openssl is missing or
// fails (its output in the message).
absl::StatusOr<TestPki> MakeTestPki(const std::string& dir);

// A certificate signed by `ca` of the TestPki made in `dir` that names
// worker `worker` (SAN DNS:<worker>, besides the usual names; CN
// worker_<worker>), as a job's certificates name its workers.
absl::StatusOr<TestIdentity> MakeWorkerIdentity(const std::string& dir,
                                                const std::string& worker);

}  // namespace ferry::testutil

#endif  // FERRY_TESTS_UTIL_TEST_PKI_H_
