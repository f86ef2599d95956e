// SPDX-License-Identifier: Apache-2.0
// The capability matrix: for every wrapper W and every optional capability C listed in
// `alloy::detail::capability`, W<A> has C exactly when A has it, over toy parts that have every
// capability, none, and each one alone. A wrapper's own capabilities (limited's `bytes_limit`)
// and the ones it documents it does not pass on (movable handles through the counting
// decorators) are listed per wrapper below; everything else must match. The checks are
// static_asserts: this file does not compile when a wrapper loses or invents a capability.
//
// Adding a capability to `detail::capability` fails here until the toy below has it (the
// `toy<all_bits>` check) and then checks every wrapper for it. A new wrapper gets a row below.
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <string>
#include <utility>

#include <alloy/alloy.hpp>
#include <alloy/policy/sharded.hpp>
#include <alloy/showcase.hpp>
#include <alloy/vmm/synchronized_vmm.hpp>

using namespace alloy::literals;
using alloy::detail::capability;
using alloy::detail::capability_count;

namespace {

using stream_t = alloy::host_stream*;

constexpr unsigned bit(capability c) { return 1u << static_cast<unsigned>(c); }
constexpr unsigned all_bits = (1u << capability_count) - 1;
static_assert(capability_count < 32, "the masks below are 32 bits");

template <capability C, class A>
constexpr bool has = alloy::detail::has_capability<C, A, stream_t>();

/// A part with exactly the capabilities in `Mask` (it never allocates: only its shape matters).
template <unsigned Mask>
struct toy {
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  static constexpr bool on(capability c) { return (Mask & bit(c)) != 0; }

  alloy::block allocate(std::size_t, std::size_t) noexcept { return {}; }
  void deallocate(alloy::block) noexcept {}
  /// Not a capability passed on but what granule_segregator asks of its parts (every toy has it).
  std::size_t granules_added(std::size_t, std::size_t) const noexcept { return 0; }

