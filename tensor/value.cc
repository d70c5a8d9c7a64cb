#include "ferry/tensor/value.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_join.h"

namespace ferry {

absl::string_view KindName(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kNone:
      return "none";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kDouble:
      return "double";
    case Value::Kind::kString:
      return "string";
    case Value::Kind::kBytes:
      return "bytes";
    case Value::Kind::kTensor:
      return "tensor";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kRRef:
      return "rref";
    case Value::Kind::kMessage:
      return "message";
  }
  return "unknown";
}

absl::Status KindMismatch(absl::string_view expected, const Value& actual) {
  return absl::InvalidArgumentError(
      absl::StrCat("expected ", expected, ", got ", KindName(actual.kind())));
}

std::string Value::DebugString() const {
  switch (kind()) {
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return *if_bool() ? "true" : "false";
    case Kind::kInt:
      return absl::StrCat(*if_int());
    case Kind::kDouble:
      return absl::StrCat(*if_double());
    case Kind::kString:
      return absl::StrCat("\"", absl::CHexEscape(*if_string()), "\"");
    case Kind::kBytes:
      return absl::StrCat("b\"", absl::CHexEscape(if_bytes()->data), "\"");
    case Kind::kTensor: {
      const Tensor& t = *if_tensor();
      if (!t.defined()) return "Tensor(undefined)";
      return absl::StrCat("Tensor(shape=[", absl::StrJoin(t.sizes(), ", "),
                          "], dtype=", DTypeName(t.dtype()),
                          ", device=", t.device().ToString(), ")");
    }
    case Kind::kList:
      return absl::StrCat("[",
                          absl::StrJoin(*if_list(), ", ",
                                        [](std::string* out, const Value& v) {
                                          out->append(v.DebugString());
                                        }),
                          "]");
    case Kind::kDict:
      return absl::StrCat(
          "{",
          absl::StrJoin(*if_dict(), ", ",
                        [](std::string* out, const auto& kv) {
                          absl::StrAppend(out, "\"", absl::CHexEscape(kv.first),
                                          "\": ", kv.second.DebugString());
                        }),
          "}");
    case Kind::kRRef: {
      const RRefHandle& r = *if_rref();
      return absl::StrCat("RRef(owner=", r.owner_id, ", id=",
                          r.rref_id.worker_id(), ":", r.rref_id.local_id(),
                          ", fork=", r.fork_id.worker_id(), ":",
                          r.fork_id.local_id(), ", type=", r.type_name, ")");
    }
    case Kind::kMessage:
      return absl::StrCat("<", if_message()->type_name, ">");
  }
  return "?";
}

bool operator==(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  return std::visit(
      [&](const auto& x) -> bool {
        using X = std::decay_t<decltype(x)>;
        const X& y = std::get<X>(b.data_);
        if constexpr (std::is_same_v<X, std::monostate>) {
          return true;
        } else if constexpr (std::is_same_v<X, Tensor>) {
          if (!x.defined() || !y.defined()) return x.defined() == y.defined();
          if (!x.device().is_cpu() || !y.device().is_cpu()) return x.is_same(y);
          return x.equal(y);
        } else {
          return x == y;
        }
      },
      a.data_);
}

}  // namespace ferry
