// SPDX-License-Identifier: Apache-2.0
// tools/replay/compositions.hpp: the allocators alloy-replay knows by name, each over the
// simulated device, and the replay targets that adapt them to the replay loop.
//
//   best_fit_arena           alloy::best_fit_arena, default options
//   best_fit_arena+defrag    the same under compacting_defragmenter; every request a movable
//                            block, never locked (replay never touches memory), so any may move
//   pool1M+arena             segregator<1 MiB, size_class_pool (2 MiB slabs), best_fit_arena>
//                            (the example heap of docs/design.md#building-blocks)
//   default_allocator        alloy::default_allocator (showcase.hpp)
//   default_allocator+defrag its parts, requests above its threshold (64 KiB) movable blocks of a
//                            best_fit_arena under compacting_defragmenter (routed here: a
//                            segregator passes movable calls on only when both sides have them)
//   caching_allocator        alloy::caching_allocator, PyTorch's layout (showcase.hpp)
//   whole_device_arena       best_fit_arena with the whole device as its one segment from the
//                            start (initial_size = maximum_size = capacity; only with a capacity,
//                            and only when named: it reserves the whole device by design)
//   whole_device_arena+defrag the same under compacting_defragmenter, every request movable
//   virtual_arena            alloy::virtual_arena, default options, over the simulated device with
//                            virtual memory (2 MiB granules; simulated_vm.hpp)
//   virtual_allocator        alloy::virtual_allocator (showcase.hpp), over the same
//   virtual_arena_pair       alloy::granule_segregator<256 KiB> of two virtual_arenas (default
//                            options) over the same device: small blocks apart unless that costs
//                            a granule
//   std_pmr_pool             std::pmr::unsynchronized_pool_resource, largest_required_pool_block
//                            1 MiB, other options default
//   thrust_pool              thrust::mr::unsynchronized_pool_resource, alignment 256,
//                            largest_block_size 1 MiB (built when Thrust is found)
//   thrust_disjoint_pool     thrust::mr::disjoint_unsynchronized_pool_resource, same options,
//                            bookkeeping from new/delete (built when Thrust is found)
//   Both thrust pools see a request below the alignment as one of the alignment (their small
//   blocks lie end to end in a bucket: a 4-byte block at 256 would be 16-byte aligned), and the
//   non-disjoint one sizes rounded up to a multiple of 8 (it writes a descriptor of pointers
//   right after an oversized block: misaligned, undefined behaviour, after other sizes);
//   `thrust_pool_target::as_seen`.
//
// Every request asks for `replay_options::alignment` (the movable blocks of the +defrag ones are
// always 256-aligned: `alloy::movable_alignment`). The peers' failures are the `std::bad_alloc`
// the device's resource throws when refused. Targets with fixed addresses say where a token's
// block is (`address`), so that the replay checks every answer (replay.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory_resource>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <alloy/literals.hpp>
#include <alloy/movable.hpp>
#include <alloy/policy/best_fit_arena.hpp>
#include <alloy/policy/compacting_defragmenter.hpp>
#include <alloy/policy/granule_segregator.hpp>
#include <alloy/policy/segregator.hpp>
#include <alloy/policy/size_class_pool.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/showcase.hpp>

#if defined(THRUST_DEVICE_SYSTEM)  // the project's Thrust host-backend target is linked
#  include <thrust/mr/disjoint_pool.h>
#  include <thrust/mr/memory_resource.h>
#  include <thrust/mr/new.h>
#  include <thrust/mr/pool.h>
#  define ALLOY_REPLAY_HAS_THRUST 1
#else
#  define ALLOY_REPLAY_HAS_THRUST 0
#endif

#include "replay/replay.hpp"
#include "replay/simulated_device.hpp"
#include "replay/simulated_vm.hpp"

