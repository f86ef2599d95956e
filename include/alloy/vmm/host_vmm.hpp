// SPDX-License-Identifier: Apache-2.0
// alloy/vmm/host_vmm.hpp: the `virtual_memory` backend on the host (docs/design.md#virtual-memory),
// with real memory, so that everything built on virtual memory is tested without a GPU.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <new>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <alloy/detail/align.hpp>
#include <alloy/device.hpp>
#include <alloy/vmm/virtual_memory.hpp>

namespace alloy {

/// `host_vmm`: host memory through the operating system's virtual memory, as `cuda_vmm` does it
/// on a device.
///
/// - Physical memory is one `memfd` (anonymous shared-memory file), truncated to a large sparse
///   size at construction (the smaller of `capacity` and 1 TiB; it is extended when more offsets
///   are ever needed). `create(bytes)` hands out a range of file offsets (released ranges are
///   recycled, lowest offset first, and coalesce), and refuses when `physical_bytes() + bytes`
///   would pass `capacity`; no system call happens, pages come when first touched.
///   `release(piece)` punches the range out of the file
///   (`fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`), so the host really gets it back.
/// - `reserve(bytes)` is `mmap(PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)`, trimmed
///   to start on a multiple of the granularity; `unreserve` is `munmap`.
/// - `map(at, piece)` is `mmap(MAP_FIXED | MAP_SHARED, PROT_READ | PROT_WRITE)` of the piece's
///   file range over the reserved addresses; `unmap(at, bytes)` maps `PROT_NONE` anonymous
///   memory (`MAP_FIXED | MAP_NORESERVE`) over them, so the addresses stay reserved. A piece
///   mapped, unmapped and mapped again elsewhere keeps its content (it lives in the file).
/// - `options`: `capacity` (physical bytes at most; default unlimited), `granularity` (a power of
///   two at least the page size, others are rounded up to one; default 2 MiB as CUDA's; tests
///   use 64 KiB), `device` (a simulated device label: each call runs with it current,
///   `basic_scoped_device<simulated_devices>`, and fails when it cannot be; -1, the default: none).
/// - Failure: every call is noexcept; a failed system call (or host memory for the offset table
///   running out) is an empty result or `false`, with nothing leaked. A failed `mmap(MAP_FIXED)`
///   may leave the addresses it covered unreserved (the kernel's rule); they are not reused.
/// - Metadata: the free offset ranges in a `std::map` (one entry per gap).
/// - Counters (`calls()`): creates, releases, maps, unmaps, reserves, unreserves, failures.
/// - Thread safety: none. Movable, not copyable (it owns the file); several users share one
///   through `vmm_ref<host_vmm>`, several threads through `synchronized_vmm<host_vmm>`.
/// - Memory kind: host only.
class host_vmm {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;

  struct options {
    std::size_t capacity = std::numeric_limits<std::size_t>::max();  ///< physical bytes at most
    std::size_t granularity = std::size_t{2} << 20;                  ///< power of two >= page size
    int device = -1;  ///< simulated device the calls run on (tests); -1: none
  };

  /// What the backend was asked, for tests and statistics.
  struct call_counts {
    std::size_t creates = 0;     ///< physical pieces created
    std::size_t releases = 0;    ///< physical pieces released
    std::size_t maps = 0;        ///< successful maps
    std::size_t unmaps = 0;      ///< unmaps
    std::size_t reserves = 0;    ///< address ranges reserved
    std::size_t unreserves = 0;  ///< address ranges given back
    std::size_t failures = 0;    ///< calls that failed (capacity refusals included)
  };

