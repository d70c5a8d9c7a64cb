// DeviceLanding (worker/device_landing.h) driven directly, as the stream
// receiver drives it, over FakeDeviceApi memory: chunks are queued as their
// bytes arrive, Adopt hands over exactly the tensor that was pipelined, and
// headers, metadata and extents that are wrong or hostile pipeline nothing
// (LandIn, which checks everything, then reports them) and crash nothing.
#include "ferry/worker/device_landing.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ferry/rpc/device_map.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/cuda/pinned_allocator.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tensor/wire.h"
#include "ferry/worker/device_header.h"
#include "ferry/worker/device_testing.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

constexpr uint64_t kChunk = DeviceLanding::kChunkBytes;

struct Fixture {
  std::shared_ptr<cuda::FakeDeviceApi> api;
  std::shared_ptr<cuda::CachingDeviceAllocator> device;
  std::shared_ptr<cuda::CachingHostAllocator> pinned;
  std::shared_ptr<DeviceLanding> landing;

  explicit Fixture(uint64_t capacity = 64 << 20)
      : api(std::make_shared<cuda::FakeDeviceApi>(2, capacity)) {
    device = *cuda::CachingDeviceAllocator::Create(api, {});
    pinned = *cuda::CachingHostAllocator::Create(api, {});
    rpc::DeviceMaps maps;
    landing = std::make_shared<DeviceLanding>(
        "w1", std::vector<Device>{Device::CUDA(0)}, maps, device, pinned);
  }
};

std::string Header(std::vector<DevicePlacement> placements) {
  DeviceHeader h;
  h.placements = std::move(placements);
  return EncodeDeviceHeader(h);
}

// One message: `stream` received into the progress's buffer in steps.
struct Arrival {
  std::shared_ptr<rpc::ReceiveProgress> progress;
  Storage buffer;

  Arrival(DeviceLanding& landing, const std::string& header,
          const std::string& stream) {
    const rpc::ReceiveStart start{.request = true,
                                  .peer = "w0",
                                  .header = &header,
                                  .payload_bytes = stream.size()};
    progress = landing.Observe(start);
    if (progress == nullptr) return;
    absl::StatusOr<Storage> b = progress->allocator()->Allocate(stream.size());
    EXPECT_TRUE(b.ok()) << b.status();
    buffer = *b;
    progress->Started(buffer);
    std::memcpy(buffer.data(), stream.data(), stream.size());
  }
  // The tensors decoded from the buffer in place (as the agent does).
  std::vector<Tensor> Decode() {
    auto held = std::make_shared<Storage>(buffer);
    WireChunk chunk{static_cast<const char*>(buffer.data()), buffer.nbytes(),
                    held};
    absl::StatusOr<Value> v = DecodeValue(absl::MakeConstSpan(&chunk, 1));
    EXPECT_TRUE(v.ok()) << v.status();
    std::vector<Tensor> out;
    if (const Tensor* t = v->if_tensor()) out.push_back(*t);
    if (const Value::List* l = v->if_list()) {
      for (const Value& e : *l) out.push_back(*e.if_tensor());
    }
    return out;
  }
};

std::string Stream(const Value& v) { return EncodeValue(v)->Flatten(); }

// 3 MiB of distinct floats.
Tensor Big() { return arange(3 << 18, DType::kFloat32); }

TEST(DeviceLanding, QueuesEachChunkOnceItsBytesAreInAndHandsItOver) {
  Fixture f;
  const Tensor cpu = Big();
  const std::string stream = Stream(Value::FromTensor(cpu));
  Arrival a(*f.landing, Header({{0, 0, 0}}), stream);
  ASSERT_NE(a.progress, nullptr);
  absl::StatusOr<std::optional<std::vector<WirePayloadExtent>>> extents =
      ReadPayloadExtents(stream);
  ASSERT_TRUE(extents.ok() && extents->has_value());
  const uint64_t at = (**extents)[0].offset;
  const uint64_t copies = f.api->pinned_copies();
  a.progress->Received(at);  // The metadata: nothing to copy yet.
  EXPECT_EQ(f.api->pinned_copies(), copies);
  a.progress->Received(at + kChunk - 1);
  EXPECT_EQ(f.api->pinned_copies(), copies);
  a.progress->Received(at + kChunk + kChunk / 2);  // One whole chunk in.
  EXPECT_EQ(f.api->pinned_copies(), copies + 1);
  // The tensor's device block came with its first chunk.
  EXPECT_EQ(f.device->Stats(0).allocated_bytes,
            cuda::CachingDeviceAllocator::RoundSize(cpu.nbytes()));
  a.progress->Received(stream.size());
  EXPECT_EQ(f.api->pinned_copies(), copies + 3);
  const std::vector<Tensor> host = a.Decode();
  ASSERT_EQ(host.size(), 1u);
  EXPECT_FALSE(f.landing->Adopt(host[0], 1).has_value());  // Not its device.
  std::optional<AdoptedLanding> got = f.landing->Adopt(host[0], 0);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->early_chunks, 1u);
  EXPECT_FALSE(f.landing->Adopt(host[0], 0).has_value());  // Once.
  const Tensor on_device = *Tensor::FromStorage(
      got->storage, cpu.dtype(), cpu.sizes(), ContiguousStrides(cpu.sizes()));
  EXPECT_TRUE(SameBytes(on_device, cpu, *f.api));
  // A tensor elsewhere is not adopted.
  EXPECT_FALSE(f.landing->Adopt(Big(), 0).has_value());
}

