// SPDX-License-Identifier: Apache-2.0
// alloy/tag.hpp: tags on allocations, for pointer-stable offload (docs/design.md#offload).
//
// A tag names a group of allocations (model weights, a KV cache, ...) that `virtual_arena` can
// send to host memory and bring back at the same addresses (`offload`, `discard`, `restore`).
// Every allocation carries one: given per call (`allocate(bytes, alignment, tag)`) or taken
// from the allocator's current tag, which `scoped_tag` sets for a scope, so that code that knows
// nothing of tags (Thrust, std::pmr containers) is tagged from outside.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>

namespace alloy {

/// A small integer naming a group of allocations; tag{0} is the default.
struct tag {
  std::uint16_t value = 0;
  friend constexpr bool operator==(tag, tag) noexcept = default;
};

/// Where the memory of a tag is.
enum class tag_state : std::uint8_t {
  resident,   ///< mapped; allocations with the tag are served
  offloaded,  ///< copied to host memory and unmapped; `restore` brings it back
  discarded,  ///< unmapped without a copy; `restore` maps it again (content unspecified)
};

/// What `offload`, `discard` and `restore` did. Anything but `done` changed nothing.
enum class offload_status : std::uint8_t {
  done,
  not_resident,          ///< offload/discard of a tag already offloaded or discarded
  already_resident,      ///< restore of a tag that is resident
  host_out_of_memory,    ///< the host copy (or host metadata) could not be allocated: the tag stays resident, intact
  device_out_of_memory,  ///< restore: not enough physical memory (nothing half-mapped; retry later)
  map_failed,            ///< restore: a backend map failed (everything undone; retry later)
  copy_failed,  ///< the copy engine failed (offload: tag stays resident; restore: nothing mapped, host copy kept)
};

inline const char* to_string(tag_state s) noexcept {
  switch (s) {
    case tag_state::resident: return "resident";
    case tag_state::offloaded: return "offloaded";
    case tag_state::discarded: return "discarded";
  }
  return "?";
}

inline const char* to_string(offload_status s) noexcept {
  switch (s) {
    case offload_status::done: return "done";
    case offload_status::not_resident: return "not_resident";
    case offload_status::already_resident: return "already_resident";
    case offload_status::host_out_of_memory: return "host_out_of_memory";
    case offload_status::device_out_of_memory: return "device_out_of_memory";
    case offload_status::map_failed: return "map_failed";
    case offload_status::copy_failed: return "copy_failed";
  }
  return "?";
}

/// Counts of the offload machinery (LMS names: a *single* reclaim frees one tag, a *full*
/// reclaim every tag, as `offload_all`).
struct offload_statistics {
  std::size_t bytes_reclaimed = 0;      ///< physical bytes unmapped by offload/discard, in total
  std::size_t num_single_reclaims = 0;  ///< offload or discard of one tag
  std::size_t num_full_reclaims = 0;    ///< offload_all calls that reclaimed something
  std::size_t bytes_on_host = 0;        ///< now, in host copies of offloaded tags
  std::size_t bytes_copied_to_host = 0;
  std::size_t bytes_copied_back = 0;
  std::size_t num_offloads = 0;
  std::size_t num_discards = 0;
  std::size_t num_restores = 0;
  std::size_t num_refused_allocations = 0;  ///< allocations with an offloaded or discarded tag

  /// Adds another part's counts (a `sharded` allocator reports the sum of its shards').
  offload_statistics& operator+=(const offload_statistics& o) noexcept {
    bytes_reclaimed += o.bytes_reclaimed;
    num_single_reclaims += o.num_single_reclaims;
    num_full_reclaims += o.num_full_reclaims;
    bytes_on_host += o.bytes_on_host;
    bytes_copied_to_host += o.bytes_copied_to_host;
    bytes_copied_back += o.bytes_copied_back;
    num_offloads += o.num_offloads;
    num_discards += o.num_discards;
    num_restores += o.num_restores;
    num_refused_allocations += o.num_refused_allocations;
    return *this;
  }
  friend bool operator==(const offload_statistics&, const offload_statistics&) = default;
};

/// An allocator with a current tag (`current_tag()`, `set_current_tag(tag)`): what `scoped_tag`
/// needs. Every wrapper of such an allocator has it too (detail/forwarding.hpp).
template <class A>
concept tag_holding = requires(A& a, const A& c, tag t) {
  { c.current_tag() } noexcept -> std::same_as<tag>;
  { a.set_current_tag(t) } noexcept;
};

/// Sets `alloc`'s current tag for a scope and puts the previous one back at its end:
/// `scoped_tag guard{alloc, tag{1}};`. `Alloc` is any `tag_holding` allocator: a `virtual_arena`,
/// a `virtual_allocator`, or any wrapper of one (`synchronized`, `stats`, `ref`, `sharded`, ...),
/// whose `set_current_tag` reaches the part that allocates. The guard is not a lock: under
/// `synchronized` another thread's plain allocations are tagged too while it lives.
template <tag_holding Alloc>
class scoped_tag {
 public:
  scoped_tag(Alloc& alloc, tag t) noexcept : alloc_(alloc), previous_(alloc.current_tag()) {
    alloc_.set_current_tag(t);
  }
  ~scoped_tag() { alloc_.set_current_tag(previous_); }
  scoped_tag(const scoped_tag&) = delete;
  scoped_tag& operator=(const scoped_tag&) = delete;

 private:
  Alloc& alloc_;
  tag previous_;
};

}  // namespace alloy
