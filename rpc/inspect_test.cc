#include "ferry/rpc/inspect.h"

#include "gtest/gtest.h"

namespace ferry::rpc {
namespace {

TEST(InspectorRegistry, RunsOneOrAllByName) {
  InspectorRegistry r;
  ASSERT_TRUE(r.Register("b", [] {
                 return std::vector<InspectionRow>{
                     {"thing", {{"id", "7"}, {"state", "live"}}}};
               }).ok());
  ASSERT_TRUE(
      r.Register("a", [] { return std::vector<InspectionRow>{}; }).ok());
  absl::StatusOr<std::vector<Inspection>> all = r.Inspect();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].name, "a");
  EXPECT_TRUE((*all)[0].rows.empty());
  absl::StatusOr<std::vector<Inspection>> b = r.Inspect("b");
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 1u);
  ASSERT_EQ((*b)[0].rows.size(), 1u);
  EXPECT_EQ((*b)[0].rows[0].kind, "thing");
  EXPECT_EQ((*b)[0].rows[0].Get("state"), "live");
  EXPECT_EQ((*b)[0].rows[0].Get("missing"), "");
}

TEST(InspectorRegistry, ErrorsNameTheInspector) {
  InspectorRegistry r;
  ASSERT_TRUE(
      r.Register("rref", [] { return std::vector<InspectionRow>{}; }).ok());
  absl::Status dup =
      r.Register("rref", [] { return std::vector<InspectionRow>{}; });
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(dup.message().find("'rref'"), std::string::npos);
  EXPECT_EQ(r.Register("", [] { return std::vector<InspectionRow>{}; }).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Register("x", nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<Inspection>> none = r.Inspect("nope");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("rref"), std::string::npos);
  r.Unregister("rref");
  EXPECT_TRUE(r.Names().empty());
}

}  // namespace
}  // namespace ferry::rpc