  bool owns(alloy::block) const noexcept
    requires(on(capability::owns))
  {
    return false;
  }
  void release() noexcept
    requires(on(capability::release))
  {}
  std::size_t reserved_bytes() const noexcept
    requires(on(capability::reserved_bytes))
  {
    return 0;
  }
  alloy::allocator_counters counters() const noexcept
    requires(on(capability::counters))
  {
    return {};
  }
  template <class F>
    requires(on(capability::for_each_block))
  void for_each_block(F&&) const {}
  void record_use(alloy::block, stream_t)
    requires(on(capability::record_use))
  {}
  std::size_t bytes_in_use() const noexcept
    requires(on(capability::bytes_in_use))
  {
    return 0;
  }
  std::size_t requested_bytes() const noexcept
    requires(on(capability::requested_bytes))
  {
    return 0;
  }
  std::size_t bytes_limit() const noexcept
    requires(on(capability::bytes_limit))
  {
    return 0;
  }
  std::size_t bytes_reservable_limit() const noexcept
    requires(on(capability::bytes_reservable_limit))
  {
    return 0;
  }
  alloy::block allocate_keeping_cache(std::size_t, std::size_t) noexcept
    requires(on(capability::allocate_keeping_cache))
  {
    return {};
  }
  alloy::block allocate_cached(std::size_t, std::size_t) noexcept
    requires(on(capability::allocate_cached))
  {
    return {};
  }
  bool try_deallocate(alloy::block) noexcept
    requires(on(capability::try_deallocate))
  {
    return false;
  }
  alloy::block allocate(std::size_t, std::size_t, stream_t) noexcept
    requires(on(capability::stream_ordered))
  {
    return {};
  }
  void deallocate(alloy::block, stream_t) noexcept
    requires(on(capability::stream_ordered))
  {}
  bool try_deallocate(alloy::block, stream_t) noexcept
    requires(on(capability::try_deallocate_on_stream))
  {
    return false;
  }
  alloy::handle allocate_movable(std::size_t) noexcept
    requires(on(capability::movable))
  {
    return {};
  }
  void* lock(alloy::handle)
    requires(on(capability::movable))
  {
    return nullptr;
  }
  void unlock(alloy::handle)
    requires(on(capability::movable))
  {}
  void deallocate(alloy::handle)
    requires(on(capability::movable))
  {}
  std::size_t size_of(alloy::handle) const
    requires(on(capability::size_of))
  {
    return 0;
  }
  alloy::movable_counters movable_statistics() const noexcept
    requires(on(capability::movable_statistics))
  {
    return {};
  }
  void reset_movable_peak() noexcept
    requires(on(capability::reset_movable_peak))
  {}
  bool is_live(alloy::handle) const noexcept
    requires(on(capability::is_live))
  {
    return false;
  }
  bool try_deallocate(alloy::handle) noexcept
    requires(on(capability::movable) && on(capability::try_free_handle))
  {
    return false;
  }
  alloy::misuse free_misuse(alloy::block) const noexcept
    requires(on(capability::free_misuse))
  {
    return alloy::misuse::none;
  }
  bool serves(std::size_t, std::size_t) const noexcept
    requires(on(capability::serves))
  {
    return true;
  }
  alloy::block allocate_or_plan(std::size_t, std::size_t, alloy::growth_plan&) noexcept
    requires(on(capability::planned_growth))
  {
    return {};
  }
  alloy::block allocate_planned(alloy::growth_plan&, std::size_t, std::size_t) noexcept
    requires(on(capability::planned_growth))
  {
    return {};
  }
  alloy::tag current_tag() const noexcept
    requires(on(capability::current_tag))
  {
    return {};
  }
  void set_current_tag(alloy::tag) noexcept
    requires(on(capability::current_tag))
  {}
  alloy::block allocate(std::size_t, std::size_t, alloy::tag) noexcept
    requires(on(capability::tagged_allocate))
  {
    return {};
  }
  alloy::offload_status offload(alloy::tag) noexcept
    requires(on(capability::offload))
  {
    return {};
  }
  alloy::offload_status discard(alloy::tag) noexcept
    requires(on(capability::offload))
  {
    return {};
  }
  alloy::offload_status restore(alloy::tag) noexcept
    requires(on(capability::offload))
  {
    return {};
  }
  alloy::tag_state state(alloy::tag) const noexcept
    requires(on(capability::offload))
  {
    return {};
  }
  alloy::offload_statistics offload_stats() const noexcept
    requires(on(capability::offload))
  {
    return {};
  }
  alloy::offload_status offload_all() noexcept
    requires(on(capability::offload_all))
  {
    return {};
  }
  std::size_t host_bytes(alloy::tag) const noexcept
    requires(on(capability::tag_figures))
  {
    return 0;
  }
  std::size_t mapped_bytes(alloy::tag) const noexcept
    requires(on(capability::tag_figures))
  {
    return 0;
  }
  std::size_t live_bytes(alloy::tag) const noexcept
    requires(on(capability::tag_figures))
  {
    return 0;
  }
  bool release_detached(alloy::detached_segments&) noexcept
    requires(on(capability::detaching_release))
  {
    return true;
  }
  bool begin_allocate_to_pool(alloy::graph_pool&, stream_t) noexcept
    requires(on(capability::graph_pools))
  {
    return true;
  }
  void end_allocate_to_pool(alloy::graph_pool&) noexcept
    requires(on(capability::graph_pools))
  {}
  void release_pool(alloy::graph_pool&) noexcept
    requires(on(capability::graph_pools))
  {}
  alloy::graph_pool_figures pool_figures() const noexcept
    requires(on(capability::graph_pools))
  {
    return {};
  }
};

/// The capabilities of `A`, as a mask.
template <class A>
constexpr unsigned mask_of() {
  return []<unsigned... I>(std::integer_sequence<unsigned, I...>) {
    return ((has<static_cast<capability>(I), A> ? (1u << I) : 0u) | ...);
  }(std::make_integer_sequence<unsigned, capability_count>{});
}

// The toys are what they claim (a capability added to the list without a toy member fails here).
static_assert(mask_of<toy<all_bits>>() == all_bits, "toy<all> lacks a capability of detail::capability");
static_assert(mask_of<toy<0>>() == 0);
// size_of and try_deallocate(handle) are movable capabilities (their concepts ask for movable
// too); every other one stands alone.
static_assert([]<unsigned... I>(std::integer_sequence<unsigned, I...>) {
  return ((mask_of<toy<(1u << I)>>() == (1u << I) || static_cast<capability>(I) == capability::size_of ||
           static_cast<capability>(I) == capability::try_free_handle) &&
          ...);
}(std::make_integer_sequence<unsigned, capability_count>{}));

constexpr unsigned movable_group = bit(capability::movable) | bit(capability::size_of) |
                                   bit(capability::movable_statistics) | bit(capability::reset_movable_peak) |
                                   bit(capability::is_live) | bit(capability::try_free_handle);
constexpr unsigned limits = bit(capability::bytes_limit) | bit(capability::bytes_reservable_limit);
// documented: graph pools belong to one stream_ordered part; the composites of two parts do not
// pass them on (a stream_ordered above the composite has them)
constexpr unsigned graph_pools = bit(capability::graph_pools);

/// What `W<A>` must have: its own capabilities, plus `A`'s except those it does not pass on.
template <class W, class A>
constexpr unsigned expected() {
  return W::own | (mask_of<A>() & ~W::not_passed);
}

// ---- the wrappers ----------------------------------------------------------------------------

struct w_ref {
  static constexpr const char* name = "ref";
  template <class A>
  using type = alloy::ref<A>;
  static constexpr unsigned own = 0, not_passed = 0;
};
struct w_synchronized {
  static constexpr const char* name = "synchronized";
  template <class A>
  using type = alloy::synchronized<A>;
  static constexpr unsigned own = 0, not_passed = 0;
};
struct w_stats {
  static constexpr const char* name = "stats";
  template <class A>
  using type = alloy::stats<A>;
  static constexpr unsigned own = bit(capability::bytes_in_use), not_passed = 0;
};
struct w_limited {
  static constexpr const char* name = "limited";
  template <class A>
  using type = alloy::limited<A>;
  static constexpr unsigned own = bit(capability::bytes_in_use) | bit(capability::bytes_limit);
  static constexpr unsigned not_passed = movable_group;  // documented: the cap is on raw blocks
};
struct w_logged {
  static constexpr const char* name = "logged";
  template <class A>
  using type = alloy::logged<A>;
  static constexpr unsigned own = 0, not_passed = movable_group;  // documented: no CSV action
};
struct w_tracked {
  static constexpr const char* name = "tracked";
  template <class A>
  using type = alloy::tracked<A>;
  static constexpr unsigned own = 0, not_passed = movable_group;  // documented
};
struct w_quantizer {
  static constexpr const char* name = "quantizer";
  template <class A>
  using type = alloy::quantizer<A, 256>;
  static constexpr unsigned own = bit(capability::requested_bytes), not_passed = movable_group;
};
/// Both parts the same toy: the composite has what its parts have, limits and handles aside.
struct w_segregator {
  static constexpr const char* name = "segregator";
  template <class A>
  using type = alloy::segregator<1024, A, A>;
  static constexpr unsigned own = 0, not_passed = movable_group | limits | graph_pools;
};
struct w_fallback {
  static constexpr const char* name = "fallback";
  template <class A>
  using type = alloy::fallback<A, A>;
  static constexpr unsigned own = 0, not_passed = movable_group | limits | graph_pools;
};
struct w_granule_segregator {
  static constexpr const char* name = "granule_segregator";
  template <class A>
  using type = alloy::granule_segregator<1024, A, A>;
  static constexpr unsigned own = 0, not_passed = movable_group | limits | graph_pools;
};

struct w_sharded {
  static constexpr const char* name = "sharded";
  template <class A>
  using type = alloy::sharded<A>;
  static constexpr unsigned own = 0;
  // documented: a planned growth is used inside (the upstream call without the shard's lock),
  // not offered; a free in a thread's cache is not one its shard sees
  static constexpr unsigned not_passed = bit(capability::planned_growth) | bit(capability::free_misuse);
};

/// Capabilities where `W<toy<Mask>>` differs from what it should have (0 when it is right).
template <class W, unsigned Mask>
constexpr unsigned mismatch() {
  using A = toy<Mask>;
  return mask_of<typename W::template type<A>>() ^ expected<W, A>();
}

/// Every toy: none, all, each capability alone, and all but each one; `Base` is or-ed into each
/// (fallback's primary and granule_segregator's small part must have `owns`).
template <class W, unsigned Base = 0>
constexpr unsigned mismatches_over_toys() {
  unsigned bad = mismatch<W, Base>() | mismatch<W, all_bits>();
  [&]<unsigned... I>(std::integer_sequence<unsigned, I...>) {
    ((bad |= mismatch<W, Base | (1u << I)>() | mismatch<W, Base | (all_bits & ~(1u << I))>()), ...);
  }(std::make_integer_sequence<unsigned, capability_count>{});
  return bad;
}

// A failing assertion shows the mask of the capabilities that differ (bit i: capability i).
static_assert(mismatches_over_toys<w_ref>() == 0);
static_assert(mismatches_over_toys<w_synchronized>() == 0);
static_assert(mismatches_over_toys<w_stats>() == 0);
static_assert(mismatches_over_toys<w_limited>() == 0);
static_assert(mismatches_over_toys<w_logged>() == 0);
static_assert(mismatches_over_toys<w_tracked>() == 0);
static_assert(mismatches_over_toys<w_quantizer>() == 0);
static_assert(mismatches_over_toys<w_segregator>() == 0);
static_assert(mismatches_over_toys<w_fallback, bit(capability::owns)>() == 0);
static_assert(mismatches_over_toys<w_granule_segregator, bit(capability::owns)>() == 0);  // Small must have owns
static_assert(mismatches_over_toys<w_sharded, bit(capability::owns)>() == 0);             // Inner must have owns

// stream_ordered gives stream-ordered calls to a part that keeps its cache: it has the part's
// queries, `record_use` and the stream calls of its own, checked frees (both forms) when the part
// checks its frees, and neither keeping-cache calls, handles nor `free_misuse` (its pending frees
// are live to the part).
template <unsigned Mask>
constexpr unsigned stream_ordered_mismatch() {
  constexpr unsigned m = Mask | bit(capability::allocate_keeping_cache);
  using A = toy<m>;
  // documented: stream_ordered allocates through the part's keeping-cache call, which takes the
  // part's current tag, so a tag reaches it by `scoped_tag`, not per call
  constexpr unsigned passed =
      m & ~(movable_group | bit(capability::allocate_keeping_cache) | bit(capability::allocate_cached) |
            bit(capability::try_deallocate_on_stream) | bit(capability::planned_growth) |
            bit(capability::tagged_allocate) | bit(capability::graph_pools) | bit(capability::free_misuse));
  constexpr unsigned checked = (m & bit(capability::try_deallocate)) != 0
                                   ? bit(capability::try_deallocate) | bit(capability::try_deallocate_on_stream)
                                   : 0u;
  // its own graph pools (a host stream is a capturable stream that never captures)
  constexpr unsigned want =
      passed | checked | bit(capability::stream_ordered) | bit(capability::record_use) | bit(capability::graph_pools);
  return mask_of<alloy::stream_ordered<A, stream_t>>() ^ want;
}
constexpr unsigned stream_ordered_mismatches = []<unsigned... I>(std::integer_sequence<unsigned, I...>) {
  return ((stream_ordered_mismatch<(1u << I)>() | stream_ordered_mismatch<(all_bits & ~(1u << I))>()) | ... |
          (stream_ordered_mismatch<0>() | stream_ordered_mismatch<all_bits>()));
}(std::make_integer_sequence<unsigned, capability_count>{});
static_assert(stream_ordered_mismatches == 0);

// The real blocks, as users see them (the table of docs/design.md#adaptors): no wrapper of
// best_fit_arena loses a capability.
using arena = alloy::best_fit_arena<alloy::host_upstream>;
constexpr unsigned arena_mask = mask_of<arena>();
static_assert((arena_mask & bit(capability::try_deallocate)) != 0);
static_assert((arena_mask & bit(capability::counters)) != 0 && (arena_mask & bit(capability::bytes_in_use)) != 0);
static_assert(mask_of<alloy::synchronized<arena>>() == arena_mask);
static_assert(mask_of<alloy::ref<arena>>() == arena_mask);
static_assert(mask_of<alloy::tracked<arena>>() == arena_mask);
static_assert(mask_of<alloy::logged<arena>>() == arena_mask);
static_assert(mask_of<alloy::limited<arena>>() == (arena_mask | bit(capability::bytes_limit)));  // its own limit
static_assert(mask_of<alloy::stats<arena>>() == arena_mask);
static_assert((mask_of<alloy::fallback<arena, arena>>() | limits) == (arena_mask | limits));
static_assert(alloy::counting_allocator<alloy::synchronized<alloy::default_allocator<alloy::host_upstream>>>);
static_assert(alloy::cache_keeping_allocator<alloy::limited<alloy::logged<alloy::tracked<arena>>>>);
// Tags and offload reach every wrapper of a virtual arena and of virtual_allocator.
using varena = alloy::virtual_arena<alloy::host_vmm>;
using vallocator = alloy::virtual_allocator<alloy::host_vmm>;
constexpr unsigned tag_group = bit(capability::current_tag) | bit(capability::tagged_allocate) |
                               bit(capability::offload) | bit(capability::offload_all) | bit(capability::tag_figures);
static_assert((mask_of<varena>() & tag_group) == tag_group);
static_assert(mask_of<alloy::synchronized<varena>>() == mask_of<varena>());
static_assert(mask_of<alloy::ref<varena>>() == mask_of<varena>());
static_assert(mask_of<alloy::stats<varena>>() == mask_of<varena>());
static_assert(mask_of<alloy::tracked<varena>>() == mask_of<varena>());
static_assert(mask_of<alloy::logged<varena>>() == mask_of<varena>());
static_assert(mask_of<alloy::limited<varena>>() == (mask_of<varena>() | bit(capability::bytes_limit)));
static_assert((mask_of<alloy::sharded<varena>>() & tag_group) == tag_group);
static_assert((mask_of<alloy::segregator<4096, varena, varena>>() & tag_group) == tag_group);
static_assert(mask_of<alloy::synchronized<alloy::stats<vallocator>>>() == mask_of<vallocator>());
static_assert(alloy::tagging_allocator<alloy::synchronized<alloy::stats<vallocator>>>);
static_assert(alloy::offloading_allocator<alloy::synchronized<alloy::stats<vallocator>>>);
// A composite of a tagging part and a part without tags has none (documented in two_parts).
static_assert((mask_of<alloy::fallback<varena, arena>>() & tag_group) == 0);
// Planned growth reaches synchronized through the showcase compositions and stats<>.
static_assert(alloy::growth_planning_allocator<alloy::stats<alloy::default_allocator<alloy::host_upstream>>>);
static_assert(alloy::growth_planning_allocator<alloy::caching_allocator<alloy::host_upstream>>);
static_assert(!alloy::growth_planning_allocator<alloy::size_class_pool<alloy::ref<arena>>>);  // not thread safe
// Over a thread-safe backend the virtual arena and virtual_allocator plan their growth (creates
// and maps without the caller's lock) and detach their release (unmaps without it), and every
// wrapper passes both on; over host_vmm they do neither.
using shared_vmm = alloy::vmm_ref<alloy::synchronized_vmm<alloy::host_vmm>>;
using ts_varena = alloy::virtual_arena<shared_vmm>;
constexpr unsigned unlocked_calls = bit(capability::planned_growth) | bit(capability::detaching_release);
static_assert(mask_of<ts_varena>() == (mask_of<varena>() | unlocked_calls));
static_assert((mask_of<varena>() & unlocked_calls) == 0);
static_assert(mask_of<alloy::synchronized<ts_varena>>() == mask_of<ts_varena>());
static_assert(mask_of<alloy::stats<ts_varena>>() == mask_of<ts_varena>());
static_assert(mask_of<alloy::limited<ts_varena>>() == (mask_of<ts_varena>() | bit(capability::bytes_limit)));
static_assert(mask_of<alloy::virtual_allocator<shared_vmm>>() == (mask_of<vallocator>() | unlocked_calls));
static_assert(mask_of<alloy::synchronized<alloy::stats<alloy::virtual_allocator<shared_vmm>>>>() ==
              mask_of<alloy::virtual_allocator<shared_vmm>>());
// So does the two-phase release: `synchronized` and `sharded` give the segments back without
// their lock through `stats<>` too.
static_assert(alloy::detaching_release_allocator<alloy::stats<alloy::default_allocator<alloy::host_upstream>>>);
static_assert(
    alloy::detaching_release_allocator<alloy::sharded<alloy::stats<alloy::default_allocator<alloy::host_upstream>>>>);

}  // namespace

