#include "ferry/tensor/tensor.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(DTypeTest, ItemSizesAndNames) {
  EXPECT_EQ(ItemSize(DType::kFloat32), 4u);
  EXPECT_EQ(ItemSize(DType::kFloat64), 8u);
  EXPECT_EQ(ItemSize(DType::kFloat16), 2u);
  EXPECT_EQ(ItemSize(DType::kBFloat16), 2u);
  EXPECT_EQ(ItemSize(DType::kInt64), 8u);
  EXPECT_EQ(ItemSize(DType::kInt32), 4u);
  EXPECT_EQ(ItemSize(DType::kInt8), 1u);
  EXPECT_EQ(ItemSize(DType::kUInt8), 1u);
  EXPECT_EQ(ItemSize(DType::kBool), 1u);
  for (DType d : kAllDTypes) EXPECT_EQ(DTypeFromName(DTypeName(d)), d);
  EXPECT_EQ(DTypeFromName("complex64"), std::nullopt);
}

TEST(DTypeTest, HalfConversion) {
  EXPECT_EQ(Half(1.0f).bits, 0x3c00);
  EXPECT_EQ(Half(-2.0f).bits, 0xc000);
  EXPECT_EQ(Half(65504.0f).bits, 0x7bff);
  EXPECT_EQ(Half(1e6f).bits, 0x7c00);                    // Overflow to inf.
  EXPECT_EQ(Half(5.960464477539063e-08f).bits, 0x0001);  // Smallest subnormal.
  EXPECT_EQ(Half(1e-9f).bits, 0x0000);
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(std::nanf("")))));
  for (uint32_t b = 0; b < 0x7c00; ++b) {  // Every finite positive half.
    Half h = Half::FromBits(static_cast<uint16_t>(b));
    ASSERT_EQ(Half(static_cast<float>(h)).bits, b) << b;
  }
  // Ties round to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(Half(1.0f + 0x1.0p-11f).bits, 0x3c00);
  EXPECT_EQ(Half(1.0f + 3 * 0x1.0p-11f).bits, 0x3c02);
}

TEST(DTypeTest, BFloat16Conversion) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(static_cast<float>(BFloat16(3.0f)), 3.0f);
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 0x1.0p-9f)),
            1.0f);  // Tie to even.
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::nanf("")))));
}

TEST(TensorTest, UndefinedTensor) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.ToString(), "Tensor(undefined)");
}

TEST(TensorTest, EmptyHasShapeStridesAndAlignment) {
  Tensor t = empty({2, 3, 4}, DType::kFloat64);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.dim(), 3);
  EXPECT_THAT(t.sizes(), ElementsAre(2, 3, 4));
  EXPECT_THAT(t.strides(), ElementsAre(12, 4, 1));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 192u);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % kStorageAlignment, 0u);
  Tensor scalar = empty({});
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.dim(), 0);
  Tensor none = empty({3, 0});
  EXPECT_EQ(none.numel(), 0);
}

// Small blocks are aligned by hand inside a malloc'd block, larger ones by
// aligned_alloc: both aligned, every byte writable (ASAN checks the ends).
TEST(TensorTest, StorageAlignedAndWritableAcrossAllocationPaths) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65},
                   size_t{4095}, size_t{4096}, size_t{4097}, size_t{70000}}) {
    absl::StatusOr<Storage> s = GetCpuAllocator()->Allocate(n);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->nbytes(), n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s->data()) % kStorageAlignment, 0u)
        << n << " bytes";
    std::memset(s->data(), 0x5a, n);
    if (n > 0) {
      EXPECT_EQ(static_cast<unsigned char*>(s->data())[n - 1], 0x5a);
    }
  }
}

TEST(TensorTest, HandlesShareElements) {
  Tensor a = zeros({4});
  Tensor b = a;
  b.add_(1.0);
  EXPECT_THAT(a.to_vector<float>(), ElementsAre(1, 1, 1, 1));
  EXPECT_TRUE(a.is_same(b));
}

