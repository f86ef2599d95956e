// SPDX-License-Identifier: Apache-2.0
// test/support/conformance.hpp: the one capability-aware routine every composition runs through.
//
// A *recipe* names a composition over a given upstream and how to build it:
//
//   struct limited_recipe {
//     template <class Upstream> using type = alloy::limited<Upstream>;
//     template <class Upstream> static type<Upstream> make(Upstream up) { return type<Upstream>{up}; }
//     static alloy::testing::conformance_options options() { return {}; }   // optional
//   };
//
// `conformance_suite<Recipe>()` then runs, over real host memory:
//   - `check_conformance` on the composition built over a `checking_upstream` (sizes 0 to
//     hundreds of MiB, alignments 1 to 4096, fill patterns and overlap checks, zero-size blocks,
//     bad arguments, `owns`, a randomized workload, `release` and introspection when present);
//   - a leak check after the composition is destroyed, and the upstream's sized-deallocation and
//     ownership checks;
//   - a failure matrix: the same workload over a `failing_upstream` failing at each call in turn,
//     and at every call from then on; the composition must stay consistent and leak nothing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <alloy/concepts.hpp>
#include <alloy/detail/align.hpp>
#include <alloy/find.hpp>
#include <alloy/literals.hpp>

#include "checking_upstream.hpp"