  host_vmm() noexcept : host_vmm(options{}) {}
  explicit host_vmm(options opts) noexcept : opts_(normalised(opts)) {
    fd_ = ::memfd_create("alloy-host-vmm", MFD_CLOEXEC);
    if (fd_ < 0) return;
    const std::size_t initial =
        std::min(detail::round_up(std::min(opts_.capacity, max_initial_file), opts_.granularity), max_initial_file);
    if (!grow_file(initial == 0 ? max_initial_file : initial)) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  host_vmm(const host_vmm&) = delete;
  host_vmm& operator=(const host_vmm&) = delete;
  host_vmm(host_vmm&& other) noexcept
      : opts_(other.opts_),
        fd_(std::exchange(other.fd_, -1)),
        file_size_(std::exchange(other.file_size_, 0)),
        high_water_(std::exchange(other.high_water_, 0)),
        physical_(std::exchange(other.physical_, 0)),
        gaps_(std::move(other.gaps_)),
        calls_(other.calls_) {
    other.gaps_.clear();
  }
  host_vmm& operator=(host_vmm&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      opts_ = other.opts_;
      fd_ = std::exchange(other.fd_, -1);
      file_size_ = std::exchange(other.file_size_, 0);
      high_water_ = std::exchange(other.high_water_, 0);
      physical_ = std::exchange(other.physical_, 0);
      gaps_ = std::move(other.gaps_);
      other.gaps_.clear();
      calls_ = other.calls_;
    }
    return *this;
  }
  /// Closes the file: memory still mapped stays valid until it is unmapped (the kernel keeps the
  /// file while mappings of it exist), then goes back to the host.
  ~host_vmm() {
    if (fd_ >= 0) ::close(fd_);
  }

  // ---- the virtual_memory concept --------------------------------------------------------------

  std::size_t granularity() const noexcept { return opts_.granularity; }
  std::size_t capacity() const noexcept { return opts_.capacity; }
  std::size_t physical_bytes() const noexcept { return physical_; }

  address_range reserve(std::size_t bytes) noexcept {
    const on_device on{opts_.device};
    if (!on) return fail<address_range>();
    const std::size_t size = detail::round_up(bytes, opts_.granularity);
    const std::size_t slack = opts_.granularity - page_size();
    if (size == 0 || size > std::numeric_limits<std::size_t>::max() - slack) return fail<address_range>();
    void* got = ::mmap(nullptr, size + slack, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (got == MAP_FAILED) return fail<address_range>();
    const auto raw = reinterpret_cast<std::uintptr_t>(got);
    const std::uintptr_t start = detail::round_up(raw, opts_.granularity);
    if (start != raw) ::munmap(got, start - raw);
    if (const std::size_t tail = raw + size + slack - (start + size); tail != 0)
      ::munmap(reinterpret_cast<void*>(start + size), tail);
    ++calls_.reserves;
    return {reinterpret_cast<void*>(start), size};
  }

  void unreserve(address_range range) noexcept {
    const on_device on{opts_.device};
    if (!range) return;
    ::munmap(range.ptr, range.size);
    ++calls_.unreserves;
  }

  physical_memory create(std::size_t bytes) noexcept {
    const on_device on{opts_.device};
    if (!on) return fail<physical_memory>();
    const std::size_t size = detail::round_up(bytes, opts_.granularity);
    if (fd_ < 0 || size == 0 || size > opts_.capacity - physical_) return fail<physical_memory>();
    std::size_t offset = 0;
    try {
      offset = take_offsets(size);
    } catch (const std::bad_alloc&) {
      return fail<physical_memory>();
    }
    if (offset == no_offset) return fail<physical_memory>();
    physical_ += size;
    ++calls_.creates;
    return {static_cast<std::uint64_t>(offset) + 1, size};
  }

  void release(physical_memory piece) noexcept {
    const on_device on{opts_.device};
    if (!piece || fd_ < 0) return;
    const std::size_t offset = static_cast<std::size_t>(piece.id - 1);
    // The pages go back to the host now, whatever becomes of the offsets.
    ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                static_cast<off_t>(piece.size));
    physical_ -= piece.size;
    ++calls_.releases;
    try {
      give_offsets(offset, piece.size);
    } catch (const std::bad_alloc&) {
      // The range stays out of use (its pages are already gone); nothing else is affected.
    }
  }

  bool map(void* at, physical_memory piece) noexcept {
    const on_device on{opts_.device};
    if (!on || !piece || fd_ < 0 || at == nullptr) return fail<bool>();
    void* got =
        ::mmap(at, piece.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd_, static_cast<off_t>(piece.id - 1));
    if (got == MAP_FAILED) return fail<bool>();
    ++calls_.maps;
    return true;
  }

