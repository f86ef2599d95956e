// SPDX-License-Identifier: Apache-2.0
// src/capi/capture_pools.hpp: the private pools liballoy makes for the CUDA graphs captured through
// it. PyTorch tells a pluggable allocator neither when a capture begins nor when its graph is
// destroyed, so the first allocation on a capturing stream routes that capture to a pool of its
// own, and the pool keeps the graph's memory (blocks freed inside the capture included, which the
// replays reuse) away from other work until `release_closed`.
#pragma once

#include <cstddef>
#include <list>
#include <vector>

#include <alloy/graph_pool.hpp>
#include <alloy/stream.hpp>

namespace alloy::capi {

/// Pools of `Alloc` (a `stream_ordered` composition, or a wrapper of one) over `Stream`, one per
/// capture seen. With a stream that cannot capture, every call does nothing. Not thread-safe: the
/// library calls it under the device's lock, before each stream-ordered allocation.
template <class Alloc, class Stream>
class capture_pools {
 public:
  /// Routes the capture running on `stream`, if any and not routed yet, to a pool of its own; and
  /// closes the pools of captures that have ended (their graphs may still be replayed).
  void route(Alloc& alloc, Stream stream) noexcept {
    if constexpr (capturable_stream<Stream> && graph_pooling_allocator<Alloc, Stream>) {
      close_ended(alloc);
      const capture_state c = stream_traits<Stream>::capture(stream);
      if (c.state != capture_state::status::active) return;
      for (const open_capture& o : open_)
        if (o.id == c.id) return;
      try {
        pools_.emplace_back();
        open_.reserve(open_.size() + 1);
      } catch (...) {
        return;  // no host memory for the bookkeeping: the capture keeps stream_ordered's own pool
      }
      graph_pool& pool = pools_.back().pool;
      if (!alloc.begin_allocate_to_pool(pool, stream)) {
        pools_.pop_back();
        return;
      }
      open_.push_back({c.id, stream, &pools_.back()});
    } else {
      (void)alloc;
      (void)stream;
    }
  }

  /// Gives the memory of every pool whose capture has ended back to everyone: call it once no
  /// graph captured through the library will be replayed again. Pools of running captures stay.
  void release_closed(Alloc& alloc) noexcept {
    if constexpr (capturable_stream<Stream> && graph_pooling_allocator<Alloc, Stream>) {
      close_ended(alloc);
      for (auto it = pools_.begin(); it != pools_.end();) {
        if (it->open) {
          ++it;
          continue;
        }
        alloc.release_pool(it->pool);
        it = pools_.erase(it);
      }
    } else {
      (void)alloc;
    }
  }

  /// Pools kept, running captures' included.
  std::size_t size() const noexcept { return pools_.size(); }

 private:
  struct entry {
    graph_pool pool;  // neither copied nor moved: its address is its name
    bool open = true;
  };
  struct open_capture {
    unsigned long long id = 0;
    Stream stream{};
    entry* pool = nullptr;
  };

  // A capture whose stream no longer reports it (ended, aborted, or the stream gone) stops routing.
  void close_ended(Alloc& alloc) noexcept {
    for (std::size_t i = 0; i < open_.size();) {
      const capture_state now = stream_traits<Stream>::capture(open_[i].stream);
      if (now.state == capture_state::status::active && now.id == open_[i].id) {
        ++i;
        continue;
      }
      alloc.end_allocate_to_pool(open_[i].pool->pool);
      open_[i].pool->open = false;
      open_[i] = open_.back();
      open_.pop_back();
    }
  }

  std::list<entry> pools_;
  std::vector<open_capture> open_;
};

}  // namespace alloy::capi
