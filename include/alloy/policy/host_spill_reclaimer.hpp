// SPDX-License-Identifier: Apache-2.0
// alloy/policy/host_spill_reclaimer.hpp
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <set>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/detail/movable_bookkeeping.hpp>
#include <alloy/detail/walk.hpp>
#include <alloy/movable.hpp>

namespace alloy {

/// `host_spill_reclaimer<Device, Host>` serves requests the device side cannot by spilling idle
/// movable blocks to the host side, after IBM Large Model Support.
///
/// - Strategy: movable blocks (`allocate_movable`, `lock`, `unlock`, `deallocate(handle)`; rules
///   in `alloy/movable.hpp`) live on `Device` while resident. When a device request fails, a
///   *single reclaim* spills one unlocked resident block (copied to a `Host` block, its device
///   memory freed) and retries: with an introspectable `Device`, the smallest block whose space,
///   merged with the free pieces beside it, holds the request; else the smallest at least as large
///   (of equal sizes, the one unlocked longest ago).
///   If that does not do, a *full reclaim* spills every unlocked resident block and retries once
///   more. `lock` brings a spilled block back (spilling others if need be); its pointer stays fixed
///   until the last `unlock`. Raw `allocate`/`deallocate` go to `Device` and never move; a failed
///   raw request is reclaimed for too (`options::reclaim_for_raw`). Over a movable `Device` (a
///   `compacting_defragmenter`) compaction is tried before spilling.
/// - Complexity: `allocate_movable`, `lock`, `unlock` O(log n) without a reclaim; the single
///   reclaim's choice O(log n) by size, O(n) with an introspectable device; a full reclaim O(n).
///   Metadata: a handle table (about 48 B per movable block), an ordered set of the unlocked
///   resident blocks and, over a raw `Device`, a set of the resident blocks' addresses, in host
///   memory; nothing is written into managed memory.
/// - Failure: an empty block, empty handle or null `lock` when no reclaim helps (a reclaim that
///   spilled nothing is not counted). A request the device can never hold (above its limit, a
///   size near SIZE_MAX, a bad alignment), or one larger than all the device side holds when its
///   upstream cannot give the difference, fails at once and spills nothing. A failed host
///   allocation or copy leaves the block where it was, intact; the destructor frees every block
///   still alive, resident or spilled.
/// - Thread safety: none (wrap in `synchronized`, which forwards the handle calls). Move-only (it
///   owns the blocks its handles name).
/// - Memory kind: `Device`'s. Capabilities: `movable_statistics()` (`bytes_active`,
///   `bytes_inactive`, `bytes_spilled`, `bytes_reclaimed`, the reclaim, spill and restore counts;
///   requested sizes), and when the parts have them `owns`, `release` (both sides),
///   `reserved_bytes`, `counters()` and introspection (device side; a device failure a reclaim
///   made good counts as a retry, not an OOM); checked frees (`try_deallocate` and `free_misuse` of
///   a raw block when `Device` has them, and `try_deallocate` of a handle: false on a refusal,
///   nothing changed). A raw free at a resident movable block's address is refused in every build
///   (`misuses()`, `options::on_misuse`).
template <allocator Device, allocator Host>
class host_spill_reclaimer {
 public:
  static constexpr bool host_accessible = Device::host_accessible;
  static constexpr bool device_accessible = Device::device_accessible;
  /// Whether resident blocks are kept as handles of a movable `Device`.
  static constexpr bool device_is_movable = movable_allocator<Device>;

  struct options {
    bool reclaim_for_raw = true;         ///< reclaim movable blocks when a raw request fails
    copy_engine::options copy = {};      ///< the stream spills and restores copy on
    misuse_handler on_misuse = nullptr;  ///< called on each raw free refused here
    void* misuse_context = nullptr;      ///< passed to `on_misuse`
  };

  host_spill_reclaimer() = default;
  explicit host_spill_reclaimer(Device device, Host host = Host{})
      : device_(std::move(device)), host_(std::move(host)) {}
  host_spill_reclaimer(Device device, Host host, options opts)
      : device_(std::move(device)), host_(std::move(host)), options_(opts), copier_(opts.copy) {}

