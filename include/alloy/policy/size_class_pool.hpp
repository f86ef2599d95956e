// SPDX-License-Identifier: Apache-2.0
// alloy/policy/size_class_pool.hpp
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/config.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/misuse.hpp>

namespace alloy {

/// A size-class layout: powers of two from `Min` to `Max`, each octave split into `Divisions`
/// equal steps, no step finer than `Min` (PyTorch's `roundup_power2_divisions`).
///
/// With the defaults (`Divisions` 4, `Min` 256 B, `Max` 1 MiB) the classes are 256, 512, 768,
/// 1024, 1280, 1536, 1792, 2048, 2560, ..., 655360, 786432, 917504, 1048576: 44 classes, every one a
/// multiple of 256 (CUDA's allocation alignment) and none more than 25 % above the request it
/// serves (once steps are a quarter octave). `index(bytes)` is a handful of bit operations and
/// two table reads; it requires `bytes <= max_size`.
template <std::size_t Divisions = 4, std::size_t Min = 256, std::size_t Max = (std::size_t{1} << 20)>
struct power2_classes {
  static_assert(detail::is_power_of_two(Divisions), "Divisions must be a power of two");
  static_assert(detail::is_power_of_two(Min) && Min >= 256, "Min must be a power of two of at least 256");
  static_assert(detail::is_power_of_two(Max) && Max >= Min, "Max must be a power of two, at least Min");
  static_assert(Max <= (std::size_t{1} << 30), "classes above 1 GiB are not supported");

  static constexpr std::size_t min_size = Min;
  static constexpr std::size_t max_size = Max;
  static constexpr std::size_t divisions = Divisions;

 private:
  static constexpr int log_min = std::countr_zero(Min);
  static constexpr int log_max = std::countr_zero(Max);
  static constexpr int log_div = std::countr_zero(Divisions);
  static constexpr int step_shift(int k) noexcept { return k - log_div > log_min ? k - log_div : log_min; }

  // first_[k]: the index of class 2^k (for log_min <= k <= log_max).
  static constexpr std::array<std::uint32_t, 65> first_ = [] {
    std::array<std::uint32_t, 65> first{};
    std::uint32_t index = 0;
    for (int k = log_min; k <= log_max; ++k) {
      first[static_cast<std::size_t>(k)] = index;
      index += static_cast<std::uint32_t>(std::size_t{1} << (k - step_shift(k)));
    }
    return first;
  }();

 public:
  /// Number of classes.
  static constexpr std::size_t count = first_[log_max] + 1;

 private:
  static constexpr std::array<std::size_t, count> sizes_ = [] {
    std::array<std::size_t, count> sizes{};
    std::size_t i = 0;
    for (int k = log_min; k < log_max; ++k) {
      for (std::size_t s = std::size_t{1} << k; s < (std::size_t{2} << k); s += std::size_t{1} << step_shift(k)) {
        sizes[i++] = s;
      }
    }
    sizes[i] = Max;
    return sizes;
  }();

 public:
  /// Bytes of class `i` (`i < count`).
  static constexpr std::size_t size(std::size_t i) noexcept { return sizes_[i]; }

  /// The smallest class of at least `bytes` bytes (`bytes <= max_size`; 0 maps to class 0).
  static constexpr std::size_t index(std::size_t bytes) noexcept {
    if (bytes <= Min) return 0;
    const std::size_t s = bytes - 1;
    const int k = static_cast<int>(std::bit_width(s)) - 1;  // 2^k <= s < 2^(k+1); bit_width <= 64
    return first_[static_cast<std::size_t>(k)] + ((s - (std::size_t{1} << k)) >> step_shift(k)) + 1;
  }
};

namespace detail {

/// Exact 32-bit division by a fixed divisor through one 64x64->128 multiply (Lemire et al.,
/// "Faster remainder by direct computation"): `n / d` for every n, d < 2^32.
struct fast_divisor {
  __extension__ typedef unsigned __int128 wide;
  std::uint64_t magic = 0;
  static constexpr fast_divisor of(std::uint32_t d) noexcept { return {~std::uint64_t{0} / d + 1}; }
  std::uint32_t divide(std::uint32_t n) const noexcept {
    return static_cast<std::uint32_t>((static_cast<wide>(magic) * n) >> 64);
  }
};

/// An open-addressing hash map from an address granule (address >> shift) to the at most two
/// slabs that overlap it (slabs are never smaller than a granule). Linear probing, power-of-two
/// capacity at most a quarter full, so that a free's lookup almost always ends at the first slot
/// (fewer mispredicted branches than at half full), deletion by backward shift (no tombstones).
/// 16 bytes per slot, a few slots per slab: host memory only.
class slab_granule_map {
 public:
  static constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();
  struct entry {
    std::uintptr_t key = empty_key;
    std::uint32_t first = none;
    std::uint32_t second = none;
  };

