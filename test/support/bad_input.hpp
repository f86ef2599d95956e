// SPDX-License-Identifier: Apache-2.0
// test/support/bad_input.hpp: the bad-input matrix: every bad input of docs/design.md#errors
// through a composition, with everything the composition says about itself checked exactly after
// each.
//
// `bad_input_suite<Recipe>(name)` builds the recipe's composition over a `checking_upstream` and
// runs, with live "witness" blocks holding fill patterns all along:
//   zero bytes, sizes near SIZE_MAX, alignments that are not powers of two or are huge, a double
//   free, foreign pointers (stack, heap, another allocator's block), interior pointers, wrong
//   sizes (smaller, larger, 0, SIZE_MAX), each followed by a valid allocate and free;
// then the same composition over a `failing_upstream` whose calls fail from some point on.
//
// After every step it compares what the composition reports — `bytes_in_use` and
// `requested_bytes` of the outermost part, `statistics()` (`num_allocs`, `bytes_in_use`) and
// PyTorch's `memory_stats` (`allocation.*.current`, `.allocated`, `.freed`,
// `allocated_bytes.all.current`, `requested_bytes.all.current`) where a `stats<>` is inside,
// `limited<>`'s count, `tracked<>`'s leak report (outstanding count and bytes, each witness
// outstanding), and the allocated pieces introspection shows — against the value before the
// step: unchanged after a refused call, accumulated counters up by exactly the valid calls made.
// Where the composition has `free_misuse`, it must name every bad free before it is made, and
// nothing for the live block of each valid pair.
// At the end the witnesses must hold their patterns, a `limited<>` must serve exactly up to its
// limit, and the upstream must get every byte back when the composition is destroyed.
//
// Inputs the composition cannot tell apart from valid ones (a stale free of an address handed
// out again with the same size) are not in the matrix; compositions whose bottom part cannot
// check frees (a decorator straight over an upstream) are not either (docs/design.md#errors asks
// the policy that owns the memory to tell).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <alloy/concepts.hpp>
#include <alloy/find.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/movable.hpp>
#include <alloy/policy/limited.hpp>
#include <alloy/policy/tracked.hpp>

#include "checking_upstream.hpp"
#include "conformance.hpp"

