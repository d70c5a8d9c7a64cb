// Writes the seed corpus for wire_fuzz: valid encodings of assorted Values
// and hostile variants. Usage: wire_corpus_gen OUTPUT_DIR
#include <string>
#include <vector>

#include "ferry/proto/tensor.pb.h"
#include "ferry/tensor/wire.h"
#include "ferry/tools/fuzz/corpus_writer.h"

namespace ferry {
namespace {

std::string Encode(const Value& v) {
  WireLimits limits;
  limits.max_depth = 1000;
  return EncodeValue(v, limits)->Flatten();
}

std::string Craft(const proto::WireMetadata& md, const std::string& payload) {
  std::string meta = md.SerializeAsString();
  std::string out = "FRY1";
  const uint32_t len = static_cast<uint32_t>(meta.size());
  out.append(reinterpret_cast<const char*>(&len), 4);
  out += meta;
  out.resize((out.size() + 63) / 64 * 64, '\0');
  out += payload;
  out.resize((out.size() + 63) / 64 * 64, '\0');
  return out;
}

proto::WireMetadata TensorMd(int dtype, std::vector<int64_t> sizes,
                             uint64_t nbytes) {
  proto::WireMetadata md;
  proto::TensorMeta* t = md.mutable_value()->mutable_tensor();
  t->set_dtype(static_cast<proto::WireDType>(dtype));
  for (int64_t s : sizes) t->add_sizes(s);
  t->set_nbytes(nbytes);
  return md;
}

fuzz::CorpusFiles Files() {
  fuzz::CorpusFiles files;
  for (DType d : kAllDTypes) {
    files.emplace_back(
        absl::StrCat("valid_tensor_", DTypeName(d)),
        Encode(Value::FromTensor(arange(6, DType::kInt64).to(d).view({2, 3}))));
  }
  Value::Dict dict;
  dict["a"] = Value::FromList(
      {Value::Int(-3), Value::Double(0.5), Value::String("s"),
       Value::FromBytes({"\x01\x02"}), Value::None(), Value::Bool(true)});
  dict["t"] = Value::FromTensor(zeros({0, 5}));
  dict["r"] =
      Value::FromRRef(RRefHandle{1, GlobalId(2, 3), GlobalId(4, 5), "T", ""});
  dict["m"] = Value::FromMessage(MessageValue{"x.Y", "\x08\x01"});
  dict["u"] = Value::FromTensor(full({}, 3, DType::kInt32));
  files.emplace_back("valid_nested", Encode(Value::FromDict(dict)));
  files.emplace_back("valid_none", Encode(Value()));
  Value deep = Value::Int(0);
  for (int i = 0; i < 70; ++i) deep = Value::FromList({deep});
  files.emplace_back("hostile_depth_70", Encode(deep));
  files.emplace_back("hostile_unknown_dtype",
                     Craft(TensorMd(42, {1}, 4), "abcd"));
  files.emplace_back("hostile_negative_dim",
                     Craft(TensorMd(1, {2, -3}, 0), ""));
  files.emplace_back("hostile_overflow",
                     Craft(TensorMd(2, {int64_t{1} << 61}, 0), ""));
  files.emplace_back("hostile_nbytes_mismatch",
                     Craft(TensorMd(1, {2}, 4), "abcd"));
  files.emplace_back(
      "hostile_huge_shape",
      Craft(TensorMd(8, {int64_t{1} << 40}, uint64_t{1} << 40), ""));
  std::string valid = Encode(Value::FromTensor(arange(100, DType::kFloat32)));
  files.emplace_back("hostile_truncated_payload",
                     valid.substr(0, valid.size() - 100));
  files.emplace_back("hostile_truncated_meta", valid.substr(0, 12));
  files.emplace_back("hostile_trailing", valid + std::string(64, '\0'));
  std::string bad_len = valid;
  bad_len[4] = '\xff';
  bad_len[7] = '\x7f';
  files.emplace_back("hostile_meta_len", bad_len);
  return files;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  return ferry::fuzz::CorpusMain(argc, argv, ferry::Files);
}
