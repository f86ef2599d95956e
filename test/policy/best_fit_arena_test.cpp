// SPDX-License-Identifier: Apache-2.0
// best_fit_arena: conformance over several option sets, a model-based randomized test, replay of
// every shipped trace, failing upstreams, misuse, and the behaviour the class comment promises.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/limited.hpp>
#include <alloy/upstream/host_upstream.hpp>
#include <alloy/upstream/null_upstream.hpp>

#include "replay/rmm_trace.hpp"
#include "support/conformance.hpp"

using namespace alloy::literals;
using alloy::best_fit_arena;
using alloy::block;
using alloy::testing::checking_upstream;
using alloy::testing::failing_upstream;

namespace {

using arena_options = best_fit_arena<checking_upstream>::options;

}  // namespace

namespace recipes {

struct arena_default {
  template <class U>
  using type = best_fit_arena<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up)};
  }
};

// One segment taken at construction, never grown (the 300 MiB + 64 MiB + 3 x 16 MiB of the
// conformance's large requests fit, with alignment padding).
struct arena_fixed_capacity {
  template <class U>
  using type = best_fit_arena<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up), {.initial_size = 640_MiB, .maximum_size = 640_MiB}};
  }
};

// Rounding of one byte (every alignment above 1 goes through the padding path), fixed odd steps.
struct arena_tiny_rounding {
  template <class U>
  using type = best_fit_arena<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up), {.growth = alloy::best_fit_growth::fixed, .growth_size = 1_MiB + 7, .rounding = 1}};
  }
};

// Rounding of 16 bytes, doubling from an odd size, small cap.
struct arena_odd_doubling {
  template <class U>
  using type = best_fit_arena<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up), {.growth_size = 100_KiB + 48, .max_growth_size = 3_MiB, .rounding = 16}};
  }
};

// Chunks above 1 MiB are not split for smaller requests; a big initial segment that only the
// large requests (and the last resort) may split.
struct arena_max_split {
  template <class U>
  using type = best_fit_arena<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up), {.initial_size = 8_MiB, .max_split_size = 1_MiB}};
  }
};

// The arena under a limit, as the compositions will use it.
struct limited_arena {
  template <class U>
  using type = alloy::limited<best_fit_arena<U>>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{best_fit_arena<U>{std::move(up)}, {.bytes_limit = 2_GiB}};
  }
};

}  // namespace recipes

using all_recipes = std::tuple<recipes::arena_default, recipes::arena_fixed_capacity, recipes::arena_tiny_rounding,
                               recipes::arena_odd_doubling, recipes::arena_max_split, recipes::limited_arena>;

// ---- helpers -------------------------------------------------------------------------------------

namespace {

/// An upstream that hands out address ranges nobody maps (device memory stand-in): the arena
/// must never touch them, and a replay of a 10 GiB trace costs no memory. Checks sized
/// deallocation and leaks like `checking_upstream`.
class address_space_upstream {
 public:
  static constexpr bool host_accessible = false;
  static constexpr bool device_accessible = true;

  struct ledger {
    std::map<std::uintptr_t, std::size_t> live;
    std::vector<std::string> errors;
    std::size_t live_bytes = 0;
    std::size_t peak_live_bytes = 0;
    std::uintptr_t next = std::uintptr_t{1} << 44;
    std::size_t capacity = std::numeric_limits<std::size_t>::max();  // bytes it will hand out at once
  };

  address_space_upstream() : ledger_(std::make_shared<ledger>()) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (!alloy::detail::is_power_of_two(alignment) || bytes > (std::size_t{1} << 40)) return {};
    if (bytes > ledger_->capacity - ledger_->live_bytes) return {};
    const std::size_t align = std::max<std::size_t>(alignment, 4096);
    const std::uintptr_t addr = (ledger_->next + align - 1) & ~(align - 1);
    ledger_->next = addr + bytes + 4096;  // a gap: segments are never adjacent
    ledger_->live.emplace(addr, bytes);
    ledger_->live_bytes += bytes;
    ledger_->peak_live_bytes = std::max(ledger_->peak_live_bytes, ledger_->live_bytes);
    return {reinterpret_cast<void*>(addr), bytes};
  }
  void deallocate(block b) noexcept {
    const auto found = ledger_->live.find(reinterpret_cast<std::uintptr_t>(b.ptr));
    if (found == ledger_->live.end()) {
      ledger_->errors.push_back("foreign deallocate");
      return;
    }
    if (found->second != b.size) ledger_->errors.push_back("wrong-size deallocate");
    ledger_->live_bytes -= found->second;
    ledger_->live.erase(found);
  }
  const std::shared_ptr<ledger>& records() const noexcept { return ledger_; }

 private:
  std::shared_ptr<ledger> ledger_;
};

template <class A>
std::size_t sum_free(const A& a) {
  std::size_t free = 0;
  a.for_each_block([&](const alloy::block_info& info) {
    if (info.state == alloy::block_state::free) free += info.size;
  });
  return free;
}

/// After everything was freed: every segment is exactly one free chunk.
template <class A>
bool every_segment_one_free_chunk(const A& a) {
  bool ok = true;
  a.for_each_block([&](const alloy::block_info& info) {
    if (info.state != alloy::block_state::free || info.ptr != info.segment || info.size != info.segment_size)
      ok = false;
  });
  return ok;
}