  /// Both slabs that may hold an address in granule `key` (`none` where absent).
  const entry* find(std::uintptr_t key) const noexcept {
    if (entries_.empty()) return nullptr;
    for (std::size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const entry& e = entries_[i];
      if (e.key == key) return &e;
      if (e.key == empty_key) return nullptr;
    }
  }

  /// Adds slab `id` to granule `key`. May throw std::bad_alloc (the caller catches it).
  void add(std::uintptr_t key, std::uint32_t id) {
    if ((size_ + 1) * 4 > entries_.size()) grow();
    std::size_t i = slot_of(key);
    while (entries_[i].key != empty_key && entries_[i].key != key) i = (i + 1) & mask_;
    entry& e = entries_[i];
    if (e.key == empty_key) {
      e = entry{key, id, none};
      ++size_;
    } else if (e.first == none) {
      e.first = id;
    } else {
      e.second = id;
    }
  }

  /// Removes slab `id` from granule `key`; the granule goes when no slab overlaps it any more.
  void remove(std::uintptr_t key, std::uint32_t id) noexcept {
    if (entries_.empty()) return;
    std::size_t i = slot_of(key);
    while (entries_[i].key != key) {
      if (entries_[i].key == empty_key) return;
      i = (i + 1) & mask_;
    }
    entry& e = entries_[i];
    if (e.first == id) e.first = none;
    if (e.second == id) e.second = none;
    if (e.first != none || e.second != none) return;
    // Backward-shift deletion keeps every probe chain unbroken.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; entries_[j].key != empty_key; j = (j + 1) & mask_) {
      const std::size_t home = slot_of(entries_[j].key);
      const bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
      if (movable) {
        entries_[hole] = entries_[j];
        hole = j;
      }
    }
    entries_[hole] = entry{};
    --size_;
  }

  /// Makes room for `n` more granules so that `add` cannot fail. May throw std::bad_alloc.
  void reserve_more(std::size_t n) {
    while ((size_ + n) * 4 > entries_.size()) grow();
  }

 private:
  static constexpr std::uintptr_t empty_key = std::numeric_limits<std::uintptr_t>::max();

  std::size_t slot_of(std::uintptr_t key) const noexcept {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void grow() {
    const std::size_t capacity = entries_.empty() ? 64 : entries_.size() * 2;
    std::vector<entry> old(capacity);
    old.swap(entries_);
    mask_ = capacity - 1;
    shift_ = 64 - std::countr_zero(capacity);
    size_ = 0;
    for (const entry& e : old) {
      if (e.key == empty_key) continue;
      std::size_t i = slot_of(e.key);
      while (entries_[i].key != empty_key) i = (i + 1) & mask_;
      entries_[i] = e;
      ++size_;
    }
  }

  std::vector<entry> entries_;
  std::size_t mask_ = 0;
  int shift_ = 64;
  std::size_t size_ = 0;
};

}  // namespace detail

/// What went wrong in a `deallocate` the size-class pool refused: the shared vocabulary of
/// `alloy/misuse.hpp` (`none` before the first).
using pool_misuse = misuse;

/// Called on every refused deallocate (see `size_class_pool::options::on_misuse`).
using pool_misuse_handler = misuse_handler;

/// How one size class is used now: what callers asked for against what the classes hand out.
struct size_class_usage {
  std::size_t class_size = 0;       ///< bytes of each block of the class
  std::size_t blocks_in_use = 0;    ///< blocks handed out and not given back
  std::size_t requested_bytes = 0;  ///< sum of the sizes callers asked for, over those blocks
  std::size_t rounded_bytes = 0;    ///< blocks_in_use × class_size
  std::size_t slabs = 0;            ///< slabs the class holds
  std::size_t reserved_bytes = 0;   ///< bytes of those slabs
  /// Internal waste: bytes handed out beyond what was asked (rounding and alignment).
  std::size_t internal_waste() const noexcept { return rounded_bytes - requested_bytes; }
};

/// `size_class_pool<Upstream, Classes>` serves small requests from fixed size classes carved out
/// of slabs (the std::pmr / thrust::mr pools, PyTorch's small pool, a slab allocator).
///
/// - Strategy: a request is rounded up to the smallest class that holds it (`Classes`, by
///   default `power2_classes<4, 256, 1 MiB>`: four steps per octave). Each class takes its own
///   slabs from the upstream, a whole number of blocks of at most `slab_size` (one block above);
///   with `initial_slab_size`, a class's first slab is that small and each next one twice the
///   last. Freed blocks are cached per class, most recently freed first; slabs go back only on
///   `release()` or when the upstream fails. An alignment A above 256 is served by rounding the
///   request up to `bytes + A - 256` and handing out the first A-aligned address in the block.
///   All metadata lives in host memory; the managed memory is never touched.
/// - Complexity: allocate and deallocate O(1) (bit arithmetic for the class, a hash look-up of
///   the slab, a multiply-shift for the block index); upstream calls only when a class has no
///   free block. `release()` O(slabs + cached blocks); `for_each_block` O(slabs log slabs +
///   blocks).
/// - Failure: when the upstream cannot give a slab, every wholly free slab is released and the
///   request retried once (`num_alloc_retries`), else an empty block (`num_ooms`). A request the
///   pool refuses by contract (larger than `Classes::max_size`, an alignment that is no power of
///   two or too large) is not counted; put the pool under a `segregator` beside a large-block
///   allocator. Bad frees (foreign, interior, double, wrong size) are detected in every build,
///   ignored, counted in `misuses()` and passed to `options::on_misuse` (docs/design.md#errors).
///   Zero bytes: a unique block of class 0 whose size reads 0.
/// - Thread safety: none (wrap in `synchronized` or `sharded`).
/// - Memory kind: the upstream's. Capabilities: `try_deallocate`, `free_misuse`, `serves`, `owns`,
///   `may_hold_slab_of` (a filter of the slab sizes taken), `release`, `reserved_bytes`,
///   `counters`, `for_each_block` (free blocks too; a wholly free slab as one), `bytes_in_use` (class sizes),
///   `requested_bytes`, `usage(class)`, `allocate_keeping_cache` and `allocate_cached` (for `stream_ordered`); over a
///   `thread_safe_upstream`, planned growth and `release_detached`, so that `synchronized` and
///   `sharded` call the upstream without their lock (docs/design.md#threads).
/// - Defaults chosen by measurement: bench/README.md#current-results
template <allocator Upstream, class Classes = power2_classes<>>
class size_class_pool {
 public:
  static constexpr bool host_accessible = Upstream::host_accessible;
  static constexpr bool device_accessible = Upstream::device_accessible;
  using classes = Classes;
  static_assert(Classes::max_size < (std::size_t{1} << 31), "class sizes must fit 31 bits");