  host_spill_reclaimer(host_spill_reclaimer&&) = default;
  host_spill_reclaimer& operator=(host_spill_reclaimer&& other) noexcept {
    if (this != &other) {
      free_all();
      device_ = std::move(other.device_);
      host_ = std::move(other.host_);
      table_ = std::move(other.table_);
      unlocked_ = std::move(other.unlocked_);
      clock_ = other.clock_;
      addresses_ = std::move(other.addresses_);
      options_ = other.options_;
      copier_ = other.copier_;
      counters_ = other.counters_;
      rescues_ = other.rescues_;
      misuses_ = other.misuses_;
    }
    return *this;
  }
  host_spill_reclaimer(const host_spill_reclaimer&) = delete;
  host_spill_reclaimer& operator=(const host_spill_reclaimer&) = delete;
  ~host_spill_reclaimer() { free_all(); }

  // ---- raw blocks: pass through, never moved -------------------------------------------------

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (const block b = device_.allocate(bytes, alignment)) return b;
    if (!options_.reclaim_for_raw) return {};
    return counted_reclaim(bytes, alignment, [&] { return device_.allocate(bytes, alignment); });
  }
  /// A raw free; one at a resident movable block's address is refused (counted in `misuses()`).
  void deallocate(block b) noexcept {
    if (detail::refuse_movable_address(addresses_, misuses_, b, options_, who)) return;
    device_.deallocate(b);
  }
  /// The device side's checked free: false, nothing changed, when it or this refuses `b` as misuse.
  bool try_deallocate(block b) noexcept
    requires checked_deallocating_allocator<Device>
  {
    if (detail::refuse_movable_address(addresses_, misuses_, b, options_, who)) return false;
    return device_.try_deallocate(b);
  }
  /// What a raw free of `b` would be refused as: a movable block's address, or the device side's
  /// answer.
  misuse free_misuse(block b) const noexcept
    requires free_screening_allocator<Device>
  {
    if (b.ptr != nullptr && addresses_.contains(b.ptr)) return misuse::foreign_pointer;
    return device_.free_misuse(b);
  }
  /// Raw frees of a resident movable block's address refused here (over a raw `Device`; a movable
  /// one refuses them itself); the device side counts its own refusals.
  misuse_counts misuses() const noexcept { return misuses_; }

  // ---- movable blocks ------------------------------------------------------------------------

  /// A resident, unlocked block of `bytes`; an empty handle when not even a reclaim makes room.
  handle allocate_movable(std::size_t bytes) noexcept {
    resident r = allocate_resident(bytes);
    if (!r) return {};
    const std::uint64_t since = ++clock_;
    const handle h = table_.insert(entry{bytes, r, {}, 0, nullptr, since});
    if (!h) {
      free_resident(r, bytes);
      return {};
    }
    if (!mark_unlocked({bytes, since, h.id})) {
      table_.erase(h);
      free_resident(r, bytes);
      return {};
    }
    counters_.bytes_inactive += bytes;
    return h;
  }

  /// Makes the block resident (restoring it from host memory if it was spilled) and pins it;
  /// nullptr when a spilled block cannot be brought back (it stays spilled and intact).
  void* lock(handle h) {
    entry& e = detail::entry_or_throw(table_, h, "lock");
    if (e.locks > 0) {
      ++e.locks;
      return e.locked;
    }
    if (!e.dev) {  // spilled: bring it back
      resident r = allocate_resident(e.size);
      if (!r) return nullptr;
      void* p = pin(r);
      if (p == nullptr || !copier_.template copy_between<Device, Host>(p, e.host.ptr, e.size)) {
        if (p != nullptr) unpin(r);
        free_resident(r, e.size);
        return nullptr;
      }
      host_.deallocate(e.host);
      e.host = {};
      e.dev = r;
      e.locks = 1;
      e.locked = p;
      counters_.bytes_spilled -= e.size;
      counters_.bytes_restored += e.size;
      ++counters_.num_restores;
      detail::note_active(counters_, e.size);
      return p;
    }
    void* p = pin(e.dev);
    if (p == nullptr) return nullptr;
    unlocked_.erase(idle_key(h, e));
    e.locks = 1;
    e.locked = p;
    detail::note_locked(counters_, e.size);
    return p;
  }