namespace alloy::testing {

using namespace alloy::literals;

struct conformance_options {
  std::size_t max_size = 320_MiB;          ///< largest single request that must succeed
  std::size_t random_ops = 20'000;         ///< operations of the randomized workload
  std::size_t random_max_size = 1_MiB;     ///< largest request of the randomized workload
  std::size_t random_max_live = 64;        ///< live blocks the randomized workload keeps at most
  std::size_t max_alignment = 4096;        ///< largest alignment that must be honoured
  bool release_returns_everything = true;  ///< reserved_bytes() == 0 after freeing all + release()
  bool huge_requests = true;               ///< ask for sizes near SIZE_MAX (see running_under_asan)
  std::uint64_t seed = 20261122;
};

// ---- fill patterns -----------------------------------------------------------------------------

inline std::uint64_t pattern_word(std::uint64_t id, std::size_t index) noexcept {
  std::uint64_t x = id * 0x9E3779B97F4A7C15ull + index;
  x ^= x >> 29;
  return x * 0xBF58476D1CE4E5B9ull;
}

/// The words of a block of `words` words that its pattern covers: every one up to 64 KiB; above,
/// the first and last 4 KiB and one word in every 64 KiB between. Where allocators write (headers,
/// free-list links, a neighbour's edge) is covered whole; overlaps are checked on the addresses
/// apart; and megabyte blocks filled whole cost the suites minutes of page faults.
template <class F>
void for_each_pattern_word(std::size_t words, F&& visit) noexcept {
  constexpr std::size_t whole = (64 << 10) / 8, edge = (4 << 10) / 8, stride = (64 << 10) / 8;
  if (words <= whole) {
    for (std::size_t i = 0; i < words; ++i) visit(i);
    return;
  }
  for (std::size_t i = 0; i < edge; ++i) visit(i);
  for (std::size_t i = edge; i < words - edge; i += stride) visit(i);
  for (std::size_t i = words - edge; i < words; ++i) visit(i);
}

/// Fills a host-accessible block with a pattern derived from `id` (its words as
/// `for_each_pattern_word` picks them, and the bytes past the last whole word).
inline void fill_pattern(block b, std::uint64_t id) noexcept {
  auto* bytes = static_cast<unsigned char*>(b.ptr);
  const std::size_t words = b.size / 8;
  for_each_pattern_word(words, [&](std::size_t i) {
    const std::uint64_t w = pattern_word(id, i);
    std::memcpy(bytes + i * 8, &w, 8);
  });
  const std::uint64_t tail = pattern_word(id, words);
  std::memcpy(bytes + words * 8, &tail, b.size % 8);
}

/// Whether a block still holds the pattern `fill_pattern(b, id)` wrote.
inline bool has_pattern(block b, std::uint64_t id) noexcept {
  const auto* bytes = static_cast<const unsigned char*>(b.ptr);
  const std::size_t words = b.size / 8;
  bool same = true;
  for_each_pattern_word(words, [&](std::size_t i) {
    const std::uint64_t w = pattern_word(id, i);
    same = same && std::memcmp(bytes + i * 8, &w, 8) == 0;
  });
  const std::uint64_t tail = pattern_word(id, words);
  return same && std::memcmp(bytes + words * 8, &tail, b.size % 8) == 0;
}

/// Blocks handed out and not yet freed, with the id their pattern was written with.
struct live_block {
  block b;
  std::uint64_t id;
  std::size_t alignment;
};

/// Whether any two live blocks overlap (a zero-size block occupies its first byte).
inline bool any_overlap(std::vector<live_block> blocks) {
  std::sort(blocks.begin(), blocks.end(), [](const live_block& l, const live_block& r) { return l.b.ptr < r.b.ptr; });
  for (std::size_t i = 1; i < blocks.size(); ++i) {
    const auto* prev = static_cast<const char*>(blocks[i - 1].b.ptr);
    const std::size_t extent = std::max<std::size_t>(blocks[i - 1].b.size, 1);
    if (prev + extent > static_cast<const char*>(blocks[i].b.ptr)) return true;
  }
  return false;
}

template <allocator A>
void give_back(A& a, std::vector<live_block>& live) {
  for (const live_block& l : live) {
    if constexpr (A::host_accessible) BOOST_TEST(has_pattern(l.b, l.id), "block " << l.id << " lost its content");
    a.deallocate(l.b);
  }
  live.clear();
}

template <allocator A>
void check_block(const A&, block b, std::size_t bytes, std::size_t alignment) {
  BOOST_TEST(static_cast<bool>(b), "allocate(" << bytes << ", " << alignment << ") failed");
  if (!b) return;
  BOOST_TEST(b.size == bytes, "a block's size must be the size asked for");
  BOOST_TEST(detail::is_aligned(b.ptr, alignment), "allocate(" << bytes << ", " << alignment << ") misaligned");
}

// ---- the routine -------------------------------------------------------------------------------

template <allocator A>
void check_sizes_and_alignments(A& a, const conformance_options& opts) {
  static constexpr std::size_t small_sizes[] = {0, 1, 7, 8, 255, 256, 257, 1000, 4095, 4096, 4097, 65537, 1_MiB + 3};
  std::uint64_t next_id = 1;
  std::vector<live_block> live;
  for (std::size_t alignment = 1; alignment <= opts.max_alignment; alignment *= 2) {
    for (std::size_t bytes : small_sizes) {
      if (bytes > opts.max_size) continue;
      const block b = a.allocate(bytes, alignment);
      check_block(a, b, bytes, alignment);
      if (!b) continue;
      const std::uint64_t id = next_id++;
      if constexpr (A::host_accessible) fill_pattern(b, id);
      live.push_back({b, id, alignment});
    }
  }
  BOOST_TEST(!any_overlap(live), "live blocks overlap");
  std::shuffle(live.begin(), live.end(), std::mt19937_64(opts.seed));
  give_back(a, live);

  // Large requests, all live at once.
  for (std::size_t bytes : {16_MiB + 1, 64_MiB, 300_MiB}) {
    if (bytes > opts.max_size) continue;
    for (std::size_t alignment : {std::size_t{1}, std::size_t{256}, opts.max_alignment}) {
      if (bytes >= 64_MiB && alignment != 256) continue;  // keep the live set to a few hundred MiB
      const block b = a.allocate(bytes, alignment);
      check_block(a, b, bytes, alignment);
      if (!b) continue;
      const std::uint64_t id = next_id++;
      if constexpr (A::host_accessible) fill_pattern(b, id);
      live.push_back({b, id, alignment});
    }
  }
  BOOST_TEST(!any_overlap(live), "large live blocks overlap");
  give_back(a, live);
}

template <allocator A>
void check_zero_size(A& a) {
  std::vector<live_block> live;
  for (std::uint64_t i = 0; i < 64; ++i) {
    const block b = a.allocate(0, 1 + (i % 2) * 255);
    BOOST_TEST(static_cast<bool>(b), "a zero-byte request yields a valid block");
    BOOST_TEST(b.size == 0u);
    if (b) live.push_back({b, i, 1});
  }
  BOOST_TEST(!any_overlap(live), "zero-byte blocks must have distinct addresses");
  give_back(a, live);
}

/// AddressSanitizer's throwing `operator new` aborts on an impossible size instead of throwing,
/// so compositions that end in `operator new` (std::pmr's new_delete_resource) cannot be asked
/// for one under ASan.
constexpr bool running_under_asan() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
  return true;
#  endif
#endif
  return false;
}

