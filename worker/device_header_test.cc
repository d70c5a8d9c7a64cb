// The device layer's header: round trips, and every malformed field refused
// as InvalidArgument naming the message and the field.
#include "ferry/worker/device_header.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

TEST(DeviceHeader, RoundTripsRequestsAndReplies) {
  DeviceHeader request{{{0, 1, 3}, {4, 0, 0}}};
  absl::StatusOr<DeviceHeader> back =
      DecodeDeviceHeader(EncodeDeviceHeader(request), 5, true, "w");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->placements, request.placements);
  DeviceHeader reply{{{2, 7, std::nullopt}}};
  back = DecodeDeviceHeader(EncodeDeviceHeader(reply), 3, false, "w");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->placements, reply.placements);
  // Target 0 is present, not "unset": a request placement keeps it.
  absl::StatusOr<DeviceHeader> zero =
      DecodeDeviceHeader(EncodeDeviceHeader({{{0, 0, 0}}}), 1, true, "w");
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->placements[0].target, 0);
  EXPECT_FALSE(zero->returning);
  // A returning request (gradients back along a forward request) carries
  // no targets, as a reply.
  DeviceHeader returning{{{1, 2, std::nullopt}}, /*returning=*/true};
  back = DecodeDeviceHeader(EncodeDeviceHeader(returning), 2, true, "w");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->returning);
  EXPECT_EQ(back->placements, returning.placements);
  EXPECT_TRUE(ClaimDeviceLayer().ok());
  EXPECT_TRUE(ClaimDeviceLayer().ok());  // Idempotent.
}

TEST(DeviceHeader, MalformedFieldsAreInvalidArgumentNamingThem) {
  struct Case {
    std::string bytes;
    size_t tensors;
    bool request;
    std::string expect;
  };
  const Case cases[] = {
      {"\xff\xff\xff", 1, true, "not a DeviceHeader"},
      {EncodeDeviceHeader({{{3, 0, 0}}}), 3, true,
       "names tensor 3 of a "
       "payload with 3 tensors"},
      {EncodeDeviceHeader({{{1, 0, 0}, {1, 0, 0}}}), 3, true,
       "positions must increase"},
      {EncodeDeviceHeader({{{0, -1, 0}}}), 1, true, "source device index -1"},
      {EncodeDeviceHeader({{{0, 0, 4096}}}), 1, true,
       "target device index 4096"},
      {EncodeDeviceHeader({{{0, 0, -2}}}), 1, true, "target device index -2"},
      {EncodeDeviceHeader({{{0, 0, std::nullopt}}}), 1, true,
       "request has no target"},
      {EncodeDeviceHeader({{{0, 0, 1}}}), 1, false, "reply has a target"},
      {EncodeDeviceHeader({{{0, 0, 0}}}), 0, true, "payload with 0 tensors"},
      {EncodeDeviceHeader({{{0, 0, 1}}, true}), 1, true,
       "returning request has a target"},
      {EncodeDeviceHeader({{{0, 0, std::nullopt}}, true}), 1, false,
       "a reply marked returning"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<DeviceHeader> h = DecodeDeviceHeader(
        c.bytes, c.tensors, c.request, "worker 'b': the request CALL 'f'");
    ASSERT_FALSE(h.ok()) << c.expect;
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(h.status().message(),
                HasSubstr("worker 'b': the request CALL 'f'"));
    EXPECT_THAT(h.status().message(), HasSubstr(c.expect));
  }
}

// A request header with one IPC placement of a [4, 8] tensor at `offset` in
// an allocation of `bytes`, and one event.
DeviceHeader IpcRequest(uint64_t offset, uint64_t bytes) {
  DevicePlacement p{1, 0, 1, IpcTensor{std::string(64, 'h'), offset, bytes,
                                       {4, 8}, 0}};
  return DeviceHeader{{p}, /*returning=*/false, {std::string(64, 'e')}};
}

TEST(DeviceHeader, IpcPlacementsRoundTrip) {
  const DeviceHeader h = IpcRequest(512, 4096);
  absl::StatusOr<DeviceHeader> back =
      DecodeDeviceHeader(EncodeDeviceHeader(h), 2, true, "w");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->placements, h.placements);
  EXPECT_EQ(back->events, h.events);
  ASSERT_TRUE(back->placements[0].ipc.has_value());
  EXPECT_EQ(back->placements[0].ipc->sizes, (std::vector<int64_t>{4, 8}));
}

TEST(DeviceHeader, ARepliesIpcAcknowledgementRoundTripsAndARequestsIsRefused) {
  DeviceHeader ack;
  ack.ipc_ack = 0;  // Worker 0's first request: present, not "unset".
  absl::StatusOr<DeviceHeader> back =
      DecodeDeviceHeader(EncodeDeviceHeader(ack), 0, false, "w");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ipc_ack, std::optional<uint64_t>(0));
  absl::StatusOr<DeviceHeader> request =
      DecodeDeviceHeader(EncodeDeviceHeader(ack), 0, true, "worker 'b'");
  ASSERT_FALSE(request.ok());
  EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(request.status().message(),
              HasSubstr("worker 'b': malformed device header: a request "
                        "carries an IPC acknowledgement"));
}