TEST(TensorTest, Factories) {
  EXPECT_THAT(zeros({3}, DType::kInt32).to_vector<int32_t>(),
              ElementsAre(0, 0, 0));
  EXPECT_THAT(ones({2}, DType::kBool).to_vector<bool>(),
              ElementsAre(true, true));
  EXPECT_THAT(full({2}, 2.5, DType::kFloat16).to_vector<float>(),
              ElementsAre(2.5f, 2.5f));
  EXPECT_THAT(arange(4).to_vector<int64_t>(), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(arange(4).dtype(), DType::kInt64);
  EXPECT_THAT(arange(1.0, 2.0, 0.25, DType::kFloat64).to_vector<double>(),
              ElementsAre(1.0, 1.25, 1.5, 1.75));
  EXPECT_THAT(arange(3.0, 0.0, -1.0, DType::kInt8).to_vector<int8_t>(),
              ElementsAre(3, 2, 1));
  Tensor v = from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_THAT(v.sizes(), ElementsAre(2, 3));
  EXPECT_EQ(v.data<int32_t>()[5], 6);
}

TEST(TensorTest, RandIsSeededAndInRange) {
  Tensor a = rand({1000}, 42), b = rand({1000}, 42), c = rand({1000}, 43);
  EXPECT_TRUE(a.equal(b));
  EXPECT_FALSE(a.equal(c));
  for (float x : a.to_vector<float>()) {
    ASSERT_GE(x, 0.0f);
    ASSERT_LT(x, 1.0f);
  }
  const double mean = a.mean().item();
  EXPECT_NEAR(mean, 0.5, 0.05);
  Tensor n = randn({20000}, 7, DType::kFloat64);
  EXPECT_TRUE(n.equal(randn({20000}, 7, DType::kFloat64)));
  EXPECT_NEAR(n.mean().item(), 0.0, 0.05);
  EXPECT_NEAR(n.mul(n).mean().item(), 1.0, 0.05);
}

TEST(TensorTest, EveryDTypeConvertsThroughTo) {
  Tensor src = from_vector<double>({0, 1, 2, 100});
  for (DType d : kAllDTypes) {
    Tensor t = src.to(d);
    EXPECT_EQ(t.dtype(), d);
    std::vector<double> back = t.to_vector<double>();
    if (d == DType::kBool) {
      EXPECT_THAT(back, ElementsAre(0, 1, 1, 1)) << DTypeName(d);
    } else {
      EXPECT_THAT(back, ElementsAre(0, 1, 2, 100)) << DTypeName(d);
    }
  }
  // Out-of-range float to int saturates instead of being undefined.
  EXPECT_EQ(from_vector<float>({1e30f}).to(DType::kInt32).item<int32_t>(),
            std::numeric_limits<int32_t>::max());
  EXPECT_EQ(from_vector<float>({-3.7f}).to(DType::kInt64).item<int64_t>(), -3);
}

TEST(TensorTest, ViewsShareStorage) {
  Tensor a = arange(12).view({3, 4});
  Tensor row = a[1];
  EXPECT_THAT(row.to_vector<int64_t>(), ElementsAre(4, 5, 6, 7));
  EXPECT_TRUE(row.storage().is_same(a.storage()));
  Tensor rows = a(1, 3);
  EXPECT_THAT(rows.sizes(), ElementsAre(2, 4));
  EXPECT_EQ(rows.storage_offset(), 4);
  EXPECT_TRUE(rows.is_contiguous());
  Tensor cols = a.slice(1, 1, 4, 2);
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_THAT(cols.to_vector<int64_t>(), ElementsAre(1, 3, 5, 7, 9, 11));
  Tensor tr = a.t();
  EXPECT_THAT(tr.sizes(), ElementsAre(4, 3));
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_THAT(tr.contiguous().to_vector<int64_t>(),
              ElementsAre(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11));
  EXPECT_THAT(tr.reshape({-1}).sizes(), ElementsAre(12));
  EXPECT_THAT(a.view({2, -1}).sizes(), ElementsAre(2, 6));
  EXPECT_THAT(a.slice(0, -1, 100).to_vector<int64_t>(),
              ElementsAre(8, 9, 10, 11));
  row.fill_(0);
  EXPECT_EQ(a.to_vector<int64_t>()[5], 0);
  EXPECT_EQ(a[2][3].item<int64_t>(), 11);
}

TEST(TensorTest, PermuteUnsqueezeSqueezeAndLike) {
  Tensor a = arange(24).view({2, 3, 4});
  Tensor p = a.permute({2, 0, 1});
  EXPECT_THAT(p.sizes(), ElementsAre(4, 2, 3));
  EXPECT_THAT(p.strides(), ElementsAre(1, 12, 4));
  EXPECT_EQ(p[3][1][2].item<int64_t>(), a[1][2][3].item<int64_t>());
  Tensor u = a.unsqueeze(1);
  EXPECT_THAT(u.sizes(), ElementsAre(2, 1, 3, 4));
  EXPECT_TRUE(u.is_contiguous());
  EXPECT_THAT(a.unsqueeze(-1).sizes(), ElementsAre(2, 3, 4, 1));
  EXPECT_TRUE(u.squeeze(1).equal(a));
  EXPECT_TRUE(zeros_like(a).equal(zeros({2, 3, 4}, DType::kInt64)));
  EXPECT_EQ(ones_like(p).sum().item<int64_t>(), 24);
  EXPECT_THAT(full_like(p, 2).sizes(), ElementsAre(4, 2, 3));
  EXPECT_EQ(empty_like(a).dtype(), DType::kInt64);
}

TEST(TensorTest, CopyHandlesNonContiguousAndConversion) {
  Tensor a = arange(6, DType::kFloat32).view({2, 3});
  Tensor dst = zeros({3, 2}, DType::kInt32);
  dst.copy_(a.t());
  EXPECT_THAT(dst.to_vector<int32_t>(), ElementsAre(0, 3, 1, 4, 2, 5));
  Tensor dst_t =
      zeros({2, 3}, DType::kFloat64).t();  // Non-contiguous destination.
  dst_t.copy_(a.t());
  EXPECT_THAT(dst_t.to_vector<double>(), ElementsAre(0, 3, 1, 4, 2, 5));
  // Overlapping views of one storage.
  Tensor x = arange(5, DType::kInt64);
  x.slice(0, 1, 5).copy_(x.slice(0, 0, 4));
  EXPECT_THAT(x.to_vector<int64_t>(), ElementsAre(0, 0, 1, 2, 3));
}

TEST(TensorTest, ElementwiseArithmetic) {
  Tensor a = from_vector<float>({1, 2, 3, 4});
  Tensor b = from_vector<float>({4, 3, 2, 1});
  EXPECT_THAT((a + b).to_vector<float>(), ElementsAre(5, 5, 5, 5));
  EXPECT_THAT((a - b).to_vector<float>(), ElementsAre(-3, -1, 1, 3));
  EXPECT_THAT((a * b).to_vector<float>(), ElementsAre(4, 6, 6, 4));
  EXPECT_THAT((a / b).to_vector<float>(), ElementsAre(0.25, 2.0f / 3, 1.5, 4));
  EXPECT_THAT((a + 1).to_vector<float>(), ElementsAre(2, 3, 4, 5));
  EXPECT_THAT((a * 2).to_vector<float>(), ElementsAre(2, 4, 6, 8));
  EXPECT_THAT(a.neg().to_vector<float>(), ElementsAre(-1, -2, -3, -4));
  Tensor c = a.clone();
  c.add_(b).mul_(2.0).sub_(1.0).div_(from_vector<float>({1, 2, 3, 9}));
  EXPECT_THAT(c.to_vector<float>(), ElementsAre(9, 4.5, 3, 1));
  EXPECT_THAT(a.to_vector<float>(), ElementsAre(1, 2, 3, 4));  // Untouched.
  Tensor ints = from_vector<int64_t>({7, -7});
  EXPECT_THAT((ints / 2).to_vector<int64_t>(), ElementsAre(3, -3));
  Tensor h = full({3}, 1.5, DType::kFloat16);
  EXPECT_THAT((h + h).to_vector<float>(), ElementsAre(3, 3, 3));
  Tensor bf = full({2}, 2, DType::kBFloat16);
  EXPECT_THAT((bf * bf).to_vector<float>(), ElementsAre(4, 4));
  Tensor bools = from_vector<bool>({true, false});
  EXPECT_THAT((bools + bools).to_vector<bool>(), ElementsAre(true, false));
  // In place on a non-contiguous view writes through to the base.
  Tensor m = zeros({2, 3});
  m.t().add_(ones({3, 2}));
  EXPECT_DOUBLE_EQ(m.sum().item(), 6.0);
  // In place with an aliasing operand.
  Tensor s = arange(4, DType::kInt32);
  s.add_(s);
  EXPECT_THAT(s.to_vector<int32_t>(), ElementsAre(0, 2, 4, 6));
}

TEST(TensorTest, Reductions) {
  Tensor a = arange(6, DType::kFloat32).view({2, 3});
  EXPECT_EQ(a.sum().dim(), 0);
  EXPECT_DOUBLE_EQ(a.sum().item(), 15.0);
  EXPECT_DOUBLE_EQ(a.mean().item(), 2.5);
  EXPECT_EQ(arange(5).sum().dtype(), DType::kInt64);
  EXPECT_EQ(arange(5).sum().item<int64_t>(), 10);
  EXPECT_EQ(ones({7}, DType::kBool).sum().item<int64_t>(), 7);
  EXPECT_THAT(a.sum(0).to_vector<float>(), ElementsAre(3, 5, 7));
  EXPECT_THAT(a.sum(1).to_vector<float>(), ElementsAre(3, 12));
  EXPECT_THAT(a.sum(1, /*keepdim=*/true).sizes(), ElementsAre(2, 1));
  EXPECT_THAT(a.t().sum(-1).to_vector<float>(), ElementsAre(3, 5, 7));
}

TEST(TensorTest, Matmul) {
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<float>({7, 8, 9, 10, 11, 12}, {3, 2});
  Tensor c = a.matmul(b);
  EXPECT_THAT(c.sizes(), ElementsAre(2, 2));
  EXPECT_THAT(c.to_vector<float>(), ElementsAre(58, 64, 139, 154));
  // Non-contiguous operands and float64.
  Tensor d = b.t().to(DType::kFloat64).matmul(a.t().to(DType::kFloat64));
  EXPECT_THAT(d.to_vector<double>(), ElementsAre(58, 139, 64, 154));
  EXPECT_TRUE(zeros({2, 0}).matmul(zeros({0, 3})).equal(zeros({2, 3})));
}

TEST(TensorTest, EqualAndAllclose) {
  Tensor a = from_vector<double>({1, 2, 3});
  EXPECT_TRUE(a.equal(a.clone()));
  EXPECT_FALSE(a.equal(a.to(DType::kFloat32)));  // Different dtype.
  EXPECT_FALSE(a.equal(a.view({3, 1})));
  EXPECT_TRUE(a.allclose(a + 1e-9));
  EXPECT_FALSE(a.allclose(a + 1e-3));
  EXPECT_TRUE(a.allclose(a.to(DType::kFloat32)));
  Tensor nan = from_vector<float>({std::nanf("")});
  EXPECT_FALSE(nan.equal(nan));
  EXPECT_FALSE(nan.allclose(nan));
}

TEST(TensorTest, ToStringTruncates) {
  Tensor a = arange(10).view({2, 5});
  EXPECT_EQ(a.ToString(2),
            "Tensor(shape=[2, 5], dtype=int64, device=cpu)\n[[0, 1, ..., 3, "
            "4], [5, 6, ..., 8, 9]]");
  EXPECT_THAT(full({1}, 0.5).ToString(), HasSubstr("[0.5]"));
  EXPECT_THAT(ones({1}, DType::kBool).ToString(), HasSubstr("[true]"));
}

TEST(TensorTest, CheckShapeRejectsBadShapes) {
  int64_t nbytes = -1;
  EXPECT_TRUE(CheckShape({2, 3}, DType::kFloat32, &nbytes).ok());
  EXPECT_EQ(nbytes, 24);
  EXPECT_THAT(std::string(CheckShape({2, -3}, DType::kFloat32).message()),
              HasSubstr("dimension 1 is negative"));
  EXPECT_THAT(
      std::string(CheckShape({int64_t{1} << 40, int64_t{1} << 30}, DType::kInt8)
                      .message()),
      HasSubstr("overflows"));
  EXPECT_THAT(
      std::string(CheckShape({int64_t{1} << 62}, DType::kFloat32).message()),
      HasSubstr("overflows"));
  EXPECT_TRUE(
      CheckShape({int64_t{1} << 62, int64_t{1} << 62, 0}, DType::kFloat32)
          .ok());
  EXPECT_FALSE(CheckShape(std::vector<int64_t>(65, 1), DType::kFloat32).ok());
}

TEST(TensorTest, FromStorageValidatesBounds) {
  Storage s = *GetCpuAllocator()->Allocate(64);
  EXPECT_TRUE(Tensor::FromStorage(s, DType::kFloat32, {4, 4}, {4, 1}).ok());
  EXPECT_FALSE(Tensor::FromStorage(s, DType::kFloat32, {4, 5}, {5, 1}).ok());
  EXPECT_FALSE(Tensor::FromStorage(s, DType::kFloat32, {4}, {1}, 13).ok());
  EXPECT_FALSE(Tensor::FromStorage(s, DType::kFloat32, {4}, {-1}, 3).ok());
  EXPECT_FALSE(Tensor::FromStorage(s, DType::kFloat32, {4}, {1, 1}).ok());
  EXPECT_TRUE(Tensor::FromStorage(s, DType::kFloat32, {0, 100}, {100, 1}).ok());
}

TEST(TensorTest, StorageWrapReleasesOwnerWithLastHandle) {
  auto flag = std::make_shared<int>(0);
  std::weak_ptr<int> watch = flag;
  static char bytes[16];
  {
    Storage s = Storage::Wrap(bytes, sizeof(bytes), Device::CPU(), flag);
    flag.reset();
    Tensor t = *Tensor::FromStorage(s, DType::kUInt8, {16}, {1});
    s = Storage();
    EXPECT_FALSE(watch.expired());
    EXPECT_EQ(t.data_ptr(), bytes);
  }
  EXPECT_TRUE(watch.expired());
}

TEST(TensorDeathTest, PreconditionsAbortWithMessage) {
  EXPECT_DEATH(zeros({2}) + zeros({3}), "add: shape mismatch");
  EXPECT_DEATH(zeros({2}, DType::kInt32) + zeros({2}), "add: dtype mismatch");
  EXPECT_DEATH(zeros({2, 3}).t().view({6}), "not contiguous");
  EXPECT_DEATH(empty({-1}), "negative");
  EXPECT_DEATH(arange(3) / 0, "division by zero");
  EXPECT_DEATH(zeros({2}).data<double>(), "expected dtype float64");
  EXPECT_DEATH(zeros({2, 3}).squeeze(0), "has size 2, not 1");
  EXPECT_DEATH(zeros({2, 3}).permute({0, 0}), "repeated");
}

TEST(TensorTest, InPlaceOpsBumpTheSharedVersion) {
  Tensor t = zeros({4});
  Tensor view = t.slice(0, 1, 3);
  const uint64_t v0 = t.version();
  view.add_(1.0);
  EXPECT_EQ(t.version(), v0 + 1);
  EXPECT_EQ(view.version(), t.version());
  t.fill_(2);
  t.copy_(ones({4}));
  t.mul_(ones({4}));
  EXPECT_EQ(t.version(), v0 + 4);
  Tensor out = t.add(1.0);  // Out of place: no bump on t.
  EXPECT_EQ(t.version(), v0 + 4);
  EXPECT_EQ(out.version(), 0u);
}

struct TestMeta : AutogradMetaInterface {
  int value = 7;
};

TEST(TensorTest, AutogradMetaSlotBelongsToTheTensorObject) {
  Tensor t = zeros({4});
  EXPECT_EQ(t.autograd_meta(), nullptr);
  t.set_autograd_meta(std::make_shared<TestMeta>());
  Tensor copy = t;  // Same object: same state.
  ASSERT_NE(copy.autograd_meta(), nullptr);
  EXPECT_EQ(static_cast<TestMeta*>(copy.autograd_meta())->value, 7);
  EXPECT_EQ(t.view({2, 2}).autograd_meta(), nullptr);  // New object.
  EXPECT_EQ(t.clone().autograd_meta(), nullptr);
}

}  // namespace
}  // namespace ferry
