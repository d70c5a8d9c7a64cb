// The DeviceMemoryApi conformance suite on FakeDeviceApi.
#include <cstring>
#include <memory>
#include <string>

#include "ferry/tensor/cuda/device_api_conformance.h"
#include "ferry/tensor/cuda/device_ipc.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace cuda {
namespace {

class FakeFixture : public DeviceApiFixture {
 public:
  std::shared_ptr<DeviceMemoryApi> api() override { return api_; }
  absl::StatusOr<StreamHandle> NewStream(int /*device*/) override {
    return next_stream_++;
  }
  absl::Status Drain(int device, StreamHandle stream) override {
    api_->CompleteStream(device, stream);
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<FakeDeviceApi> api_ =
      std::make_shared<FakeDeviceApi>(2, uint64_t{64} << 20);
  StreamHandle next_stream_ = 1;
};

INSTANTIATE_TEST_SUITE_P(
    Fake, DeviceApiConformanceTest,
    ::testing::Values(DeviceApiConformanceParam{
        "fake", []() -> absl::StatusOr<std::unique_ptr<DeviceApiFixture>> {
          return std::make_unique<FakeFixture>();
        }}),
    [](const auto& info) { return info.param.name; });

using ::testing::HasSubstr;

// Two fakes on one FakeHost share an allocation through its handle; the
// reader's stream waits on the writer's event; a fake on another host, a
// freed allocation and malformed bytes are refused.
TEST(FakeDeviceIpc, FakesOnOneHostShareMemoryAndOthersCannot) {
  auto host = std::make_shared<FakeHost>("h1");
  auto writer = std::make_shared<FakeDeviceApi>(1, 1 << 20, host);
  auto reader = std::make_shared<FakeDeviceApi>(1, 1 << 20, host);
  auto stranger = std::make_shared<FakeDeviceApi>(
      1, 1 << 20, std::make_shared<FakeHost>("h2"));
  ASSERT_NE(AsIpc(std::shared_ptr<DeviceMemoryApi>(writer)), nullptr);
  void* block = writer->Malloc(0, 4096).value();
  const char* inside = static_cast<const char*>(block) + 100;
  absl::StatusOr<IpcMemory> exported = writer->ExportMemory(0, inside);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->handle.size(), kIpcHandleBytes);
  EXPECT_EQ(exported->offset, 100u);
  EXPECT_EQ(exported->allocation_bytes, 4096u);
  // The same allocation exports the same handle.
  EXPECT_EQ(writer->ExportMemory(0, block).value().handle, exported->handle);
  // A write queued on the writer's stream, then an event after it.
  const std::string text = "through the handle";
  ASSERT_TRUE(writer->MemcpyAsync(0, const_cast<char*>(inside), text.data(),
                                  text.size(), 0).ok());
  EventHandle ev = writer->CreateIpcEvent(0).value();
  ASSERT_TRUE(writer->RecordIpcEvent(0, ev, 0).ok());
  std::string ev_handle = writer->ExportEvent(0, ev).value();
  absl::StatusOr<IpcMapping> mapped = reader->OpenMemory(0, exported->handle);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(mapped->bytes, 4096u);
  EventHandle theirs = reader->OpenEvent(0, ev_handle).value();
  ASSERT_TRUE(reader->StreamWaitEvent(0, 7, theirs).ok());
  std::string out(text.size(), '?');
  ASSERT_TRUE(reader->MemcpyAsync(0, out.data(),
                                  static_cast<char*>(mapped->base) + 100,
                                  text.size(), 7).ok());
  ASSERT_TRUE(reader->SynchronizeStream(0, 7).ok());
  EXPECT_EQ(out, text);  // The wait ran the writer's queued copy first.
  EXPECT_EQ(reader->ipc_opens(), 1u);
  EXPECT_EQ(reader->open_mappings(), 1u);
  ASSERT_TRUE(reader->CloseMemory(0, mapped->base).ok());
  EXPECT_EQ(reader->open_mappings(), 0u);
  EXPECT_FALSE(reader->CloseMemory(0, mapped->base).ok());
  ASSERT_TRUE(reader->DestroyIpcEvent(0, theirs).ok());
  ASSERT_TRUE(writer->DestroyIpcEvent(0, ev).ok());
  // Another host: FailedPrecondition naming it.
  absl::StatusOr<IpcMapping> far = stranger->OpenMemory(0, exported->handle);
  ASSERT_FALSE(far.ok());
  EXPECT_EQ(far.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(far.status().message(), HasSubstr("another host"));
  // Malformed bytes: InvalidArgument.
  absl::StatusOr<IpcMapping> junk =
      reader->OpenMemory(0, std::string(kIpcHandleBytes, 'x'));
  ASSERT_FALSE(junk.ok());
  EXPECT_EQ(junk.status().code(), absl::StatusCode::kInvalidArgument);
  // A freed allocation cannot be opened any more.
  ASSERT_TRUE(writer->Free(0, block).ok());
  absl::StatusOr<IpcMapping> freed = reader->OpenMemory(0, exported->handle);
  ASSERT_FALSE(freed.ok());
  EXPECT_EQ(freed.status().code(), absl::StatusCode::kFailedPrecondition);
  // A pointer no allocation holds is not exported; a fake without a host
  // has no IPC at all.
  int local = 0;
  EXPECT_EQ(writer->ExportMemory(0, &local).status().code(),
            absl::StatusCode::kInvalidArgument);
  FakeDeviceApi alone(1, 1 << 20);
  EXPECT_THAT(alone.CreateIpcEvent(0).status().message(),
              HasSubstr("no FakeHost"));
}

// CompleteStream stops at a wait for another stream's event;
// CompleteStreamAndWaits runs that stream first (as a device would), and
// refuses streams that wait on each other.
TEST(FakeDeviceApi, CompleteStreamAndWaitsRunsTheAwaitedStreamFirst) {
  FakeDeviceApi api(1, uint64_t{1} << 20);
  const int produced = 7, stale = -1;
  int middle = stale, last = stale;
  ASSERT_TRUE(api.MemcpyAsync(0, &middle, &produced, sizeof(int), 1).ok());
  absl::StatusOr<EventHandle> e1 = api.RecordEvent(0, 1);
  ASSERT_TRUE(e1.ok()) << e1.status();
  ASSERT_TRUE(api.StreamWaitEvent(0, 2, *e1).ok());
  ASSERT_TRUE(api.MemcpyAsync(0, &last, &middle, sizeof(int), 2).ok());
  EXPECT_FALSE(api.CompleteStream(0, 2));
  EXPECT_EQ(last, stale);
  EXPECT_TRUE(api.CompleteStreamAndWaits(0, 2));
  EXPECT_EQ(middle, produced);
  EXPECT_EQ(last, produced);
  // Streams 3 and 4 each wait for an event recorded after the other's wait.
  absl::StatusOr<EventHandle> e3 = api.RecordEvent(0, 3);
  absl::StatusOr<EventHandle> e4 = api.RecordEvent(0, 4);
  ASSERT_TRUE(e3.ok() && e4.ok());
  ASSERT_TRUE(api.StreamWaitEvent(0, 3, *e4).ok());
  ASSERT_TRUE(api.StreamWaitEvent(0, 4, *e3).ok());
  absl::StatusOr<EventHandle> e3b = api.RecordEvent(0, 3);
  absl::StatusOr<EventHandle> e4b = api.RecordEvent(0, 4);
  ASSERT_TRUE(e3b.ok() && e4b.ok());
  ASSERT_TRUE(api.StreamWaitEvent(0, 3, *e4b).ok());
  ASSERT_TRUE(api.StreamWaitEvent(0, 4, *e3b).ok());
  EXPECT_FALSE(api.CompleteStreamAndWaits(0, 3));
  for (EventHandle e : {*e1, *e3, *e4, *e3b, *e4b})
    ASSERT_TRUE(api.DestroyEvent(0, e).ok());
}

}  // namespace
}  // namespace cuda
}  // namespace ferry