 private:
  // A block's entry in its slab's table: 0 when free, else (size asked + 1) in the low
  // `entry_size_bits` bits and, above them, log2(alignment) - 8 for a block aligned beyond 256
  // (0 otherwise), from which the block's start in its slot is found again. 32 bits while the
  // largest class is at most 64 MiB (27 + 5 bits), 64 bits above.
  static constexpr bool narrow_entries = Classes::max_size <= (std::size_t{1} << 26);
  using entry_type = std::conditional_t<narrow_entries, std::uint32_t, std::uint64_t>;
  static constexpr int entry_size_bits = narrow_entries ? 27 : 32;
  static constexpr entry_type entry_size_mask = (entry_type{1} << entry_size_bits) - 1;

 public:
  /// Alignment every block has without asking (and the alignment slabs are taken with).
  static constexpr std::size_t natural_alignment = 256;
  /// The largest alignment the pool serves (for a request of at most 256 bytes; a larger request
  /// needs `bytes + alignment - 256 <= max_size()`); the edges read it to tell a bad alignment
  /// from an out-of-memory.
  static constexpr std::size_t max_alignment = Classes::max_size;
  static constexpr std::size_t num_classes = Classes::count;

  struct options {
    std::size_t slab_size = std::size_t{2} << 20;  ///< bytes of a slab, at most 1 GiB; default 2 MiB
    std::size_t initial_slab_size = 0;             ///< a class's first slab; 0 (default): `slab_size`
    pool_misuse_handler on_misuse = nullptr;       ///< called on a refused free; null: stderr (checked builds)
    void* misuse_context = nullptr;                ///< passed to `on_misuse`
  };

  size_class_pool() : size_class_pool(Upstream{}) {}
  explicit size_class_pool(Upstream upstream) : size_class_pool(std::move(upstream), options{}) {}
  size_class_pool(Upstream upstream, options opts)
      : upstream_(std::move(upstream)), on_misuse_(opts.on_misuse), misuse_context_(opts.misuse_context) {
    constexpr std::size_t max_slab = std::size_t{1} << 30;
    const std::size_t largest_slab = std::clamp<std::size_t>(opts.slab_size, natural_alignment, max_slab);
    const std::size_t initial = opts.initial_slab_size == 0
                                    ? largest_slab
                                    : std::clamp<std::size_t>(opts.initial_slab_size, natural_alignment, largest_slab);
    slab_size_ = largest_slab;
    std::size_t smallest = std::numeric_limits<std::size_t>::max();
    for (std::size_t i = 0; i < num_classes; ++i) {
      const std::size_t c = Classes::size(i);
      class_state& cls = classes_[i];
      cls.size = static_cast<std::uint32_t>(c);
      cls.divisor = detail::fast_divisor::of(cls.size);
      cls.next_slab = slab_bytes_for(c, initial);
      smallest = std::min(smallest, cls.next_slab);
    }
    granule_shift_ = static_cast<int>(std::bit_width(smallest)) - 1;  // every slab spans at least one granule
  }

