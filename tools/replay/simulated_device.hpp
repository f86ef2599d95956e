// SPDX-License-Identifier: Apache-2.0
// tools/replay/simulated_device.hpp: a device of a given capacity, simulated in host address
// space, so that a trace recorded on an 80 GiB GPU runs out of memory and fragments the same way
// on a laptop.
//
// `simulated_device` hands out addresses from large anonymous mappings made with MAP_NORESERVE:
// address space that costs nothing until a page is written. The replay never writes to the blocks
// it gets, so a composition that reserves 60 GiB commits no memory. Peers that keep bookkeeping
// inside their blocks (std::pmr and thrust::mr pools) and the defragmenter (which copies blocks for
// real) may write: the mappings are readable and writable, and those pages are committed until
// `reset()` discards them.
//
// - Capacity: a request is refused (nullptr, counted in `refusals()`) when the bytes held would go
//   above `capacity`. That is the only limit: when the address space mapped so far is too
//   fragmented for a request, another mapping is made, so the simulated device never fails for a
//   reason a real one would not have.
// - Accounting: `reserved()` and `peak_reserved()` count the bytes asked for (what a `cudaMalloc`
//   caller holds), `allocations()` / `deallocations()` the calls. Blocks are aligned to at least
//   256 B (the CUDA guarantee), at most 1 GiB; a block's address range is its size rounded up to
//   256 B, so neighbouring blocks never share a granule.
// - Placement: best fit over the free address ranges (O(log n)), freed ranges coalesce, so
//   addresses depend only on the sequence of calls: two runs of the same calls get the same
//   offsets from the first mapping.
// - Checking (`set_checking(true)`, the replay's figures run): the device also keeps its live
//   allocations, so that `holds(p, n)` says whether a block a composition served lies inside one
//   of them, and a free of an address it never handed out (or with another size) is refused and
//   recorded as a fault (`faults()`, `first_fault()`) instead of corrupting its free lists.
// - Edges: `upstream()` is an alloy upstream (copyable, refers to the device), `pmr_resource()` a
//   `std::pmr::memory_resource` that throws `std::bad_alloc` when refused.
// - Not thread-safe; one replay at a time.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory_resource>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <alloy/block.hpp>

namespace alloy::replay {

inline constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();

class simulated_device {
 public:
  static constexpr std::size_t granule = 256;
  static constexpr std::size_t max_alignment = std::size_t{1} << 30;

  explicit simulated_device(std::size_t capacity = unlimited) : capacity_(capacity) {}
  simulated_device(const simulated_device&) = delete;
  simulated_device& operator=(const simulated_device&) = delete;
  ~simulated_device() {
    for (const mapping& m : mappings_) munmap(reinterpret_cast<void*>(m.base), m.size);
  }

  /// A block of `bytes` aligned to `alignment` (a power of two), or nullptr when the device would
  /// go above its capacity (or the host has no address space left).
  void* allocate(std::size_t bytes, std::size_t alignment) noexcept {
    alignment = std::max(alignment, granule);
    if (alignment > max_alignment || (alignment & (alignment - 1)) != 0 || bytes > capacity_ - reserved_ ||
        bytes > std::numeric_limits<std::size_t>::max() - max_alignment) {
      ++refusals_;
      return nullptr;
    }
    const std::size_t span = round_up(std::max<std::size_t>(bytes, 1), granule);
    std::uintptr_t at = find(span, alignment);
    if (at == 0) {
      if (!map_more(span + alignment)) {
        ++refusals_;
        return nullptr;
      }
      at = find(span, alignment);
    }
    if (checking_) {
      try {
        live_.emplace(at, bytes);
      } catch (...) {  // out of host memory for the check: give the range back, refuse
        insert_free(at, span);
        ++refusals_;
        return nullptr;
      }
    }
    reserved_ += bytes;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    ++allocations_;
    return reinterpret_cast<void*>(at);
  }

  void deallocate(void* p, std::size_t bytes) noexcept {
    if (p == nullptr) return;
    if (checking_) {
      const auto it = live_.find(reinterpret_cast<std::uintptr_t>(p));
      if (it == live_.end() || it->second != bytes) {
        fault(it == live_.end() ? "freed an address the device never handed out (or freed it twice)"
                                : "freed a device block with another size than it asked for");
        return;
      }
      live_.erase(it);
    }
    const std::size_t span = round_up(std::max<std::size_t>(bytes, 1), granule);
    insert_free(reinterpret_cast<std::uintptr_t>(p), span);
    reserved_ -= bytes;
    ++deallocations_;
  }

  /// Starts afresh for the next composition: every address is free again (whatever is still
  /// held is forgotten), pages written so far are discarded, counters restart.
  void reset() noexcept {
    by_address_.clear();
    by_size_.clear();
    for (const mapping& m : mappings_) {
      madvise(reinterpret_cast<void*>(m.base), m.size, MADV_DONTNEED);
      insert_free(m.base, m.size);
    }
    reserved_ = peak_reserved_ = allocations_ = deallocations_ = refusals_ = faults_ = 0;
    live_.clear();
    first_fault_.clear();
  }

  /// Keep the live allocations from now on (after `reset()`), for `holds` and the free check.
  void set_checking(bool on) noexcept { checking_ = on; }
  /// Whether `[p, p + bytes)` lies inside one live allocation (only while checking; else true).
  bool holds(const void* p, std::size_t bytes) const noexcept {
    if (!checking_) return true;
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    auto it = live_.upper_bound(at);
    if (it == live_.begin()) return false;
    --it;
    return at - it->first <= it->second && bytes <= it->second - (at - it->first);
  }
  std::size_t faults() const noexcept { return faults_; }
  const std::string& first_fault() const noexcept { return first_fault_; }
  void set_capacity(std::size_t capacity) noexcept { capacity_ = capacity; }
  /// Map and unmap calls: none, a device of segments has no virtual memory.
  std::size_t map_calls() const noexcept { return 0; }

  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t reserved() const noexcept { return reserved_; }
  std::size_t peak_reserved() const noexcept { return peak_reserved_; }
  std::size_t allocations() const noexcept { return allocations_; }
  std::size_t deallocations() const noexcept { return deallocations_; }
  std::size_t refusals() const noexcept { return refusals_; }
  void reset_peak() noexcept { peak_reserved_ = reserved_; }