template <allocator A>
void check_bad_arguments(A& a, const conformance_options& opts = {}) {
  for (std::size_t alignment : {0u, 3u, 6u, 12u, 1000u, 4097u}) {
    const block b = a.allocate(64, alignment);
    BOOST_TEST(!b, "alignment " << alignment << " is not a power of two and must be refused");
    if (b) a.deallocate(b);
  }
  if (!opts.huge_requests) return;
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  for (std::size_t bytes : {max, max - 1, max - 255, max / 2 + 1, max / 2}) {
    for (std::size_t alignment : {1u, 256u, 4096u}) {
      const block b = a.allocate(bytes, alignment);
      BOOST_TEST(!b, "allocate(" << bytes << ") cannot succeed");
      if (b) a.deallocate(b);
    }
  }
  const block after = a.allocate(100, 8);  // still usable
  BOOST_TEST(static_cast<bool>(after));
  if (after) a.deallocate(after);
}

template <allocator A>
void check_owns(A& a) {
  if constexpr (owning_allocator<A>) {
    const block mine = a.allocate(1000, 64);
    BOOST_REQUIRE(mine);
    BOOST_TEST(a.owns(mine));
    BOOST_TEST(a.owns(block{static_cast<char*>(mine.ptr), 1}), "owns looks at the address");
    int on_stack = 0;
    BOOST_TEST(!a.owns(block{&on_stack, sizeof on_stack}));
    a.deallocate(mine);
  }
}

/// Random allocations and frees, sizes log-uniform up to `random_max_size`, random alignments;
/// every block's pattern is checked when it is freed, and overlaps are looked for throughout.
template <allocator A>
void check_random_workload(A& a, const conformance_options& opts) {
  std::mt19937_64 rng(opts.seed);
  std::uniform_real_distribution<double> log_size(0.0, std::log2(static_cast<double>(opts.random_max_size)));
  std::uniform_int_distribution<int> log_alignment(0, static_cast<int>(std::log2(opts.max_alignment)));
  std::vector<live_block> live;
  std::uint64_t next_id = 1;
  for (std::size_t op = 0; op < opts.random_ops; ++op) {
    const bool grow = live.empty() || (live.size() < opts.random_max_live && rng() % 2 == 0);
    if (grow) {
      const std::size_t bytes = static_cast<std::size_t>(std::exp2(log_size(rng))) - 1;
      const std::size_t alignment = std::size_t{1} << log_alignment(rng);
      const block b = a.allocate(bytes, alignment);
      check_block(a, b, bytes, alignment);
      if (!b) continue;
      const std::uint64_t id = next_id++;
      if constexpr (A::host_accessible) fill_pattern(b, id);
      live.push_back({b, id, alignment});
    } else {
      const std::size_t victim = rng() % live.size();
      std::vector<live_block> one{live[victim]};
      live[victim] = live.back();
      live.pop_back();
      give_back(a, one);
    }
    if (op % 1000 == 0) BOOST_TEST(!any_overlap(live), "overlap after operation " << op);
  }
  give_back(a, live);
}

template <allocator A>
void check_after_everything_freed(A& a, const conformance_options& opts) {
  if constexpr (introspectable_allocator<A>) {
    std::size_t in_use = 0;
    a.for_each_block([&](const block_info& info) {
      if (info.state != block_state::free && info.state != block_state::unmapped) ++in_use;
    });
    BOOST_TEST(in_use == 0u, "introspection reports blocks in use after everything was freed");
  }
  if constexpr (releasing_allocator<A>) {
    a.release();
    if constexpr (reserving_allocator<A>) {
      if (opts.release_returns_everything) BOOST_TEST(a.reserved_bytes() == 0u, "release() keeps memory");
    }
  }
}