// The matrix is checked at compile time above; at run time, the same masks are reported per
// wrapper (so a reader of the test log sees what was covered), and they must be zero.
BOOST_AUTO_TEST_CASE(every_wrapper_has_exactly_what_its_part_has) {
  const std::pair<const char*, unsigned> rows[] = {
      {w_ref::name, mismatches_over_toys<w_ref>()},
      {w_synchronized::name, mismatches_over_toys<w_synchronized>()},
      {w_stats::name, mismatches_over_toys<w_stats>()},
      {w_limited::name, mismatches_over_toys<w_limited>()},
      {w_logged::name, mismatches_over_toys<w_logged>()},
      {w_tracked::name, mismatches_over_toys<w_tracked>()},
      {w_quantizer::name, mismatches_over_toys<w_quantizer>()},
      {w_segregator::name, mismatches_over_toys<w_segregator>()},
      {w_fallback::name, mismatches_over_toys<w_fallback, bit(capability::owns)>()},
      {w_granule_segregator::name, mismatches_over_toys<w_granule_segregator, bit(capability::owns)>()},
      {w_sharded::name, mismatches_over_toys<w_sharded, bit(capability::owns)>()},
      {"stream_ordered", stream_ordered_mismatches},
  };
  for (const auto& [name, bad] : rows) BOOST_TEST(bad == 0u, name << " over " << (2 * capability_count + 2) << " toys");
}

