#include "ferry/tensor/value.h"

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/proto/tensor.pb.h"
#include "ferry/tensor/proto_value.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

template <typename T>
T RoundTrip(const T& x) {
  absl::StatusOr<T> y = FromValue<T>(ToValue(x));
  EXPECT_TRUE(y.ok()) << y.status();
  return y.ok() ? *y : T{};
}

TEST(ValueTest, KindsAndAccessors) {
  EXPECT_TRUE(Value().is_none());
  EXPECT_EQ(Value::Int(3).kind(), Value::Kind::kInt);
  EXPECT_EQ(*Value::Int(3).if_int(), 3);
  EXPECT_EQ(Value::Int(3).if_double(), nullptr);
  EXPECT_EQ(KindName(Value::Kind::kTensor), "tensor");
  Value l = Value::FromList({Value::Int(1), Value::String("a")});
  ASSERT_NE(l.mutable_list(), nullptr);
  l.mutable_list()->push_back(Value::Bool(true));
  EXPECT_EQ(l.DebugString(), "[1, \"a\", true]");
}

TEST(ValueTest, ScalarsRoundTrip) {
  EXPECT_EQ(RoundTrip(true), true);
  EXPECT_EQ(RoundTrip(int8_t{-5}), -5);
  EXPECT_EQ(RoundTrip(uint16_t{65535}), 65535);
  EXPECT_EQ(RoundTrip(int64_t{1} << 62), int64_t{1} << 62);
  EXPECT_EQ(RoundTrip(~uint64_t{0}), ~uint64_t{0});
  EXPECT_EQ(RoundTrip(2.5), 2.5);
  EXPECT_EQ(RoundTrip(1.5f), 1.5f);
  EXPECT_EQ(RoundTrip(std::string("hi")), "hi");
  EXPECT_EQ(RoundTrip(Bytes{std::string("\0\1", 2)}).data,
            std::string("\0\1", 2));
  EXPECT_EQ(*FromValue<double>(ToValue(3)), 3.0);  // int widens to double.
  EXPECT_EQ(*FromValue<std::string>(ToValue("lit")), "lit");
}

TEST(ValueTest, ContainersRoundTrip) {
  std::vector<int> v = {1, 2, 3};
  EXPECT_EQ(RoundTrip(v), v);
  std::map<std::string, std::vector<double>> m = {{"a", {1.0}}, {"b", {}}};
  EXPECT_EQ(RoundTrip(m), m);
  std::tuple<int, std::string, bool> t{4, "x", false};
  EXPECT_EQ(RoundTrip(t), t);
  std::pair<std::string, int64_t> p{"k", 9};
  EXPECT_EQ(RoundTrip(p), p);
  std::optional<int> none;
  EXPECT_EQ(RoundTrip(none), std::nullopt);
  EXPECT_EQ(RoundTrip(std::optional<int>(5)), 5);
}

TEST(ValueTest, TensorIsSharedNotCopied) {
  Tensor a = arange(4);
  Value v = ToValue(std::vector<Tensor>{a});
  Tensor b = (*FromValue<std::vector<Tensor>>(v))[0];
  EXPECT_EQ(a.data_ptr(), b.data_ptr());
  EXPECT_EQ(v, ToValue(std::vector<Tensor>{arange(4)}));  // Compared by value.
  EXPECT_NE(v, ToValue(std::vector<Tensor>{arange(5)}));
}

TEST(ValueTest, RRefAndMessages) {
  RRefHandle r{1, GlobalId(2, 3), GlobalId(4, 5), "Tensor", "x"};
  EXPECT_EQ(RoundTrip(r), r);
  proto::TensorMeta meta;
  meta.set_nbytes(42);
  meta.add_sizes(7);
  Value v = ToValue(meta);
  EXPECT_EQ(v.if_message()->type_name, "ferry.proto.TensorMeta");
  proto::TensorMeta back = *FromValue<proto::TensorMeta>(v);
  EXPECT_EQ(back.nbytes(), 42u);
  EXPECT_EQ(back.sizes(0), 7);
  absl::StatusOr<proto::ListValue> wrong = FromValue<proto::ListValue>(v);
  EXPECT_THAT(std::string(wrong.status().message()),
              HasSubstr("expected message ferry.proto.ListValue, got message "
                        "ferry.proto.TensorMeta"));
}

TEST(ValueTest, WrongTypesNameExpectedAndActual) {
  absl::StatusOr<int> i = FromValue<int>(ToValue("s"));
  EXPECT_EQ(i.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(i.status().message(), "expected int, got string");
  EXPECT_THAT(std::string(FromValue<int8_t>(ToValue(300)).status().message()),
              HasSubstr("out of range for a 8-bit signed integer"));
  EXPECT_FALSE(FromValue<uint32_t>(ToValue(-1)).ok());
  auto nested = FromValue<std::vector<std::map<std::string, Tensor>>>(ToValue(
      std::vector<std::map<std::string, std::string>>{{}, {{"w", "oops"}}}));
  EXPECT_EQ(nested.status().message(),
            "[1]: ['w']: expected tensor, got string");
  auto tup = FromValue<std::tuple<int, bool>>(ToValue(std::make_tuple(1, 2)));
  EXPECT_EQ(tup.status().message(), "[1]: expected bool, got int");
  auto arity = FromValue<std::tuple<int, bool>>(ToValue(std::vector<int>{1}));
  EXPECT_THAT(std::string(arity.status().message()),
              HasSubstr("expected a list of 2"));
  EXPECT_EQ(FromValue<Tensor>(Value()).status().message(),
            "expected tensor, got none");
}

TEST(ValueTest, Equality) {
  EXPECT_EQ(Value(), Value());
  EXPECT_NE(Value::Int(1), Value::Double(1));
  EXPECT_NE(Value::String("a"), Value::FromBytes({"a"}));
  EXPECT_EQ(ToValue(std::map<std::string, int>{{"a", 1}}),
            ToValue(std::map<std::string, int>{{"a", 1}}));
}

}  // namespace
}  // namespace ferry