/// The conformance routine: what every allocator must do, plus each capability it has.
template <allocator A>
void check_conformance(A& a, const conformance_options& opts = {}) {
  check_sizes_and_alignments(a, opts);
  check_zero_size(a);
  check_bad_arguments(a, opts);
  check_owns(a);
  check_random_workload(a, opts);
  check_after_everything_freed(a, opts);
}

// ---- suites over recipes -----------------------------------------------------------------------

template <class Recipe>
conformance_options options_of() {
  if constexpr (requires { Recipe::options(); }) {
    return Recipe::options();
  } else {
    return {};
  }
}

/// A short workload for the failure matrix: mixed sizes, some frees, a release at the end.
/// Returns how many requests failed.
template <allocator A>
std::size_t failure_workload(A& a) {
  static constexpr std::size_t sizes[] = {100, 3_MiB, 256, 70_KiB, 9_MiB, 1, 512_KiB, 33_MiB, 4096, 2_MiB + 5};
  std::vector<live_block> live;
  std::size_t failed = 0;
  for (std::uint64_t round = 0; round < 3; ++round) {
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      const block b = a.allocate(sizes[i], 256);
      if (!b) {
        ++failed;
        continue;
      }
      BOOST_TEST(b.size == sizes[i]);
      BOOST_TEST(detail::is_aligned(b.ptr, 256));
      const std::uint64_t id = round * 100 + i;
      if constexpr (A::host_accessible) fill_pattern(b, id);
      live.push_back({b, id, 256});
      if (i % 3 == 2) {  // free an older block now and then so the composition reuses memory
        std::vector<live_block> one{live.front()};
        live.erase(live.begin());
        give_back(a, one);
      }
    }
    BOOST_TEST(!any_overlap(live));
  }
  give_back(a, live);
  if constexpr (releasing_allocator<A>) a.release();
  return failed;
}

template <allocator A>
void check_bad_arguments_when_failing(A& a) {
  for (std::size_t alignment : {0u, 3u, 1000u}) {
    const block b = a.allocate(64, alignment);
    BOOST_TEST(!b);
    if (b) a.deallocate(b);
  }
  const block huge = a.allocate(std::numeric_limits<std::size_t>::max() - 7, 256);
  BOOST_TEST(!huge);
  if (huge) a.deallocate(huge);
}

/// Conformance over a checking upstream, then the leak check once the composition is gone.
template <class Recipe>
void conformance_suite_checked() {
  std::shared_ptr<ledger> records;
  {
    auto a = Recipe::make(checking_upstream{});
    records = find<checking_upstream>(a).records();
    check_conformance(a, options_of<Recipe>());
  }
  BOOST_TEST(records->live_count() == 0u, "the composition leaked " << records->live_count() << " upstream blocks");
  BOOST_TEST(records->errors.empty(), "upstream saw misuse: " << (records->errors.empty() ? "" : records->errors[0]));
  BOOST_TEST(records->allocations == records->deallocations);
}

/// The failure matrix: fail call k alone, and every call from k on, for each k the workload makes.
template <class Recipe>
void conformance_suite_failing() {
  std::size_t total_calls = 0;
  {
    auto a = Recipe::make(failing_upstream{});
    BOOST_TEST(failure_workload(a) == 0u, "the workload must succeed when nothing fails");
    total_calls = find<failing_upstream>(a).calls();
  }
  for (std::size_t k = 0; k <= total_calls; ++k) {
    for (bool from_k_on : {false, true}) {
      failing_upstream::options fail;
      if (from_k_on) {
        fail.fail_from = k;
      } else {
        fail.fail_at = {k};
      }
      std::shared_ptr<ledger> records;
      {
        auto a = Recipe::make(failing_upstream{fail});
        records = find<failing_upstream>(a).records();
        failure_workload(a);
        // Still usable for small requests the composition may have cached, and consistent.
        check_bad_arguments_when_failing(a);
      }
      BOOST_TEST(records->live_count() == 0u, "leak with upstream failing at call " << k << (from_k_on ? " on" : ""));
      BOOST_TEST(records->errors.empty());
    }
  }
}

template <class Recipe>
void conformance_suite() {
  conformance_suite_checked<Recipe>();
  conformance_suite_failing<Recipe>();
}

}  // namespace alloy::testing
