#include "ferry/rpc/grpc/admin_json.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "ferry/tensor/dtype.h"
#include "ferry/tensor/tensor.h"

namespace ferry::rpc::grpc_agent {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using JsonValue = google::protobuf::Value;

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// google.protobuf.Struct is compiled into Debian's libprotobuf, and its map
// field is read and written here only through reflection, i.e. by that
// library's code: protobuf's map_field.h gives MapFieldBase two more members
// when compiled with -fsanitize=thread, so inline map accessors in a
// --config=tsan build would read the library's Struct at wrong offsets.
using StructFields = std::map<std::string, const JsonValue*>;

const google::protobuf::FieldDescriptor* FieldsField() {
  return Struct::descriptor()->FindFieldByName("fields");
}

// The fields of `s` by key; the values are owned by `s`.
StructFields FieldsOf(const Struct& s) {
  StructFields out;
  const google::protobuf::Reflection* r = s.GetReflection();
  const google::protobuf::FieldDescriptor* fields = FieldsField();
  for (int i = 0; i < r->FieldSize(s, fields); ++i) {
    const google::protobuf::Message& e = r->GetRepeatedMessage(s, fields, i);
    const google::protobuf::Reflection* er = e.GetReflection();
    const google::protobuf::Descriptor* ed = e.GetDescriptor();
    out[er->GetString(e, ed->map_key())] =
        static_cast<const JsonValue*>(&er->GetMessage(e, ed->map_value()));
  }
  return out;
}

// Adds the field `key` (not yet in `s`) with `value`.
void AddField(Struct* s, const std::string& key, JsonValue value) {
  google::protobuf::Message* e =
      s->GetReflection()->AddMessage(s, FieldsField());
  const google::protobuf::Reflection* er = e->GetReflection();
  const google::protobuf::Descriptor* ed = e->GetDescriptor();
  er->SetString(e, ed->map_key(), key);
  static_cast<JsonValue*>(er->MutableMessage(e, ed->map_value()))->Swap(&value);
}

JsonValue String(std::string s) {
  JsonValue j;
  j.set_string_value(std::move(s));
  return j;
}

absl::StatusOr<Value> JsonToTensor(const StructFields& fields,
                                   const std::string& path) {
  auto f = [&fields](const char* key) -> const JsonValue& {
    return *fields.at(key);
  };
  if (!f("dtype").has_string_value()) return Bad(path, "dtype is not a string");
  std::optional<DType> dtype = DTypeFromName(f("dtype").string_value());
  if (!dtype.has_value()) {
    return Bad(path,
               absl::StrCat("unknown dtype '", f("dtype").string_value(), "'"));
  }
  if (!f("shape").has_list_value() || !f("data").has_list_value()) {
    return Bad(path, "shape and data must be arrays");
  }
  std::vector<int64_t> shape;
  int64_t numel = 1;
  for (const JsonValue& d : f("shape").list_value().values()) {
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
  const auto& data = f("data").list_value().values();
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
  Struct* s = j.mutable_struct_value();
  AddField(s, "dtype", String(std::string(DTypeName(t.dtype()))));
  if (!t.sizes().empty()) {
    JsonValue shape;
    for (int64_t d : t.sizes()) {
      *shape.mutable_list_value()->add_values() =
          Number(static_cast<double>(d));
    }
    AddField(s, "shape", std::move(shape));
  }
  AddField(s, "numel", Number(static_cast<double>(t.numel())));
  AddField(s, "device", String(t.device().ToString()));
  const int64_t n = std::min(t.numel(), std::max<int64_t>(preview, 0));
  JsonValue head_values;
  ListValue* list = head_values.mutable_list_value();
  if (t.device().is_cpu() && n > 0) {
    Tensor head = t.contiguous().reshape({t.numel()}).slice(0, 0, n);
    for (double v : head.to_vector<double>()) *list->add_values() = Number(v);
  }
  JsonValue truncated;
  truncated.set_bool_value(list->values_size() < t.numel());
  AddField(s, "preview", std::move(head_values));
  AddField(s, "truncated", std::move(truncated));
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
      const StructFields fields = FieldsOf(json.struct_value());
      if (fields.contains("dtype") && fields.contains("shape") &&
          fields.contains("data")) {
        return JsonToTensor(fields, path);
      }
      Value::Dict dict;
      for (const auto& [key, field] : fields) {
        absl::StatusOr<Value> v = JsonToValue(*field, path + "." + key);
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
      AddField(j.mutable_struct_value(), "bytes_base64",
               String(absl::Base64Escape(value.if_bytes()->data)));
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
      Struct* s = j.mutable_struct_value();
      for (const auto& [k, v] : *value.if_dict()) {
        AddField(s, k, ValueToJson(v, tensor_preview));
      }
      break;
    }
    default:
      j.set_string_value(value.DebugString());
  }
  return j;
}

}  // namespace ferry::rpc::grpc_agent
