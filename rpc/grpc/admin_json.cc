#include "rpc/grpc/admin_json.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace ferry::rpc::grpc_agent {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using JsonValue = google::protobuf::Value;

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::StatusOr<Value> JsonToTensor(const Struct& s, const std::string& path) {
  const auto& f = s.fields();
  if (!f.at("dtype").has_string_value())
    return Bad(path, "dtype is not a string");
  std::optional<DType> dtype = DTypeFromName(f.at("dtype").string_value());
  if (!dtype.has_value()) {
    return Bad(path, absl::StrCat("unknown dtype '",
                                  f.at("dtype").string_value(), "'"));
  }
  if (!f.at("shape").has_list_value() || !f.at("data").has_list_value()) {
    return Bad(path, "shape and data must be arrays");
  }
  std::vector<int64_t> shape;
  int64_t numel = 1;
  for (const JsonValue& d : f.at("shape").list_value().values()) {
    const double v = d.number_value();
    if (!d.has_number_value() || v < 0 || v != std::floor(v) ||
        v > kMaxJsonTensorElements) {
      return Bad(path + ".shape",
                 absl::StrCat("dimensions must be integers in [0, ",
                              kMaxJsonTensorElements, "]"));
    }
    shape.push_back(static_cast<int64_t>(v));
    numel *= shape.back();
    if (numel > kMaxJsonTensorElements) {
      return Bad(path, absl::StrCat("more than ", kMaxJsonTensorElements,
                                    " elements"));
    }
  }
  const auto& data = f.at("data").list_value().values();
  if (static_cast<int64_t>(data.size()) != numel) {
    return Bad(path, absl::StrCat(data.size(), " data values for a shape of ",
                                  numel, " elements"));
  }
  std::vector<double> values;
  values.reserve(data.size());
  for (const JsonValue& d : data) {
    if (!d.has_number_value()) return Bad(path + ".data", "not a number");
    values.push_back(d.number_value());
  }
  Tensor flat = from_vector(values, {numel});
  return Value::FromTensor(flat.reshape(shape).to(*dtype));
}

JsonValue Number(double d) {
  JsonValue j;
  j.set_number_value(d);
  return j;
}

JsonValue TensorToJson(const Tensor& t, int64_t preview) {
  JsonValue j;
  auto& f = *j.mutable_struct_value()->mutable_fields();
  f["dtype"].set_string_value(std::string(DTypeName(t.dtype())));
  for (int64_t d : t.sizes()) {
    *f["shape"].mutable_list_value()->add_values() =
        Number(static_cast<double>(d));
  }
  f["numel"] = Number(static_cast<double>(t.numel()));
  f["device"].set_string_value(t.device().ToString());
  const int64_t n = std::min(t.numel(), std::max<int64_t>(preview, 0));
  auto* list = f["preview"].mutable_list_value();
  if (t.device().is_cpu() && n > 0) {
    Tensor head = t.contiguous().reshape({t.numel()}).slice(0, 0, n);
    for (double v : head.to_vector<double>()) *list->add_values() = Number(v);
  }
  f["truncated"].set_bool_value(list->values_size() < t.numel());
  return j;
}

}  // namespace

absl::StatusOr<Value> JsonToValue(const JsonValue& json,
                                  const std::string& path) {
  switch (json.kind_case()) {
    case JsonValue::kNullValue:
    case JsonValue::KIND_NOT_SET:
      return Value::None();
    case JsonValue::kBoolValue:
      return Value::Bool(json.bool_value());
    case JsonValue::kNumberValue: {
      const double d = json.number_value();
      if (d == std::floor(d) && std::fabs(d) < 9.2e18) {
        return Value::Int(static_cast<int64_t>(d));
      }
      return Value::Double(d);
    }
    case JsonValue::kStringValue:
      return Value::String(json.string_value());
    case JsonValue::kListValue: {
      Value::List list;
      for (int i = 0; i < json.list_value().values_size(); ++i) {
        absl::StatusOr<Value> v = JsonToValue(json.list_value().values(i),
                                              absl::StrCat(path, "[", i, "]"));
        if (!v.ok()) return v.status();
        list.push_back(*std::move(v));
      }
      return Value::FromList(std::move(list));
    }
    case JsonValue::kStructValue: {
      const Struct& s = json.struct_value();
      if (s.fields().contains("dtype") && s.fields().contains("shape") &&
          s.fields().contains("data")) {
        return JsonToTensor(s, path);
      }
      Value::Dict dict;
      for (const auto& [key, field] : s.fields()) {
        absl::StatusOr<Value> v = JsonToValue(field, path + "." + key);
        if (!v.ok()) return v.status();
        dict.emplace(key, *std::move(v));
      }
      return Value::FromDict(std::move(dict));
    }
  }
  return Bad(path, "unsupported JSON value");
}

JsonValue ValueToJson(const Value& value, int64_t tensor_preview) {
  JsonValue j;
  switch (value.kind()) {
    case Value::Kind::kNone:
      j.set_null_value(google::protobuf::NULL_VALUE);
      break;
    case Value::Kind::kBool:
      j.set_bool_value(*value.if_bool());
      break;
    case Value::Kind::kInt: {
      const int64_t i = *value.if_int();
      // JSON numbers are doubles: beyond 2^53 they would round.
      if (i > (int64_t{1} << 53) || i < -(int64_t{1} << 53)) {
        j.set_string_value(absl::StrCat(i));
      } else {
        j.set_number_value(static_cast<double>(i));
      }
      break;
    }
    case Value::Kind::kDouble:
      j.set_number_value(*value.if_double());
      break;
    case Value::Kind::kString:
      j.set_string_value(*value.if_string());
      break;
    case Value::Kind::kBytes:
      (*j.mutable_struct_value()->mutable_fields())["bytes_base64"]
          .set_string_value(absl::Base64Escape(value.if_bytes()->data));
      break;
    case Value::Kind::kTensor:
      return TensorToJson(*value.if_tensor(), tensor_preview);
    case Value::Kind::kList:
      for (const Value& v : *value.if_list()) {
        *j.mutable_list_value()->add_values() = ValueToJson(v, tensor_preview);
      }
      j.mutable_list_value();  // [] for an empty list
      break;
    case Value::Kind::kDict: {
      auto& fields = *j.mutable_struct_value()->mutable_fields();
      for (const auto& [k, v] : *value.if_dict()) {
        fields[k] = ValueToJson(v, tensor_preview);
      }
      break;
    }
    default:
      j.set_string_value(value.DebugString());
  }
  return j;
}

}  // namespace ferry::rpc::grpc_agent
