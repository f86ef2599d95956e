// SPDX-License-Identifier: Apache-2.0
// libFuzzer target (docs/design.md#testing-without-a-gpu): the input drives one of several
// compositions through allocations, frees, bad frees (double, foreign, interior, wrong size:
// docs/design.md#errors), stream-ordered calls and releases, checked against a model of the live
// blocks: sizes, alignment, no overlap, fill patterns (at each block's ends) intact until freed,
// the statistics exact after every operation (bytes asked for in use, from the outermost part that
// counts them; `stats<>`'s num_allocs and PyTorch allocation count every 64 operations) — a bad
// free must change nothing, and `free_misuse` must name it (and nothing for a live block) where
// the composition has it — and, at the end, nothing leaked, every upstream free sized right; the
// arena's own invariants every 64 operations and at the end. Any violation traps.
//
// The virtual compositions (virtual_arena<host_vmm> with its default release rule; with
// `virtual_allocator`'s block-sized pieces, alone and under stream_ordered; two under
// `granule_segregator`, one release rule shared; `stats<virtual_allocator>`;
// and `synchronized<virtual_allocator>` over a thread-safe backend, whose growths are planned,
// mapped and committed within each call, granules ahead at the frontier included, on tag 0 only)
// also take tags, offload, discard and restore, and run over a backend that fails chosen creates,
// maps and reserves and a host copy that fails when asked: a tag's blocks must come back at the
// same addresses holding the same bytes after an offload, a failed call must change no tag's
// state, the backend's physical bytes must equal the arenas' mapped bytes after every operation,
// and after everything is freed and released nothing is mapped, nor, once the composition is
// gone, reserved (inputs of odd length restore every tag first; even ones leave offloaded tags to
// the destructor).
//
// The movable stack (host_spill_reclaimer over compacting_defragmenter over best_fit_arena, under
// stats<> and under limited<>, on a device of 16 MiB, so that blocks are moved and spilled) also
// takes movable blocks where the composition has them (op & 0x40: allocate_movable, a handle's
// free, checked or not, and a bad handle: freed, another allocator's, locked or empty, which must
// throw, be refused by try_deallocate and change nothing); their content is checked through lock.
//
// Input: byte 0 picks the composition; then 4 bytes per operation:
//   [op] [size exponent] [size mantissa] [alignment exponent / victim]
// op % 4 == 3 is a check (and sometimes a release) when op & 0x10 is clear, else a bad free whose
// kind is arg % 4. For the virtual compositions (op >> 2) % 3 picks the tag of an allocation,
// op & 0x20 whether it is the current tag (`scoped_tag`; `allocate_keeping_cache` where there is
// one) or the call's (stream-ordered ones: always the current tag, op & 0x20 the default stream), and
// a check with arg % 8 of 1-6 offloads, discards or restores tag (arg >> 3) % 3, makes the host copy
// fail or succeed, or schedules backend failures (bytes 1 and 2: which call, which kinds, whether
// every call from then on fails). For the others op & 0x20 allocates through `allocate_cached`
// where there is one (only from what is held).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <new>
#include <optional>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/movable.hpp>
#include <alloy/policy/compacting_defragmenter.hpp>
#include <alloy/policy/host_spill_reclaimer.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/showcase.hpp>
#include <alloy/vmm/host_vmm.hpp>
#include <alloy/vmm/synchronized_vmm.hpp>

#include "support/checking_upstream.hpp"
#include "support/failing_vmm.hpp"

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
  std::uint16_t tag;
};

using fuzz_vmm = alloy::testing::failing_vmm<alloy::vmm_ref<alloy::host_vmm>>;
/// The same backend behind a lock: a `thread_safe_vmm`, so that `synchronized` plans growths.
using planning_vmm = alloy::vmm_ref<alloy::synchronized_vmm<fuzz_vmm>>;

/// What the input may make fail in a virtual composition: the backend (a copy sharing the
/// arena's failure options) and the host copy of an offload.
struct fault_injection {
  fuzz_vmm vmm;
  bool host_copy_fails = false;
  std::optional<alloy::synchronized_vmm<fuzz_vmm>> locked{};  ///< `planning_vmm`'s backend, when used