struct misuse_log {
  std::vector<std::pair<alloy::arena_misuse, block>> seen;
  static void record(alloy::arena_misuse kind, block b, void* context) noexcept {
    try {
      static_cast<misuse_log*>(context)->seen.emplace_back(kind, b);
    } catch (...) {}
  }
};

// Cheap fill patterns for huge blocks: the first and last 64 bytes and 8 words in between.
void stamp(block b, std::uint64_t id) {
  auto* bytes = static_cast<unsigned char*>(b.ptr);
  const std::size_t n = b.size;
  auto put = [&](std::size_t at, std::size_t len) {
    for (std::size_t i = 0; i < len; ++i)
      bytes[at + i] = static_cast<unsigned char>(alloy::testing::pattern_word(id, at + i));
  };
  if (n <= 256) {
    put(0, n);
    return;
  }
  put(0, 64);
  put(n - 64, 64);
  for (std::size_t k = 1; k <= 8; ++k) put((n / 9) * k, 8);
}
bool stamped(block b, std::uint64_t id) {
  const auto* bytes = static_cast<const unsigned char*>(b.ptr);
  const std::size_t n = b.size;
  auto check = [&](std::size_t at, std::size_t len) {
    for (std::size_t i = 0; i < len; ++i)
      if (bytes[at + i] != static_cast<unsigned char>(alloy::testing::pattern_word(id, at + i))) return false;
    return true;
  };
  if (n <= 256) return check(0, n);
  bool ok = check(0, 64) && check(n - 64, 64);
  for (std::size_t k = 1; k <= 8; ++k) ok = ok && check((n / 9) * k, 8);
  return ok;
}

