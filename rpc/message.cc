#include "ferry/rpc/message.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ferry/rpc/layer.h"

namespace ferry::rpc {

std::string MessageTypeName(MessageType type) {
  switch (type) {
    case MessageType::kUnspecified:
      return "UNSPECIFIED";
    case MessageType::kCall:
      return "CALL";
    case MessageType::kPing:
      return "PING";
    case MessageType::kMembership:
      return "MEMBERSHIP";
    case MessageType::kFirstLayerType:
      break;
  }
  if (std::optional<LayerTypeName> n =
          ClaimedTypeName(static_cast<uint32_t>(type))) {
    return n->name;
  }
  return absl::StrCat("TYPE_", static_cast<uint32_t>(type));
}

namespace {

void Collect(const Value& v, std::vector<Tensor>& out) {
  if (const Tensor* t = v.if_tensor()) {
    out.push_back(*t);
  } else if (const Value::List* l = v.if_list()) {
    for (const Value& e : *l) Collect(e, out);
  } else if (const Value::Dict* d = v.if_dict()) {
    for (const auto& [k, e] : *d) Collect(e, out);
  }
}

}  // namespace

std::vector<Tensor> Message::Tensors() const {
  std::vector<Tensor> out;
  Collect(payload, out);
  return out;
}

namespace {

LayerHeaders::iterator Place(LayerHeaders& headers, uint32_t layer) {
  return std::lower_bound(
      headers.begin(), headers.end(), layer,
      [](const LayerHeader& h, uint32_t l) { return h.layer < l; });
}

}  // namespace

const std::string* Message::FindHeader(uint32_t layer) const {
  for (const LayerHeader& h : headers) {
    if (h.layer == layer) return &h.bytes;
  }
  return nullptr;
}

void Message::SetHeader(uint32_t layer, std::string bytes) {
  auto it = Place(headers, layer);
  if (it != headers.end() && it->layer == layer) {
    it->bytes = std::move(bytes);
  } else {
    headers.insert(it, LayerHeader{layer, std::move(bytes)});
  }
}

void Message::ClearHeader(uint32_t layer) {
  auto it = Place(headers, layer);
  if (it != headers.end() && it->layer == layer) headers.erase(it);
}

std::string Message::DebugString() const {
  std::string s = MessageTypeName(type);
  if (!function.empty()) absl::StrAppend(&s, " '", function, "'");
  if (!caller_name.empty()) absl::StrAppend(&s, " from '", caller_name, "'");
  return s;
}

void ForEachTensor(Value& value, const std::function<void(Tensor&)>& fn) {
  if (Tensor* t = value.mutable_tensor()) {
    fn(*t);
  } else if (Value::List* l = value.mutable_list()) {
    for (Value& e : *l) ForEachTensor(e, fn);
  } else if (Value::Dict* d = value.mutable_dict()) {
    for (auto& [k, e] : *d) ForEachTensor(e, fn);
  }
}

std::string DescribeTarget(const std::string& worker, const Message& message) {
  return DescribeTarget(worker, message.type, message.function);
}

std::string DescribeTarget(const std::string& worker, MessageType type,
                           const std::string& function) {
  std::optional<LayerTypeName> claimed;
  if (type != MessageType::kCall) {
    claimed = ClaimedTypeName(static_cast<uint32_t>(type));
  }
  if (type == MessageType::kCall ||
      (claimed.has_value() && claimed->names_function)) {
    return absl::StrCat("worker '", worker, "' function '", function, "'");
  }
  return absl::StrCat("worker '", worker, "' message ", MessageTypeName(type));
}

}  // namespace ferry::rpc
