// SPDX-License-Identifier: Apache-2.0
// alloy/graph_pool.hpp: private memory pools for CUDA graphs, and what stream_ordered keeps about
// the captures it saw.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <new>
#include <unordered_map>
#include <vector>

#include <alloy/block.hpp>
#include <alloy/stream.hpp>

namespace alloy {

/// A private pool for the memory of one or more CUDA graphs (docs/design.md#cuda-graphs), a handle
/// the user owns: `alloc.begin_allocate_to_pool(pool, stream)` routes the allocations of the
/// capture running on `stream` to it, `alloc.end_allocate_to_pool(pool)` stops that, and
/// `alloc.release_pool(pool)` (once no graph of the pool will run again) makes its memory free for
/// everyone, after the captures still using it have ended. Until then the pool's addresses are
/// handed only to captures routed to it. The handle is its address: it must outlive its use by
/// the allocator, and is neither copied nor moved.
class graph_pool {
 public:
  graph_pool() = default;
  graph_pool(const graph_pool&) = delete;
  graph_pool& operator=(const graph_pool&) = delete;
};

/// The memory a composition keeps in private pools (`pool_figures()` of `stream_ordered`):
/// held by graphs, not counted as free by anyone else.
struct graph_pool_figures {
  std::size_t pools = 0;       ///< pools with memory (user pools and captures' own)
  std::size_t live_bytes = 0;  ///< pool blocks the caller holds
  std::size_t free_bytes = 0;  ///< pool blocks freed, kept for the pool's graphs
  std::size_t deferred = 0;    ///< frees of blocks from before a capture, waiting for its end

  graph_pool_figures& operator+=(const graph_pool_figures& o) noexcept {
    pools += o.pools;
    live_bytes += o.live_bytes;
    free_bytes += o.free_bytes;
    deferred += o.deferred;
    return *this;
  }
};

/// An allocator with private graph pools over `Stream` (`stream_ordered` over a
/// `capturable_stream`, and every wrapper of one).
template <class A, class Stream>
concept graph_pooling_allocator = requires(A& a, const A& ca, graph_pool& pool, Stream stream) {
  { a.begin_allocate_to_pool(pool, stream) } noexcept -> std::same_as<bool>;
  { a.end_allocate_to_pool(pool) } noexcept;
  { a.release_pool(pool) } noexcept;
  { ca.pool_figures() } noexcept -> std::same_as<graph_pool_figures>;
};

namespace detail {

/// What `stream_ordered` keeps about captures and private pools (the pools' blocks are live in
/// its `Inner`). Pools are keyed by the user's handle, or by the capture for a capture's own pool.
template <class Stream>
struct capture_book {
  using key = std::uintptr_t;
  /// The pool of a block that left its pool while live (kept to free it at `Inner`'s size).
  static constexpr key ordinary = 0;
  static key own_pool(unsigned long long capture) noexcept { return (key{1} << (8 * sizeof(key) - 1)) | capture; }
  static key user_pool(const graph_pool& p) noexcept { return reinterpret_cast<key>(&p); }

  struct capture {
    unsigned long long id = 0;
    Stream stream{};  ///< a stream seen in the capture, probed to learn that it ended
    capture_mode mode = capture_mode::global;
    bool invalidated = false;    ///< seen invalidated: it ends without a graph
    key pool = 0;                ///< where its allocations go
    std::vector<void*> taken;    ///< blocks of a user pool it took
    bool holds_release = false;  ///< a pool it used was released while it ran (`release_pool`)
  };
  struct pooled {
    std::size_t size = 0;    ///< as `Inner` handed it out
    std::size_t handed = 0;  ///< as the caller holds it (a pool block may serve fewer bytes)
    key pool = 0;
    std::uint32_t takers = 0;  ///< captures that took it (not unwound)
    unsigned long long last_taker = 0;
    unsigned long long freed_in = 0;  ///< capture it was freed in (0: outside)
    Stream stream{};                  ///< stream it was freed on
    bool free = false;
    bool freed_on_stream = false;
  };
  struct pool {
    std::multimap<std::size_t, void*> free;  ///< by size
    std::size_t live_bytes = 0;
    std::size_t free_bytes = 0;
    bool released = false;  ///< released while captures using it ran: dropped once they ended
  };
  struct deferred_free {
    block b;
    Stream stream;
    unsigned long long capture;
  };

  capture* find(unsigned long long id) noexcept {
    for (capture& c : captures) {
      if (c.id == id) return &c;
    }
    return nullptr;
  }
  /// A free block of `from` for the capture `c`: aligned, large enough, and not freed on another
  /// stream of the same capture (no order between them) nor on a stream outside captures.
  block take(pool& from, capture& c, std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    int budget = 16;
    for (auto it = from.free.lower_bound(bytes); it != from.free.end() && budget-- > 0; ++it) {
      void* p = it->second;
      pooled& pb = blocks.find(p)->second;
      if (alignment > 1 && reinterpret_cast<std::uintptr_t>(p) % alignment != 0) continue;
      if (pb.freed_in == c.id ? !(pb.stream == stream) : pb.freed_in == 0 && pb.freed_on_stream) continue;
      if (pb.last_taker != c.id && c.pool != own_pool(c.id)) {
        try {
          c.taken.push_back(p);
        } catch (const std::bad_alloc&) {
          continue;
        }
      }
      if (pb.last_taker != c.id) ++pb.takers;
      pb.last_taker = c.id;
      from.free.erase(it);
      pb.free = false;
      pb.handed = bytes;
      from.free_bytes -= pb.size;
      from.live_bytes += pb.size;
      return {p, bytes};
    }
    return {};
  }

  /// Whether capture `c` is routed to pool `k` or took a block of it.
  bool uses(const capture& c, key k) const noexcept {
    if (c.pool == k) return true;
    for (void* p : c.taken) {
      const auto found = blocks.find(p);
      if (found != blocks.end() && found->second.pool == k) return true;
    }
    return false;
  }
  /// Marks the known captures that use pool `k` as holding its release; false when none does.
  bool hold_release(key k) noexcept {
    bool held = false;
    for (capture& c : captures) {
      if (uses(c, k)) held = c.holds_release = true;
    }
    return held;
  }
  /// A known capture holds a release back: the released pools wait for every such capture's end.
  bool release_held() const noexcept {
    for (const capture& c : captures) {
      if (c.holds_release) return true;
    }
    return false;
  }
  bool any_forbidding() const noexcept {
    for (const capture& c : captures) {
      if (c.mode != capture_mode::relaxed) return true;
    }
    return false;
  }

  std::vector<capture> captures;  ///< seen and not yet seen ended
  std::unordered_map<void*, pooled> blocks;
  std::map<key, pool> pools;
  std::vector<deferred_free> deferred;
  std::size_t released_waiting = 0;  ///< pools with `released` set
};

}  // namespace detail
}  // namespace alloy