TEST(DeviceHeader, AReplysIpcTensorAndARequestsReplyFieldsRoundTrip) {
  DeviceHeader reply = IpcRequest(0, 4096);  // A reply: no target.
  reply.placements[0].target = std::nullopt;
  reply.ipc_ack = 3;
  reply.ipc_reply = 9;
  absl::StatusOr<DeviceHeader> back =
      DecodeDeviceHeader(EncodeDeviceHeader(reply), 2, false, "w");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->placements, reply.placements);
  EXPECT_EQ(back->events, reply.events);
  EXPECT_EQ(back->ipc_reply, std::optional<uint64_t>(9));
  DeviceHeader returning = IpcRequest(0, 4096);  // Gradients going back.
  returning.returning = true;
  returning.placements[0].target = std::nullopt;
  back = DecodeDeviceHeader(EncodeDeviceHeader(returning), 2, true, "w");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->placements, returning.placements);
  DeviceHeader request;
  request.ipc_replies = true;
  request.reply_acks = {0, 5, uint64_t{1} << 40};
  back = DecodeDeviceHeader(EncodeDeviceHeader(request), 0, true, "w");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->ipc_replies);
  EXPECT_EQ(back->reply_acks, request.reply_acks);
  back = DecodeDeviceHeader(EncodeDeviceHeader(DeviceHeader{}), 0, true, "w");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->ipc_replies);
  EXPECT_TRUE(back->reply_acks.empty());
}

TEST(DeviceHeader, MalformedIpcFieldsAreInvalidArgumentNamingThem) {
  struct Case {
    DeviceHeader header;
    bool request;
    std::string expect;
  };
  std::vector<Case> cases;
  DeviceHeader unnamed_reply = IpcRequest(0, 4096);
  unnamed_reply.placements[0].target = std::nullopt;
  cases.push_back({unnamed_reply, false, "IPC tensors without ipc_reply"});
  DeviceHeader named_request = IpcRequest(0, 4096);
  named_request.ipc_reply = 1;
  cases.push_back({named_request, true, "ipc_reply on a request"});
  DeviceHeader flagged_reply;
  flagged_reply.ipc_replies = true;
  cases.push_back({flagged_reply, false, "a reply carries ipc_replies"});
  DeviceHeader acking_reply;
  acking_reply.reply_acks = {7};
  cases.push_back({acking_reply, false, "a reply carries ipc_replies"});
  DeviceHeader too_many_acks;
  too_many_acks.reply_acks.assign(kMaxReplyAcks + 1, 7);
  cases.push_back({too_many_acks, true, "acknowledges 4097 replies (at most"});
  DeviceHeader short_handle = IpcRequest(0, 4096);
  short_handle.placements[0].ipc->memory_handle = "abc";
  cases.push_back({short_handle, true, "memory handle of 3 bytes"});
  cases.push_back({IpcRequest(4096, 4096), true,
                   "offset 4096 outside its allocation of 4096 bytes"});
  cases.push_back({IpcRequest(0, 0), true, "allocation of 0 bytes"});
  cases.push_back({IpcRequest(0, uint64_t{1} << 41), true,
                   "allocation of 2199023255552 bytes"});
  // 32 elements need at least 32 bytes; 4090 + 32 > 4096.
  cases.push_back({IpcRequest(4090, 4096), true,
                   "more elements than the 6 bytes after its offset"});
  DeviceHeader negative = IpcRequest(0, 4096);
  negative.placements[0].ipc->sizes = {4, -1};
  cases.push_back({negative, true, "size -1 at dimension 1"});
  DeviceHeader huge = IpcRequest(0, 4096);
  huge.placements[0].ipc->sizes = {int64_t{1} << 40, int64_t{1} << 40};
  cases.push_back({huge, true, "more elements than"});
  DeviceHeader empty = IpcRequest(0, 4096);
  empty.placements[0].ipc->sizes = {0};
  cases.push_back({empty, true, "no elements"});
  DeviceHeader dims = IpcRequest(0, 4096);
  dims.placements[0].ipc->sizes = std::vector<int64_t>(65, 1);
  cases.push_back({dims, true, "65 dimensions"});
  DeviceHeader no_event = IpcRequest(0, 4096);
  no_event.events.clear();
  cases.push_back({no_event, true, "names event 0 of 0"});
  DeviceHeader bad_event = IpcRequest(0, 4096);
  bad_event.events[0] = "short";
  cases.push_back({bad_event, true, "event 0 has 5 bytes"});
  for (const Case& c : cases) {
    absl::StatusOr<DeviceHeader> h =
        DecodeDeviceHeader(EncodeDeviceHeader(c.header), 2, c.request,
                           "worker 'b': the request CALL 'f' from 'a'");
    ASSERT_FALSE(h.ok()) << c.expect;
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(h.status().message(), HasSubstr("worker 'b'"));
    EXPECT_THAT(h.status().message(), HasSubstr(c.expect));
  }
}

}  // namespace
}  // namespace ferry