  size_class_pool(const size_class_pool&) = delete;
  size_class_pool& operator=(const size_class_pool&) = delete;
  size_class_pool(size_class_pool&& other) noexcept
      : upstream_(std::move(other.upstream_)),
        classes_(std::move(other.classes_)),
        slabs_(std::move(other.slabs_)),
        free_ids_(std::move(other.free_ids_)),
        granules_(std::move(other.granules_)),
        slab_size_(other.slab_size_),
        granule_shift_(other.granule_shift_),
        slab_size_bits_(other.slab_size_bits_),
        slab_size_hashes_(other.slab_size_hashes_),
        reserved_(std::exchange(other.reserved_, 0)),
        in_use_(std::exchange(other.in_use_, 0)),
        requested_(std::exchange(other.requested_, 0)),
        counters_(std::exchange(other.counters_, {})),
        misuses_(std::exchange(other.misuses_, {})),
        last_misuse_(std::exchange(other.last_misuse_, pool_misuse::none)),
        on_misuse_(other.on_misuse_),
        misuse_context_(other.misuse_context_) {
    other.slabs_.clear();
    other.free_ids_.clear();
    other.granules_ = {};
    for (class_state& c : other.classes_) c.reset();
  }
  size_class_pool& operator=(size_class_pool&&) = delete;

  ~size_class_pool() {
    // Blocks still handed out are the caller's leak; the slabs go back regardless.
    for (slab& s : slabs_) {
      if (s.base != nullptr) upstream_.deallocate(s.upstream_block);
    }
  }

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return allocate_impl(bytes, alignment, detail::growth_mode::releasing);
  }

  /// Whether a request is one the pool takes at all, by the rules above (size up to the largest
  /// class, an alignment A above 256 needing `bytes + A - 256` of a class), before any memory is
  /// sought (`request_screening_allocator`: a segregator routes by it, an edge names the cause).
  static constexpr bool serves(std::size_t bytes, std::size_t alignment) noexcept {
    if (!detail::is_power_of_two(alignment)) return false;
    if (alignment <= natural_alignment) return bytes <= Classes::max_size;
    return alignment <= Classes::max_size && bytes <= Classes::max_size &&
           std::max<std::size_t>(bytes, 1) + (alignment - natural_alignment) <= Classes::max_size;
  }
  /// As `allocate`, but an upstream failure is not answered by releasing empty slabs and
  /// retrying: the request fails instead, not counted as an OOM (for `stream_ordered`, which
  /// then makes its streams' work finish and calls `allocate`).
  block allocate_keeping_cache(std::size_t bytes, std::size_t alignment) noexcept {
    return allocate_impl(bytes, alignment, detail::growth_mode::keeping_cache);
  }
  /// A free or uncarved block of the class only (`cache_serving_allocator`): no slab taken, a
  /// failure not counted (for `stream_ordered` under a CUDA graph's capture).
  block allocate_cached(std::size_t bytes, std::size_t alignment) noexcept {
    return allocate_impl(bytes, alignment, detail::growth_mode::without_upstream);
  }

  /// Planned growth (`growth_planning_allocator`, over a `thread_safe_upstream` only): a block
  /// when the class has a free or uncarved block; else an empty block, the pool unchanged, with
  /// `plan` set to the class's next slab (or left empty for a request the pool refuses).
  block allocate_or_plan(std::size_t bytes, std::size_t alignment, growth_plan& plan) noexcept
    requires thread_safe_upstream<Upstream>
  {
    return allocate_impl(bytes, alignment, detail::growth_mode::releasing, &plan);
  }
  /// Adopts `plan.got` as the class's new slab when the class still has no free or uncarved
  /// block (else, or when host metadata cannot grow, it is left in `plan.got` for the caller to
  /// give back, counted as taken and given back), then allocates as `allocate` does.
  block allocate_planned(growth_plan& plan, std::size_t bytes, std::size_t alignment) noexcept
    requires thread_safe_upstream<Upstream>
  {
    if (plan.got) adopt_slab(plan, bytes, alignment);
    if (plan.retried) [[unlikely]] {
      ++counters_.num_alloc_retries;
      return allocate_impl(bytes, alignment, detail::growth_mode::cache_only);
    }
    return allocate_impl(bytes, alignment, detail::growth_mode::releasing);
  }

 private:
  static constexpr std::size_t no_class = std::numeric_limits<std::size_t>::max();
  /// The class a request goes to, or `no_class` for one the pool refuses.
  static std::size_t class_for(std::size_t bytes, std::size_t alignment) noexcept {
    if (!detail::is_power_of_two(alignment)) return no_class;
    std::size_t need = bytes;
    if (alignment > natural_alignment) {
      // The block starts up to alignment - 256 bytes into its slot and must keep its first byte
      // (a zero-byte block too) inside the slot.
      if (alignment > Classes::max_size || bytes > Classes::max_size) return no_class;
      need = std::max<std::size_t>(bytes, 1) + (alignment - natural_alignment);
    }
    if (need > Classes::max_size) return no_class;
    return Classes::index(need);
  }

