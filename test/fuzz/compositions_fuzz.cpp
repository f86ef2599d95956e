// libFuzzer target (DESIGN §8): the input drives one of several compositions through allocations,
// frees, stream-ordered calls and releases, checked against a model of the live blocks: sizes,
// alignment, no overlap, fill patterns (at each block's ends) intact until freed, and, at the end, nothing leaked, every
// upstream free sized right, the arena's own invariants. Any violation traps.
//
// Input: byte 0 picks the composition; then 4 bytes per operation:
//   [op] [size exponent] [size mantissa] [alignment exponent / victim]
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <vector>

#include <alloy/alloy.hpp>

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

#define ALLOY_FUZZ_CHECK(condition) \
  do {                              \
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

template <class A>
void drive(A& alloc, const std::uint8_t* data, std::size_t size) {
  constexpr bool streams = alloy::stream_ordered_allocator<A, inline_stream>;
  std::vector<live_block> live;
  std::map<std::uintptr_t, std::uintptr_t> ranges;  // start -> end of every live non-empty block
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
      default:  // every live block still holds its pattern; sometimes release the cache
        for (const live_block& l : live) ALLOY_FUZZ_CHECK(intact(l));
        if constexpr (alloy::releasing_allocator<A>) {
          if (arg % 8 == 0) alloc.release();
        }
        break;
    }
  }
  for (const live_block& l : live) {
    ALLOY_FUZZ_CHECK(intact(l));
    alloc.deallocate(l.b);
  }
}

template <class A, class Check>
void run(A&& alloc, const std::uint8_t* data, std::size_t size, Check&& check) {
  drive(alloc, data, size);
  check(alloc);
}

constexpr auto no_check = [](auto&) {};
constexpr auto arena_check = [](auto& a) { ALLOY_FUZZ_CHECK(alloy::find<alloy::best_fit_arena>(a).check_invariants()); };

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
      case 0:
        run(arena{up, {.growth_size = 64_KiB, .max_growth_size = 1_MiB}}, ops, n, arena_check);
        break;
      case 1:
        run(arena{up, {.initial_size = 4_MiB, .maximum_size = 4_MiB, .max_split_size = 256_KiB}}, ops, n, arena_check);
        break;
      case 2:
        run(pool{up}, ops, n, no_check);
        break;
      case 3:
        run(alloy::stats<heap>{heap{pool{up}, arena{up}}}, ops, n, arena_check);
        break;
      case 4:
        run(alloy::stream_ordered<arena, inline_stream>{arena{up, {.maximum_size = 8_MiB}}}, ops, n, arena_check);
        break;
      default:
        run(alloy::limited<alloy::stream_ordered<heap, inline_stream>>{
                alloy::stream_ordered<heap, inline_stream>{heap{pool{up}, arena{up}}}, {.bytes_limit = 6_MiB}},
            ops, n, arena_check);
        break;
    }
  }
  ALLOY_FUZZ_CHECK(records->live_count() == 0);
  ALLOY_FUZZ_CHECK(records->errors.empty());
  return 0;
}
