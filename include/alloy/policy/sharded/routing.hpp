// SPDX-License-Identifier: Apache-2.0
// alloy/policy/sharded/routing.hpp: how `sharded`'s requests and frees reach a shard: a request
// through the thread's shard or the others in turn (the upstream call of a planned growth without
// the lock), a free to the shard that owns the block, and the thread caches' refills and flushes.
// Member definitions only: the class, with every declaration and its contract, is in
// alloy/policy/sharded.hpp, which includes this file.
#pragma once

#include <alloy/policy/sharded.hpp>

namespace alloy {

template <allocator Inner, class Mutex>
template <bool Plain, class Call>
inline block sharded<Inner, Mutex>::allocate_from_shards(std::size_t first, std::size_t caller, std::size_t bytes,
                                                         std::size_t alignment, Call call) noexcept {
  std::size_t inner_bytes = bytes, inner_alignment = alignment;
  if (is_cached_size(bytes) && detail::is_power_of_two(alignment)) {
    inner_bytes = classes::size(classes::index(bytes));
    inner_alignment = std::max(alignment, cache_alignment);
  }
  for (std::size_t n = 0; n < shard_count_; ++n) {
    shard& s = shards_[shard_after(first, n)];
    block b;
    if constexpr (Plain && growth_planning_allocator<Inner>) {
      growth_plan plan;
      {
        shard_lock lock(s, caller);
        b = s.inner.allocate_or_plan(inner_bytes, inner_alignment, plan);
        if (!b && !plan) [[unlikely]]
          b = call(s.inner, inner_bytes, inner_alignment);
        if (b) return remembered(s, b, bytes);
        if (!plan) continue;
      }
      b = grow_unlocked(s, caller, plan, inner_bytes, inner_alignment);
      if (b) return block{b.ptr, bytes};
    } else {
      shard_lock lock(s, caller);
      b = call(s.inner, inner_bytes, inner_alignment);
      if (b) return remembered(s, b, bytes);
    }
  }
  return {};
}

template <allocator Inner, class Mutex>
block sharded<Inner, Mutex>::grow_unlocked(shard& s, std::size_t caller, growth_plan& plan, std::size_t bytes,
                                           std::size_t alignment) noexcept
  requires growth_planning_allocator<Inner>
{
  plan.fetch([&](auto&& f) {
    shard_lock lock(s, caller);
    return f();
  });
  block b;
  {
    shard_lock lock(s, caller);
    b = s.inner.allocate_planned(plan, bytes, alignment);
    if (b && shard_count_ > 1) s.recent[recent_index(b.ptr)] = b.ptr;
  }
  plan.give_back_unused();
  return b;
}

template <allocator Inner, class Mutex>
inline bool sharded<Inner, Mutex>::free_block(block b) noexcept {
  slot* me = my_slot();
  if (is_cached_size(b.size) && b.ptr != nullptr) {
    if (!may_free(b)) [[unlikely]]
      return false;
    const std::size_t c = classes::index(b.size);
    if (me != nullptr && me->cache != nullptr && capacity_[c] != 0) [[likely]] {
      cache& k = *me->cache;
      // The block freed last to this class, freed again (glibc's fastbins make the same check).
      if (k.count[c] != 0 && k.blocks[c][k.count[c] - 1] == b.ptr) [[unlikely]] {
        refuse(b);
        return false;
      }
      if (k.count[c] == capacity_[c]) flush(*me, k, c, capacity_[c] / 2, index_of(me));
      k.blocks[c][k.count[c]++] = b.ptr;
      return true;
    }
  }
  return free_to_owner(b, [](Inner& in, block x) { return detail::free_in(in, x); }, me);
}

template <allocator Inner, class Mutex>
template <class Free>
inline bool sharded<Inner, Mutex>::free_to_owner(block b, Free free, slot* me) noexcept {
  if (b.ptr == nullptr) return b.size == 0;
  const block inner = inner_block(b);
  const std::size_t first = shard_of(me);
  if (shard_count_ > 1) {
    shard& s = shards_[first];
    shard_lock lock(s, index_of(me));
    void*& entry = s.recent[recent_index(inner.ptr)];
    if (entry == inner.ptr) {
      entry = nullptr;
      if (free(s.inner, inner) != detail::free_outcome::refused) return true;
      refuse(inner);
      return false;
    }
  }
  void* p = inner.ptr;
  return give_back(first, index_of(me), inner.size, &p, 1, nullptr, free) == 0;
}

template <allocator Inner, class Mutex>
template <class Free>
inline bool sharded<Inner, Mutex>::free_to_owner(block b, Free free) noexcept {
  return free_to_owner(b, free, my_slot());
}

template <allocator Inner, class Mutex>
inline std::size_t sharded<Inner, Mutex>::give_back(std::size_t first, std::size_t caller, std::size_t bytes,
                                                    void** ptrs, std::size_t n, std::size_t* taker) noexcept {
  return give_back(first, caller, bytes, ptrs, n, taker, [](Inner& in, block x) { return detail::free_in(in, x); });
}

template <allocator Inner, class Mutex>
template <class Free>
inline std::size_t sharded<Inner, Mutex>::give_back(std::size_t first, std::size_t caller, std::size_t bytes,
                                                    void** ptrs, std::size_t n, std::size_t* taker,
                                                    Free free) noexcept {
  std::size_t lost = 0;
  if (shard_count_ == 1 && !ALLOY_CHECKED) {
    shard_lock lock(shards_[0], caller);
    for (std::size_t i = 0; i < n; ++i) {
      if (free(shards_[0].inner, block{ptrs[i], bytes}) == detail::free_outcome::refused) {
        refuse(block{ptrs[i], bytes});
        ++lost;
      }
    }
    return lost;
  }
  for (std::size_t k = 0; k < shard_count_ && n != 0; ++k) {
    shard& s = shards_[shard_after(first, k)];
    shard_lock lock(s, caller);
    for (std::size_t i = n; i-- > 0;) {
      const block b{ptrs[i], bytes};
      if (!s.inner.owns(b)) continue;
      if (taker != nullptr) *taker = shard_after(first, k);
      if (void*& entry = s.recent[recent_index(b.ptr)]; entry == b.ptr) entry = nullptr;
      ptrs[i] = ptrs[--n];
      if (free(s.inner, b) == detail::free_outcome::refused) {
        refuse(b);
        ++lost;
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) refuse(block{ptrs[i], bytes});
  return lost + n;
}

template <allocator Inner, class Mutex>
inline void sharded<Inner, Mutex>::refill(std::size_t first, std::size_t caller, cache& k, std::size_t c) noexcept {
  const std::size_t size = classes::size(c);
  shard& s = shards_[first];
  const std::uint32_t before = k.count[c];
  if constexpr (growth_planning_allocator<Inner>) {
    // Planned growth: the refill stops where the shard would call its upstream; when it got
    // nothing, that call is made without the lock for one block (the slab serves the next).
    growth_plan plan;
    {
      shard_lock lock(s, caller);
      const std::uint32_t want = capacity_[c] / 2;
      while (k.count[c] < want) {
        const block b = s.inner.allocate_or_plan(size, cache_alignment, plan);
        if (!b) break;
        k.blocks[c][k.count[c]++] = b.ptr;
      }
      if (k.count[c] == 0 && !plan) {  // neither served nor planned: one block under the lock
        if (const block b = s.inner.allocate(size, cache_alignment)) k.blocks[c][k.count[c]++] = b.ptr;
      }
    }
    if (k.count[c] == 0 && plan) {
      if (const block b = grow_unlocked(s, caller, plan, size, cache_alignment)) k.blocks[c][k.count[c]++] = b.ptr;
    }
  } else {
    shard_lock lock(s, caller);
    const std::uint32_t want = capacity_[c] / 2;
    while (k.count[c] < want) {
      const block b = s.inner.allocate(size, cache_alignment);
      if (!b) break;
      k.blocks[c][k.count[c]++] = b.ptr;
    }
  }
  if (k.count[c] == 0 && shard_count_ > 1) {
    const block b = allocate_direct<true>(shard_after(first, 1), caller, size, cache_alignment,
                                          [](Inner& in, std::size_t n, std::size_t a) { return in.allocate(n, a); });
    if (b) k.blocks[c][k.count[c]++] = b.ptr;
  }
  for (std::uint32_t i = before; i < k.count[c]; ++i) starts_->add(k.blocks[c][i]);  // for their frees
}

template <allocator Inner, class Mutex>
inline void sharded<Inner, Mutex>::flush(slot& me, cache& k, std::size_t c, std::uint32_t n,
                                         std::size_t caller) noexcept {
  void* out[per_class_max];
  std::copy(k.blocks[c], k.blocks[c] + n, out);
  std::copy(k.blocks[c] + n, k.blocks[c] + k.count[c], k.blocks[c]);
  k.count[c] -= n;
  (void)give_back(me.flush_hint, caller, classes::size(c), out, n, &me.flush_hint);
}

template <allocator Inner, class Mutex>
inline void sharded<Inner, Mutex>::flush_all(slot& me, cache& k, std::size_t caller) noexcept {
  for (std::size_t c = 0; c < classes::count; ++c) {
    if (k.count[c] != 0) flush(me, k, c, k.count[c], caller);
  }
}

}  // namespace alloy