  [[gnu::noinline]] void adopt_slab(growth_plan& plan, std::size_t bytes, std::size_t alignment) noexcept {
    const std::size_t ci = class_for(bytes, alignment);
    ++counters_.num_device_alloc;
    if (ci != no_class) {
      const class_state& cls = classes_[ci];
      if (cls.free.empty() && cls.bump_slab == none && plan.bytes % cls.size == 0 &&
          install_slab(ci, plan.got, plan.bytes)) {
        plan.got = {};
        return;
      }
    }
    ++counters_.num_device_free;  // the caller gives it back
  }

  block allocate_impl(std::size_t bytes, std::size_t alignment, detail::growth_mode mode,
                      growth_plan* plan = nullptr) noexcept {
    const std::size_t ci = class_for(bytes, alignment);
    if (ci == no_class) return {};
    class_state& cls = classes_[ci];
    std::uint32_t id, index;
    if (!cls.free.empty()) {
      const free_entry e = cls.free.back();
      cls.free.pop_back();
      id = e.slab;
      index = e.index;
    } else if (cls.bump_slab != none) {
      id = cls.bump_slab;
      index = cls.bump_next++;
      if (cls.bump_next == slabs_[id].capacity) cls.bump_slab = none;
    } else {
      if (plan != nullptr) {
        if constexpr (thread_safe_upstream<Upstream>)
          *plan = growth_plan::of(upstream_, cls.next_slab, natural_alignment, *this);
        return {};
      }
      if (!new_slab(ci, mode)) return {};
      id = cls.bump_slab;
      index = cls.bump_next++;
      if (cls.bump_next == slabs_[id].capacity) cls.bump_slab = none;
    }
    slab& s = slabs_[id];
    ++s.live;
    entry_type entry = static_cast<entry_type>(bytes) + 1;
    if (alignment > natural_alignment)
      entry |= static_cast<entry_type>(std::countr_zero(alignment) - 8) << entry_size_bits;
    s.requested[index] = entry;
    ++cls.in_use;
    cls.requested += bytes;
    in_use_ += cls.size;
    requested_ += bytes;
    std::byte* p = s.base + static_cast<std::size_t>(index) * cls.size;
    if (alignment > natural_alignment) {
      p += (alignment - (reinterpret_cast<std::uintptr_t>(p) & (alignment - 1))) & (alignment - 1);
    }
    return {p, bytes};
  }

 public:
  void deallocate(block b) noexcept { (void)try_deallocate(b); }

  /// Checked deallocation (`checked_deallocating_allocator`): frees `b` and returns true when it
  /// is a live block of this pool (or empty); returns false for a misuse, which is ignored and
  /// reported as the class comment says, so that decorators count only accepted frees.
  bool try_deallocate(block b) noexcept {
    if (!b) return true;
    const std::uint32_t id = slab_of(b.ptr);
    if (id == none) [[unlikely]] {
      misuse(pool_misuse::foreign_pointer, b);
      return false;
    }
    slab& s = slabs_[id];
    class_state& cls = classes_[s.class_index];
    const auto [index, into, entry] = slot_of(s, cls, b.ptr);
    if (!is_usual_free(into, entry, b)) [[unlikely]] {
      if (!accept_unusual_free(s, cls, index, into, entry, b)) return false;
    }
    s.requested[index] = 0;
    --s.live;
    --cls.in_use;
    cls.requested -= b.size;
    in_use_ -= cls.size;
    requested_ -= b.size;
    // Cannot fail: the stack's capacity covers every block the class has carved (see new_slab).
    cls.free.push_back({id, index});
    return true;
  }

  /// What `try_deallocate(b)` would refuse `b` as now, or `none` (`free_screening_allocator`):
  /// O(1) for a live block, a bad one as its refused free costs.
  pool_misuse free_misuse(block b) const noexcept {
    if (!b) return pool_misuse::none;
    const std::uint32_t id = slab_of(b.ptr);
    if (id == none) return pool_misuse::foreign_pointer;
    const slab& s = slabs_[id];
    const class_state& cls = classes_[s.class_index];
    const auto [index, into, entry] = slot_of(s, cls, b.ptr);
    return is_usual_free(into, entry, b) ? pool_misuse::none : unusual_free_misuse(s, cls, index, into, entry, b);
  }

  /// Whether `b.ptr` lies in one of this pool's slabs (in use or not).
  bool owns(block b) const noexcept { return b.ptr != nullptr && slab_of(b.ptr) != none; }
  /// Whether a slab of `bytes` may have been taken from the upstream: false means none ever was,
  /// so an upstream block of that size is no slab of this pool (a filter: true may be wrong, false
  /// never is). For a composition that shares the upstream and must not take a slab back as a
  /// block of its own, to skip `owns`. Two words: a size with a bit set that no slab size has
  /// (every size not a multiple of 256, since slabs are whole numbers of class sizes) is refused
  /// at once; the rest by a 64-bit hash of the sizes taken.
  bool may_hold_slab_of(std::size_t bytes) const noexcept {
    return (bytes & ~slab_size_bits_) == 0 && ((slab_size_hashes_ >> slab_size_bit(bytes)) & 1u) != 0;
  }

