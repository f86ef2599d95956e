// SPDX-License-Identifier: Apache-2.0
// alloy/detail/movable_bookkeeping.hpp: what the policies that keep movable blocks over a part
// below (compacting_defragmenter, host_spill_reclaimer) do the same way: the counters a lock and
// an unlock move, the handle calls refused for their lock state, the requests served only after
// making room, introspection that shows movable pieces as active or inactive, and the addresses
// of the resident movable blocks, by which a raw free of one is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include <alloy/concepts.hpp>
#include <alloy/detail/address_table.hpp>
#include <alloy/error.hpp>
#include <alloy/misuse.hpp>
#include <alloy/movable/counters.hpp>

namespace alloy::detail {

/// A resident movable block's first lock: its bytes go from inactive to active.
inline void note_locked(movable_counters& c, std::size_t bytes) noexcept {
  c.bytes_inactive -= bytes;
  note_active(c, bytes);
}

/// Its last unlock: from active back to inactive.
inline void note_unlocked(movable_counters& c, std::size_t bytes) noexcept {
  c.bytes_active -= bytes;
  c.bytes_inactive += bytes;
}

/// `unlock` of a handle that holds no lock is a logic error.
inline void check_locked(std::uint32_t locks, handle h, alloy::source_location at = alloy::source_location::current()) {
  if (locks == 0) throw logic_error("unlock of a handle that is not locked (id " + std::to_string(h.id) + ")", at);
}

/// `deallocate` of a locked handle is a logic error (its address is in use).
inline void check_unlocked(std::uint32_t locks, handle h,
                           alloy::source_location at = alloy::source_location::current()) {
  if (locks > 0) throw logic_error("deallocate of a locked handle (id " + std::to_string(h.id) + ")", at);
}

/// Requests served only after the policy made room (a defragmentation, a reclaim). The part
/// below failed them first and counted OOMs; `adjust` reports each request as one call, so
/// that those failures are retries (`num_alloc_retries`), not OOMs.
class rescue_tally {
 public:
  /// Runs `attempt` (make room, retry) after `part` failed a request, noting the OOMs `part`
  /// counts meanwhile and, when it succeeds, the failure that started it.
  template <class Part, class Attempt>
  auto rescue(const Part& part, Attempt&& attempt) noexcept -> decltype(attempt()) {
    const std::size_t before = ooms_of(part);
    auto served = attempt();
    absorbed_ooms_ += ooms_of(part) - before;
    if (served) {
      ++absorbed_ooms_;
      ++rescued_;
    }
    return served;
  }

  /// `part`'s counters as if each request were one call.
  allocator_counters adjust(allocator_counters c) const noexcept {
    c.num_ooms -= absorbed_ooms_;
    c.num_alloc_retries += rescued_;
    return c;
  }

 private:
  template <class Part>
  static std::size_t ooms_of(const Part& part) noexcept {
    if constexpr (counting_allocator<Part>) {
      return part.counters().num_ooms;
    } else {
      (void)part;
      return 0;
    }
  }

  std::size_t absorbed_ooms_ = 0;  // OOMs of the part below that were not failures of a request
  std::size_t rescued_ = 0;        // requests served after making room
};

/// Calls `visit` for every piece of `part`, with the pieces that hold a movable block reported
/// `active` (locked) or `inactive` (unlocked) instead of `allocated`. `each_movable(note)` calls
/// `note(address, locked)` for every movable block resident in `part`.
template <class Part, class EachMovable, class F>
void for_each_block_showing_movable(const Part& part, EachMovable&& each_movable, F&& visit) {
  std::unordered_map<const void*, bool> movable;  // address -> locked
  each_movable([&](const void* address, bool locked) { movable.emplace(address, locked); });
  part.for_each_block([&](const block_info& info) {
    if (info.state == block_state::allocated) {
      if (const auto found = movable.find(info.ptr); found != movable.end()) {
        block_info shown = info;
        shown.state = found->second ? block_state::active : block_state::inactive;
        visit(shown);
        return;
      }
    }
    visit(info);
  });
}

/// The addresses of a policy's resident movable blocks. The part below sees each as a live raw
/// block, so without this a raw free of one (a pointer the caller got from `lock`, never as a raw
/// block) would free the memory under its handle.
using movable_addresses = address_table<>;

/// Whether a raw free of `b` must be refused because a movable block lies at its address; the
/// refusal is counted in `counts` and passed to `opts.on_misuse` (as a foreign pointer: the caller
/// was never handed it raw).
template <class Options>
bool refuse_movable_address(const movable_addresses& addresses, misuse_counts& counts, block b, const Options& opts,
                            const char* who) noexcept {
  if (b.ptr == nullptr || !addresses.contains(b.ptr)) return false;
  report_misuse(counts, misuse::foreign_pointer, b, opts.on_misuse, opts.misuse_context, who);
  return true;
}

}  // namespace alloy::detail