TEST(DeviceLanding, SmallMessagesBadHeadersAndForeignTargetsAreNotObserved) {
  Fixture f;
  const std::string stream = Stream(Value::FromTensor(Big()));
  const std::string ok = Header({{0, 0, 0}});
  EXPECT_NE(Arrival(*f.landing, ok, stream).progress, nullptr);
  // Below kMinBytes.
  EXPECT_EQ(Arrival(*f.landing, ok,
                    Stream(Value::FromTensor(arange(16, DType::kFloat32))))
                .progress,
            nullptr);
  // A header that does not decode.
  EXPECT_EQ(Arrival(*f.landing, std::string("\xff\xff\xff", 3), stream)
                .progress,
            nullptr);
  // cuda:1, which this worker does not use.
  EXPECT_EQ(Arrival(*f.landing, Header({{0, 0, 1}}), stream).progress,
            nullptr);
}

TEST(DeviceLanding, WrongMetadataOrPositionsPipelineNothingAndCrashNothing) {
  Fixture f;
  const Tensor cpu = Big();
  std::string stream = Stream(Value::FromTensor(cpu));
  {  // Bad magic: never read as a stream.
    std::string bad = stream;
    bad[0] = 'X';
    Arrival a(*f.landing, Header({{0, 0, 0}}), bad);
    ASSERT_NE(a.progress, nullptr);
    const uint64_t copies = f.api->pinned_copies();
    a.progress->Received(bad.size());
    EXPECT_EQ(f.api->pinned_copies(), copies);
  }
  {  // A position past the payload's tensors.
    Arrival a(*f.landing, Header({{5, 0, 0}}), stream);
    ASSERT_NE(a.progress, nullptr);
    const uint64_t copies = f.api->pinned_copies();
    a.progress->Received(stream.size());
    EXPECT_EQ(f.api->pinned_copies(), copies);
    EXPECT_FALSE(f.landing->Adopt(a.Decode()[0], 0).has_value());
  }
  {  // Metadata declaring more bytes than the message has.
    std::string lying = Stream(Value::FromTensor(arange(3 << 19,
                                                        DType::kFloat32)));
    lying.resize(stream.size());  // Cut: the extent runs past the buffer.
    Arrival a(*f.landing, Header({{0, 0, 0}}), lying);
    ASSERT_NE(a.progress, nullptr);
    const uint64_t copies = f.api->pinned_copies();
    a.progress->Received(lying.size());
    EXPECT_EQ(f.api->pinned_copies(), copies);
  }
  // Dropped, every device block went back.
  EXPECT_EQ(f.device->Stats(0).allocated_bytes, 0u);
}

TEST(DeviceLanding, ADeviceOutOfMemoryLeavesTheTensorToTheOldPath) {
  Fixture f(/*capacity=*/2 << 20);  // Less than the 3 MiB tensor.
  const Tensor cpu = Big();
  const std::string stream = Stream(Value::FromTensor(cpu));
  Arrival a(*f.landing, Header({{0, 0, 0}}), stream);
  ASSERT_NE(a.progress, nullptr);
  const uint64_t copies = f.api->pinned_copies();
  a.progress->Received(stream.size());
  EXPECT_EQ(f.api->pinned_copies(), copies);
  EXPECT_FALSE(f.landing->Adopt(a.Decode()[0], 0).has_value());
}

TEST(DeviceLanding, ADroppedMessageGivesBackItsDeviceBlocks) {
  Fixture f;
  const std::string stream = Stream(Value::FromTensor(Big()));
  {
    Arrival a(*f.landing, Header({{0, 0, 0}}), stream);
    ASSERT_NE(a.progress, nullptr);
    a.progress->Received(stream.size() / 2);
    EXPECT_GT(f.device->Stats(0).allocated_bytes, 0u);
  }  // The stream failed: the receiver drops the progress and the buffer.
  EXPECT_EQ(f.device->Stats(0).allocated_bytes, 0u);
  EXPECT_EQ(f.pinned->Stats().allocated_bytes, 0u);
}

}  // namespace
}  // namespace ferry