  /// Gives every wholly free slab back to the upstream.
  void release() noexcept {
    (void)release_slabs(slabs_.size(), [this](block taken) { upstream_.deallocate(taken); });
  }
  /// `release()` without the upstream calls: the empty slabs leave the books into `out`
  /// (`detaching_release_allocator`); false when `out` filled before every one did.
  bool release_detached(detached_segments& out) noexcept
    requires thread_safe_upstream<Upstream>
  {
    return release_slabs(detached_segments::capacity - out.count, [&](block taken) { out.add(upstream_, taken); });
  }

  std::size_t reserved_bytes() const noexcept { return reserved_; }
  /// Bytes handed out, counted in class sizes (what the blocks occupy).
  std::size_t bytes_in_use() const noexcept { return in_use_; }
  /// Bytes callers asked for, over the blocks handed out.
  std::size_t requested_bytes() const noexcept { return requested_; }
  allocator_counters counters() const noexcept { return counters_; }

  /// Usage of class `i` (`i < num_classes`): blocks, requested against rounded bytes, slabs.
  size_class_usage usage(std::size_t i) const noexcept {
    const class_state& cls = classes_[i];
    return {cls.size, cls.in_use, cls.requested, cls.in_use * cls.size, cls.slabs, cls.reserved};
  }
  /// Class size of class `i`, and the class a request of `bytes` (alignment ≤ 256) goes to.
  static constexpr std::size_t class_size(std::size_t i) noexcept { return Classes::size(i); }
  static constexpr std::size_t class_index(std::size_t bytes) noexcept { return Classes::index(bytes); }
  static constexpr std::size_t max_size() noexcept { return Classes::max_size; }
  std::size_t slab_size() const noexcept { return slab_size_; }
  std::size_t slab_count() const noexcept { return slabs_.size() - free_ids_.size(); }

  /// Refused deallocations so far, by kind; their total; and the latest kind.
  misuse_counts misuses() const noexcept { return misuses_; }
  std::size_t misuse_count() const noexcept { return misuses_.total(); }
  pool_misuse last_misuse() const noexcept { return last_misuse_; }

  /// Calls `visit(const block_info&)` for every block of every slab, slabs in address order.
  /// An allocated block is reported with its class size and the size asked for.
  template <class F>
  void for_each_block(F&& visit) const {
    std::vector<std::uint32_t> order;
    order.reserve(slab_count());
    for (std::uint32_t id = 0; id < slabs_.size(); ++id) {
      if (slabs_[id].base != nullptr) order.push_back(id);
    }
    std::sort(order.begin(), order.end(),
              [this](std::uint32_t l, std::uint32_t r) { return slabs_[l].base < slabs_[r].base; });
    for (const std::uint32_t id : order) {
      const slab& s = slabs_[id];
      if (s.live == 0) {  // one free block: the slab goes back whole before a request fails
        block_info info;
        info.segment = info.ptr = s.base;
        info.segment_size = info.size = s.bytes;
        visit(static_cast<const block_info&>(info));
        continue;
      }
      const std::size_t c = classes_[s.class_index].size;
      for (std::uint32_t i = 0; i < s.capacity; ++i) {
        block_info info;
        info.segment = s.base;
        info.segment_size = s.bytes;
        info.ptr = s.base + static_cast<std::size_t>(i) * c;
        info.size = c;
        if (s.requested[i] != 0) {
          info.requested = static_cast<std::size_t>(s.requested[i] & entry_size_mask) - 1;
          info.state = block_state::allocated;
        }
        visit(static_cast<const block_info&>(info));
      }
    }
  }

  Upstream& upstream() noexcept { return upstream_; }
  const Upstream& upstream() const noexcept { return upstream_; }
  auto parts() noexcept { return std::tie(upstream_); }
  auto parts() const noexcept { return std::tie(upstream_); }

 private:
  static constexpr std::uint32_t none = detail::slab_granule_map::none;

  struct free_entry {
    std::uint32_t slab;
    std::uint32_t index;
  };

  struct class_state {
    std::vector<free_entry> free;  // capacity >= blocks carved from the class's slabs
    std::uint32_t size = 0;
    detail::fast_divisor divisor{};
    std::uint32_t bump_slab = none;  // newest slab, not yet wholly carved
    std::uint32_t bump_next = 0;
    std::size_t next_slab = 0;  // bytes of the next slab
    std::size_t carved = 0;     // blocks in the class's slabs
    std::size_t in_use = 0;
    std::size_t requested = 0;
    std::size_t slabs = 0;
    std::size_t reserved = 0;
    void reset() noexcept {
      free.clear();
      bump_slab = none;
      carved = in_use = requested = slabs = reserved = 0;
    }
  };

