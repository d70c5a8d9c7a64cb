#include "ferry/tensor/dlpack.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(DLPackTest, RoundTripSharesMemory) {
  for (DType d : kAllDTypes) {
    Tensor t =
        arange(6, d == DType::kBool ? DType::kInt64 : d).to(d).view({2, 3});
    absl::StatusOr<DLManagedTensor*> m = ToDLPack(t);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ((*m)->dl_tensor.data, t.data_ptr());
    EXPECT_EQ((*m)->dl_tensor.ndim, 2);
    EXPECT_EQ((*m)->dl_tensor.device.device_type, kDLCPU);
    absl::StatusOr<Tensor> back = FromDLPack(*m);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->data_ptr(), t.data_ptr()) << DTypeName(d);
    EXPECT_EQ(back->dtype(), d);
    EXPECT_TRUE(back->equal(t)) << DTypeName(d);
  }
}

TEST(DLPackTest, ExportKeepsStorageAliveAndPreservesStrides) {
  Tensor base = arange(12, DType::kFloat32).view({3, 4});
  Tensor nc =
      base.t().slice(0, 1, 3);  // 2x3 view with offset 1, strides {1, 4}.
  DLManagedTensor* m = *ToDLPack(nc);
  EXPECT_THAT(std::vector<int64_t>(m->dl_tensor.shape, m->dl_tensor.shape + 2),
              ElementsAre(2, 3));
  EXPECT_THAT(
      std::vector<int64_t>(m->dl_tensor.strides, m->dl_tensor.strides + 2),
      ElementsAre(1, 4));
  const long before = base.storage().use_count();
  Tensor back = *FromDLPack(m);
  EXPECT_EQ(back.data_ptr(), nc.data_ptr());
  EXPECT_THAT(back.to_vector<float>(), ElementsAre(1, 5, 9, 2, 6, 10));
  back.fill_(-1);  // Writes through to the original.
  EXPECT_EQ(base[0][1].item(), -1);
  EXPECT_GE(base.storage().use_count(), before);
}

struct Foreign {
  std::vector<double> data{1, 2, 3, 4};
  int64_t shape[2] = {2, 2};
  int* deleted;
  DLManagedTensor managed{};
};

DLManagedTensor* MakeForeign(int* deleted) {
  auto* f = new Foreign();
  f->deleted = deleted;
  f->managed.dl_tensor.data = f->data.data();
  f->managed.dl_tensor.device = {kDLCPU, 0};
  f->managed.dl_tensor.ndim = 2;
  f->managed.dl_tensor.dtype = {kDLFloat, 64, 1};
  f->managed.dl_tensor.shape = f->shape;
  f->managed.dl_tensor.strides = nullptr;  // Compact row-major.
  f->managed.manager_ctx = f;
  f->managed.deleter = [](DLManagedTensor* self) {
    auto* foreign = static_cast<Foreign*>(self->manager_ctx);
    ++*foreign->deleted;
    delete foreign;
  };
  return &f->managed;
}

TEST(DLPackTest, ImportCallsDeleterOnceWhenLastHandleGoes) {
  int deleted = 0;
  DLManagedTensor* m = MakeForeign(&deleted);
  const void* data = m->dl_tensor.data;
  {
    Tensor t = *FromDLPack(m);
    EXPECT_EQ(t.data_ptr(), data);
    EXPECT_TRUE(t.is_contiguous());
    Tensor view = t[1];
    t = Tensor();
    EXPECT_EQ(deleted, 0);
    EXPECT_EQ(view.sum().item(), 7.0);
  }
  EXPECT_EQ(deleted, 1);
}

TEST(DLPackTest, BadCapsulesAreErrorsAndStillReleased) {
  EXPECT_FALSE(FromDLPack(nullptr).ok());
  struct Case {
    void (*mutate)(DLTensor*);
    absl::StatusCode code;
    const char* message;
  };
  static int64_t neg_shape[2] = {2, -2};
  static int64_t neg_strides[2] = {-2, 1};
  const Case cases[] = {
      {[](DLTensor* t) { t->dtype.lanes = 4; },
       absl::StatusCode::kInvalidArgument, "lanes = 4"},
      {[](DLTensor* t) {
         t->dtype = {kDLComplex, 64, 1};
       },
       absl::StatusCode::kInvalidArgument,
       "unsupported dtype (code 5, bits 64)"},
      {[](DLTensor* t) { t->shape = neg_shape; },
       absl::StatusCode::kInvalidArgument, "negative"},
      {[](DLTensor* t) { t->strides = neg_strides; },
       absl::StatusCode::kInvalidArgument, "negative stride -2"},
      {[](DLTensor* t) { t->ndim = -1; }, absl::StatusCode::kInvalidArgument,
       "invalid ndim"},
      {[](DLTensor* t) { t->device.device_type = kDLOpenCL; },
       absl::StatusCode::kUnimplemented, "unsupported device type 4"},
  };
  for (const Case& c : cases) {
    int deleted = 0;
    DLManagedTensor* m = MakeForeign(&deleted);
    c.mutate(&m->dl_tensor);
    absl::StatusOr<Tensor> t = FromDLPack(m);
    EXPECT_EQ(t.status().code(), c.code) << c.message;
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(c.message));
    EXPECT_EQ(deleted, 1) << c.message;
  }
}

TEST(DLPackTest, CudaDeviceIsCarriedThrough) {
  int deleted = 0;
  DLManagedTensor* m = MakeForeign(&deleted);
  m->dl_tensor.device = {kDLCUDA, 3};
  Tensor t = *FromDLPack(m);
  EXPECT_TRUE(t.device() == Device::CUDA(3));
  DLManagedTensor* out = *ToDLPack(t);
  EXPECT_EQ(out->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(out->dl_tensor.device.device_id, 3);
  out->deleter(out);
  t = Tensor();
  EXPECT_EQ(deleted, 1);
}

}  // namespace
}  // namespace ferry