  /// Undoes one `lock`; after the last one the block may be moved or spilled.
  void unlock(handle h) {
    entry& e = detail::entry_or_throw(table_, h, "unlock");
    detail::check_locked(e.locks, h);
    if (e.locks > 1) {
      --e.locks;
      return;
    }
    const std::uint64_t since = clock_ + 1;
    unlocked_.insert({e.size, since, h.id});  // may throw std::bad_alloc before anything changed
    clock_ = since;
    e.since = since;
    e.locks = 0;
    e.locked = nullptr;
    unpin(e.dev);
    detail::note_unlocked(counters_, e.size);
  }

  /// Frees the block, wherever it is. Throws for a locked, empty, unknown or stale handle.
  void deallocate(handle h) {
    entry& e = detail::entry_or_throw(table_, h, "deallocate");
    detail::check_unlocked(e.locks, h);
    free_movable(h, e);
  }
  /// As `deallocate(h)`, but a handle it would throw for (empty, unknown, stale, another
  /// allocator's, locked) is refused with false, nothing changed.
  bool try_deallocate(handle h) noexcept {
    entry* e = table_.find(h);
    if (e == nullptr || e->locks > 0) return false;
    free_movable(h, *e);
    return true;
  }

  /// Spills every unlocked resident block now (a full reclaim not asked for by a request; not
  /// counted as one). Returns the bytes spilled.
  std::size_t spill_all() noexcept { return spill_unlocked(); }

  // ---- questions about handles (empty/unknown/stale handles: false, 0) ------------------------

  std::size_t size_of(handle h) const noexcept {
    const entry* e = table_.find(h);
    return e ? e->size : 0;
  }
  bool is_resident(handle h) const noexcept {
    const entry* e = table_.find(h);
    return e && e->dev;
  }
  bool is_locked(handle h) const noexcept {
    const entry* e = table_.find(h);
    return e && e->locks > 0;
  }
  bool is_live(handle h) const noexcept { return table_.find(h) != nullptr; }
  std::size_t movable_count() const noexcept { return table_.size(); }

  // ---- counters and capabilities -------------------------------------------------------------

  movable_counters movable_statistics() const noexcept {
    movable_counters c = counters_;
    if constexpr (movable_counting_allocator<Device>) {
      const movable_counters d = device_.movable_statistics();
      c.num_defragmentations = d.num_defragmentations;
      c.bytes_defragged = d.bytes_defragged;
      c.num_moves = d.num_moves;
    }
    return c;
  }
  void reset_movable_peak() noexcept { counters_.peak_bytes_active = counters_.bytes_active; }

  bool owns(block b) const noexcept
    requires owning_allocator<Device>
  {
    return device_.owns(b);
  }
  void release() noexcept
    requires releasing_allocator<Device>
  {
    device_.release();
    if constexpr (releasing_allocator<Host>) host_.release();
  }
  std::size_t reserved_bytes() const noexcept
    requires reserving_allocator<Device>
  {
    return device_.reserved_bytes();
  }
  /// The device side's counters, as if each request were one call: device failures that a
  /// reclaim made good are not OOMs but `num_alloc_retries`.
  allocator_counters counters() const noexcept
    requires counting_allocator<Device>
  {
    return rescues_.adjust(device_.counters());
  }
  /// The device side's pieces; with a raw `Device`, pieces holding movable blocks are reported
  /// `active` (locked) or `inactive` (unlocked) instead of `allocated`.
  template <class F>
    requires introspectable_allocator<Device>
  void for_each_block(F&& visit) const {
    if constexpr (device_is_movable) {
      device_.for_each_block(visit);
    } else {
      detail::for_each_block_showing_movable(
          device_,
          [&](auto note) {
            table_.for_each([&](handle, const entry& e) {
              if (e.dev) note(e.dev.raw.ptr, e.locks > 0);
            });
          },
          visit);
    }
  }