  void unmap(void* at, std::size_t bytes) noexcept {
    const on_device on{opts_.device};
    if (at == nullptr || bytes == 0) return;
    ::mmap(at, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    ++calls_.unmaps;
  }

  // ---- beyond the concept ----------------------------------------------------------------------

  const call_counts& calls() const noexcept { return calls_; }
  const options& get_options() const noexcept { return opts_; }
  /// The memfd (for tests that look at what the host holds: `fstat(...).st_blocks`).
  int file_descriptor() const noexcept { return fd_; }
  /// Whether construction succeeded (a memfd could be made); when not, every create fails.
  bool valid() const noexcept { return fd_ >= 0; }
  /// The device label (-1: none).
  int device() const noexcept { return opts_.device; }

 private:
  static constexpr std::size_t max_initial_file = std::size_t{1} << 40;  // 1 TiB, sparse
  static constexpr std::size_t no_offset = std::numeric_limits<std::size_t>::max();
  using on_device = basic_scoped_device<simulated_devices>;

  static std::size_t page_size() noexcept {
    const long p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<std::size_t>(p) : 4096;
  }
  static options normalised(options o) noexcept {
    const std::size_t page = page_size();
    if (o.granularity < page) o.granularity = page;
    if (!detail::is_power_of_two(o.granularity)) {
      std::size_t p = page;
      while (p < o.granularity) p <<= 1;
      o.granularity = p;
    }
    return o;
  }

  template <class Result>
  Result fail() noexcept {
    ++calls_.failures;
    return Result{};
  }

  bool grow_file(std::size_t size) noexcept {
    if (size > static_cast<std::size_t>(std::numeric_limits<off_t>::max())) return false;
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return false;
    file_size_ = size;
    return true;
  }

  /// The lowest free range of offsets that holds `size` bytes (from the gaps, else above the
  /// high-water mark, extending the file if needed), or `no_offset`.
  std::size_t take_offsets(std::size_t size) {
    for (auto gap = gaps_.begin(); gap != gaps_.end(); ++gap) {
      if (gap->second < size) continue;
      const std::size_t offset = gap->first;
      const std::size_t rest = gap->second - size;
      if (rest != 0) gaps_.emplace_hint(std::next(gap), offset + size, rest);  // may throw: nothing changed yet
      gaps_.erase(gap);
      return offset;
    }
    if (size > std::numeric_limits<std::size_t>::max() - high_water_) return no_offset;
    const std::size_t end = high_water_ + size;
    if (end > file_size_ && !grow_file(std::max(end, file_size_ > no_offset / 2 ? end : file_size_ * 2)))
      return no_offset;
    const std::size_t offset = high_water_;
    high_water_ = end;
    return offset;
  }

  /// Returns `[offset, offset + size)` to the gaps, merged with its neighbours.
  void give_offsets(std::size_t offset, std::size_t size) {
    if (offset + size == high_water_) {
      high_water_ = offset;
      // A gap that now touches the high-water mark goes too.
      if (!gaps_.empty()) {
        auto last = std::prev(gaps_.end());
        if (last->first + last->second == high_water_) {
          high_water_ = last->first;
          gaps_.erase(last);
        }
      }
      return;
    }
    auto after = gaps_.lower_bound(offset);
    if (after != gaps_.end() && after->first == offset) return;  // released twice: ignored
    std::size_t start = offset, length = size;
    if (after != gaps_.begin()) {
      auto before = std::prev(after);
      if (before->first + before->second == offset) {
        start = before->first;
        length += before->second;
        gaps_.erase(before);
      }
    }
    if (after != gaps_.end() && after->first == offset + size) {
      length += after->second;
      after = gaps_.erase(after);
    }
    gaps_.emplace_hint(after, start, length);
  }

  options opts_{};
  int fd_ = -1;
  std::size_t file_size_ = 0;
  std::size_t high_water_ = 0;  ///< offsets at and above it were never handed out (or all came back)
  std::size_t physical_ = 0;
  std::map<std::size_t, std::size_t> gaps_;  ///< free offset ranges below the high-water mark
  call_counts calls_{};
};

}  // namespace alloy
