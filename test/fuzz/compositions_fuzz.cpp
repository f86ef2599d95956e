// SPDX-License-Identifier: Apache-2.0
// libFuzzer target (DESIGN §8): the input drives one of several compositions through allocations,
// frees, bad frees (double, foreign, interior, wrong size: DESIGN §7), stream-ordered calls and
// releases, checked against a model of the live blocks: sizes, alignment, no overlap, fill
// patterns (at each block's ends) intact until freed, the statistics exact after every operation
// (bytes asked for in use, from the outermost part that counts them; `stats<>`'s num_allocs and
// PyTorch allocation count every 64 operations) — a bad free must change nothing — and, at the
// end, nothing leaked, every upstream free sized right, the arena's own invariants. Any violation
// traps.
//
// Input: byte 0 picks the composition; then 4 bytes per operation:
//   [op] [size exponent] [size mantissa] [alignment exponent / victim]
// op % 4 == 3 is a check (and sometimes a release) when op & 0x10 is clear, else a bad free whose
// kind is arg % 4.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/memory_stats.hpp>

#include "support/checking_upstream.hpp"

using namespace alloy::literals;
using alloy::block;
using alloy::testing::checking_upstream;

/// A stream whose work is always done: the stream_ordered bookkeeping (ranges, events, claims)
/// runs fully, with no threads.
struct inline_stream {
  int id = 0;
  friend bool operator==(inline_stream, inline_stream) = default;
};
template <>
struct alloy::stream_traits<inline_stream> {
  struct event_type {
    bool recorded = false;
  };
  static bool create(event_type&) noexcept { return true; }
  static void destroy(event_type& e) noexcept { e = {}; }
  static bool record(event_type& e, inline_stream s) noexcept { return e.recorded = s.id != 3; }  // stream 3 fails
  static bool wait(inline_stream, const event_type&) noexcept { return true; }
  static bool ready(const event_type& e) noexcept { return !e.recorded; }  // pending until waited on
  static void synchronize(const event_type&) noexcept {}
  static void synchronize(inline_stream) noexcept {}
};