// The forwarded queries answer with the part's figures, through the guard (synchronized) or the
// pointer (ref), and the checked free says what the arena did.
BOOST_AUTO_TEST_CASE(forwarded_queries_give_the_parts_figures) {
  alloy::synchronized<arena> locked;
  const alloy::block a = locked.allocate(1000, 256);
  BOOST_REQUIRE(a);
  BOOST_TEST(locked.bytes_in_use() == locked.inner().bytes_in_use());
  BOOST_TEST(locked.bytes_in_use() == 1024u);
  BOOST_TEST(locked.requested_bytes() == 1000u);
  BOOST_TEST(locked.counters().num_device_alloc == 1u);
  BOOST_TEST(locked.try_deallocate(a));
  BOOST_TEST(!locked.try_deallocate(a));  // a double free, refused
  BOOST_TEST(locked.inner().misuses().double_frees == 1u);

  arena shared;
  alloy::ref<arena> r{shared};
  const alloy::block b = r.allocate_keeping_cache(300, 16);
  BOOST_REQUIRE(b);
  BOOST_TEST(r.bytes_in_use() == 512u);
  BOOST_TEST(r.requested_bytes() == 300u);
  BOOST_TEST(!r.try_deallocate({b.ptr, 299}));  // wrong size: the block stays allocated
  BOOST_TEST(shared.requested_bytes() == 300u);
  BOOST_TEST(r.try_deallocate(b));
  BOOST_TEST(shared.requested_bytes() == 0u);

  alloy::fallback<arena, arena> both;
  const alloy::block c = both.allocate(100, 16);
  BOOST_TEST(both.counters().num_device_alloc == 1u);
  BOOST_TEST(both.bytes_in_use() == 256u);
  both.deallocate(c);
  BOOST_TEST(both.bytes_in_use() == 0u);
}
