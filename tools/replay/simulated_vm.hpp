// SPDX-License-Identifier: Apache-2.0
// tools/replay/simulated_vm.hpp: a device with virtual memory management, simulated, so that the
// virtual compositions (virtual_arena, virtual_allocator) replay at any capacity on any machine.
//
// `simulated_vm_device` keeps the books of a CUDA device's virtual memory (`cuMemAddressReserve`,
// `cuMemCreate`, `cuMemMap`, `cuMemUnmap`, `cuMemRelease`) without memory behind them: physical
// memory is a count limited by `capacity`, addresses come from one large range reserved
// `PROT_NONE` with `MAP_NORESERVE` that is never made accessible. The replay never writes to the
// blocks it gets and neither do the virtual compositions (their bookkeeping lives on the host),
// so nothing costs memory; anything that touched a block would fault at once rather than go
// unnoticed.
//
// - Physical memory: `create(bytes)` (a multiple of the granularity, 2 MiB by default as on
//   CUDA's GPUs) is refused (an empty piece, counted in `refusals()`) when the pieces that exist
//   would pass `capacity`. `reserved()` / `peak_reserved()` are the physical bytes that exist,
//   `allocations()` / `deallocations()` the creates and releases, `maps()` / `unmaps()` the map
//   calls. Addresses are plentiful: `reserve` hands out consecutive ranges of the big one, so a
//   range asked for right after another lies right after it (an arena can grow in place).
// - Checked as a driver would: a map of a piece that is mapped already, at an address that is
//   not reserved, not aligned or mapped already, an unmap that is not exactly one earlier map, a
//   release of a mapped or unknown piece, an unreserve of a range with something mapped: each is
//   refused (nothing changes) and recorded as a fault (`faults()`, `first_fault()`). A piece's
//   id carries a generation, so an id kept after its release is unknown even once its books are
//   reused.
// - Cost: create and release are O(1), map and unmap O(granules of the piece), on flat books (a
//   slot per piece, a cell per granule in pages where maps were made), so that a replay's ns/op is the
//   composition's own bookkeeping; what a driver call costs on a GPU is counted in calls, not
//   timed here.
// - `holds(p, n)`: whether `[p, p + n)` is mapped, all of it: what a served block must be.
// - `backend()` is the `alloy::virtual_memory` backend the compositions hold (copyable, refers
//   to the device, which must outlive it). Not thread-safe; one replay at a time.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <alloy/vmm/virtual_memory.hpp>

#include "replay/simulated_device.hpp"

namespace alloy::replay {

class simulated_vm_device {
 public:
  static constexpr std::size_t default_granularity = std::size_t{2} << 20;

  explicit simulated_vm_device(std::size_t capacity = unlimited, std::size_t granularity = default_granularity)
      : capacity_(capacity), granularity_(granularity) {}
  simulated_vm_device(const simulated_vm_device&) = delete;
  simulated_vm_device& operator=(const simulated_vm_device&) = delete;
  ~simulated_vm_device() {
    if (space_size_ != 0) munmap(reinterpret_cast<void*>(space_base_), space_size_);
  }

  // ---- the backend's calls ---------------------------------------------------------------------

  std::size_t granularity() const noexcept { return granularity_; }

  address_range reserve(std::size_t bytes) noexcept {
    if (bytes == 0 || bytes % granularity_ != 0 || !have_space()) return {};
    for (auto it = unreserved_.begin(); it != unreserved_.end(); ++it) {  // first fit among holes
      if (it->second < bytes) continue;
      const auto [base, size] = *it;
      unreserved_.erase(it);
      if (size > bytes && !remember(unreserved_, base + bytes, size - bytes)) return {};
      return take_range(base, bytes);
    }
    if (bytes > space_base_ + space_size_ - top_) return {};
    const std::uintptr_t base = top_;
    top_ += bytes;
    return take_range(base, bytes);
  }

  void unreserve(address_range range) noexcept {
    const auto base = reinterpret_cast<std::uintptr_t>(range.ptr);
    const auto it = reserved_ranges_.find(base);
    if (it == reserved_ranges_.end() || it->second != range.size)
      return fault("unreserve of a range that was not reserved");
    if (any_mapped(base, range.size)) return fault("unreserve of a range with memory mapped in it");
    reserved_ranges_.erase(it);
    std::uintptr_t start = base;
    std::size_t size = range.size;
    auto next = unreserved_.lower_bound(start);  // merge with the holes beside it
    if (next != unreserved_.begin() && std::prev(next)->first + std::prev(next)->second == start) {
      --next;
      start = next->first;
      size += next->second;
      next = unreserved_.erase(next);
    }
    if (next != unreserved_.end() && start + size == next->first) {
      size += next->second;
      unreserved_.erase(next);
    }
    if (start + size == top_) {
      top_ = start;
    } else {
      remember(unreserved_, start, size);
    }
  }