std::vector<std::filesystem::path> shipped_traces() {
  std::vector<std::filesystem::path> files;
  const std::filesystem::path root = ALLOY_TRACE_DIR;
  std::error_code ec;
  for (const char* sub : {"pytorch", "minimalloc"}) {
    for (auto it = std::filesystem::directory_iterator(root / sub, ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.ends_with(".rmm.csv.gz") || name.ends_with(".events.rmm.csv")) files.push_back(it->path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(best_fit_arena_suite)

BOOST_AUTO_TEST_CASE_TEMPLATE(conformance, Recipe, all_recipes) { alloy::testing::conformance_suite<Recipe>(); }

BOOST_AUTO_TEST_CASE(capabilities_are_detected) {
  using A = best_fit_arena<alloy::host_upstream>;
  static_assert(alloy::allocator<A>);
  static_assert(alloy::owning_allocator<A>);
  static_assert(alloy::releasing_allocator<A>);
  static_assert(alloy::reserving_allocator<A>);
  static_assert(alloy::counting_allocator<A>);
  static_assert(alloy::introspectable_allocator<A>);
  static_assert(!alloy::stream_ordered_allocator<A, int>);
  static_assert(A::host_accessible && !A::device_accessible);
  static_assert(best_fit_arena<address_space_upstream>::device_accessible);
  static_assert(std::is_nothrow_move_constructible_v<A>);
}

// ---- the model-based randomized test -------------------------------------------------------------

namespace {

struct model_block {
  block b;
  std::uint64_t id;
  std::size_t alignment;
};

void run_model(std::uint64_t seed, std::size_t ops, const arena_options& opts) {
  checking_upstream up;
  const auto records = up.records();
  {
    best_fit_arena<checking_upstream> arena{up, opts};
    const std::size_t rounding = arena.get_options().rounding;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> log_size(0.0, 26.0);  // 1 B .. 64 MiB
    std::uniform_int_distribution<int> log_alignment(0, 13);     // 1 .. 8 KiB
    std::vector<model_block> live;
    std::map<std::uintptr_t, std::uintptr_t> extents;  // start -> end of every live block
    std::size_t in_use = 0, requested = 0, failures = 0, next_id = 1;
    std::size_t target = 64;  // the live set wanders between 0 and 384 blocks
    bool ok = true;
    for (std::size_t op = 0; op < ops && ok; ++op) {
      if (op % 50'000 == 0) target = rng() % 385;
      const bool grow = live.empty() || (live.size() < target ? rng() % 4 != 0 : rng() % 4 == 0);
      if (grow) {
        const std::size_t bytes = static_cast<std::size_t>(std::exp2(log_size(rng))) - (rng() % 2);
        const std::size_t alignment = std::size_t{1} << log_alignment(rng);
        const block b = arena.allocate(bytes, alignment);
        if (!b) {
          ++failures;
          continue;
        }
        ok = b.size == bytes && alloy::detail::is_aligned(b.ptr, alignment);
        const auto start = reinterpret_cast<std::uintptr_t>(b.ptr);
        const std::uintptr_t end = start + std::max<std::size_t>(bytes, 1);
        const auto after = extents.lower_bound(start);
        if (after != extents.end() && after->first < end) ok = false;
        if (after != extents.begin() && std::prev(after)->second > start) ok = false;
        extents.emplace(start, end);
        const std::uint64_t id = next_id++;
        stamp(b, id);
        live.push_back({b, id, alignment});
        in_use += alloy::detail::round_up(std::max<std::size_t>(bytes, 1), rounding);
        requested += bytes;
      } else {
        const std::size_t victim = rng() % live.size();
        const model_block m = live[victim];
        live[victim] = live.back();
        live.pop_back();
        ok = stamped(m.b, m.id);
        extents.erase(reinterpret_cast<std::uintptr_t>(m.b.ptr));
        arena.deallocate(m.b);
        in_use -= alloy::detail::round_up(std::max<std::size_t>(m.b.size, 1), rounding);
        requested -= m.b.size;
      }
      // With max_split_size an oversize chunk may be handed out whole: more in use than rounded.
      const bool exact = opts.max_split_size == std::numeric_limits<std::size_t>::max();
      ok = ok && (exact ? arena.bytes_in_use() == in_use : arena.bytes_in_use() >= in_use) &&
           arena.requested_bytes() == requested &&
           arena.reserved_bytes() == arena.bytes_in_use() + arena.free_bytes() &&
           arena.reserved_bytes() == records->live_bytes;
      if (op % 8192 == 0) {
        ok = ok && arena.check_invariants() && sum_free(arena) + arena.bytes_in_use() == arena.reserved_bytes();
        if (op % 65536 == 0) {
          const std::size_t largest = arena.largest_free_block();
          std::size_t seen_largest = 0;
          arena.for_each_block([&](const alloy::block_info& i) {
            if (i.state == alloy::block_state::free) seen_largest = std::max(seen_largest, i.size);
          });
          ok = ok && largest == seen_largest;
        }
      }
      if (!ok) BOOST_ERROR("seed " << seed << ": model disagrees at operation " << op);
    }
    BOOST_TEST(failures == 0u, "seed " << seed << ": " << failures << " requests failed");
    for (const model_block& m : live) {
      BOOST_TEST(stamped(m.b, m.id));
      arena.deallocate(m.b);
    }
    BOOST_TEST(arena.bytes_in_use() == 0u);
    BOOST_TEST(arena.check_invariants());
    BOOST_TEST(every_segment_one_free_chunk(arena), "seed " << seed << ": a segment is not one free chunk");
    BOOST_TEST(arena.misuses().total() == 0u);
    arena.release();
    BOOST_TEST(arena.reserved_bytes() == 0u);
    BOOST_TEST(arena.segment_count() == 0u);
    BOOST_TEST_MESSAGE("seed " << seed << ": " << ops << " operations, " << arena.counters().num_device_alloc
                               << " segments taken");
  }
  BOOST_TEST(records->live_count() == 0u);
  BOOST_TEST(records->errors.empty());
}

}  // namespace

BOOST_AUTO_TEST_CASE(model_based_randomized) {
  for (std::uint64_t seed : {1u, 2u, 3u}) run_model(seed, 1'000'000, {});
}

BOOST_AUTO_TEST_CASE(model_based_randomized_other_options) {
  run_model(11, 200'000, {.growth = alloy::best_fit_growth::fixed, .growth_size = 5_MiB + 3, .rounding = 1});
  run_model(12, 200'000, {.max_growth_size = 16_MiB, .rounding = 4096, .max_split_size = 8_MiB});
}

// ---- traces ----------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(replays_every_shipped_trace) {
  const auto files = shipped_traces();
  if (files.empty()) {
    BOOST_TEST_MESSAGE("SKIPPED: no traces under " << ALLOY_TRACE_DIR << " (the shared trace folder is missing)");
    BOOST_WARN_MESSAGE(false, "trace replay skipped: " << ALLOY_TRACE_DIR << " has no traces");
    return;
  }
  for (const auto& path : files) {
    const alloy::bench::rmm_trace trace = alloy::bench::read_rmm_trace(path.string());
    address_space_upstream up;
    const auto records = up.records();
    std::size_t failed = 0, peak_reserved = 0;
    {
      best_fit_arena<address_space_upstream> arena{up};
      std::vector<block> blocks(trace.allocations);
      for (const auto& e : trace.events) {
        if (e.action == alloy::bench::trace_action::allocate) {
          blocks[e.allocation] = arena.allocate(e.size, 256);
          if (!blocks[e.allocation]) ++failed;
          peak_reserved = std::max(peak_reserved, arena.reserved_bytes());
        } else if (e.action == alloy::bench::trace_action::free) {
          arena.deallocate(blocks[e.allocation]);
          blocks[e.allocation] = {};
        }
      }
      for (block& b : blocks) arena.deallocate(b);  // what the recording never freed
      BOOST_TEST(arena.bytes_in_use() == 0u, path.filename());
      BOOST_TEST(arena.check_invariants(), path.filename());
      BOOST_TEST(every_segment_one_free_chunk(arena), path.filename());
      BOOST_TEST(arena.misuses().total() == 0u, path.filename());
      arena.release();
      BOOST_TEST(arena.reserved_bytes() == 0u, path.filename());
    }
    BOOST_TEST(failed == 0u, path.filename() << ": " << failed << " requests failed");
    BOOST_TEST(records->live.empty(), path.filename() << " leaked segments");
    BOOST_TEST(records->errors.empty(), path.filename());
    BOOST_TEST_MESSAGE(path.filename().string()
                       << ": " << trace.events.size() << " events, peak reserved / peak live = "
                       << static_cast<double>(peak_reserved) / static_cast<double>(trace.peak_live_bytes));
  }
}

BOOST_AUTO_TEST_CASE(minimalloc_traces_in_a_fixed_1_GiB_capacity) {
  const auto files = shipped_traces();
  std::size_t replayed = 0;
  for (const auto& path : files) {
    if (path.string().find("minimalloc") == std::string::npos) continue;
    const alloy::bench::rmm_trace trace = alloy::bench::read_rmm_trace(path.string());
    address_space_upstream up;
    const auto records = up.records();
    std::size_t failed = 0;
    {
      best_fit_arena<address_space_upstream> arena{up, {.initial_size = 1_GiB, .maximum_size = 1_GiB}};
      std::vector<block> blocks(trace.allocations);
      for (const auto& e : trace.events) {
        if (e.action == alloy::bench::trace_action::allocate) {
          blocks[e.allocation] = arena.allocate(e.size, 256);
          if (!blocks[e.allocation]) ++failed;
          BOOST_TEST(arena.reserved_bytes() <= 1_GiB);
        } else if (e.action == alloy::bench::trace_action::free) {
          arena.deallocate(blocks[e.allocation]);  // an empty block (a failed request) is ignored
        }
      }
      BOOST_TEST(arena.counters().num_ooms == failed);
      BOOST_TEST(arena.check_invariants());
      BOOST_TEST(arena.misuses().total() == 0u);
    }
    BOOST_TEST(records->live.empty());
    BOOST_TEST_MESSAGE(path.filename().string()
                       << " in 1 GiB: " << failed << " of " << trace.allocations << " requests failed");
    ++replayed;
  }
  if (replayed == 0) BOOST_TEST_MESSAGE("SKIPPED: no minimalloc traces under " << ALLOY_TRACE_DIR);
}

BOOST_AUTO_TEST_CASE(trace_reader_pairs_and_reports_errors) {
  const auto trace = alloy::bench::parse_rmm_trace(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,23:00:53.858957,allocate,0x7f0000000000,100,0\n"
      "1,23:00:53.858958,allocate,0x7f0000000100,200,1a\r\n"
      "7,23:00:53.858959,allocate failure,(nil),99999999999,0\n"
      "1,23:00:53.858960,free,0x7f0000000000,100,0\n"
      "\n"
      "1,23:00:53.858961,allocate,0x7f0000000000,50,0\n",
      "inline");
  BOOST_TEST(trace.events.size() == 5u);
  BOOST_TEST(trace.allocations == 3u);
  BOOST_TEST(trace.failures == 1u);
  BOOST_TEST(trace.unfreed == 2u);
  BOOST_TEST(trace.peak_live_bytes == 300u);
  BOOST_TEST(trace.events[1].stream == 0x1au);
  BOOST_TEST(trace.events[2].thread == 7u);
  BOOST_TEST((trace.events[3].action == alloy::bench::trace_action::free));
  BOOST_TEST(trace.events[3].allocation == 0u);
  BOOST_TEST(trace.events[4].allocation == 2u);

  auto error_of = [](const char* text) -> std::string {
    try {
      alloy::bench::parse_rmm_trace(text, "t.csv");
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  const std::string header = "Thread,Time,Action,Pointer,Size,Stream\n";
  BOOST_TEST(error_of((header + "1,0,allocate,0x10,12\n").c_str()).starts_with("t.csv:2: expected 6 fields"));
  BOOST_TEST(error_of((header + "1,0,allocate,0x10,1x2,0\n").c_str()).starts_with("t.csv:2: bad size"));
  BOOST_TEST(error_of((header + "1,0,alloc,0x10,12,0\n").c_str()).starts_with("t.csv:2: unknown action"));
  BOOST_TEST(error_of((header + "1,0,allocate,0x10,12,0\n1,0,free,0x20,12,0\n").c_str())
                 .starts_with("t.csv:3: free of pointer"));
  BOOST_TEST(error_of("Pointer,Size\n").starts_with("t.csv:1: expected the header"));
  BOOST_TEST(error_of("").starts_with("t.csv:0: empty file"));
  BOOST_CHECK_THROW(alloy::bench::read_rmm_trace("/nonexistent/trace.csv"), std::runtime_error);
}

// ---- behaviour ------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(best_fit_coalescing_and_splitting) {
  best_fit_arena<checking_upstream> arena{checking_upstream{}, {.initial_size = 1_MiB, .maximum_size = 1_MiB}};
  BOOST_TEST(arena.reserved_bytes() == 1_MiB);
  BOOST_TEST(arena.bytes_reservable_limit() == 1_MiB);
  BOOST_TEST(best_fit_arena<checking_upstream>{}.bytes_reservable_limit() == std::numeric_limits<std::size_t>::max(),
             "unbounded stays SIZE_MAX, not rounded down");
  // Carve holes of 10 KiB, 3 KiB and 5 KiB separated by live blocks.
  const block a = arena.allocate(10_KiB, 256), s1 = arena.allocate(256, 256);
  const block b = arena.allocate(3_KiB, 256), s2 = arena.allocate(256, 256);
  const block c = arena.allocate(5_KiB, 256), s3 = arena.allocate(256, 256);
  arena.deallocate(a);
  arena.deallocate(b);
  arena.deallocate(c);
  BOOST_TEST(arena.free_chunk_count() == 4u);  // three holes and the tail
  const block fit = arena.allocate(4_KiB, 256);
  BOOST_TEST(fit.ptr == c.ptr, "the 5 KiB hole is the best fit for 4 KiB");
  const block exact = arena.allocate(3_KiB - 10, 256);
  BOOST_TEST(exact.ptr == b.ptr, "the 3 KiB hole fits exactly");
  BOOST_TEST(arena.largest_free_block() == 1_MiB - 10_KiB - 8_KiB - 3 * 256);
  // Free everything in an order that merges from both sides.
  for (block x : {s2, fit, s1, exact, s3}) arena.deallocate(x);
  BOOST_TEST(arena.free_chunk_count() == 1u);
  BOOST_TEST(arena.largest_free_block() == 1_MiB);
  BOOST_TEST(every_segment_one_free_chunk(arena));
  BOOST_TEST(arena.check_invariants());
  // The full capacity in one block, then nothing more.
  const block all = arena.allocate(1_MiB, 256);
  BOOST_TEST(static_cast<bool>(all));
  BOOST_TEST(!arena.allocate(1, 1));
  BOOST_TEST(arena.counters().num_ooms == 1u);
  BOOST_TEST(arena.counters().num_device_alloc == 1u);
  arena.deallocate(all);
}

BOOST_AUTO_TEST_CASE(large_alignments_are_served_inside_the_arena) {
  best_fit_arena<checking_upstream> arena;
  std::vector<block> blocks;
  for (std::size_t alignment : {512_KiB, 4096_KiB, 64_KiB, 4_KiB, 2_MiB}) {
    const block x = arena.allocate(1000, alignment);
    BOOST_TEST(alloy::detail::is_aligned(x.ptr, alignment));
    blocks.push_back(x);
  }
  BOOST_TEST(arena.check_invariants());
  BOOST_TEST(arena.bytes_in_use() == 5 * 1024u, "padding in front stays free, not in use");
  for (block x : blocks) arena.deallocate(x);
  BOOST_TEST(every_segment_one_free_chunk(arena));
  BOOST_TEST(!arena.allocate(1, 3));
  BOOST_TEST(!arena.allocate(1, std::size_t{1} << 63), "no overflow when padding a huge alignment");
}

namespace {

/// Promises 256 B, as CUDA's calls do, and never gives more: every block starts 256 B past a
/// 4 KiB boundary. Refuses alignments above its promise, as the CUDA upstreams do.
struct only_256_aligned_upstream {
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  static constexpr std::size_t max_alignment = 256;
  checking_upstream under{};
  alloy::block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (alignment > max_alignment || bytes > SIZE_MAX - 4096) return {};
    const alloy::block b = under.allocate(bytes + 256, 4096);
    if (!b) return {};
    return {static_cast<char*>(b.ptr) + 256, bytes};
  }
  void deallocate(alloy::block b) noexcept {
    if (b) under.deallocate({static_cast<char*>(b.ptr) - 256, b.size + 256});
  }
};

}  // namespace

// A rounding above what the upstream promises (CUDA: 256 B) still gives rounding-aligned
// segments: the arena asks for what the upstream can do and aligns inside a slightly longer one.
BOOST_AUTO_TEST_CASE(rounding_above_the_upstream_alignment) {
  best_fit_arena<only_256_aligned_upstream> arena{only_256_aligned_upstream{}, {.initial_size = 0, .rounding = 4096}};
  std::vector<block> blocks;
  for (const std::size_t size : std::vector<std::size_t>{1000, 5000, 3_MiB, 100}) {
    const block x = arena.allocate(size, 4096);
    BOOST_REQUIRE(x);
    BOOST_TEST(alloy::detail::is_aligned(x.ptr, 4096));
    std::memset(x.ptr, 0x5a, x.size);
    blocks.push_back(x);
  }
  BOOST_TEST(arena.check_invariants());
  for (block x : blocks) arena.deallocate(x);
  BOOST_TEST(every_segment_one_free_chunk(arena));
  arena.release();
  BOOST_TEST(arena.reserved_bytes() == 0u);
  const auto& records = *arena.upstream().under.records();
  BOOST_TEST(records.allocations == records.deallocations, "every upstream block went back");
}

BOOST_AUTO_TEST_CASE(growth_doubles_or_steps) {
  {
    best_fit_arena<checking_upstream> arena{checking_upstream{}, {.growth_size = 1_MiB, .max_growth_size = 4_MiB}};
    std::vector<std::size_t> segments;
    std::vector<block> blocks;
    for (int i = 0; i < 6; ++i) {
      blocks.push_back(arena.allocate(1_MiB, 256));  // each fills the free space left, then grows
      std::vector<std::size_t> now;
      arena.for_each_block([&](const alloy::block_info& info) {
        if (info.ptr == info.segment) now.push_back(info.segment_size);
      });
      segments = now;
    }
    std::sort(segments.begin(), segments.end());
    // 1, 2 (1 left), 4 (3 left: three more blocks fit) -> 6 blocks in 1 + 2 + 4 MiB.
    BOOST_TEST(segments == (std::vector<std::size_t>{1_MiB, 2_MiB, 4_MiB}), boost::test_tools::per_element());
    blocks.push_back(arena.allocate(1_MiB, 256));
    blocks.push_back(arena.allocate(6_MiB, 256));  // bigger than the step: exactly its size
    BOOST_TEST(arena.reserved_bytes() == 1_MiB + 2_MiB + 4_MiB + 6_MiB, "the seventh fills the last MiB");
    for (block b : blocks) arena.deallocate(b);
  }
  {
    best_fit_arena<checking_upstream> arena{checking_upstream{},
                                            {.growth = alloy::best_fit_growth::fixed, .growth_size = 3_MiB}};
    std::vector<block> blocks;
    for (int i = 0; i < 7; ++i) blocks.push_back(arena.allocate(1_MiB, 256));
    BOOST_TEST(arena.reserved_bytes() == 9_MiB);
    BOOST_TEST(arena.counters().num_device_alloc == 3u);
    blocks.push_back(arena.allocate(5_MiB, 256));
    BOOST_TEST(arena.reserved_bytes() == 14_MiB);
    for (block b : blocks) arena.deallocate(b);
    BOOST_TEST(arena.release() == 14_MiB);
    BOOST_TEST(arena.counters().num_device_free == 4u);
  }
}

BOOST_AUTO_TEST_CASE(maximum_size_caps_growth) {
  best_fit_arena<checking_upstream> arena{checking_upstream{}, {.maximum_size = 5_MiB, .growth_size = 2_MiB}};
  const block a = arena.allocate(2_MiB, 256);
  const block b = arena.allocate(2_MiB, 256);
  const block c = arena.allocate(1_MiB, 256);  // the last segment is cut to what is left
  BOOST_TEST(static_cast<bool>(a));
  BOOST_TEST(static_cast<bool>(b));
  BOOST_TEST(static_cast<bool>(c));
  BOOST_TEST(arena.reserved_bytes() == 5_MiB);
  BOOST_TEST(!arena.allocate(1, 1));
  BOOST_TEST(arena.counters().num_ooms == 1u);
  BOOST_TEST(arena.counters().num_alloc_retries == 0u, "nothing to release, the upstream never failed");
  arena.deallocate(a);
  arena.deallocate(b);
  arena.deallocate(c);
}

BOOST_AUTO_TEST_CASE(upstream_failure_releases_free_segments_and_retries_once) {
  failing_upstream up;
  const auto records = up.records();
  {
    best_fit_arena<failing_upstream> arena{up, {.growth_size = 1_MiB, .max_growth_size = 1_MiB}};
    std::vector<block> blocks;
    for (int i = 0; i < 4; ++i) blocks.push_back(arena.allocate(1_MiB, 256));
    BOOST_TEST(arena.segment_count() == 4u);
    arena.deallocate(blocks[1]);
    arena.deallocate(blocks[2]);
    // The next upstream call fails; two segments are wholly free: released, and the retry works.
    up.set_options({.fail_at = {up.calls()}});
    const block big = arena.allocate(3_MiB, 256);
    BOOST_TEST(static_cast<bool>(big));
    BOOST_TEST(arena.counters().num_alloc_retries == 1u);
    BOOST_TEST(arena.counters().num_ooms == 0u);
    BOOST_TEST(arena.segment_count() == 3u);
    // Everything fails from now on: an empty block, one retry (the upstream failed), one OOM.
    up.set_options({.fail_from = 0});
    BOOST_TEST(!arena.allocate(8_MiB, 256));
    BOOST_TEST(arena.counters().num_alloc_retries == 2u);
    BOOST_TEST(arena.counters().num_ooms == 1u);
    BOOST_TEST(arena.check_invariants());
    const block small = arena.allocate(100, 256);  // nothing free left: fails too
    BOOST_TEST(!small);
    arena.deallocate(blocks[0]);
    const block again = arena.allocate(100, 256);  // served from the freed chunk without the upstream
    BOOST_TEST(static_cast<bool>(again));
    arena.deallocate(again);
    arena.deallocate(blocks[3]);
    arena.deallocate(big);
  }
  BOOST_TEST(records->live_count() == 0u);
  BOOST_TEST(records->errors.empty());
}

// allocate_keeping_cache: the same upstream failure gives an empty block, keeps the free segments
// and counts neither a retry nor an OOM (stream_ordered retries with allocate after waiting).
BOOST_AUTO_TEST_CASE(allocate_keeping_cache_never_releases) {
  failing_upstream up;
  const auto records = up.records();
  {
    best_fit_arena<failing_upstream> arena{up, {.growth_size = 1_MiB, .max_growth_size = 1_MiB}};
    std::vector<block> blocks;
    for (int i = 0; i < 3; ++i) blocks.push_back(arena.allocate_keeping_cache(1_MiB, 256));
    BOOST_TEST(arena.segment_count() == 3u);
    arena.deallocate(blocks[1]);
    const block reused = arena.allocate_keeping_cache(1_MiB, 256);  // from the cache: no upstream call
    BOOST_TEST(reused.ptr == blocks[1].ptr);
    arena.deallocate(reused);
    up.set_options({.fail_from = up.calls()});
    BOOST_TEST(!arena.allocate_keeping_cache(2_MiB, 256));
    BOOST_TEST(arena.segment_count() == 3u);
    BOOST_TEST(records->live_count() == 3u);
    BOOST_TEST(arena.counters().num_alloc_retries == 0u);
    BOOST_TEST(arena.counters().num_ooms == 0u);
    BOOST_TEST(!arena.allocate(2_MiB, 256));  // the releasing call gives the free segment back
    BOOST_TEST(arena.segment_count() == 2u);
    BOOST_TEST(arena.counters().num_ooms == 1u);
    BOOST_TEST(arena.check_invariants());
    arena.deallocate(blocks[0]);
    arena.deallocate(blocks[2]);
  }
  BOOST_TEST(records->live_count() == 0u);
  BOOST_TEST(records->errors.empty());
}

BOOST_AUTO_TEST_CASE(null_upstream_gives_empty_blocks) {
  best_fit_arena<alloy::null_upstream> arena{alloy::null_upstream{}, {.initial_size = 1_MiB}};
  BOOST_TEST(arena.reserved_bytes() == 0u);
  BOOST_TEST(!arena.allocate(10, 8));
  BOOST_TEST(!arena.allocate(0, 8));
  BOOST_TEST(arena.counters().num_ooms == 2u);
  BOOST_TEST(arena.counters().num_device_alloc == 0u);
  arena.deallocate({});
  BOOST_TEST(arena.check_invariants());
}

BOOST_AUTO_TEST_CASE(misuse_is_detected_ignored_and_reported) {
  misuse_log log;
  checking_upstream up;
  best_fit_arena<checking_upstream> arena{up, {.on_misuse = &misuse_log::record, .misuse_context = &log}};
  const block a = arena.allocate(1000, 256);
  const block b = arena.allocate(3000, 256);
  const block c = arena.allocate(500, 256);
  arena.deallocate(b);
  arena.deallocate(b);  // double free
  int on_stack = 0;
  arena.deallocate(block{&on_stack, sizeof on_stack});           // foreign
  arena.deallocate(block{static_cast<char*>(a.ptr) + 256, 10});  // interior pointer
  arena.deallocate(block{a.ptr, 999});                           // wrong size
  BOOST_TEST(arena.misuses().double_frees == 1u);
  BOOST_TEST(arena.misuses().foreign_pointers == 2u);
  BOOST_TEST(arena.misuses().wrong_sizes == 1u);
  BOOST_REQUIRE(log.seen.size() == 4u);
  BOOST_TEST((log.seen[0].first == alloy::arena_misuse::double_free));
  BOOST_TEST((log.seen[0].second == b));
  BOOST_TEST((log.seen[3].first == alloy::arena_misuse::wrong_size));
  BOOST_TEST(arena.check_invariants());
  BOOST_TEST(arena.bytes_in_use() == 1024u + 512u, "a and c still allocated");
  // A block freed and handed out again at the same address: the stale double free is not
  // detectable (it is a valid free of the new block) -- but a wrong size is.
  arena.deallocate(a);
  arena.deallocate(c);
  BOOST_TEST(arena.misuses().total() == 4u);
  BOOST_TEST(every_segment_one_free_chunk(arena));
  BOOST_TEST(!arena.owns(block{&on_stack, 4}));
}

BOOST_AUTO_TEST_CASE(max_split_size_keeps_big_chunks_whole) {
  best_fit_arena<checking_upstream> arena{checking_upstream{},
                                          {.initial_size = 16_MiB, .growth_size = 2_MiB, .max_split_size = 4_MiB}};
  // A small request does not split the oversize 16 MiB chunk: it grows a segment of at most 4 MiB.
  const block small = arena.allocate(1_MiB, 256);
  BOOST_TEST(arena.segment_count() == 2u);
  BOOST_TEST(arena.largest_free_block() == 16_MiB);
  // A big request splits it, and the rest stays oversize for big requests.
  const block big = arena.allocate(5_MiB, 256);
  BOOST_TEST(arena.largest_free_block() == 11_MiB);
  // A request leaving less than max_split_size over takes the chunk whole.
  const block whole = arena.allocate(8_MiB, 256);
  BOOST_TEST(arena.bytes_in_use() == 1_MiB + 5_MiB + 11_MiB);
  BOOST_TEST(arena.requested_bytes() == 1_MiB + 5_MiB + 8_MiB);
  bool reported = false;
  arena.for_each_block([&](const alloy::block_info& i) {
    if (i.ptr == whole.ptr)
      reported = i.size == 11_MiB && i.requested == 8_MiB && i.state == alloy::block_state::allocated;
  });
  BOOST_TEST(reported);
  arena.deallocate(whole);
  arena.deallocate(big);
  arena.deallocate(small);
  BOOST_TEST(every_segment_one_free_chunk(arena));
}

BOOST_AUTO_TEST_CASE(max_split_size_last_resort_in_a_fixed_capacity) {
  best_fit_arena<checking_upstream> arena{checking_upstream{},
                                          {.initial_size = 8_MiB, .maximum_size = 8_MiB, .max_split_size = 1_MiB}};
  std::vector<block> blocks;
  for (int i = 0; i < 32; ++i) blocks.push_back(arena.allocate(256_KiB, 256));
  for (block b : blocks) BOOST_TEST(static_cast<bool>(b), "the only segment is split as a last resort");
  BOOST_TEST(arena.reserved_bytes() == 8_MiB);
  for (block b : blocks) arena.deallocate(b);
  BOOST_TEST(every_segment_one_free_chunk(arena));
}

BOOST_AUTO_TEST_CASE(introspection_and_release) {
  checking_upstream up;
  const auto records = up.records();
  best_fit_arena<checking_upstream> arena{up, {.growth = alloy::best_fit_growth::fixed, .growth_size = 1_MiB}};
  const block a = arena.allocate(100, 1);
  const block z = arena.allocate(0, 1);
  const block big = arena.allocate(3_MiB, 256);
  BOOST_TEST(z.size == 0u);
  BOOST_TEST(z.ptr != a.ptr);
  std::vector<alloy::block_info> infos;
  arena.for_each_block([&](const alloy::block_info& i) { infos.push_back(i); });
  BOOST_REQUIRE(infos.size() >= 4u);
  BOOST_TEST(std::is_sorted(infos.begin(), infos.end(), [](const auto& l, const auto& r) { return l.ptr < r.ptr; }));
  std::size_t allocated = 0;
  for (const auto& i : infos) {
    if (i.state == alloy::block_state::allocated) {
      ++allocated;
      if (i.ptr == a.ptr) BOOST_TEST((i.size == 256u && i.requested == 100u));
      if (i.ptr == z.ptr) BOOST_TEST((i.size == 256u && i.requested == 0u));
    }
  }
  BOOST_TEST(allocated == 3u);
  BOOST_TEST(arena.owns(a));
  BOOST_TEST(arena.owns(block{static_cast<char*>(big.ptr) + 3_MiB - 1, 1}));
  arena.deallocate(big);
  BOOST_TEST(arena.release() == 3_MiB, "only the wholly free segment goes back");
  BOOST_TEST(arena.reserved_bytes() == 1_MiB);
  BOOST_TEST(!arena.owns(big));
  arena.deallocate(a);
  arena.deallocate(z);
  BOOST_TEST(arena.release() == 1_MiB);
  BOOST_TEST(records->live_count() == 0u);
}

BOOST_AUTO_TEST_CASE(allocate_at_places_a_block_in_a_free_chunk) {
  best_fit_arena<checking_upstream> arena{checking_upstream{}, {.initial_size = 1_MiB, .maximum_size = 1_MiB}};
  const block a = arena.allocate(1000, 256);
  auto* base = static_cast<char*>(a.ptr);
  BOOST_TEST(!arena.allocate_at(base + 512, 10), "inside an allocated chunk");
  BOOST_TEST(!arena.allocate_at(base + 4096 + 1, 10), "not a multiple of the rounding");
  BOOST_TEST(!arena.allocate_at(base + 1_MiB - 256, 257), "runs past the end of the free chunk");
  int on_stack = 0;
  BOOST_TEST(!arena.allocate_at(&on_stack, 4));
  const block placed = arena.allocate_at(base + 64_KiB, 5000);
  BOOST_TEST(placed.ptr == base + 64_KiB);
  BOOST_TEST(placed.size == 5000u);
  BOOST_TEST(arena.free_chunk_count() == 2u, "free bytes before and after stay free chunks");
  BOOST_TEST(arena.check_invariants());
  arena.deallocate(placed);
  arena.deallocate(a);
  BOOST_TEST(every_segment_one_free_chunk(arena));
}

BOOST_AUTO_TEST_CASE(odd_maximum_size_is_rounded_down) {
  best_fit_arena<checking_upstream> arena{checking_upstream{},
                                          {.initial_size = 1_MiB + 100, .maximum_size = 1_MiB + 100}};
  BOOST_TEST(arena.bytes_reservable_limit() == 1_MiB);
  BOOST_TEST(arena.reserved_bytes() == 1_MiB);
  const block a = arena.allocate(1_MiB, 256);
  BOOST_TEST(static_cast<bool>(a));
  BOOST_TEST(!arena.allocate(1, 1));
  arena.deallocate(a);
  BOOST_TEST(arena.check_invariants());
}

BOOST_AUTO_TEST_CASE(moving_and_destruction_return_every_segment) {
  checking_upstream up;
  const auto records = up.records();
  {
    best_fit_arena<checking_upstream> first{up};
    const block a = first.allocate(5000, 64);
    BOOST_TEST(static_cast<bool>(a));
    best_fit_arena<checking_upstream> second{std::move(first)};
    BOOST_TEST(second.owns(a));
    best_fit_arena<checking_upstream> third{up, {.initial_size = 1_MiB}};
    third = std::move(second);  // third's own segment goes back
    BOOST_TEST(records->live_count() == 1u);
    third.deallocate(a);
    const block leaked = third.allocate(100, 8);  // still live when the arena goes: returned anyway
    BOOST_TEST(static_cast<bool>(leaked));
  }
  BOOST_TEST(records->live_count() == 0u);
  BOOST_TEST(records->errors.empty());
}

BOOST_AUTO_TEST_SUITE_END()