  struct slab {
    std::byte* base = nullptr;  // null: the id is free
    std::size_t bytes = 0;
    block upstream_block{};
    std::unique_ptr<entry_type[]> requested;  // per block: its entry (see entry_type), 0 when free
    std::uint32_t capacity = 0;
    std::uint32_t live = 0;
    std::uint32_t class_index = 0;
    bool releasing = false;
  };

  static std::size_t slab_bytes_for(std::size_t c, std::size_t target) noexcept {
    return c >= target ? c : target / c * c;
  }

  static unsigned slab_size_bit(std::size_t bytes) noexcept {
    return static_cast<unsigned>((static_cast<std::uint64_t>(bytes) * 0x9E3779B97F4A7C15u) >> 58);  // Fibonacci hashing
  }

  std::uint32_t slab_of(const void* p) const noexcept {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    const auto* e = granules_.find(address >> granule_shift_);
    if (e == nullptr) return none;
    for (const std::uint32_t id : {e->first, e->second}) {
      if (id == none) continue;
      const slab& s = slabs_[id];
      const auto base = reinterpret_cast<std::uintptr_t>(s.base);
      if (address >= base && address - base < s.bytes) return id;
    }
    return none;
  }

  /// Takes a slab for class `ci` and makes it the class's bump slab. Leaves everything as it was
  /// on failure (upstream or host metadata).
  bool new_slab(std::size_t ci, detail::growth_mode mode) noexcept {
    if (mode == detail::growth_mode::without_upstream) return false;
    if (mode == detail::growth_mode::cache_only) {  // the caller asked the upstream already
      ++counters_.num_ooms;
      return false;
    }
    const std::size_t bytes = classes_[ci].next_slab;
    block got = upstream_.allocate(bytes, natural_alignment);
    if (!got && mode == detail::growth_mode::keeping_cache) return false;  // the caller retries with release
    if (!got) {
      ++counters_.num_alloc_retries;
      release();
      got = upstream_.allocate(bytes, natural_alignment);
      if (!got) {
        ++counters_.num_ooms;
        return false;
      }
    }
    if (install_slab(ci, got, bytes)) {
      ++counters_.num_device_alloc;
      return true;
    }
    upstream_.deallocate(got);
    ++counters_.num_ooms;
    return false;
  }

  /// Makes `got` (`bytes`, a whole number of class `ci`'s blocks) the class's bump slab. False,
  /// with nothing changed, when host metadata cannot grow.
  bool install_slab(std::size_t ci, block got, std::size_t bytes) noexcept {
    class_state& cls = classes_[ci];
    const std::size_t capacity = bytes / cls.size;
    std::uint32_t id = none;
    try {
      const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(got.ptr) >> granule_shift_;
      const std::uintptr_t last = (reinterpret_cast<std::uintptr_t>(got.ptr) + bytes - 1) >> granule_shift_;
      granules_.reserve_more(static_cast<std::size_t>(last - first + 1));
      detail::reserve_room(cls.free, cls.carved + capacity);
      auto table = std::make_unique<entry_type[]>(capacity);  // zeroed: every block free
      if (free_ids_.empty()) {
        detail::reserve_room(free_ids_, slabs_.size() + 1);  // so drop_slab's push_back cannot throw
        slabs_.emplace_back();
        id = static_cast<std::uint32_t>(slabs_.size() - 1);
      } else {
        id = free_ids_.back();
        free_ids_.pop_back();
      }
      slab& s = slabs_[id];
      s.base = static_cast<std::byte*>(got.ptr);
      s.bytes = bytes;
      s.upstream_block = got;
      s.requested = std::move(table);
      s.capacity = static_cast<std::uint32_t>(capacity);
      s.live = 0;
      s.class_index = static_cast<std::uint32_t>(ci);
      s.releasing = false;
      for (std::uintptr_t g = first; g <= last; ++g) granules_.add(g, id);  // room reserved above
    } catch (...) {
      return false;
    }
    reserved_ += bytes;
    slab_size_bits_ |= bytes;
    slab_size_hashes_ |= std::uint64_t{1} << slab_size_bit(bytes);
    cls.carved += capacity;
    ++cls.slabs;
    cls.reserved += bytes;
    cls.bump_slab = id;
    cls.bump_next = 0;
    cls.next_slab = std::max(cls.next_slab, slab_bytes_for(cls.size, std::min(bytes * 2, slab_size_)));
    return true;
  }

  /// Drops up to `most` empty slabs, each one's upstream block handed to `give`; true when no
  /// empty slab is left.
  template <class Give>
  bool release_slabs(std::size_t most, Give give) noexcept {
    std::size_t marked = 0;
    bool all = true;
    for (std::uint32_t id = 0; id < slabs_.size(); ++id) {
      if (slabs_[id].base != nullptr && slabs_[id].live == 0) {
        if (marked == most) {
          all = false;
          break;
        }
        slabs_[id].releasing = true;
        ++marked;
      }
    }
    if (marked == 0) return all;
    for (class_state& cls : classes_) {
      std::erase_if(cls.free, [this](const free_entry& e) { return slabs_[e.slab].releasing; });
      if (cls.bump_slab != none && slabs_[cls.bump_slab].releasing) cls.bump_slab = none;
    }
    for (std::uint32_t id = 0; id < slabs_.size(); ++id) {
      if (slabs_[id].releasing) {
        give(slabs_[id].upstream_block);
        drop_slab(id, false);
      }
    }
    return all;
  }