  physical_memory create(std::size_t bytes) noexcept {
    if (bytes == 0 || bytes % granularity_ != 0) {
      fault("create of a size that is not a multiple of the granularity");
      return {};
    }
    if (bytes > capacity_ || physical_ > capacity_ - bytes) {
      ++refusals_;
      return {};
    }
    std::uint32_t slot = 0;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      try {  // room for every slot in the free list too, so that release and reset cannot fail
        if (free_slots_.capacity() <= pieces_.size()) free_slots_.reserve(2 * pieces_.size() + 16);
        pieces_.emplace_back();
      } catch (...) {
        ++refusals_;
        return {};
      }
      slot = static_cast<std::uint32_t>(pieces_.size() - 1);
    }
    piece_state& p = pieces_[slot];
    ++p.generation;  // a stale id of this slot no longer matches
    p.size = bytes;
    p.live = true;
    p.mapped = false;
    physical_ += bytes;
    peak_physical_ = std::max(peak_physical_, physical_);
    ++creates_;
    return {(std::uint64_t{p.generation} << 32) | (std::uint64_t{slot} + 1), bytes};
  }

  void release(physical_memory piece) noexcept {
    piece_state* p = find_piece(piece);
    if (p == nullptr) return fault("release of a piece that does not exist");
    if (p->mapped) return fault("release of a piece that is still mapped");
    physical_ -= p->size;
    p->live = false;
    free_slots_.push_back(static_cast<std::uint32_t>((piece.id & 0xFFFFFFFFu) - 1));  // room made by create
    ++releases_;
  }

  bool map(void* at, physical_memory piece) noexcept {
    const auto start = reinterpret_cast<std::uintptr_t>(at);
    piece_state* p = find_piece(piece);
    if (p == nullptr) return fault("map of a piece that does not exist"), false;
    if (p->mapped) return fault("map of a piece that is mapped already"), false;
    if (start % granularity_ != 0) return fault("map at an address that is not a multiple of the granularity"), false;
    if (!inside_reserved(start, piece.size)) return fault("map outside every reserved range"), false;
    if (any_mapped(start, piece.size)) return fault("map over memory that is mapped already"), false;
    const std::size_t first = cell_of(start), n = piece.size / granularity_;
    if (!cells_.make(first, n)) return false;  // out of host memory for the books: the map fails, a normal event
    for (std::size_t g = first; g < first + n; ++g) cells_[g].start = first + 1;
    cells_[first].piece = piece.id;
    cells_[first].granules = n;
    p->mapped = true;
    mapped_ += piece.size;
    peak_mapped_ = std::max(peak_mapped_, mapped_);
    ++maps_calls_;
    return true;
  }

  void unmap(void* at, std::size_t bytes) noexcept {
    const auto start = reinterpret_cast<std::uintptr_t>(at);
    const cell* head = start >= space_base_ ? cells_.find(cell_of(start)) : nullptr;
    const std::size_t first = head != nullptr ? cell_of(start) : 0;
    if (start % granularity_ != 0 || head == nullptr || head->start != first + 1 ||
        head->granules * granularity_ != bytes)
      return fault("unmap that is not exactly one earlier map");
    if (piece_state* p = find_piece({cells_[first].piece, bytes})) p->mapped = false;
    for (std::size_t g = first; g < first + cells_[first].granules; ++g) cells_[g].start = 0;
    cells_[first].piece = 0;
    cells_[first].granules = 0;
    mapped_ -= bytes;
    ++unmaps_calls_;
  }

  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t physical_bytes() const noexcept { return physical_; }

  // ---- what the replay reads ---------------------------------------------------------------------

  /// Whether every byte of `[p, p + bytes)` is mapped (at least its first byte for 0 bytes).
  bool holds(const void* p, std::size_t bytes) const noexcept {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    if (bytes > UINTPTR_MAX - at || at < space_base_) return false;
    const std::uintptr_t last = at + std::max<std::size_t>(bytes, 1) - 1;
    for (std::size_t g = cell_of(at); g <= cell_of(last); ++g)  // consecutive maps, one per piece
      if (const cell* c = cells_.find(g); c == nullptr || c->start == 0) return false;
    return true;
  }

  std::size_t reserved() const noexcept { return physical_; }
  std::size_t peak_reserved() const noexcept { return peak_physical_; }
  std::size_t mapped() const noexcept { return mapped_; }
  std::size_t peak_mapped() const noexcept { return peak_mapped_; }
  std::size_t allocations() const noexcept { return creates_; }
  std::size_t deallocations() const noexcept { return releases_; }
  std::size_t refusals() const noexcept { return refusals_; }
  std::size_t maps() const noexcept { return maps_calls_; }
  std::size_t unmaps() const noexcept { return unmaps_calls_; }
  std::size_t map_calls() const noexcept { return maps_calls_ + unmaps_calls_; }
  std::size_t faults() const noexcept { return faults_; }
  const std::string& first_fault() const noexcept { return first_fault_; }
  void set_capacity(std::size_t capacity) noexcept { capacity_ = capacity; }
  void set_checking(bool) noexcept {}  // always checked: the books are the device