  const options& get_options() const noexcept { return options_; }
  Device& device() noexcept { return device_; }
  const Device& device() const noexcept { return device_; }
  Host& host() noexcept { return host_; }
  const Host& host() const noexcept { return host_; }
  auto parts() noexcept { return std::tie(device_, host_); }
  auto parts() const noexcept { return std::tie(device_, host_); }

 private:
  /// Where a resident block lives on the device: a raw block, or a handle of a movable device.
  struct resident {
    block raw{};
    handle moved{};
    explicit operator bool() const noexcept {
      if constexpr (device_is_movable) {
        return static_cast<bool>(moved);
      } else {
        return static_cast<bool>(raw);
      }
    }
  };

  struct entry {
    std::size_t size = 0;
    resident dev{};  // empty when spilled
    block host{};    // the spilled copy; empty when resident
    std::uint32_t locks = 0;
    void* locked = nullptr;   // the pinned address while locked
    std::uint64_t since = 0;  // `clock_` at its allocation or last unlock
  };
  /// An unlocked resident block, in the order a reclaim looks at them: by size, then the one
  /// unlocked longest ago (a deterministic choice, and the least recently used).
  struct idle {
    std::size_t size;
    std::uint64_t since;
    std::uint64_t id;  // its handle
    auto operator<=>(const idle&) const = default;
  };
  static idle idle_key(handle h, const entry& e) noexcept { return {e.size, e.since, h.id}; }

  void free_movable(handle h, entry& e) noexcept {
    if (e.dev) {
      unlocked_.erase(idle_key(h, e));
      counters_.bytes_inactive -= e.size;
      free_resident(e.dev, e.size);
    } else {
      counters_.bytes_spilled -= e.size;
      host_.deallocate(e.host);
    }
    table_.erase(h);
  }

  resident try_device(std::size_t bytes) noexcept {
    if constexpr (device_is_movable) {
      return {{}, device_.allocate_movable(bytes)};
    } else {
      return {device_.allocate(bytes, movable_alignment), {}};
    }
  }

  /// A device block for a movable block; over a raw `Device` its address is noted, so that a raw
  /// free of it is refused.
  resident allocate_resident(std::size_t bytes) noexcept {
    resident r = try_device(bytes);
    if (!r) r = counted_reclaim(bytes, movable_alignment, [&] { return try_device(bytes); });
    if constexpr (!device_is_movable) {
      if (r && !addresses_.add(r.raw.ptr)) {
        device_.deallocate(r.raw);
        return {};
      }
    }
    return r;
  }

  void free_resident(resident r, std::size_t bytes) noexcept {
    (void)bytes;
    if constexpr (device_is_movable) {
      try {
        device_.deallocate(r.moved);
      } catch (...) {  // cannot happen: the handle is live and unlocked
      }
    } else {
      addresses_.remove(r.raw.ptr);
      device_.deallocate(r.raw);
    }
  }

  /// The device address of a resident block, pinned in place while it is locked.
  void* pin(resident r) noexcept {
    if constexpr (device_is_movable) {
      try {
        return device_.lock(r.moved);
      } catch (...) {
        return nullptr;
      }
    } else {
      return r.raw.ptr;
    }
  }
  void unpin(resident r) noexcept {
    if constexpr (device_is_movable) {
      try {
        device_.unlock(r.moved);
      } catch (...) {}
    } else {
      (void)r;
    }
  }

  bool mark_unlocked(const idle& key) noexcept {
    try {
      unlocked_.insert(key);
      return true;
    } catch (...) {
      return false;
    }
  }

  /// Spills one unlocked resident block; false (nothing changed) when the host side or the copy
  /// fails.
  bool spill(handle h) noexcept {
    entry* e = table_.find(h);
    if (e == nullptr || !e->dev || e->locks > 0) return false;
    const block host = host_.allocate(e->size, movable_alignment);
    if (!host) return false;
    void* p = pin(e->dev);
    if (p == nullptr) {
      host_.deallocate(host);
      return false;
    }
    const bool copied = copier_.template copy_between<Host, Device>(host.ptr, p, e->size);
    unpin(e->dev);
    if (!copied) {
      host_.deallocate(host);
      return false;
    }
    unlocked_.erase(idle_key(h, *e));
    free_resident(e->dev, e->size);
    e->dev = {};
    e->host = host;
    counters_.bytes_inactive -= e->size;
    counters_.bytes_spilled += e->size;
    counters_.bytes_reclaimed += e->size;
    ++counters_.num_spills;
    return true;
  }