namespace {

#define ALLOY_FUZZ_CHECK(condition)     \
  do {                                  \
    if (!(condition)) __builtin_trap(); \
  } while (0)

struct live_block {
  block b;
  std::uint8_t pattern;
  int stream;
};

// The pattern covers a block's first and last `edge` bytes: enough to catch a block handed out
// twice or written into by the allocator, without page-faulting MiBs per input (the model tests
// fill whole blocks; here speed buys coverage).
constexpr std::size_t edge = 512;

void fill(const live_block& l) {
  auto* p = static_cast<std::uint8_t*>(l.b.ptr);
  if (l.b.size <= 2 * edge) {
    std::memset(p, l.pattern, l.b.size);
  } else {
    std::memset(p, l.pattern, edge);
    std::memset(p + l.b.size - edge, l.pattern, edge);
  }
}

bool all_equal(const std::uint8_t* p, std::size_t n, std::uint8_t value) {
  // Every byte equals the first, and the first is the value: one memcmp of the range against
  // itself shifted by a byte.
  return n == 0 || (p[0] == value && std::memcmp(p, p + 1, n - 1) == 0);
}

bool intact(const live_block& l) {
  const auto* p = static_cast<const std::uint8_t*>(l.b.ptr);
  if (l.b.size <= 2 * edge) return all_equal(p, l.b.size, l.pattern);
  return all_equal(p, edge, l.pattern) && all_equal(p + l.b.size - edge, edge, l.pattern);
}

/// What the model says the composition holds: blocks and bytes asked for, allocations so far.
struct model_counts {
  std::size_t bytes = 0;
  std::size_t blocks = 0;
  std::size_t allocations = 0;
};

/// The composition's own counts against the model: the bytes asked for in use from the outermost
/// part that counts them (stats<> and limited<> count sizes asked; the engines' requested_bytes()),
/// and, when `full`, stats<>'s num_allocs and PyTorch allocation count.
template <class A>
void check_counts(A& alloc, const model_counts& model, bool full) {
  if constexpr (alloy::detail::is_specialization_of<A, alloy::stats> ||
                alloy::detail::is_specialization_of<A, alloy::limited>) {
    ALLOY_FUZZ_CHECK(alloc.bytes_in_use() == model.bytes);
  } else if constexpr (requires { alloc.requested_bytes(); }) {
    ALLOY_FUZZ_CHECK(alloc.requested_bytes() == model.bytes);
  }
  if constexpr (alloy::detail::contains_stats<A>) {
    if (full) {
      const alloy::statistics s = alloy::statistics_of(alloc);
      ALLOY_FUZZ_CHECK(s.bytes_in_use == model.bytes);
      ALLOY_FUZZ_CHECK(s.num_allocs == model.allocations);
      auto pytorch = alloy::memory_stats(alloc);
      ALLOY_FUZZ_CHECK(pytorch["allocation.all.current"] == static_cast<std::int64_t>(model.blocks));
      ALLOY_FUZZ_CHECK(pytorch["allocated_bytes.all.current"] == static_cast<std::int64_t>(model.bytes));
    }
  }
}

template <class A>
void drive(A& alloc, const std::uint8_t* data, std::size_t size) {
  constexpr bool streams = alloy::stream_ordered_allocator<A, inline_stream>;
  std::vector<live_block> live;
  std::map<std::uintptr_t, std::uintptr_t> ranges;  // start -> end of every live non-empty block
  std::vector<block> freed;                         // recently freed blocks, for double frees (most recent last)
  model_counts model;
  checking_upstream elsewhere;  // another allocator, whose block is foreign to `alloc`
  const block foreign = elsewhere.allocate(4096, 256);
  std::uint8_t next_pattern = 1;
  for (std::size_t at = 0; at + 4 <= size && live.size() < 512; at += 4) {
    const std::uint8_t op = data[at];
    const std::size_t exponent = data[at + 1] % 23;  // up to 4 MiB
    const std::size_t bytes = (std::size_t{1} << exponent) + (data[at + 2] << exponent >> 8);
    const std::uint8_t arg = data[at + 3];
    const int stream = streams ? op >> 6 : 0;
    switch (op % 4) {
      case 0:
      case 1: {  // allocate
        const std::size_t alignment = std::size_t{1} << (arg % 13);
        block b;
        if constexpr (streams) {
          b = (op & 0x20) ? alloc.allocate(bytes, alignment) : alloc.allocate(bytes, alignment, inline_stream{stream});
        } else {
          b = alloc.allocate(bytes, alignment);
        }
        if (!b) break;
        ALLOY_FUZZ_CHECK(b.size == bytes);
        ALLOY_FUZZ_CHECK(reinterpret_cast<std::uintptr_t>(b.ptr) % alignment == 0);
        const auto lo = reinterpret_cast<std::uintptr_t>(b.ptr);
        const std::uintptr_t hi = lo + b.size;
        if (b.size != 0) {
          auto next = ranges.lower_bound(lo);
          ALLOY_FUZZ_CHECK(next == ranges.end() || next->first >= hi);
          ALLOY_FUZZ_CHECK(next == ranges.begin() || std::prev(next)->second <= lo);
          ranges.emplace(lo, hi);
        }
        live.push_back({b, next_pattern++, stream});
        if (next_pattern == 0) next_pattern = 1;
        fill(live.back());
        model.bytes += b.size;
        ++model.blocks;
        ++model.allocations;
        break;
      }
      case 2: {  // free
        if (live.empty()) break;
        const std::size_t victim = arg % live.size();
        const live_block l = live[victim];
        ALLOY_FUZZ_CHECK(intact(l));
        if (l.b.size != 0) ranges.erase(reinterpret_cast<std::uintptr_t>(l.b.ptr));
        live[victim] = live.back();
        live.pop_back();
        model.bytes -= l.b.size;
        --model.blocks;
        freed.push_back(l.b);
        if (freed.size() > 16) freed.erase(freed.begin());
        if constexpr (streams) {
          if (op & 0x20) {
            alloy::record_use(alloc, l.b, inline_stream{(l.stream + 1) % 4});
          }
          alloc.deallocate(l.b, inline_stream{l.stream});
        } else {
          alloc.deallocate(l.b);
        }
        break;
      }
      default:
        if (op & 0x10) {  // a bad free: refused, it must change nothing
          block bad{};
          switch (arg % 4) {
            case 0: {  // double free of a recently freed block, unless its address is a live block's again
              if (freed.empty()) break;
              const block old = freed[(arg >> 2) % freed.size()];
              bool reused_same = false;
              for (const live_block& l : live)
                reused_same = reused_same || (l.b.ptr == old.ptr && l.b.size == old.size);
              if (!reused_same) bad = old;  // (a live block at that address with another size: a wrong size)
              break;
            }
            case 1:  // foreign: another allocator's block, or a stack address
              bad = (arg & 4) ? foreign : block{&model, sizeof model};
              break;
            case 2: {  // interior pointer of a live block of at least 2 bytes
              if (live.empty()) break;
              const live_block& l = live[(arg >> 2) % live.size()];
              if (l.b.size < 2) break;
              const std::size_t offset = 1 + (bytes % (l.b.size - 1));
              bad = {static_cast<std::uint8_t*>(l.b.ptr) + offset, l.b.size - offset};
              break;
            }
            default: {  // wrong size of a live block
              if (live.empty()) break;
              const live_block& l = live[(arg >> 2) % live.size()];
              static constexpr std::size_t deltas[] = {1, 255, 4096};
              const std::size_t delta = deltas[bytes % 3];
              bad = {l.b.ptr, (op & 0x20) && l.b.size >= delta ? l.b.size - delta : l.b.size + delta};
              break;
            }
          }
          if (!bad) break;
          if constexpr (streams) {
            alloc.deallocate(bad, inline_stream{stream});
          } else {
            alloc.deallocate(bad);
          }
          break;  // checked below, as after every operation
        }
        // Every live block still holds its pattern; sometimes release the cache.
        for (const live_block& l : live) ALLOY_FUZZ_CHECK(intact(l));
        if constexpr (alloy::releasing_allocator<A>) {
          if (arg % 8 == 0) alloc.release();
        }
        break;
    }
    check_counts(alloc, model, (at / 4) % 64 == 63);
  }
  for (const live_block& l : live) {
    ALLOY_FUZZ_CHECK(intact(l));
    alloc.deallocate(l.b);
  }
  model = {0, 0, model.allocations};
  check_counts(alloc, model, true);
  elsewhere.deallocate(foreign);
}

template <class A, class Check>
void run(A&& alloc, const std::uint8_t* data, std::size_t size, Check&& check) {
  drive(alloc, data, size);
  check(alloc);
}

constexpr auto no_check = [](auto&) {};
constexpr auto arena_check = [](auto& a) {
  ALLOY_FUZZ_CHECK(alloy::find<alloy::best_fit_arena>(a).check_invariants());
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  checking_upstream up;
  const auto records = up.records();
  {
    using arena = alloy::best_fit_arena<checking_upstream>;
    using pool = alloy::size_class_pool<checking_upstream>;
    using heap = alloy::segregator<64_KiB, pool, arena>;
    const std::uint8_t* ops = data + 1;
    const std::size_t n = size - 1;
    switch (data[0] % 6) {
      case 0: run(arena{up, {.growth_size = 64_KiB, .max_growth_size = 1_MiB}}, ops, n, arena_check); break;
      case 1:
        run(arena{up, {.initial_size = 4_MiB, .maximum_size = 4_MiB, .max_split_size = 256_KiB}}, ops, n, arena_check);
        break;
      case 2: run(pool{up}, ops, n, no_check); break;
      case 3: run(alloy::stats<heap>{heap{pool{up}, arena{up}}}, ops, n, arena_check); break;
      case 4:
        run(alloy::stream_ordered<arena, inline_stream>{arena{up, {.maximum_size = 8_MiB}}}, ops, n, arena_check);
        break;
      default:
        run(
            alloy::limited<alloy::stream_ordered<heap, inline_stream>>{
                alloy::stream_ordered<heap, inline_stream>{heap{pool{up}, arena{up}}}, {.bytes_limit = 6_MiB}},
            ops, n, arena_check);
        break;
    }
  }
  ALLOY_FUZZ_CHECK(records->live_count() == 0);
  ALLOY_FUZZ_CHECK(records->errors.empty());
  return 0;
}