  /// Starts afresh: every address unreserved, every piece gone, counters at zero.
  void reset() noexcept {
    reserved_ranges_.clear();
    unreserved_.clear();
    free_slots_.clear();
    for (std::size_t slot = pieces_.size(); slot-- != 0;) {  // generations go on: an old id stays unknown
      pieces_[slot].live = pieces_[slot].mapped = false;
      free_slots_.push_back(static_cast<std::uint32_t>(slot));  // room made by create
    }
    cells_.clear();
    top_ = space_base_;
    physical_ = peak_physical_ = mapped_ = peak_mapped_ = 0;
    creates_ = releases_ = refusals_ = maps_calls_ = unmaps_calls_ = faults_ = 0;
    first_fault_.clear();
  }

  /// The device as an `alloy::virtual_memory` backend.
  class backend {
   public:
    // Nothing may touch the memory from the host (it is PROT_NONE); a device's memory.
    static constexpr bool host_accessible = false;
    static constexpr bool device_accessible = true;

    backend() = default;
    explicit backend(simulated_vm_device& device) noexcept : device_(&device) {}

    std::size_t granularity() const noexcept { return device_->granularity(); }
    address_range reserve(std::size_t bytes) noexcept { return device_->reserve(bytes); }
    void unreserve(address_range range) noexcept { device_->unreserve(range); }
    physical_memory create(std::size_t bytes) noexcept { return device_->create(bytes); }
    void release(physical_memory piece) noexcept { device_->release(piece); }
    bool map(void* at, physical_memory piece) noexcept { return device_->map(at, piece); }
    void unmap(void* at, std::size_t bytes) noexcept { device_->unmap(at, bytes); }
    std::size_t capacity() const noexcept { return device_->capacity(); }
    std::size_t physical_bytes() const noexcept { return device_->physical_bytes(); }

    simulated_vm_device& device() const noexcept { return *device_; }
    friend bool operator==(const backend& a, const backend& b) noexcept { return a.device_ == b.device_; }

   private:
    simulated_vm_device* device_ = nullptr;
  };

 private:
  // The books are flat, so that a call costs the replay next to nothing (a driver's cost is
  // counted in calls, not timed): pieces in slots whose id carries a generation, so that a stale
  // id is refused; the mapped addresses as one cell per granule of the big range.
  struct piece_state {
    std::size_t size = 0;
    std::uint32_t generation = 0;
    bool live = false;
    bool mapped = false;
  };
  struct cell {
    std::size_t start = 0;     ///< 1 + the cell where the map covering this granule starts; 0: unmapped
    std::uint64_t piece = 0;   ///< at a map's first cell: the piece mapped
    std::size_t granules = 0;  ///< at a map's first cell: how many cells it covers
  };

  /// The cells by granule of the big range, in pages made when a map first reaches them: ranges
  /// reserved far apart (two arenas of a terabyte of addresses each) cost the books the pages they
  /// map, not a cell for every granule between them. `clear` zeroes the pages and keeps them, so
  /// that a replay after the first makes none (its time is the composition's).
  class cell_table {
   public:
    static constexpr std::size_t page_cells = 512;
    /// Granule `g`'s cell, or null when no map reached its page.
    cell* find(std::size_t g) noexcept {
      const std::size_t p = g / page_cells;
      return p < pages_.size() && pages_[p] ? &pages_[p][g % page_cells] : nullptr;
    }
    const cell* find(std::size_t g) const noexcept { return const_cast<cell_table*>(this)->find(g); }
    /// Granules the pages cover, made or not (no map reached a granule beyond).
    std::size_t extent() const noexcept { return pages_.size() * page_cells; }
    /// A cell whose page `make` made.
    cell& operator[](std::size_t g) noexcept { return pages_[g / page_cells][g % page_cells]; }
    /// Makes the pages of granules [first, first + n); false when host memory ran out.
    bool make(std::size_t first, std::size_t n) noexcept {
      try {
        const std::size_t last_page = (first + n - 1) / page_cells;
        if (last_page >= pages_.size()) pages_.resize(last_page + 1);
        for (std::size_t p = first / page_cells; p <= last_page; ++p)
          if (!pages_[p]) pages_[p] = std::make_unique<cell[]>(page_cells);
        return true;
      } catch (...) {
        return false;
      }
    }
    void clear() noexcept {
      for (auto& page : pages_)
        if (page) std::fill(page.get(), page.get() + page_cells, cell{});
    }