namespace alloy::testing {

/// What a composition says about itself, by name. Names in `accumulated_keys` only grow.
using observation = std::map<std::string, long long>;

inline bool is_accumulated_allocs(const std::string& key) {
  return key == "stats.num_allocs" || key == "allocation.all.allocated";
}
inline bool is_accumulated_frees(const std::string& key) { return key == "allocation.all.freed"; }

template <class A>
observation observe(A& a) {
  observation o;
  // A thread cache's blocks count as in use in the shards: they go back first, so that the
  // figures are the live blocks' (and what the cache held is checked by the shards' engines).
  if constexpr (requires { a.flush_thread_cache(); }) a.flush_thread_cache();
  if constexpr (detail::reports_bytes_in_use<A>) o["bytes_in_use"] = static_cast<long long>(a.bytes_in_use());
  if constexpr (detail::reports_requested_bytes<A>) o["requested_bytes"] = static_cast<long long>(a.requested_bytes());
  if constexpr (detail::contains_stats<A>) {
    const statistics s = statistics_of(a);
    o["stats.num_allocs"] = static_cast<long long>(s.num_allocs);
    o["stats.bytes_in_use"] = static_cast<long long>(s.bytes_in_use);
    o["stats.requested_bytes"] = static_cast<long long>(s.requested_bytes);
    auto m = memory_stats(a);
    for (const char* key : {"allocation.all.current", "allocation.all.allocated", "allocation.all.freed",
                            "allocation.small_pool.current", "allocation.large_pool.current", "active.all.current",
                            "allocated_bytes.all.current", "requested_bytes.all.current", "active_bytes.all.current"}) {
      o[key] = m[key];
    }
  }
  if constexpr (detail::contains_part<A, detail::specialization_of<alloy::limited>>()) {
    o["limited.bytes_in_use"] = static_cast<long long>(find<alloy::limited>(a).bytes_in_use());
  }
  if constexpr (detail::contains_part<A, detail::specialization_of<alloy::tracked>>()) {
    auto& t = find<alloy::tracked>(a);
    o["tracked.outstanding_count"] = static_cast<long long>(t.outstanding_count());
    o["tracked.outstanding_bytes"] = static_cast<long long>(t.outstanding_bytes());
  }
  if constexpr (detail::has_movable_statistics<A>) {
    const movable_counters m = a.movable_statistics();
    o["movable.bytes_active"] = static_cast<long long>(m.bytes_active);
    o["movable.bytes_inactive"] = static_cast<long long>(m.bytes_inactive);
    o["movable.bytes_spilled"] = static_cast<long long>(m.bytes_spilled);
  }
  if constexpr (introspectable_allocator<A>) {
    long long allocated = 0;
    a.for_each_block([&](const block_info& info) {
      if (info.state != block_state::free && info.state != block_state::unmapped) ++allocated;
    });
    o["introspection.allocated_pieces"] = allocated;
  }
  return o;
}

/// Checks `after` against `before`: every value equal, except the accumulated counters, which
/// must have grown by exactly `allocs` (allocations) and `frees` (accepted frees).
inline void expect_observation(const observation& before, const observation& after, long long allocs, long long frees,
                               const std::string& what) {
  for (const auto& [key, value] : before) {
    const auto found = after.find(key);
    if (found == after.end()) continue;
    long long expected = value;
    if (is_accumulated_allocs(key)) expected += allocs;
    if (is_accumulated_frees(key)) expected += frees;
    BOOST_TEST(found->second == expected, what << ": " << key << " is " << found->second << ", expected " << expected);
  }
}

/// Whether a `limited<>` is on the path of every request: `A` is one, or wraps one part that is.
template <class A>
constexpr bool limited_on_every_path() {
  if constexpr (detail::is_specialization_of<A, alloy::limited>) {
    return true;
  } else if constexpr (composite<A>) {
    using parts = detail::parts_t<A>;
    if constexpr (std::tuple_size_v<parts> == 1) {
      return limited_on_every_path<std::remove_cvref_t<std::tuple_element_t<0, parts>>>();
    } else {
      return false;
    }
  } else {
    return false;
  }
}

/// The matrix over one composition `a` (its upstream host memory). `name` goes in messages;
/// requests above `largest` (a pool alone serves up to its largest class) are left out.
template <allocator A>
void check_bad_input_matrix(A& a, const std::string& name, std::size_t largest) {
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  std::vector<live_block> witnesses;
  std::uint64_t next_id = 1000;
  for (std::size_t bytes : {std::size_t{100}, std::size_t{1000}, std::size_t{5000}, 70_KiB, 3_MiB}) {
    if (bytes > largest) continue;
    const block b = a.allocate(bytes, 256);
    BOOST_REQUIRE_MESSAGE(b, name << ": witness of " << bytes << " bytes");
    fill_pattern(b, next_id);
    witnesses.push_back({b, next_id++, 256});
  }
  const auto no_overlap_with_witnesses = [&](block b, const std::string& what) {
    std::vector<live_block> all = witnesses;
    all.push_back({b, 0, 1});
    BOOST_TEST(!any_overlap(all), name << ": " << what << ": a new block overlaps a live one");
  };
  // A valid allocate and free after each step: it must work and count exactly one pair.
  const auto valid_pair_still_works = [&](const std::string& after) {
    const observation before = observe(a);
    const block b = a.allocate(4096, 256);
    BOOST_TEST(static_cast<bool>(b), name << ": a valid allocate after " << after);
    if (!b) return;
    fill_pattern(b, 1);
    no_overlap_with_witnesses(b, after);
    if constexpr (alloy::free_screening_allocator<A>)
      BOOST_TEST((a.free_misuse(b) == alloy::misuse::none), name << ": free_misuse of a live block after " << after);
    a.deallocate(b);
    expect_observation(before, observe(a), 1, 1, name + ": valid pair after " + after);
  };
  const auto refused_free = [&](block bad, const observation& expected, const std::string& what) {
    if constexpr (alloy::free_screening_allocator<A>)
      BOOST_TEST((a.free_misuse(bad) != alloy::misuse::none), name << ": free_misuse does not name the " << what);
    a.deallocate(bad);
    expect_observation(expected, observe(a), 0, 0, name + ": " + what);
  };

  // Zero bytes: a valid block of size 0, counted as one allocation, freed as one.
  for (std::size_t alignment : {std::size_t{1}, std::size_t{256}}) {
    const observation before = observe(a);
    const block z = a.allocate(0, alignment);
    BOOST_TEST(static_cast<bool>(z), name << ": zero bytes yield a block");
    BOOST_TEST(z.size == 0u);
    if (z) {
      no_overlap_with_witnesses(z, "zero bytes");
      a.deallocate(z);
    }
    expect_observation(before, observe(a), z ? 1 : 0, z ? 1 : 0, name + ": zero bytes, freed");
    valid_pair_still_works("zero bytes");
  }

  // Sizes near SIZE_MAX and bad alignments: an empty block, nothing counted.
  for (std::size_t bytes : {max, max - 1, max - 255, max - 4095, max / 2 + 1}) {
    for (std::size_t alignment : {std::size_t{1}, std::size_t{256}, std::size_t{4096}}) {
      const observation before = observe(a);
      const block b = a.allocate(bytes, alignment);
      BOOST_TEST(!b, name << ": allocate(" << bytes << ", " << alignment << ") cannot succeed");
      if (b) a.deallocate(b);
      expect_observation(before, observe(a), 0, 0, name + ": huge size " + std::to_string(bytes));
    }
  }
  valid_pair_still_works("huge sizes");
  for (std::size_t alignment :
       {std::size_t{0}, std::size_t{3}, std::size_t{6}, std::size_t{1000}, std::size_t{4097}, max}) {
    const observation before = observe(a);
    const block b = a.allocate(64, alignment);
    BOOST_TEST(!b, name << ": alignment " << alignment << " is not a power of two");
    if (b) a.deallocate(b);
    expect_observation(before, observe(a), 0, 0, name + ": bad alignment " + std::to_string(alignment));
  }
  {
    const observation before = observe(a);
    const block b = a.allocate(64, std::size_t{1} << 40);  // a power of two no composition here can serve
    if (b) {
      BOOST_TEST(detail::is_aligned(b.ptr, std::size_t{1} << 40));
      a.deallocate(b);
    }
    expect_observation(before, observe(a), b ? 1 : 0, b ? 1 : 0, name + ": alignment 2^40");
  }
  valid_pair_still_works("bad alignments");

  // Double free, for a small, a large and a huge block (caching_allocator's 2 MiB quantum).
  for (std::size_t bytes : {std::size_t{777}, 2_MiB + 5, 12_MiB + 5}) {
    if (bytes > largest) continue;
    const observation before = observe(a);
    const block b = a.allocate(bytes, 16);
    BOOST_REQUIRE(b);
    fill_pattern(b, 2);
    a.deallocate(b);
    expect_observation(before, observe(a), 1, 1, name + ": allocate and free");
    const observation freed = observe(a);
    refused_free(b, freed, "double free of " + std::to_string(bytes) + " bytes");
    valid_pair_still_works("a double free");
  }

  // Foreign pointers: the stack, the heap, another allocator's block.
  {
    int on_stack = 0;
    void* on_heap = std::malloc(256);
    checking_upstream other;
    const block elsewhere = other.allocate(4096, 256);
    const observation before = observe(a);
    refused_free({&on_stack, sizeof on_stack}, before, "free of a stack pointer");
    refused_free({on_heap, 256}, before, "free of a malloc'd pointer");
    refused_free(elsewhere, before, "free of another allocator's block");
    std::free(on_heap);
    other.deallocate(elsewhere);
    valid_pair_still_works("foreign frees");
  }

  // Interior pointers and wrong sizes of a live block: refused, the block stays live and is not
  // handed out again; then its valid free is accepted.
  for (std::size_t bytes : {std::size_t{1000}, 3_MiB + 7, 12_MiB + 7}) {
    if (bytes > largest) continue;
    const observation before = observe(a);
    const block b = a.allocate(bytes, 16);
    BOOST_REQUIRE(b);
    fill_pattern(b, 3);
    const observation live = observe(a);
    auto* p = static_cast<char*>(b.ptr);
    refused_free({p + 16, bytes}, live, "interior pointer +16");
    refused_free({p + 256, bytes - 256}, live, "interior pointer +256");
    refused_free({p + 1, bytes - 1}, live, "interior pointer +1");
    refused_free({p, bytes - 1}, live, "wrong size (one less)");
    refused_free({p, bytes + 1}, live, "wrong size (one more)");
    refused_free({p, bytes * 4}, live, "wrong size (four times)");
    refused_free({p, 0}, live, "wrong size (0)");
    refused_free({p, max}, live, "wrong size (SIZE_MAX)");
    const block again = a.allocate(bytes, 16);
    BOOST_REQUIRE(again);
    std::vector<live_block> pair{{b, 3, 16}, {again, 4, 16}};
    BOOST_TEST(!any_overlap(pair), name << ": the block a bad free named was handed out again");
    a.deallocate(again);
    BOOST_TEST(has_pattern(b, 3), name << ": the live block lost its content");
    a.deallocate(b);
    expect_observation(before, observe(a), 2, 2, name + ": after the bad frees of a live block");
    valid_pair_still_works("interior and wrong-size frees");
  }

  // The witnesses kept their content through all of it, and are freed exactly.
  if constexpr (detail::contains_part<A, detail::specialization_of<alloy::tracked>>()) {
    auto& t = find<alloy::tracked>(a);
    for (const live_block& w : witnesses)
      BOOST_TEST(t.is_outstanding(w.b.ptr), name << ": a witness left the leak report");
  }
  give_back(a, witnesses);
  const observation end = observe(a);
  for (const char* key : {"bytes_in_use", "requested_bytes", "stats.bytes_in_use", "stats.requested_bytes",
                          "allocation.all.current", "allocated_bytes.all.current", "requested_bytes.all.current",
                          "limited.bytes_in_use", "tracked.outstanding_count", "tracked.outstanding_bytes",
                          "introspection.allocated_pieces", "allocation.small_pool.current",
                          "allocation.large_pool.current", "active.all.current", "active_bytes.all.current"}) {
    if (const auto found = end.find(key); found != end.end())
      BOOST_TEST(found->second == 0, name << ": " << key << " is " << found->second << " with nothing allocated");
  }
  if (const auto found = end.find("allocation.all.allocated"); found != end.end())
    BOOST_TEST(found->second == end.at("allocation.all.freed"), name << ": allocations and frees differ");

  // A limit on the way of every request still holds exactly: what is left up to it is served,
  // one byte more is not.
  if constexpr (limited_on_every_path<A>()) {
    auto& l = find<alloy::limited>(a);
    if (l.bytes_limit() - l.bytes_in_use() <= std::min(largest, 256_MiB)) {
      const std::size_t room = l.bytes_limit() - l.bytes_in_use();
      const block all = a.allocate(room, 256);
      BOOST_TEST(static_cast<bool>(all), name << ": the limit's last " << room << " bytes are refused");
      const block more = a.allocate(1, 1);
      BOOST_TEST(!more, name << ": one byte past the limit is served");
      if (more) a.deallocate(more);
      if (all) a.deallocate(all);
      BOOST_TEST(l.bytes_in_use() == 0u);
    }
  }
}

/// Bad handles through a movable composition (alloy/movable.hpp): a freed handle, a handle of
/// another instance of the same composition (its id names a live slot here too), the empty
/// handle, a locked handle: `deallocate` throws `alloy::logic_error` and changes nothing (the
/// block the id names here stays live, content intact), `try_deallocate` (where the composition
/// has it) says false and changes nothing; every figure is checked exactly after each. Then a raw
/// free at a movable block's address, unlocked and locked: refused the same way, and named by
/// `free_misuse` where the composition has it.
template <class Recipe, movable_allocator A>
void check_bad_handles(A& a, const std::string& name) {
  auto other = Recipe::make(checking_upstream{});
  const auto fill = [](auto& alloc, handle h, std::size_t bytes, std::uint64_t id) {
    void* p = alloc.lock(h);
    BOOST_REQUIRE(p != nullptr);
    fill_pattern({p, bytes}, id);
    alloc.unlock(h);
  };
  const auto intact = [](auto& alloc, handle h, std::size_t bytes, std::uint64_t id) {
    if (!alloc.is_live(h)) return false;
    void* p = alloc.lock(h);
    const bool kept = p != nullptr && has_pattern({p, bytes}, id);
    alloc.unlock(h);
    return kept;
  };
  const auto refused = [&](handle bad, const std::string& what) {
    const observation before = observe(a);
    BOOST_CHECK_THROW(a.deallocate(bad), alloy::logic_error);
    expect_observation(before, observe(a), 0, 0, name + ": deallocate of " + what);
    if constexpr (requires {
                    { a.try_deallocate(bad) } noexcept -> std::same_as<bool>;
                  }) {
      BOOST_TEST(!a.try_deallocate(bad), name << ": try_deallocate of " << what << " accepted");
      expect_observation(before, observe(a), 0, 0, name + ": try_deallocate of " + what);
    }
  };

  const observation start = observe(a);
  const handle mine = a.allocate_movable(1000);
  BOOST_REQUIRE_MESSAGE(mine, name << ": a movable block");
  fill(a, mine, 1000, 21);
  const handle theirs = other.allocate_movable(1000);
  BOOST_REQUIRE_MESSAGE(theirs, name << ": a movable block of another instance");
  fill(other, theirs, 1000, 22);
  const observation live = observe(a);

  refused(theirs, "a handle of another instance");
  BOOST_TEST(a.is_live(mine), name << ": a foreign handle freed a block of its own");
  BOOST_TEST(intact(a, mine, 1000, 21), name << ": a foreign handle's free touched a live block");
  if (!a.is_live(mine)) return;
  refused(handle{}, "the empty handle");
  refused(handle{mine.id ^ (std::uint64_t{1} << 40)}, "an unknown handle");
  (void)a.lock(mine);
  refused(mine, "a locked handle");
  a.unlock(mine);

  // A movable block of 0 bytes is valid (alloy/movable.hpp): counted once, freed once.
  const handle zero = a.allocate_movable(0);
  BOOST_TEST(static_cast<bool>(zero), name << ": a movable block of 0 bytes");
  if (zero) {
    BOOST_TEST(a.size_of(zero) == 0u);
    a.deallocate(zero);
  }
  expect_observation(live, observe(a), zero ? 1 : 0, zero ? 1 : 0, name + ": a movable block of 0 bytes");

  a.deallocate(mine);
  const long long pairs = zero ? 2 : 1;  // the movable block of 0 bytes, then this one
  expect_observation(start, observe(a), pairs, pairs, name + ": the valid free of a handle");
  refused(mine, "a freed handle");
  BOOST_TEST(other.is_live(theirs));
  BOOST_TEST(intact(other, theirs, 1000, 22), name << ": the other instance's block lost its content");
  other.deallocate(theirs);

  // A handle freed after its slot was given to a new block: still refused, the new one kept.
  const handle reused = a.allocate_movable(2000);
  BOOST_REQUIRE(reused);
  fill(a, reused, 2000, 23);
  refused(mine, "a freed handle whose slot was reused");
  BOOST_TEST(intact(a, reused, 2000, 23), name << ": a stale handle's free touched the slot's new block");
  a.deallocate(reused);
  expect_observation(start, observe(a), pairs + 1, pairs + 1, name + ": after the bad handles");

  // A raw free at a movable block's address (a pointer `lock` gave, never handed out raw), locked
  // or not: refused, the block live under its handle with its content, its place not handed out.
  const handle held = a.allocate_movable(1000);
  BOOST_REQUIRE(held);
  fill(a, held, 1000, 24);
  for (const bool locked : {false, true}) {
    const observation unlocked = observe(a);
    void* at = a.lock(held);
    if (!locked) a.unlock(held);
    const block raw{at, 1000};
    const std::string what =
        std::string("a raw free at a movable block's address (") + (locked ? "locked)" : "unlocked)");
    const observation before = observe(a);
    if constexpr (alloy::free_screening_allocator<A>)
      BOOST_TEST((a.free_misuse(raw) == alloy::misuse::foreign_pointer), name << ": free_misuse of " << what);
    a.deallocate(raw);
    expect_observation(before, observe(a), 0, 0, name + ": " + what);
    if constexpr (alloy::checked_deallocating_allocator<A>) {
      BOOST_TEST(!a.try_deallocate(raw), name << ": try_deallocate of " << what << " accepted");
      expect_observation(before, observe(a), 0, 0, name + ": try_deallocate of " + what);
    }
    if (!locked) (void)a.lock(held);
    void* now = a.lock(held);  // fixed while locked: a raw block must not land on it
    const block fresh = a.allocate(1000, 256);
    BOOST_TEST(static_cast<bool>(fresh), name << ": a raw block after " << what);
    if (fresh) {
      BOOST_TEST(!any_overlap({{fresh, 0, 1}, {{now, 1000}, 0, 1}}), name << ": " << what << " freed the block");
      a.deallocate(fresh);
    }
    a.unlock(held);
    a.unlock(held);
    BOOST_TEST(intact(a, held, 1000, 24), name << ": " << what << " touched the block");
    expect_observation(unlocked, observe(a), fresh ? 1 : 0, fresh ? 1 : 0, name + ": after " + what);
  }
  a.deallocate(held);
}

/// Over a failing upstream: a request that fails changes nothing, one that succeeds from cached
/// memory counts normally; once the upstream works again so does the composition; nothing leaks.
template <class Recipe>
void check_bad_input_failing_upstream(const std::string& name, std::size_t largest) {
  std::shared_ptr<ledger> records;
  {
    failing_upstream up;
    auto a = Recipe::make(up);
    records = up.records();  // copies share it
    std::vector<live_block> live;
    std::uint64_t id = 1;
    for (std::size_t bytes : {std::size_t{100}, 70_KiB, 3_MiB}) {
      if (bytes > largest) continue;
      const block b = a.allocate(bytes, 256);
      BOOST_REQUIRE(b);
      fill_pattern(b, id);
      live.push_back({b, id++, 256});
    }
    up.set_options({.fail_from = 0});  // every upstream call fails from now on
    for (std::size_t bytes : {std::size_t{100}, std::size_t{5000}, 70_KiB, 3_MiB, 64_MiB, 300_MiB}) {
      const observation before = observe(a);
      const block b = a.allocate(bytes, 256);
      if (!b) {
        expect_observation(before, observe(a), 0, 0, name + ": failed allocate of " + std::to_string(bytes));
        continue;
      }
      fill_pattern(b, id);
      live.push_back({b, id++, 256});
      BOOST_TEST(!any_overlap(live));
    }
    up.set_options({});
    const observation before = observe(a);
    const block b = a.allocate(std::min(16_MiB, largest / 2), 256);
    BOOST_TEST(static_cast<bool>(b), name << ": the upstream works again, the composition must too");
    if (b) a.deallocate(b);
    expect_observation(before, observe(a), b ? 1 : 0, b ? 1 : 0, name + ": after the upstream recovered");
    give_back(a, live);
  }
  BOOST_TEST(records->live_count() == 0u, name << ": leaked " << records->live_count() << " upstream blocks");
  BOOST_TEST(records->errors.empty(),
             name << ": upstream saw misuse: " << (records->errors.empty() ? "" : records->errors[0]));
}

/// The whole matrix for one recipe: over a checking upstream (then the leak check), and over a
/// failing one.
template <class Recipe>
void bad_input_suite(const std::string& name) {
  std::size_t largest = std::numeric_limits<std::size_t>::max();
  if constexpr (requires { Recipe::largest; }) largest = Recipe::largest;
  std::shared_ptr<ledger> records;
  {
    const checking_upstream up;
    auto a = Recipe::make(up);
    records = up.records();  // copies share it
    check_bad_input_matrix(a, name, largest);
    if constexpr (movable_allocator<decltype(a)>) check_bad_handles<Recipe>(a, name);
  }
  BOOST_TEST(records->live_count() == 0u, name << ": leaked " << records->live_count() << " upstream blocks");
  BOOST_TEST(records->errors.empty(),
             name << ": upstream saw misuse: " << (records->errors.empty() ? "" : records->errors[0]));
  check_bad_input_failing_upstream<Recipe>(name, largest);
}

}  // namespace alloy::testing