  /// Spills every unlocked resident block it can; returns the bytes spilled.
  std::size_t spill_unlocked() noexcept {
    std::size_t spilled = 0;
    for (auto it = unlocked_.begin(); it != unlocked_.end();) {
      const idle key = *it;
      ++it;  // spill() erases the current element
      if (spill(handle{key.id})) spilled += key.size;
    }
    return spilled;
  }

  /// Whether the device side can show where each resident block lies (for choose_by_hole).
  static constexpr bool device_shows_places =
      introspectable_allocator<Device> && (!device_is_movable || requires(const Device& d, handle h) {
        { d.address_of(h) } -> std::convertible_to<const void*>;
      });

  const void* place_of(const entry& e) const noexcept {
    if constexpr (device_is_movable) {
      return device_.address_of(e.dev.moved);
    } else {
      return e.dev.raw.ptr;
    }
  }

  /// With an introspectable device: the unlocked resident block of the smallest size whose
  /// eviction, merged with the free pieces beside it, leaves a piece that holds `bytes` at
  /// `alignment`; 0 when there is none (or host memory for the scan ran out).
  std::uint64_t choose_by_hole(std::size_t bytes, std::size_t alignment) const noexcept {
    if constexpr (device_shows_places) {
      try {
        std::size_t need = detail::round_up(bytes == 0 ? 1 : bytes, movable_alignment);
        if constexpr (requires { device_.chunk_size(bytes); }) need = device_.chunk_size(bytes);
        if (need == 0) return 0;
        if (alignment > movable_alignment) need += alignment - movable_alignment;
        std::unordered_map<const void*, std::pair<std::uint64_t, std::size_t>> candidates;  // ptr -> (id, size)
        candidates.reserve(unlocked_.size());
        for (const idle& key : unlocked_) {
          if (const entry* e = table_.find(handle{key.id}))
            candidates.emplace(place_of(*e), std::pair{key.id, key.size});
        }
        std::vector<block_info> pieces;
        device_.for_each_block([&](const block_info& info) { pieces.push_back(info); });
        std::uint64_t best = 0;
        std::size_t best_size = 0;
        for (std::size_t i = 0; i < pieces.size(); ++i) {
          if (pieces[i].state == block_state::free || pieces[i].state == block_state::active) continue;
          const auto found = candidates.find(pieces[i].ptr);
          if (found == candidates.end()) continue;
          std::size_t hole = pieces[i].size;
          if (i > 0 && pieces[i - 1].state == block_state::free && pieces[i - 1].segment == pieces[i].segment)
            hole += pieces[i - 1].size;
          if (i + 1 < pieces.size() && pieces[i + 1].state == block_state::free &&
              pieces[i + 1].segment == pieces[i].segment)
            hole += pieces[i + 1].size;
          if (hole >= need && (best == 0 || found->second.second < best_size)) {
            best = found->second.first;
            best_size = found->second.second;
          }
        }
        return best;
      } catch (...) {
        return 0;
      }
    } else {
      (void)bytes;
      (void)alignment;
      return 0;
    }
  }

  /// False when the device side can never hold `bytes`, however much is spilled: more than its
  /// `bytes_limit()` or `bytes_reservable_limit()` when it has one, or a size whose rounding
  /// overflows. Such a request spills nothing.
  /// The memory source at the bottom of `p`: followed through parts while there is exactly one.
  template <class P>
  static auto& root_upstream(P& p) noexcept {
    if constexpr (composite<P>) {
      if constexpr (std::tuple_size_v<std::remove_cvref_t<decltype(p.parts())>> == 1) {
        return root_upstream(std::get<0>(p.parts()));
      } else {
        return p;
      }
    } else {
      return p;
    }
  }

