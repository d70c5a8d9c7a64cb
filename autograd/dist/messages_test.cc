#include "ferry/autograd/dist/messages.h"

#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace ferry::autograd::dist {
namespace {

AutogradHeader WithContext(GlobalId id) {
  AutogradHeader h;
  h.context = id;
  return h;
}

std::string Bytes(const AutogradHeader& h) {
  rpc::Message m;
  SetAutogradHeader(m, h);
  const std::string* b = m.FindHeader(kAutogradHeader);
  return b == nullptr ? std::string() : *b;
}

absl::StatusOr<AutogradHeader> Decode(const std::string& bytes) {
  rpc::Message m;
  m.SetHeader(kAutogradHeader, bytes);
  return AutogradHeaderOf(m);
}

TEST(AutogradMessagesTest, EveryFieldRoundTrips) {
  AutogradHeader h;
  h.context = GlobalId(3, 9);
  h.fields = AutogradFields{GlobalId(3, 9), GlobalId(4, 1), true, {0, 2, 7}};
  h.releases = AutogradReleases{4, 3, {GlobalId(4, 5), GlobalId(4, 6)}};
  h.fused_steps = {FusedStep{3, 11}, FusedStep{0, 12}};
  absl::StatusOr<AutogradHeader> back = Decode(Bytes(h));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, h);
}

TEST(AutogradMessagesTest, AnEmptyHeaderIsNoHeader) {
  rpc::Message m;
  SetAutogradHeader(m, WithContext(GlobalId(1, 1)));
  ASSERT_NE(m.FindHeader(kAutogradHeader), nullptr);
  SetAutogradHeader(m, AutogradHeader{});
  EXPECT_EQ(m.FindHeader(kAutogradHeader), nullptr);
  absl::StatusOr<AutogradHeader> h = AutogradHeaderOf(m);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, AutogradHeader{});
}

TEST(AutogradMessagesTest, SetAutogradFieldsKeepsTheRest) {
  rpc::Message m;
  AutogradHeader h;
  h.context = GlobalId(1, 2);
  h.releases = AutogradReleases{1, 2, {GlobalId(1, 3)}};
  h.fused_steps = {FusedStep{2, 5}};
  SetAutogradHeader(m, h);
  AutogradFields f{GlobalId(1, 2), GlobalId(1, 4), false, {1}};
  SetAutogradFields(m, f);
  h.fields = f;
  absl::StatusOr<AutogradHeader> back = AutogradHeaderOf(m);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, h);
}

// What no sender writes is refused with InvalidArgument naming the header.
TEST(AutogradMessagesTest, MalformedHeadersAreInvalidArgument) {
  AutogradHeader unordered;
  unordered.fields = AutogradFields{GlobalId(1, 1), GlobalId(1, 2), false,
                                    {2, 2}};
  AutogradHeader descending;
  descending.fields = AutogradFields{GlobalId(1, 1), GlobalId(1, 2), false,
                                     {3, 1}};
  AutogradHeader too_large;  // Past int's range once decoded.
  too_large.fields = AutogradFields{GlobalId(1, 1), GlobalId(1, 2), false,
                                    {-1}};
  AutogradHeader no_ids;
  no_ids.releases = AutogradReleases{1, 2, {}};
  const std::pair<const char*, std::string> cases[] = {
      {"garbage", std::string("\xff\xff\xff", 3)},
      {"truncated", Bytes(WithContext(GlobalId(1, 1))).substr(0, 3)},
      {"repeated index", Bytes(unordered)},
      {"descending indices", Bytes(descending)},
      {"index past int", Bytes(too_large)},
      {"release list without ids", Bytes(no_ids)},
  };
  for (const auto& [what, bytes] : cases) {
    absl::StatusOr<AutogradHeader> h = Decode(bytes);
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument)
        << what << ": " << h.status();
    EXPECT_NE(h.status().message().find("malformed autograd header"),
              std::string::npos)
        << what << ": " << h.status();
  }
}

}  // namespace
}  // namespace ferry::autograd::dist
