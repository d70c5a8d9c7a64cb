// A client of a worker's gRPC service that is not a worker: the stub
// generated from proto/rpc.proto, for tests that send what a stranger would
// (spoofed callers, crafted descriptors).
#ifndef FERRY_TESTS_UTIL_RAW_WORKER_CLIENT_H_
#define FERRY_TESTS_UTIL_RAW_WORKER_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ferry/proto/rpc.grpc.pb.h"

namespace ferry::testutil {

// A stub for `address` over `credentials`.
std::unique_ptr<rpc::v1::Worker::Stub> RawWorkerStub(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials =
        grpc::InsecureChannelCredentials());

// Sends `request` with `metadata`; the call's outcome as one status: gRPC's,
// or the handler error the reply carries.
absl::Status RawWorkerCall(
    rpc::v1::Worker::Stub& stub, const rpc::v1::RpcRequest& request,
    const std::vector<std::pair<std::string, std::string>>& metadata = {},
    absl::Duration timeout = absl::Seconds(30));

// TLS credentials from PEM files (a CA bundle, a client certificate and its
// key).
std::shared_ptr<grpc::ChannelCredentials> ClientTlsCredentials(
    const std::string& ca_file, const std::string& cert_file,
    const std::string& key_file);

}  // namespace ferry::testutil

#endif  // FERRY_TESTS_UTIL_RAW_WORKER_CLIENT_H_