  /// False when spilling everything could not make room for `bytes`: the request is larger than
  /// all the device side holds, and the upstream below it cannot give the rest now.
  bool eviction_could_help(std::size_t bytes) noexcept {
    if constexpr (reserving_allocator<Device>) {
      const std::size_t reserved = device_.reserved_bytes();
      if (bytes <= reserved) return true;
      auto& source = root_upstream(device_);
      using source_type = std::remove_cvref_t<decltype(source)>;
      if constexpr (std::is_same_v<source_type, Device> || composite<source_type>) {
        return true;  // no single upstream below the device to ask
      } else {
        const block probe = source.allocate(bytes - reserved, movable_alignment);
        if (!probe) return false;
        source.deallocate(probe);
        return true;
      }
    } else {
      (void)bytes;
      return true;
    }
  }

  bool could_ever_fit(std::size_t bytes) const noexcept {
    if (detail::round_up(bytes, movable_alignment) == 0 && bytes != 0) return false;
    if constexpr (detail::reports_bytes_limit<Device>) {
      if (bytes > device_.bytes_limit()) return false;
    }
    if constexpr (detail::reports_bytes_reservable_limit<Device>) {
      if (bytes > device_.bytes_reservable_limit()) return false;
    }
    return true;
  }

  /// reclaim_and_retry, keeping the device's counters honest: device failures that a reclaim made
  /// good are retries, not OOMs.
  template <class Attempt>
  auto counted_reclaim(std::size_t bytes, std::size_t alignment, Attempt&& attempt) noexcept -> decltype(attempt()) {
    return rescues_.rescue(device_, [&] { return reclaim_and_retry(bytes, alignment, attempt); });
  }

  /// Single reclaim, then full reclaim, retrying `attempt` after each.
  template <class Attempt>
  auto reclaim_and_retry(std::size_t bytes, std::size_t alignment, Attempt&& attempt) noexcept -> decltype(attempt()) {
    if (!could_ever_fit(bytes) || !detail::is_power_of_two(alignment)) return {};
    if (unlocked_.empty() || !eviction_could_help(bytes)) return {};
    // Single: with a raw introspectable device, the smallest block whose eviction opens a big
    // enough piece; otherwise (or when the host side refuses it) the smallest unlocked resident
    // block at least as large as the request, trying the next larger one when the host refuses.
    bool single = false;
    if (const std::uint64_t chosen = choose_by_hole(bytes, alignment); chosen != 0 && spill(handle{chosen})) {
      single = true;
    } else {
      for (auto it = unlocked_.lower_bound({bytes, 0, 0}); it != unlocked_.end(); ++it) {
        if (spill(handle{it->id})) {
          single = true;
          break;
        }
      }
    }
    if (single) {
      ++counters_.num_single_reclaims;
      if (auto r = attempt()) return r;
    }
    if (unlocked_.empty()) return {};
    if (spill_unlocked() == 0) return {};
    ++counters_.num_full_reclaims;
    return attempt();
  }

  void free_all() noexcept {
    table_.for_each([&](handle, entry& e) {
      if (e.dev) {
        if (e.locks > 0) unpin(e.dev);
        e.locks = 0;
        free_resident(e.dev, e.size);
      }
      if (e.host) host_.deallocate(e.host);
    });
    table_ = {};
    unlocked_.clear();
    addresses_.clear();
  }

  static constexpr const char* who = "host_spill_reclaimer";

  Device device_{};
  Host host_{};
  detail::handle_table<entry> table_{};
  std::set<idle> unlocked_{};              // the unlocked resident blocks, smallest first, then unlocked longest ago
  std::uint64_t clock_ = 0;                // counts allocations and last unlocks: an `idle::since`
  detail::movable_addresses addresses_{};  // where the resident blocks lie (over a raw `Device`)
  options options_{};
  copy_engine copier_{};
  movable_counters counters_{};
  detail::rescue_tally rescues_{};  // requests served after a reclaim
  misuse_counts misuses_{};
};

}  // namespace alloy