  void drop_slab(std::uint32_t id, bool give_back = true) noexcept {
    slab& s = slabs_[id];
    class_state& cls = classes_[s.class_index];
    const auto start = reinterpret_cast<std::uintptr_t>(s.base);
    for (std::uintptr_t g = start >> granule_shift_; g <= (start + s.bytes - 1) >> granule_shift_; ++g) {
      granules_.remove(g, id);
    }
    if (give_back) upstream_.deallocate(s.upstream_block);
    ++counters_.num_device_free;
    reserved_ -= s.bytes;
    cls.carved -= s.capacity;
    --cls.slabs;
    cls.reserved -= s.bytes;
    s = slab{};
    free_ids_.push_back(id);  // capacity: slabs_.size() ids fit, reserved when the slab was made
  }

  struct slot_position {
    std::uint32_t index;  ///< the slot's index in its slab
    std::uint32_t into;   ///< the pointer's offset into its slot
    entry_type entry;     ///< the slot's entry
  };
  static slot_position slot_of(const slab& s, const class_state& cls, const void* p) noexcept {
    const auto offset = static_cast<std::uint32_t>(static_cast<const std::byte*>(p) - s.base);
    const std::uint32_t index = cls.divisor.divide(offset);
    return {index, offset - index * cls.size, s.requested[index]};
  }
  /// A live block of natural alignment has the entry size + 1 and starts its slot; anything else
  /// (a bad free, or an over-aligned block) takes the slow path. `size + 1` wraps to 0 for
  /// SIZE_MAX, which must not match a free slot's 0.
  static bool is_usual_free(std::uint32_t into, entry_type entry, block b) noexcept {
    return !((entry != b.size + 1) | (into != 0) | (entry == 0));
  }
  /// What is wrong with freeing `b` from its slot, if anything (`none`: an over-aligned live block).
  static pool_misuse unusual_free_misuse(const slab& s, const class_state& cls, std::uint32_t index, std::uint32_t into,
                                         entry_type entry, block b) noexcept {
    if (entry == 0)  // a free slot: where a block of some alignment could have started, or not
      return into % natural_alignment == 0 ? pool_misuse::double_free : pool_misuse::foreign_pointer;
    std::uint32_t start = 0;  // where the block starts in its slot
    if (const int log_over = static_cast<int>(entry >> entry_size_bits); log_over != 0) {
      const std::uintptr_t slot = reinterpret_cast<std::uintptr_t>(s.base) + std::uintptr_t{index} * cls.size;
      const std::uintptr_t alignment = std::uintptr_t{1} << (log_over + 8);
      start = static_cast<std::uint32_t>((alignment - (slot & (alignment - 1))) & (alignment - 1));
    }
    if (into != start) return pool_misuse::foreign_pointer;
    if (static_cast<std::size_t>(entry & entry_size_mask) - 1 != b.size) return pool_misuse::wrong_size;
    return pool_misuse::none;
  }
  /// The slow path of a free whose entry is not a plain match: true when it is the valid free of
  /// an over-aligned block, else reports why it is refused and returns false.
  [[gnu::cold]] [[gnu::noinline]] bool accept_unusual_free(const slab& s, const class_state& cls, std::uint32_t index,
                                                           std::uint32_t into, entry_type entry, block b) noexcept {
    const pool_misuse kind = unusual_free_misuse(s, cls, index, into, entry, b);
    if (kind == pool_misuse::none) return true;
    misuse(kind, b);
    return false;
  }

  void misuse(pool_misuse kind, block b) noexcept {
    last_misuse_ = kind;
    detail::report_misuse(misuses_, kind, b, on_misuse_, misuse_context_, "size_class_pool");
  }

  Upstream upstream_{};
  std::array<class_state, num_classes> classes_{};
  std::vector<slab> slabs_;
  std::vector<std::uint32_t> free_ids_;
  detail::slab_granule_map granules_;
  std::size_t slab_size_ = 0;
  int granule_shift_ = 20;
  std::size_t slab_size_bits_ = 0;      ///< every slab size taken, or-ed
  std::uint64_t slab_size_hashes_ = 0;  ///< bit `slab_size_bit(bytes)` for every slab size taken
  std::size_t reserved_ = 0;
  std::size_t in_use_ = 0;
  std::size_t requested_ = 0;
  allocator_counters counters_{};
  misuse_counts misuses_{};
  pool_misuse last_misuse_ = pool_misuse::none;
  pool_misuse_handler on_misuse_ = nullptr;
  void* misuse_context_ = nullptr;
};

}  // namespace alloy
