// The device layer's header: round trips, and every malformed field refused
// as InvalidArgument naming the message and the field.
#include "ferry/worker/device_header.h"

#include <string>

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

}  // namespace
}  // namespace ferry