namespace alloy::replay {

// ---- the alloy compositions, by type (the round-trip test builds the same ones) --------------

using upstream_t = device_upstream;
using arena_t = best_fit_arena<upstream_t>;
using arena_defrag_t = compacting_defragmenter<arena_t>;
using pool1m_arena_t = segregator<(std::size_t{1} << 20), size_class_pool<upstream_t>, arena_t>;
using default_t = default_allocator<upstream_t>;
using caching_t = caching_allocator<upstream_t>;
using default_small_t = std::remove_cvref_t<decltype(std::declval<default_t&>().small())>;
using vm_t = simulated_vm_device::backend;
using virtual_arena_t = virtual_arena<vm_t>;
using virtual_allocator_t = virtual_allocator<vm_t>;
using virtual_arena_pair_t = granule_segregator<(std::size_t{256} << 10), virtual_arena_t, virtual_arena_t>;

inline arena_t make_arena(upstream_t u) { return arena_t{u}; }
inline arena_defrag_t make_arena_defrag(upstream_t u) { return arena_defrag_t{arena_t{u}}; }
inline pool1m_arena_t make_pool1m_arena(upstream_t u) {
  return pool1m_arena_t{size_class_pool<upstream_t>{u}, arena_t{u}};
}
inline default_t make_default(upstream_t u) { return default_t{u}; }
inline caching_t make_caching(upstream_t u) { return caching_t{u}; }
/// An arena that takes the whole device as one segment at construction and never grows: what a
/// defragmenter needs to open any hole (it cannot merge separate segments).
inline arena_t make_whole_device_arena(upstream_t u, std::size_t capacity) {
  const std::size_t size = capacity / 256 * 256;
  return arena_t{u, {.initial_size = size, .maximum_size = size}};
}

// ---- replay targets ------------------------------------------------------------------------------

/// An alloy allocator, raw blocks.
template <class A>
class raw_target {
 public:
  using token = block;
  raw_target(A a, std::size_t alignment) : a_(std::move(a)), alignment_(alignment) {}
  token allocate(std::size_t bytes) noexcept { return a_.allocate(bytes, alignment_); }
  void deallocate(token b, std::size_t) noexcept { a_.deallocate(b); }
  static const void* address(const token& b) noexcept { return b.ptr; }
  std::size_t bytes_moved() const noexcept { return 0; }
  A& allocator() noexcept { return a_; }

 private:
  A a_;
  std::size_t alignment_;
};

/// A movable allocator: every request a movable block, never locked.
template <class A>
class movable_target {
 public:
  using token = handle;
  explicit movable_target(A a) : a_(std::move(a)) {}
  token allocate(std::size_t bytes) noexcept { return a_.allocate_movable(bytes); }
  void deallocate(token h, std::size_t) { a_.deallocate(h); }
  std::size_t bytes_moved() const noexcept { return a_.movable_statistics().bytes_defragged; }

 private:
  A a_;
};

/// Requests up to `Threshold` as raw blocks of `Small`, larger ones as movable blocks of `Large`.
template <std::size_t Threshold, class Small, class Large>
class split_movable_target {
 public:
  struct token {
    block raw;
    handle movable;
    explicit operator bool() const noexcept { return static_cast<bool>(raw) || static_cast<bool>(movable); }
  };
  split_movable_target(Small small, Large large, std::size_t alignment)
      : small_(std::move(small)), large_(std::move(large)), alignment_(alignment) {}
  static const void* address(const token& t) noexcept { return t.raw.ptr; }  // movable ones: none
  token allocate(std::size_t bytes) noexcept {
    if (bytes <= Threshold) return {small_.allocate(bytes, alignment_), {}};
    return {{}, large_.allocate_movable(bytes)};
  }
  void deallocate(token t, std::size_t) {
    if (t.raw) {
      small_.deallocate(t.raw);
    } else {
      large_.deallocate(t.movable);
    }
  }
  std::size_t bytes_moved() const noexcept { return large_.movable_statistics().bytes_defragged; }

 private:
  Small small_;
  Large large_;
  std::size_t alignment_;
};

/// A `std::pmr` pool over the device (it must not move: the pool points at its upstream).
class pmr_pool_target {
 public:
  using token = void*;
  pmr_pool_target(simulated_device& device, std::pmr::pool_options options, std::size_t alignment)
      : upstream_(device), pool_(options, &upstream_), alignment_(alignment) {}
  pmr_pool_target(const pmr_pool_target&) = delete;
  pmr_pool_target& operator=(const pmr_pool_target&) = delete;
  token allocate(std::size_t bytes) noexcept {
    try {
      return pool_.allocate(bytes, alignment_);
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
  }
  void deallocate(token p, std::size_t bytes) noexcept { pool_.deallocate(p, bytes, alignment_); }
  static const void* address(token p) noexcept { return p; }
  std::size_t bytes_moved() const noexcept { return 0; }

 private:
  device_pmr_resource upstream_;
  std::pmr::unsynchronized_pool_resource pool_;
  std::size_t alignment_;
};

#if ALLOY_REPLAY_HAS_THRUST
/// The device as a `thrust::mr::memory_resource<>` (throws `std::bad_alloc` when refused).
class device_thrust_resource final : public thrust::mr::memory_resource<> {
 public:
  explicit device_thrust_resource(simulated_device& device) noexcept : device_(&device) {}
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    void* p = device_->allocate(bytes, alignment);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) override { device_->deallocate(p, bytes); }

 private:
  simulated_device* device_;
};

/// A thrust::mr pool over the device (it must not move: the pool points at its upstream).
template <bool Disjoint>
class thrust_pool_target {
  using pool_t = std::conditional_t<
      Disjoint,
      thrust::mr::disjoint_unsynchronized_pool_resource<device_thrust_resource, thrust::mr::new_delete_resource>,
      thrust::mr::unsynchronized_pool_resource<device_thrust_resource>>;