  static void* host_allocate(std::size_t bytes, void* self) {
    return static_cast<fault_injection*>(self)->host_copy_fails ? nullptr : ::operator new(bytes, std::nothrow);
  }
  static void host_deallocate(void* p, std::size_t, void*) { ::operator delete(p); }
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

/// A live movable block of the model.
struct live_handle {
  alloy::handle h;
  std::size_t size;
  std::uint8_t pattern;
};

/// Fills a movable block's ends with its pattern (false: it could not be locked).
template <class A>
bool fill_handle(A& alloc, const live_handle& l) {
  void* p = alloc.lock(l.h);
  if (p == nullptr) return false;
  fill(live_block{{p, l.size}, l.pattern, 0, 0});
  alloc.unlock(l.h);
  return true;
}
/// Whether a movable block still holds its pattern; a spilled one that cannot be brought back now
/// (nullptr from lock) stays spilled, intact by the rules, and is checked another time.
template <class A>
bool handle_intact(A& alloc, const live_handle& l) {
  void* p = alloc.lock(l.h);
  if (p == nullptr) return true;
  const bool kept = intact(live_block{{p, l.size}, l.pattern, 0, 0});
  alloc.unlock(l.h);
  return kept;
}
/// A bad handle: `deallocate` throws, `try_deallocate` refuses; the caller checks that nothing
/// changed.
template <class A>
void refuse_handle(A& alloc, alloy::handle bad) {
  bool threw = false;
  try {
    alloc.deallocate(bad);
  } catch (const alloy::logic_error&) {
    threw = true;
  }
  ALLOY_FUZZ_CHECK(threw);
  if constexpr (requires { alloc.try_deallocate(bad); }) ALLOY_FUZZ_CHECK(!alloc.try_deallocate(bad));
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

/// Tags, offload and failures of a virtual composition, against the model of each tag's state.
template <class A>
class tag_model {
 public:
  static constexpr bool enabled = requires(A& a) { a.offload(alloy::tag{1}); };
  /// A composition that plans its growth takes tag 0 only: a tagged request is never planned
  /// (`virtual_arena::allocate_or_plan`), and with three tags two requests in three would be.
  static constexpr std::uint16_t tags = alloy::growth_planning_allocator<A> ? 1 : 3;

  bool resident(std::uint16_t t) const { return state_[t] == alloy::tag_state::resident; }

  /// A check operation's tag work; the caller has checked every resident block's pattern.
  void apply(A& alloc, std::vector<live_block>& live, fault_injection& faults, const std::uint8_t* op) {
    const std::uint8_t arg = op[3];
    const alloy::tag t{static_cast<std::uint16_t>((arg >> 3) % tags)};
    const alloy::tag_state before = state_[t.value];
    switch (arg % 8) {
      case 1:    // offload: every byte kept on the host
      case 2: {  // discard: the bytes are gone
        const bool copy = arg % 8 == 1;
        const alloy::offload_status s = copy ? alloc.offload(t) : alloc.discard(t);
        if (before != alloy::tag_state::resident) {
          ALLOY_FUZZ_CHECK(s == alloy::offload_status::not_resident);
        } else if (s == alloy::offload_status::done) {
          state_[t.value] = copy ? alloy::tag_state::offloaded : alloy::tag_state::discarded;
        } else {
          ALLOY_FUZZ_CHECK(copy && s == alloy::offload_status::host_out_of_memory && faults.host_copy_fails);
        }
        break;
      }
      case 3: {  // restore: the same addresses, the same bytes when they were offloaded
        const alloy::offload_status s = alloc.restore(t);
        if (before == alloy::tag_state::resident) {
          ALLOY_FUZZ_CHECK(s == alloy::offload_status::already_resident);
        } else if (s == alloy::offload_status::done) {
          state_[t.value] = alloy::tag_state::resident;
          for (live_block& l : live) {
            if (l.tag != t.value) continue;
            if (before == alloy::tag_state::offloaded) {
              ALLOY_FUZZ_CHECK(intact(l));
            } else {
              fill(l);
            }
          }
        } else {
          ALLOY_FUZZ_CHECK(s == alloy::offload_status::device_out_of_memory || s == alloy::offload_status::map_failed);
        }
        break;
      }
      case 4: faults.host_copy_fails = !faults.host_copy_fails; break;
      case 5: {  // one call a few ahead fails, or every call from then on
        const std::size_t ahead = faults.vmm.calls() + op[1] % 8;
        const unsigned kinds = 1 + op[2] % 7;  // creates 1, maps 2, reserves 4
        fuzz_vmm::options o{.kinds = kinds};
        if (op[2] & 0x80) {
          o.fail_from = ahead;
        } else {
          o.fail_at = {ahead};
        }
        faults.vmm.set_options(std::move(o));
        break;
      }
      case 6: faults.vmm.set_options({}); break;
      default: break;
    }
    ALLOY_FUZZ_CHECK(alloc.state(t) == state_[t.value]);
  }

 private:
  alloy::tag_state state_[3] = {alloy::tag_state::resident, alloy::tag_state::resident, alloy::tag_state::resident};
};

/// Drives `alloc` with the operations of `data`; sizes below 2^exponents bytes.
template <class A, class Check>
void drive(A& alloc, const std::uint8_t* data, std::size_t size, fault_injection* faults, Check& check,
           std::size_t exponents) {
  constexpr bool streams = alloy::stream_ordered_allocator<A, inline_stream>;
  constexpr bool movable = alloy::movable_allocator<A>;
  using tags_type = tag_model<A>;
  tags_type tags;
  std::vector<live_block> live;
  std::vector<live_handle> handles;                 // live movable blocks
  std::vector<alloy::handle> freed_handles;         // recently freed handles (most recent last)
  std::map<std::uintptr_t, std::uintptr_t> ranges;  // start -> end of every live non-empty block
  std::vector<block> freed;                         // recently freed blocks, for double frees (most recent last)
  model_counts model;
  checking_upstream elsewhere;  // another allocator, whose block is foreign to `alloc`
  const block foreign = elsewhere.allocate(4096, 256);
  // Another movable allocator: its handles' ids name slots here too, but not blocks of `alloc`.
  alloy::compacting_defragmenter<alloy::best_fit_arena<checking_upstream>> other{
      alloy::best_fit_arena<checking_upstream>{elsewhere}};
  alloy::handle foreign_handles[4];
  if constexpr (movable) {
    for (alloy::handle& h : foreign_handles) h = other.allocate_movable(1000);
  }
  std::uint8_t next_pattern = 1;
  for (std::size_t at = 0; at + 4 <= size && live.size() + handles.size() < 512; at += 4) {
    const std::uint8_t op = data[at];
    const std::size_t exponent = data[at + 1] % exponents;
    const std::size_t bytes = (std::size_t{1} << exponent) + (data[at + 2] << exponent >> 8);
    const std::uint8_t arg = data[at + 3];
    const int stream = streams ? op >> 6 : 0;
    switch (op % 4) {
      case 0:
      case 1: {  // allocate
        if constexpr (movable) {
          if (op & 0x40) {  // a movable block
            const alloy::handle h = alloc.allocate_movable(bytes);
            if (!h) break;
            ALLOY_FUZZ_CHECK(alloc.size_of(h) == bytes);
            handles.push_back({h, bytes, next_pattern++});
            if (next_pattern == 0) next_pattern = 1;
            ALLOY_FUZZ_CHECK(fill_handle(alloc, handles.back()));  // a new block is resident
            model.bytes += bytes;
            ++model.blocks;
            ++model.allocations;
            break;
          }
        }
        const std::size_t alignment = std::size_t{1} << (arg % 13);
        block b;
        const auto tag = static_cast<std::uint16_t>(tags_type::enabled ? (op >> 2) % tags_type::tags : 0);
        if constexpr (streams) {
          const auto allocate = [&] {
            return (op & 0x20) ? alloc.allocate(bytes, alignment)
                               : alloc.allocate(bytes, alignment, inline_stream{stream});
          };
          if constexpr (tags_type::enabled) {  // stream_ordered takes the current tag only
            const alloy::scoped_tag current{alloc, alloy::tag{tag}};
            b = allocate();
          } else {
            b = allocate();
          }
        } else if constexpr (tags_type::enabled) {
          if (op & 0x20) {  // the current tag, and the first try of stream_ordered where there is one
            const alloy::scoped_tag current{alloc, alloy::tag{tag}};
            if constexpr (requires { alloc.allocate_keeping_cache(bytes, alignment); }) {
              b = alloc.allocate_keeping_cache(bytes, alignment);
            } else {
              b = alloc.allocate(bytes, alignment);
            }
          } else {
            b = alloc.allocate(bytes, alignment, alloy::tag{tag});
          }
        } else if constexpr (alloy::cache_serving_allocator<A>) {
          // from what the allocator holds only, on some ops (what a CUDA graph's capture gets)
          b = (op & 0x20) ? alloc.allocate_cached(bytes, alignment) : alloc.allocate(bytes, alignment);
        } else {
          b = alloc.allocate(bytes, alignment);
        }
        ALLOY_FUZZ_CHECK(!b || tags.resident(tag));  // an offloaded or discarded tag takes nothing
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
        live.push_back({b, next_pattern++, stream, tag});
        if (next_pattern == 0) next_pattern = 1;
        fill(live.back());
        model.bytes += b.size;
        ++model.blocks;
        ++model.allocations;
        break;
      }
      case 2: {  // free
        if constexpr (movable) {
          if ((op & 0x40) && !handles.empty()) {  // a movable block, checked (op & 0x20) or not
            const std::size_t victim = arg % handles.size();
            const live_handle l = handles[victim];
            ALLOY_FUZZ_CHECK(handle_intact(alloc, l));
            handles[victim] = handles.back();
            handles.pop_back();
            model.bytes -= l.size;
            --model.blocks;
            freed_handles.push_back(l.h);
            if (freed_handles.size() > 16) freed_handles.erase(freed_handles.begin());
            bool checked = false;
            if constexpr (requires { alloc.try_deallocate(l.h); }) {
              if (op & 0x20) {
                ALLOY_FUZZ_CHECK(alloc.try_deallocate(l.h));
                checked = true;
              }
            }
            if (!checked) alloc.deallocate(l.h);
            break;
          }
        }
        if (live.empty()) break;
        const std::size_t victim = arg % live.size();
        const live_block l = live[victim];
        ALLOY_FUZZ_CHECK(!tags.resident(l.tag) || intact(l));  // a block of an offloaded tag may be freed
        if constexpr (alloy::free_screening_allocator<A>)
          ALLOY_FUZZ_CHECK(alloc.free_misuse(l.b) == alloy::misuse::none);
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
        if constexpr (movable) {
          if ((op & 0x10) && (op & 0x40)) {  // a bad handle: refused, it must change nothing
            switch (arg % 4) {
              case 0:  // freed (its slot maybe reused since)
                if (!freed_handles.empty()) refuse_handle(alloc, freed_handles[(arg >> 2) % freed_handles.size()]);
                break;
              case 1: refuse_handle(alloc, foreign_handles[(arg >> 2) % 4]); break;
              case 2: {  // locked
                if (handles.empty()) break;
                const live_handle& l = handles[(arg >> 2) % handles.size()];
                if (alloc.lock(l.h) == nullptr) break;  // spilled, and no room to bring it back now
                refuse_handle(alloc, l.h);
                alloc.unlock(l.h);
                break;
              }
              default: refuse_handle(alloc, alloy::handle{}); break;
            }
            break;  // checked below, as after every operation
          }
        }
        if (op & 0x10) {  // a bad free: refused, it must change nothing
          block bad{};
          switch (arg % 4) {
            case 0: {  // double free of a recently freed block, unless its address is a live block's again
              if (freed.empty() || !handles.empty()) break;  // (a movable block's place is not known here)
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
          if constexpr (alloy::free_screening_allocator<A>)
            ALLOY_FUZZ_CHECK(alloc.free_misuse(bad) != alloy::misuse::none);
          if constexpr (streams) {
            alloc.deallocate(bad, inline_stream{stream});
          } else {
            alloc.deallocate(bad);
          }
          break;  // checked below, as after every operation
        }
        // Every resident block still holds its pattern; sometimes release the cache; the tags.
        for (const live_block& l : live) ALLOY_FUZZ_CHECK(!tags.resident(l.tag) || intact(l));
        if constexpr (movable) {
          for (const live_handle& l : handles) ALLOY_FUZZ_CHECK(handle_intact(alloc, l));
        }
        if constexpr (alloy::releasing_allocator<A>) {
          if (arg % 8 == 0) alloc.release();
        }
        if constexpr (tags_type::enabled) tags.apply(alloc, live, *faults, data + at);
        break;
    }
    const bool full = (at / 4) % 64 == 63;
    check_counts(alloc, model, full);
    check(alloc, full);
  }
  for (const live_block& l : live) {
    ALLOY_FUZZ_CHECK(!tags.resident(l.tag) || intact(l));
    alloc.deallocate(l.b);
  }
  if constexpr (movable) {
    for (const live_handle& l : handles) {
      ALLOY_FUZZ_CHECK(handle_intact(alloc, l));
      alloc.deallocate(l.h);
    }
    for (alloy::handle h : foreign_handles)
      if (h) other.deallocate(h);
  }
  model = {0, 0, model.allocations};
  check_counts(alloc, model, true);
  check(alloc, true);
  elsewhere.deallocate(foreign);
}

template <class A, class Check>
void run(A&& alloc, const std::uint8_t* data, std::size_t size, Check&& check) {
  drive(alloc, data, size, nullptr, check, 23);  // below 8 MiB
}

constexpr auto no_check = [](auto&, bool) {};
constexpr auto arena_check = [](auto& a, bool full) {
  if (full) ALLOY_FUZZ_CHECK(alloy::find<alloy::best_fit_arena>(a).check_invariants());
};
/// Calls `visit` with each virtual_arena of a composition (`virtual_allocator` has no `parts()`:
/// its `arena()`; `granule_segregator` its two parts).
template <class A, class Visit>
void for_each_virtual_arena(const A& a, Visit&& visit) {
  if constexpr (requires { a.arena(); }) {
    visit(a.arena());
  } else if constexpr (requires { a.inner(); }) {
    for_each_virtual_arena(a.inner(), visit);
  } else if constexpr (requires { a.small_part(); }) {
    visit(a.small_part());
    visit(a.large_part());
  } else {
    visit(a);
  }
}
template <class A>
std::size_t mapped_bytes_of(const A& a) {
  std::size_t mapped = 0;
  for_each_virtual_arena(a, [&](const auto& arena) { mapped += arena.mapped_bytes(); });
  return mapped;
}

/// The arenas' books, and the backend's physical bytes against their mapped bytes (no plan is
/// ever pending here), after every operation.
constexpr auto virtual_check = [](const auto& a, bool full) {
  std::size_t physical = 0, capacity = 0;
  for_each_virtual_arena(a, [&](const auto& arena) {
    physical = arena.vmm().physical_bytes();  // one backend
    capacity = arena.vmm().capacity();
    if (full) ALLOY_FUZZ_CHECK(arena.check_invariants());
  });
  ALLOY_FUZZ_CHECK(physical == mapped_bytes_of(a));
  ALLOY_FUZZ_CHECK(physical <= capacity);
};

/// A virtual composition over a small host_vmm whose calls fail as the input says: after
/// everything is freed and released nothing is mapped, and once it is gone nothing is reserved.
/// 48 granules of 16 KiB (by default) and requests below 512 KiB: the device runs short often, and
/// the maps (system calls) and offload copies stay few and small, so a run stays fast.
template <class Make>
void run_virtual(const std::uint8_t* data, std::size_t size, Make&& make, std::size_t capacity = 768_KiB) {
  alloy::host_vmm backend{{.capacity = capacity, .granularity = 16_KiB}};
  fault_injection faults{fuzz_vmm{alloy::vmm_ref<alloy::host_vmm>{backend}}};
  {
    auto alloc = make(faults);
    drive(alloc, data, size, &faults, virtual_check, 19);  // below 512 KiB
    faults.vmm.set_options({});
    if (size % 2 == 1)
      for (std::uint16_t t = 0; t < tag_model<decltype(alloc)>::tags; ++t) (void)alloc.restore(alloy::tag{t});
    alloc.release();
    ALLOY_FUZZ_CHECK(mapped_bytes_of(alloc) == 0);
    ALLOY_FUZZ_CHECK(backend.physical_bytes() == 0);
  }
  ALLOY_FUZZ_CHECK(backend.physical_bytes() == 0);
  ALLOY_FUZZ_CHECK(backend.calls().reserves == backend.calls().unreserves);
  ALLOY_FUZZ_CHECK(backend.calls().creates == backend.calls().releases);
}

template <class Options>
Options with_fault_injection(Options o, fault_injection& faults) {
  o.host_allocate = &fault_injection::host_allocate;
  o.host_deallocate = &fault_injection::host_deallocate;
  o.host_context = &faults;
  return o;
}

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
    using virtual_arena = alloy::virtual_arena<fuzz_vmm>;
    using virtual_allocator = alloy::virtual_allocator<fuzz_vmm>;
    using movable_stack = alloy::host_spill_reclaimer<alloy::compacting_defragmenter<arena>, checking_upstream>;
    const auto make_stack = [&] {
      return movable_stack{alloy::compacting_defragmenter<arena>{arena{up, {.maximum_size = 16_MiB}}}, up};
    };
    switch (data[0] % 14) {
      case 0: run(arena{up, {.growth_size = 64_KiB, .max_growth_size = 1_MiB}}, ops, n, arena_check); break;
      case 1:
        run(arena{up, {.initial_size = 4_MiB, .maximum_size = 4_MiB, .max_split_size = 256_KiB}}, ops, n, arena_check);
        break;
      case 2: run(pool{up}, ops, n, no_check); break;
      case 3: run(alloy::stats<heap>{heap{pool{up}, arena{up}}}, ops, n, arena_check); break;
      case 4:
        run(alloy::stream_ordered<arena, inline_stream>{arena{up, {.maximum_size = 8_MiB}}}, ops, n, arena_check);
        break;
      case 5:
        run(
            alloy::limited<alloy::stream_ordered<heap, inline_stream>>{
                alloy::stream_ordered<heap, inline_stream>{heap{pool{up}, arena{up}}}, {.bytes_limit = 6_MiB}},
            ops, n, arena_check);
        break;
      case 6:  // the default release rule: a least-recently-freed list, trims at frees and allocations
        run_virtual(ops, n, [](fault_injection& f) {
          return virtual_arena{f.vmm, with_fault_injection(virtual_arena::options{.address_space = 2_MiB}, f)};
        });
        break;
      case 7:  // block-sized pieces, nothing released until the device runs short
        run_virtual(ops, n, [](fault_injection& f) {
          return virtual_arena{f.vmm,
                               with_fault_injection(virtual_arena::options{.address_space = 2_MiB,
                                                                           .release_threshold = virtual_arena::keep_all,
                                                                           .block_sized_pieces = true},
                                                    f)};
        });
        break;
      case 8:  // stream-ordered reuse over block-sized pieces: allocate_keeping_cache, then allocate
        run_virtual(ops, n, [](fault_injection& f) {
          return alloy::stream_ordered<virtual_arena, inline_stream>{virtual_arena{
              f.vmm, with_fault_injection(virtual_arena::options{.address_space = 2_MiB,
                                                                 .release_threshold = virtual_arena::keep_all,
                                                                 .block_sized_pieces = true},
                                          f)}};
        });
        break;
      case 9:  // two arenas, small blocks apart unless that costs a granule, free granules kept by one rule
        run_virtual(ops, n, [](fault_injection& f) {
          const auto o = with_fault_injection(virtual_arena::options{.address_space = 2_MiB}, f);
          return alloy::granule_segregator<16_KiB, virtual_arena, virtual_arena>{virtual_arena{f.vmm, o},
                                                                                 virtual_arena{f.vmm, o}};
        });
        break;
      case 10:  // the showcase composition, counted
        run_virtual(ops, n, [](fault_injection& f) {
          virtual_allocator::options o;
          o.arena = with_fault_injection(o.arena, f);
          o.arena.address_space = 2_MiB;
          return alloy::stats<virtual_allocator>{virtual_allocator{f.vmm, o}};
        });
        break;
      case 12: run(alloy::stats<movable_stack>{make_stack()}, ops, n, arena_check); break;
      case 13: run(alloy::limited<movable_stack>{make_stack(), {.bytes_limit = 12_MiB}}, ops, n, arena_check); break;
      default:  // the showcase composition under synchronized, its large requests' growths planned;
                // frontier growth 1/1 on 512 granules, so that granules go ahead while up to 32 are held
        run_virtual(
            ops, n,
            [](fault_injection& f) {
              using planning_allocator = alloy::virtual_allocator<planning_vmm>;
              static_assert(alloy::growth_planning_allocator<planning_allocator>);
              f.locked.emplace(f.vmm);
              planning_allocator::options o;
              o.arena = with_fault_injection(o.arena, f);
              o.arena.address_space = 2_MiB;
              o.arena.frontier_growth_divisor = 1;
              return alloy::synchronized<planning_allocator>{planning_allocator{planning_vmm{*f.locked}, o}};
            },
            8_MiB);
        break;
    }
  }
  ALLOY_FUZZ_CHECK(records->live_count() == 0);
  ALLOY_FUZZ_CHECK(records->errors.empty());
  return 0;
}
