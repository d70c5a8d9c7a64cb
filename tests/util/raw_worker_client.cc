#include "ferry/tests/util/raw_worker_client.h"

#include <fstream>
#include <iterator>

namespace ferry::testutil {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

std::unique_ptr<rpc::v1::Worker::Stub> RawWorkerStub(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  return rpc::v1::Worker::NewStub(grpc::CreateChannel(address, credentials));
}

absl::Status RawWorkerCall(
    rpc::v1::Worker::Stub& stub, const rpc::v1::RpcRequest& request,
    const std::vector<std::pair<std::string, std::string>>& metadata,
    absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  for (const auto& [key, value] : metadata) context.AddMetadata(key, value);
  rpc::v1::RpcResponse response;
  grpc::Status s = stub.Call(&context, request, &response);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        s.error_message());
  }
  return absl::Status(static_cast<absl::StatusCode>(response.error_code()),
                      response.error_message());
}

std::shared_ptr<grpc::ChannelCredentials> ClientTlsCredentials(
    const std::string& ca_file, const std::string& cert_file,
    const std::string& key_file) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ReadFile(ca_file);
  o.pem_cert_chain = ReadFile(cert_file);
  o.pem_private_key = ReadFile(key_file);
  return grpc::SslCredentials(o);
}

}  // namespace ferry::testutil