 private:
  struct mapping {
    std::uintptr_t base;
    std::size_t size;
  };

  static std::size_t round_up(std::size_t n, std::size_t to) noexcept { return (n + to - 1) / to * to; }

  /// Best fit: the smallest free range that holds `span` bytes at `alignment`; 0 if none.
  std::uintptr_t find(std::size_t span, std::size_t alignment) noexcept {
    for (std::size_t need : {span, span + alignment - granule}) {
      for (auto it = by_size_.lower_bound({need, 0}); it != by_size_.end(); ++it) {
        const auto [size, base] = *it;
        const std::uintptr_t start = (base + alignment - 1) & ~(static_cast<std::uintptr_t>(alignment) - 1);
        if (start - base + span <= size) {
          take(base, size, start, span);
          return start;
        }
        if (need == span) break;  // the smallest candidate is misaligned: look for room to align
      }
    }
    return 0;
  }

  void take(std::uintptr_t base, std::size_t size, std::uintptr_t start, std::size_t span) noexcept {
    erase_free(base, size);
    if (start > base) insert_range(base, start - base);
    const std::uintptr_t end = start + span;
    if (end < base + size) insert_range(end, base + size - end);
  }

  void insert_range(std::uintptr_t base, std::size_t size) noexcept {
    try {
      by_address_.emplace(base, size);
      by_size_.emplace(size, base);
    } catch (...) {  // out of host memory for bookkeeping: the range is lost, nothing breaks
    }
  }
  void erase_free(std::uintptr_t base, std::size_t size) noexcept {
    by_address_.erase(base);
    by_size_.erase({size, base});
  }

  /// Returns a range to the free lists, merging it with free neighbours.
  void insert_free(std::uintptr_t base, std::size_t size) noexcept {
    auto next = by_address_.lower_bound(base);
    if (next != by_address_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == base) {
        base = prev->first;
        size += prev->second;
        erase_free(prev->first, prev->second);
        next = by_address_.lower_bound(base);
      }
    }
    if (next != by_address_.end() && base + size == next->first) {
      size += next->second;
      erase_free(next->first, next->second);
    }
    insert_range(base, size);
  }

  /// Maps at least `bytes` more address space (aligned to `max_alignment`).
  bool map_more(std::size_t bytes) noexcept {
    const std::size_t usual = std::min<std::size_t>(round_up(std::min(capacity_, std::size_t{1} << 36), max_alignment),
                                                    std::size_t{1} << 36);  // capacity, at most 64 GiB
    const std::size_t size = round_up(std::max({bytes, usual, max_alignment}), max_alignment);
    const std::size_t padded = size + max_alignment;
    void* raw = mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return false;
    const auto start = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t base = (start + max_alignment - 1) & ~(static_cast<std::uintptr_t>(max_alignment) - 1);
    if (base > start) munmap(raw, base - start);
    if (base + size < start + padded) munmap(reinterpret_cast<void*>(base + size), start + padded - base - size);
    try {
      mappings_.push_back({base, size});
    } catch (...) {
      munmap(reinterpret_cast<void*>(base), size);
      return false;
    }
    insert_free(base, size);
    return true;
  }

  void fault(const char* what) noexcept {
    if (faults_++ == 0) {
      try {
        first_fault_ = what;
      } catch (...) {}
    }
  }

  std::size_t capacity_;
  bool checking_ = false;
  std::map<std::uintptr_t, std::size_t> live_;  // while checking: live allocations, base -> bytes
  std::size_t faults_ = 0;
  std::string first_fault_;
  std::vector<mapping> mappings_;
  std::map<std::uintptr_t, std::size_t> by_address_;          // free ranges: base -> size
  std::set<std::pair<std::size_t, std::uintptr_t>> by_size_;  // free ranges: (size, base)
  std::size_t reserved_ = 0;
  std::size_t peak_reserved_ = 0;
  std::size_t allocations_ = 0;
  std::size_t deallocations_ = 0;
  std::size_t refusals_ = 0;
};

/// The device as an alloy upstream: held by value in every part of a composition, it refers to
/// one `simulated_device`, which must outlive it.
class device_upstream {
 public:
  static constexpr bool host_accessible = true;  // host pages: the defragmenter copies with memcpy
  static constexpr bool device_accessible = false;

  device_upstream() = default;
  explicit device_upstream(simulated_device& device) noexcept : device_(&device) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    void* p = device_->allocate(bytes, alignment);
    return p == nullptr ? block{} : block{p, bytes};
  }
  void deallocate(block b) noexcept { device_->deallocate(b.ptr, b.size); }

  simulated_device& device() const noexcept { return *device_; }
  friend bool operator==(const device_upstream& a, const device_upstream& b) noexcept { return a.device_ == b.device_; }

 private:
  simulated_device* device_ = nullptr;
};

/// The device as a `std::pmr::memory_resource` (upstream of the std::pmr peers).
class device_pmr_resource final : public std::pmr::memory_resource {
 public:
  explicit device_pmr_resource(simulated_device& device) noexcept : device_(&device) {}

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    void* p = device_->allocate(bytes, alignment);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) override { device_->deallocate(p, bytes); }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }

  simulated_device* device_;
};

}  // namespace alloy::replay
