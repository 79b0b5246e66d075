// The allocator's accounting counts only bytes that tensors really hold: an allocation that
// fails (out of memory, a driver error) leaves every counter, peak and the reserved total as
// they were, and a later successful allocation is counted normally.

#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

#include "meshtrain/tensor/allocator.h"

namespace meshtrain {
namespace {

// Host memory that refuses every request above `limit` bytes, the way cudaMalloc does when the
// device is full.
class LimitedAllocator final : public Allocator {
 public:
  explicit LimitedAllocator(size_t limit) : Allocator(Device::Cpu), limit_(limit) {}
  ~LimitedAllocator() override { release_cached(); }

 protected:
  void* raw_allocate(size_t bytes) override {
    if (bytes > limit_) throw std::runtime_error("out of memory (test allocator)");
    return std::malloc(bytes);
  }
  void raw_release(void* ptr, size_t) override { std::free(ptr); }

 private:
  size_t limit_;
};

struct Snapshot {
  std::array<size_t, kMemoryCategories> current{}, peak{}, at_peak{};
  size_t current_total = 0, peak_total = 0, reserved = 0;

  explicit Snapshot(const Allocator& a) {
    const MemoryTracker& t = a.tracker();
    for (size_t i = 0; i < kMemoryCategories; ++i) {
      const auto c = static_cast<MemoryCategory>(i);
      current[i] = t.current(c);
      peak[i] = t.peak(c);
      at_peak[i] = t.at_peak(c);
    }
    current_total = t.current_total();
    peak_total = t.peak_total();
    reserved = a.reserved();
  }
  bool operator==(const Snapshot&) const = default;
};

TEST(Allocator, FailedAllocationLeavesAccountingUnchanged) {
  LimitedAllocator alloc(1 << 20);
  auto held = alloc.allocate(4096, MemoryCategory::Parameters);
  const Snapshot before(alloc);
  EXPECT_THROW(alloc.allocate(size_t{64} << 20, MemoryCategory::Activations), std::runtime_error);
  const Snapshot after(alloc);
  EXPECT_EQ(after.current, before.current);
  EXPECT_EQ(after.peak, before.peak) << "a failed allocation raised a peak";
  EXPECT_EQ(after.at_peak, before.at_peak);
  EXPECT_EQ(after.current_total, before.current_total);
  EXPECT_EQ(after.peak_total, before.peak_total);
  EXPECT_EQ(after.reserved, before.reserved);
}

TEST(Allocator, CountsNormallyAfterAFailure) {
  LimitedAllocator alloc(1 << 20);
  EXPECT_THROW(alloc.allocate(size_t{64} << 20, MemoryCategory::Workspace), std::runtime_error);
  {
    auto b = alloc.allocate(4096, MemoryCategory::Workspace);
    EXPECT_EQ(alloc.tracker().current(MemoryCategory::Workspace), 4096u);
    EXPECT_EQ(alloc.tracker().peak_total(), 4096u);
    EXPECT_EQ(alloc.reserved(), 4096u);
  }
  EXPECT_EQ(alloc.tracker().current_total(), 0u);
  EXPECT_EQ(alloc.reserved(), 4096u);  // cached for reuse
}

// Freed blocks of one size are reused oldest first, as they always were: a CPU run's buffers
// keep the addresses they had, whatever the cache's structure.
TEST(Allocator, ReusesTheOldestFreedBlockOfASizeFirst) {
  HostAllocator alloc;
  auto a = alloc.allocate(4096, MemoryCategory::Activations);
  auto b = alloc.allocate(4000, MemoryCategory::Activations);  // rounds to the same size
  void* const first = a->data();
  void* const second = b->data();
  a.reset();
  b.reset();
  auto c = alloc.allocate(4096, MemoryCategory::Workspace);
  auto d = alloc.allocate(4096, MemoryCategory::Workspace);
  EXPECT_EQ(c->data(), first);
  EXPECT_EQ(d->data(), second);
  EXPECT_EQ(alloc.reserved(), 8192u);
  EXPECT_EQ(alloc.tracker().current(MemoryCategory::Workspace), 8192u);
  EXPECT_EQ(alloc.tracker().current(MemoryCategory::Activations), 0u);
}

// A planner's dry run past its limit: the allocation that crossed it throws, and its bytes
// (counted for the peak) are given back, whether the block came from the cache or was new.
TEST(Allocator, PastTheLimitTheBytesAreGivenBack) {
  MetaAllocator alloc(Device::Cpu);
  alloc.tracker().set_limit(6000);
  auto held = alloc.allocate(4096, MemoryCategory::Parameters);
  EXPECT_THROW(alloc.allocate(4096, MemoryCategory::Activations), MemoryLimitExceeded);  // new
  EXPECT_EQ(alloc.tracker().current_total(), 4096u);
  EXPECT_EQ(alloc.tracker().peak_total(), 8192u);
  EXPECT_EQ(alloc.reserved(), 8192u);
  EXPECT_THROW(alloc.allocate(4096, MemoryCategory::Activations), MemoryLimitExceeded);  // cached
  EXPECT_EQ(alloc.tracker().current_total(), 4096u);
  EXPECT_EQ(alloc.reserved(), 8192u) << "the cached block was lost or taken twice";
  held.reset();
  EXPECT_EQ(alloc.tracker().current_total(), 0u);
}

// What an out-of-memory message reports: the bytes held now, not the peaks of another phase.
TEST(MemoryTracker, InUseReportsCurrentBytes) {
  MemoryTracker t;
  t.on_allocate(MemoryCategory::Activations, 3 << 20);
  t.on_release(MemoryCategory::Activations, 3 << 20);
  t.on_allocate(MemoryCategory::Parameters, 1 << 20);
  EXPECT_NE(t.in_use().find("parameters 1.00 MiB"), std::string::npos) << t.in_use();
  EXPECT_NE(t.in_use().find("activations 0 B"), std::string::npos) << t.in_use();
  EXPECT_NE(t.in_use().find("total 1.00 MiB"), std::string::npos) << t.in_use();
}

}  // namespace
}  // namespace meshtrain