   private:
    std::vector<std::unique_ptr<cell[]>> pages_;
  };

  piece_state* find_piece(physical_memory piece) noexcept {
    const std::uint64_t slot = (piece.id & 0xFFFFFFFFu) - 1;
    if (piece.id == 0 || slot >= pieces_.size()) return nullptr;
    piece_state& p = pieces_[slot];
    if (!p.live || p.generation != (piece.id >> 32) || p.size != piece.size) return nullptr;
    return &p;
  }
  std::size_t cell_of(std::uintptr_t at) const noexcept { return (at - space_base_) / granularity_; }
  /// Whether any granule of [at, at + bytes) is mapped.
  bool any_mapped(std::uintptr_t at, std::size_t bytes) const noexcept {
    if (at < space_base_ || bytes == 0) return false;
    const std::size_t end = std::min(cells_.extent(), cell_of(at + bytes - 1) + 1);
    for (std::size_t g = cell_of(at); g < end;) {
      const cell* c = cells_.find(g);
      if (c == nullptr) {  // no map reached this page: on to the next
        g = (g / cell_table::page_cells + 1) * cell_table::page_cells;
        continue;
      }
      if (c->start != 0) return true;
      ++g;
    }
    return false;
  }

  /// The big range of addresses, made on first use: as large as the host gives, at most 16 TiB.
  bool have_space() noexcept {
    if (space_size_ != 0) return true;
    for (std::size_t size = std::size_t{1} << 44; size >= (std::size_t{1} << 32); size >>= 1) {
      void* raw = mmap(nullptr, size + granularity_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (raw == MAP_FAILED) continue;
      const auto start = reinterpret_cast<std::uintptr_t>(raw);
      space_base_ = (start + granularity_ - 1) / granularity_ * granularity_;
      if (space_base_ > start) munmap(raw, space_base_ - start);
      const std::uintptr_t end = start + size + granularity_;
      if (space_base_ + size < end) munmap(reinterpret_cast<void*>(space_base_ + size), end - space_base_ - size);
      space_size_ = size;
      top_ = space_base_;
      return true;
    }
    return false;
  }

  address_range take_range(std::uintptr_t base, std::size_t bytes) noexcept {
    if (!remember(reserved_ranges_, base, bytes)) {
      remember(unreserved_, base, bytes);
      return {};
    }
    return {reinterpret_cast<void*>(base), bytes};
  }

  static bool remember(std::map<std::uintptr_t, std::size_t>& ranges, std::uintptr_t base, std::size_t size) noexcept {
    try {
      ranges.emplace(base, size);
      return true;
    } catch (...) {
      return false;
    }
  }

  bool inside_reserved(std::uintptr_t at, std::size_t bytes) const noexcept {
    auto it = reserved_ranges_.upper_bound(at);
    if (it == reserved_ranges_.begin()) return false;
    --it;
    return at - it->first < it->second && bytes <= it->second - (at - it->first);
  }

  void fault(const char* what) noexcept {
    if (faults_++ == 0) {
      try {
        first_fault_ = what;
      } catch (...) {}
    }
  }

  std::size_t capacity_;
  std::size_t granularity_;
  std::uintptr_t space_base_ = 0;
  std::size_t space_size_ = 0;
  std::uintptr_t top_ = 0;                                 // addresses from here on never reserved
  std::map<std::uintptr_t, std::size_t> reserved_ranges_;  // base -> size
  std::map<std::uintptr_t, std::size_t> unreserved_;       // holes below top_: base -> size
  std::vector<piece_state> pieces_;                        // by slot (id: generation << 32 | slot + 1)
  std::vector<std::uint32_t> free_slots_;                  // slots of released pieces, reused
  cell_table cells_;                                       // by granule of the big range, pages where mapped
  std::size_t physical_ = 0, peak_physical_ = 0, mapped_ = 0, peak_mapped_ = 0;
  std::size_t creates_ = 0, releases_ = 0, refusals_ = 0, maps_calls_ = 0, unmaps_calls_ = 0, faults_ = 0;
  std::string first_fault_;
};

static_assert(virtual_memory<simulated_vm_device::backend>);

/// The two devices a replay runs on: one of segments (cudaMalloc-like) for the segment-based
/// compositions and the peers, one with virtual memory for the virtual compositions, of the same
/// capacity.
struct devices {
  explicit devices(std::size_t capacity = unlimited) : segments(capacity), vm(capacity) {}
  void set_capacity(std::size_t capacity) noexcept {
    segments.set_capacity(capacity);
    vm.set_capacity(capacity);
  }
  simulated_device segments;
  simulated_vm_device vm;
};

}  // namespace alloy::replay