 public:
  using token = void*;
  thrust_pool_target(simulated_device& device, std::size_t alignment)
      : upstream_(device), pool_(make_pool(alignment)), alignment_(alignment) {}
  thrust_pool_target(const thrust_pool_target&) = delete;
  thrust_pool_target& operator=(const thrust_pool_target&) = delete;
  token allocate(std::size_t bytes) noexcept {
    try {
      return pool_.allocate(as_seen(bytes), alignment_);
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
  }
  void deallocate(token p, std::size_t bytes) noexcept { pool_.deallocate(p, as_seen(bytes), alignment_); }
  static const void* address(token p) noexcept { return p; }
  std::size_t bytes_moved() const noexcept { return 0; }

  /// Why a request is not handed to the pool at all (the replay counts it as the pool's fault),
  /// or null. The non-disjoint pool asks its upstream for `bytes + sizeof(descriptor)` and writes
  /// the descriptor at `block + bytes`: within a descriptor of SIZE_MAX the sum wraps, the
  /// upstream serves a few bytes and the pool writes before them (it once "served" 2^64 - 6
  /// bytes that way). Asking would corrupt the replay itself.
  const char* cannot_ask(std::size_t bytes) const noexcept {
    if (!Disjoint && bytes > SIZE_MAX - 4096)
      return "not asked: thrust::mr's pool would compute the size plus its descriptor, which wraps for this size, "
             "and write outside the block it gets";
    return nullptr;
  }

  /// The size the pool is asked for. (1) Both pools serve a small request from a bucket of
  /// blocks of its rounded size laid end to end, so a block smaller than the alignment asked for
  /// is not aligned to it (4 bytes at 256: 16-byte aligned): requests below the alignment are
  /// asked for as the alignment. (2) The non-disjoint pool stores a descriptor of pointers right
  /// after an oversized block, so a size that is not a multiple of 8 would make it write
  /// misaligned (undefined behaviour; UBSan reports it): sizes are rounded up to 8. Sizes within
  /// 8 of SIZE_MAX are passed on as they are (and the answer checked).
  std::size_t as_seen(std::size_t bytes) const noexcept {
    if (bytes < alignment_) return alignment_;
    if constexpr (Disjoint) {
      return bytes;  // bookkeeping on the host: nothing written into the block
    } else {
      return bytes > SIZE_MAX - 7 ? bytes : (bytes + 7) & ~std::size_t{7};
    }
  }

 private:
  pool_t make_pool(std::size_t alignment) {
    auto opts = pool_t::get_default_options();
    opts.alignment = alignment;
    opts.largest_block_size = std::size_t{1} << 20;
    if constexpr (Disjoint) {
      return pool_t{&upstream_, &bookkeeper_, opts};
    } else {
      return pool_t{&upstream_, opts};
    }
  }

  device_thrust_resource upstream_;
  thrust::mr::new_delete_resource bookkeeper_;
  pool_t pool_;
  std::size_t alignment_;
};
#endif

// ---- the registry ----------------------------------------------------------------------------------

struct composition {
  std::string name;
  std::string description;
  bool peer = false;            ///< not alloy: a pool of std::pmr or thrust::mr
  bool needs_capacity = false;  ///< only with a device of finite capacity; chosen by name only
  bool virtual_memory = false;  ///< runs on the virtual-memory device (granules of 2 MiB)
  std::function<replay_result(const bench::rmm_trace&, devices&, const replay_options&)> run;
};

namespace detail {
/// A composition over the device of segments.
template <class Make>
composition entry(std::string name, std::string description, bool peer, Make make, bool needs_capacity = false) {
  composition c{name, std::move(description), peer, needs_capacity, false, {}};
  c.run = [name, make](const bench::rmm_trace& t, devices& d, const replay_options& o) {
    return replay(t, d.segments, [&] { return make(d.segments, o); }, o, name);
  };
  return c;
}
/// A composition over the virtual-memory device.
template <class Make>
composition vm_entry(std::string name, std::string description, Make make) {
  composition c{name, std::move(description), false, false, true, {}};
  c.run = [name, make](const bench::rmm_trace& t, devices& d, const replay_options& o) {
    return replay(t, d.vm, [&] { return make(d.vm, o); }, o, name);
  };
  return c;
}
}  // namespace detail

/// Every composition alloy-replay knows, in the order the reports list them.
inline std::vector<composition> compositions() {
  using detail::entry;
  std::vector<composition> all;
  all.push_back(entry("best_fit_arena", "alloy::best_fit_arena, default options", false,
                      [](simulated_device& d, const replay_options& o) {
                        return raw_target<arena_t>{make_arena(upstream_t{d}), o.alignment};
                      }));
  all.push_back(entry("best_fit_arena+defrag", "compacting_defragmenter<best_fit_arena>, every request a movable block",
                      false, [](simulated_device& d, const replay_options&) {
                        return movable_target<arena_defrag_t>{make_arena_defrag(upstream_t{d})};
                      }));
  all.push_back(entry("pool1M+arena", "segregator<1 MiB, size_class_pool (2 MiB slabs), best_fit_arena>", false,
                      [](simulated_device& d, const replay_options& o) {
                        return raw_target<pool1m_arena_t>{make_pool1m_arena(upstream_t{d}), o.alignment};
                      }));
  all.push_back(entry("default_allocator", "alloy::default_allocator (pool up to 64 KiB, best_fit_arena above)", false,
                      [](simulated_device& d, const replay_options& o) {
                        return raw_target<default_t>{make_default(upstream_t{d}), o.alignment};
                      }));
  all.push_back(entry("default_allocator+defrag",
                      "default_allocator's pool up to 64 KiB, above it movable blocks of a defragmented best_fit_arena",
                      false, [](simulated_device& d, const replay_options& o) {
                        const upstream_t u{d};
                        return split_movable_target<default_t::threshold, default_small_t, arena_defrag_t>{
                            default_small_t{u, default_t::options{}.small}, make_arena_defrag(u), o.alignment};
                      }));
  all.push_back(entry("caching_allocator", "alloy::caching_allocator (PyTorch's layout)", false,
                      [](simulated_device& d, const replay_options& o) {
                        return raw_target<caching_t>{make_caching(upstream_t{d}), o.alignment};
                      }));
  all.push_back(entry(
      "whole_device_arena", "best_fit_arena holding the whole device from the start (needs --capacity)", false,
      [](simulated_device& d, const replay_options& o) {
        return raw_target<arena_t>{make_whole_device_arena(upstream_t{d}, o.capacity), o.alignment};
      },
      true));
  all.push_back(entry(
      "whole_device_arena+defrag", "the same under compacting_defragmenter, every request a movable block", false,
      [](simulated_device& d, const replay_options& o) {
        return movable_target<arena_defrag_t>{arena_defrag_t{make_whole_device_arena(upstream_t{d}, o.capacity)}};
      },
      true));
  all.push_back(detail::vm_entry("virtual_arena",
                                 "alloy::virtual_arena (default options) on virtual memory, 2 MiB granules",
                                 [](simulated_vm_device& d, const replay_options& o) {
                                   return raw_target<virtual_arena_t>{virtual_arena_t{vm_t{d}}, o.alignment};
                                 }));
  all.push_back(
      detail::vm_entry("virtual_allocator",
                       "alloy::virtual_allocator (pool up to 128 KiB with slabs from the virtual arena, the arena "
                       "above) on virtual memory, 2 MiB granules",
                       [](simulated_vm_device& d, const replay_options& o) {
                         return raw_target<virtual_allocator_t>{virtual_allocator_t{vm_t{d}}, o.alignment};
                       }));
  all.push_back(detail::vm_entry(
      "virtual_arena_pair",
      "alloy::granule_segregator<256 KiB> of two virtual_arenas (default options): small blocks in one of their "
      "own unless that adds a granule the other would not, on virtual memory, 2 MiB granules",
      [](simulated_vm_device& d, const replay_options& o) {
        return raw_target<virtual_arena_pair_t>{
            virtual_arena_pair_t{virtual_arena_t{vm_t{d}}, virtual_arena_t{vm_t{d}}}, o.alignment};
      }));
  all.push_back(
      entry("std_pmr_pool", "std::pmr::unsynchronized_pool_resource, largest_required_pool_block 1 MiB", true,
            [](simulated_device& d, const replay_options& o) {
              return pmr_pool_target{
                  d, {.max_blocks_per_chunk = 0, .largest_required_pool_block = std::size_t{1} << 20}, o.alignment};
            }));
#if ALLOY_REPLAY_HAS_THRUST
  all.push_back(entry(
      "thrust_pool",
      "thrust::mr::unsynchronized_pool_resource, largest_block_size 1 MiB; requests below the "
      "alignment asked as the alignment, sizes rounded up to 8 B (see compositions.hpp)",
      true, [](simulated_device& d, const replay_options& o) { return thrust_pool_target<false>{d, o.alignment}; }));
  all.push_back(entry(
      "thrust_disjoint_pool",
      "thrust::mr::disjoint_unsynchronized_pool_resource, largest_block_size 1 MiB, bookkeeping on the "
      "host; requests below the alignment asked as the alignment (see compositions.hpp)",
      true, [](simulated_device& d, const replay_options& o) { return thrust_pool_target<true>{d, o.alignment}; }));
#endif
  return all;
}

}  // namespace alloy::replay
