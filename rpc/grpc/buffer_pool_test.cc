#include "ferry/rpc/grpc/buffer_pool.h"

#include <cstring>
#include <memory>

#include "gtest/gtest.h"
#include "ferry/tensor/storage.h"

namespace ferry::rpc::grpc_agent {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// The data pointer of a buffer of `n` bytes, released at once.
void* GetAndDrop(ReceiveBufferPool& pool, size_t n) {
  absl::StatusOr<Storage> s = pool.Get(n);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? s->data() : nullptr;
}

TEST(ReceiveBufferPool, AReturnedBufferServesTheNextOfAboutItsSize) {
  auto pool = ReceiveBufferPool::Create();
  absl::StatusOr<Storage> first = pool->Get(kMiB);
  ASSERT_TRUE(first.ok());
  void* data = first->data();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % kStorageAlignment, 0u);
  std::memset(data, 1, kMiB);  // Usable over its whole size.
  *first = Storage();          // Back to the pool.
  EXPECT_EQ(pool->stats().idle_buffers, 1u);
  absl::StatusOr<Storage> again = pool->Get(kMiB / 2 + 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), data);
  EXPECT_EQ(again->nbytes(), kMiB / 2 + 1);  // The size asked for.
  EXPECT_EQ(pool->stats().reused, 1u);
  EXPECT_EQ(pool->stats().allocated, 1u);
}

TEST(ReceiveBufferPool, HeldBuffersAreNotHandedOutTwice) {
  auto pool = ReceiveBufferPool::Create();
  absl::StatusOr<Storage> a = pool->Get(kMiB);
  ASSERT_TRUE(a.ok());
  Storage view = *a;  // A second handle (a tensor) keeps it out of the pool.
  *a = Storage();
  absl::StatusOr<Storage> b = pool->Get(kMiB);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->data(), view.data());
}

TEST(ReceiveBufferPool, TooLargeABufferIsNotReusedForASmallPayload) {
  auto pool = ReceiveBufferPool::Create();
  void* big = GetAndDrop(*pool, 4 * kMiB);
  EXPECT_NE(GetAndDrop(*pool, kMiB), big);  // 4 MiB > 2 x 1 MiB.
  EXPECT_EQ(pool->stats().reused, 0u);
  EXPECT_EQ(GetAndDrop(*pool, 3 * kMiB), big);
}

TEST(ReceiveBufferPool, AFullPoolEvictsTheLeastRecentlyReturned) {
  auto pool =
      ReceiveBufferPool::Create({.max_buffers = 2, .max_bytes = 64 * kMiB});
  void* one = GetAndDrop(*pool, 1 * kMiB);
  void* four = GetAndDrop(*pool, 4 * kMiB);
  void* sixteen = GetAndDrop(*pool, 16 * kMiB);  // Evicts the 1 MiB buffer.
  EXPECT_EQ(pool->stats().idle_buffers, 2u);
  EXPECT_EQ(pool->stats().idle_bytes, 20 * kMiB);
  EXPECT_EQ(GetAndDrop(*pool, 16 * kMiB), sixteen);
  EXPECT_EQ(GetAndDrop(*pool, 4 * kMiB), four);
  GetAndDrop(*pool, 1 * kMiB);
  EXPECT_EQ(pool->stats().reused, 2u);
  (void)one;
}

TEST(ReceiveBufferPool, IdleBytesStayUnderTheLimit) {
  auto pool =
      ReceiveBufferPool::Create({.max_buffers = 8, .max_bytes = 20 * kMiB});
  GetAndDrop(*pool, 8 * kMiB);
  GetAndDrop(*pool, 5 * kMiB);  // The 8 MiB buffer (<= 2 x 5 MiB).
  EXPECT_EQ(pool->stats().reused, 1u);
  void* twelve = GetAndDrop(*pool, 12 * kMiB);  // 8 + 12 = 20: both kept.
  EXPECT_EQ(pool->stats().idle_bytes, 20 * kMiB);
  GetAndDrop(*pool, 16 * kMiB);  // 8 + 12 + 16 > 20: the two older go.
  EXPECT_EQ(pool->stats().idle_buffers, 1u);
  EXPECT_EQ(pool->stats().idle_bytes, 16 * kMiB);
  EXPECT_NE(GetAndDrop(*pool, 12 * kMiB), twelve);
}

TEST(ReceiveBufferPool, ABufferOverTheByteLimitIsNeverKept) {
  auto pool =
      ReceiveBufferPool::Create({.max_buffers = 4, .max_bytes = 2 * kMiB});
  GetAndDrop(*pool, 1 * kMiB);
  GetAndDrop(*pool, 3 * kMiB);
  EXPECT_EQ(pool->stats().idle_buffers, 1u);  // Only the 1 MiB one.
  EXPECT_EQ(pool->stats().idle_bytes, 1 * kMiB);
}

TEST(ReceiveBufferPool, BuffersOutliveThePool) {
  auto pool = ReceiveBufferPool::Create();
  absl::StatusOr<Storage> s = pool->Get(kMiB);
  ASSERT_TRUE(s.ok());
  pool.reset();
  std::memset(s->data(), 3, kMiB);  // Still valid; freed when dropped.
  EXPECT_EQ(static_cast<char*>(s->data())[kMiB - 1], 3);
}

// Counts allocations; hands out CPU memory under another allocator's name.
class CountingAllocator final : public Allocator {
 public:
  absl::StatusOr<Storage> Allocate(size_t nbytes) override {
    ++calls;
    return GetCpuAllocator()->Allocate(nbytes);
  }
  Device device() const override { return Device::CPU(); }
  int calls = 0;
};

TEST(ReceiveBufferPool, AnotherAllocatorsMemoryIsNotPooled) {
  auto pool = ReceiveBufferPool::Create();
  CountingAllocator other;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<Storage> s = pool->Get(kMiB, &other);
    ASSERT_TRUE(s.ok());
  }
  EXPECT_EQ(other.calls, 3);
  EXPECT_EQ(pool->stats().idle_buffers, 0u);
}

}  // namespace
}  // namespace ferry::rpc::grpc_agent
