// What the device stage (worker/device_stage.h) adds to a message whose
// tensors are all on the CPU: the staging interceptor's walk when it leaves
// and the landing interceptor's header lookup when it arrives, per message,
// on one thread, for a call's typical payload and a larger one.
//
//   bazel run -c opt //bench/rpc:device_stage_cost -- [messages]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ferry/rpc/message.h"
#include "ferry/tensor/tensor.h"
#include "ferry/worker/device_stage.h"

namespace ferry {
namespace {

int Run(long messages) {
  absl::StatusOr<std::shared_ptr<DeviceStage>> stage =
      DeviceStage::Create("w0", DeviceOptions{}, nullptr);
  if (!stage.ok()) {
    std::fprintf(stderr, "%s\n", stage.status().ToString().c_str());
    return 1;
  }
  rpc::Interceptor send = DeviceStage::SendInterceptor(*stage);
  rpc::Interceptor receive = DeviceStage::ReceiveInterceptor(*stage);
  const rpc::WorkerInfo peer{"w1", 1, ""};
  struct Shape {
    const char* name;
    Value payload;
  };
  Value::List big;
  for (int i = 0; i < 64; ++i) {
    big.push_back(Value::FromTensor(full({4}, 1.0)));
    big.push_back(Value::Int(i));
  }
  const Shape shapes[] = {
      {"2 tensors + int", Value::FromList({Value::FromTensor(full({16}, 1.0)),
                                           Value::FromTensor(full({16}, 2.0)),
                                           Value::Int(3)})},
      {"64 tensors + 64 ints", Value::FromList(big)},
  };
  for (const Shape& shape : shapes) {
    rpc::Message m;
    m.type = rpc::MessageType::kCall;
    m.function = "f";
    m.payload = shape.payload;
    const absl::Time start = absl::Now();
    for (long i = 0; i < messages; ++i) {
      if (!send(rpc::InterceptPoint::kSendRequest, peer, m).ok() ||
          !receive(rpc::InterceptPoint::kReceiveRequest, peer, m).ok()) {
        std::fprintf(stderr, "interceptor failed\n");
        return 1;
      }
    }
    const double ns =
        absl::ToDoubleNanoseconds(absl::Now() - start) / messages;
    std::printf("%-22s %8.1f ns per message (send + receive), %ld messages\n",
                shape.name, ns, messages);
  }
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  const long messages = argc > 1 ? std::atol(argv[1]) : 1000000;
  return ferry::Run(messages > 0 ? messages : 1000000);
}
