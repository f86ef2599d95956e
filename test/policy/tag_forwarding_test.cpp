// SPDX-License-Identifier: Apache-2.0
// Tags and offload through wrappers (detail/forwarding.hpp): a randomized
// model-based run of allocations, frees and offload / discard / restore cycles of random tags
// through `synchronized<stats<virtual_arena>>`, `stats<virtual_allocator>` and
// `stats<sharded<virtual_arena>>` (shards sharing one backend through `vmm_ref`), checking after
// every step fill patterns at unchanged addresses and, exactly, the decorator's bytes in use,
// reserved bytes (= the backend's physical bytes), OOM count, reclaims and refused allocations;
// then misuse through the wrappers (an offloaded tag's allocation refused and counted, restore of
// a resident tag, a failing map, host allocation failing in one shard: the others undone; shards
// holding a tag apart after a restore or an `offload_all` that stopped halfway: its requests
// refused), `limited`'s count across an offload, a pmr container tagged from outside through the
// decorators, and memory_summary / memory_stats.
#include <boost/test/unit_test.hpp>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory_resource>
#include <mutex>
#include <new>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <alloy/adaptor/pmr.hpp>
#include <alloy/host_stream.hpp>
#include <alloy/literals.hpp>
#include <alloy/memory_stats.hpp>
#include <alloy/policy/limited.hpp>
#include <alloy/policy/quantizer.hpp>
#include <alloy/policy/segregator.hpp>
#include <alloy/policy/sharded.hpp>
#include <alloy/policy/stats.hpp>
#include <alloy/policy/stream_ordered.hpp>
#include <alloy/policy/synchronized.hpp>
#include <alloy/policy/tracked.hpp>
#include <alloy/policy/virtual_arena.hpp>
#include <alloy/ref.hpp>
#include <alloy/showcase.hpp>
#include <alloy/tag.hpp>
#include <alloy/vmm/host_vmm.hpp>

#include "support/conformance.hpp"
#include "support/failing_vmm.hpp"
#include "support/sanitizers.hpp"
#include "support/tag_printing.hpp"

using namespace alloy::literals;
using alloy::block;
using alloy::host_vmm;
using alloy::offload_status;
using alloy::scoped_tag;
using alloy::tag;
using alloy::tag_state;
using alloy::testing::fill_pattern;
using alloy::testing::has_pattern;

namespace {

constexpr std::size_t granule = 64_KiB;
using shared_arena = alloy::virtual_arena<alloy::vmm_ref<host_vmm>>;

/// Runs each task on a thread of its own, one at a time, and waits for it (so that a sharded
/// allocator sees calls from two threads, hence two shards, in a deterministic order).
class worker {
 public:
  worker() : thread_([this] { loop(); }) {}
  ~worker() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void run(const std::function<void()>& f) {
    std::unique_lock lock(m_);
    task_ = &f;
    cv_.notify_all();
    cv_.wait(lock, [&] { return task_ == nullptr; });
  }

 private:
  void loop() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || task_ != nullptr; });
      if (stop_) return;
      (*task_)();
      task_ = nullptr;
      cv_.notify_all();
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  const std::function<void()>* task_ = nullptr;
  bool stop_ = false;
  std::thread thread_;
};

/// What the model run needs of a composition besides the allocator's own calls.
template <class Stats, class Mapped, class Exec>
struct probes {
  Stats statistics;  ///< the decorator's `statistics()`
  Mapped mapped;     ///< mapped bytes of a tag (the arena's figure)
  Exec exec;         ///< runs an allocating call (on some thread)
  /// Parts each offload reaches (shards): each counts a reclaim, and each asked refuses an
  /// allocation with an offloaded tag (`sharded` asks every shard in turn).
  std::size_t parts = 1;
  std::uint16_t first_offloadable = 0;  ///< tags below are never offloaded
};
template <class Stats, class Mapped, class Exec>
probes<Stats, Mapped, Exec> make_probes(Stats s, Mapped m, Exec e, std::size_t parts = 1,
                                        std::uint16_t first_offloadable = 0) {
  return {s, m, e, parts, first_offloadable};
}

/// The randomized model run: `steps` operations over `tags` tags, checking everything exactly.
template <class A, class P>
void random_cycles(A& alloc, const host_vmm& backend, P p, std::uint64_t seed, int steps, std::uint16_t tags) {
  struct entry {
    block b;
    std::uint16_t t;
    std::uint64_t id;
  };
  std::vector<entry> live;
  std::mt19937_64 rng{seed};
  std::uint64_t next_id = 1;
  std::size_t in_use = 0, ooms = 0, refused = 0, allocs = 0, checked = 0, offloads = 0, restores = 0;
  const std::size_t refused_before = alloc.offload_stats().num_refused_allocations;
  auto check_figures = [&](int step) {
    const alloy::statistics s = p.statistics();
    BOOST_TEST(s.bytes_in_use == in_use, "step " << step);  // blocks of offloaded tags included
    BOOST_TEST(s.bytes_reserved == backend.physical_bytes(), "step " << step);
    BOOST_TEST(s.num_ooms == ooms, "step " << step);
    BOOST_TEST(s.num_allocs == allocs, "step " << step);
    BOOST_TEST(alloc.offload_stats().num_refused_allocations - refused_before == refused, "step " << step);
  };
  for (int step = 0; step < steps; ++step) {
    const unsigned op = static_cast<unsigned>(rng() % 100);
    auto t = static_cast<std::uint16_t>(rng() % tags);
    if (op < 45) {
      const std::size_t bytes = 1 + rng() % (granule * 3 / 2);
      const std::size_t alignment = std::size_t{8} << (rng() % 8);
      const bool scoped = rng() % 2 == 0;
      const tag_state state = alloc.state(tag{t});
      block b;
      p.exec([&] {
        if (scoped) {
          scoped_tag guard{alloc, tag{t}};  // tagged from outside
          b = alloc.allocate(bytes, alignment);
        } else {
          b = alloc.allocate(bytes, alignment, tag{t});
        }
      });
      BOOST_TEST(alloc.current_tag().value == 0u);  // the guard put it back
      if (state != tag_state::resident) {
        BOOST_TEST(b.ptr == nullptr, "an allocation with an offloaded tag was served");
        refused += p.parts;
        ++ooms;
      } else if (b.ptr == nullptr) {
        ++ooms;
      } else {
        BOOST_TEST(reinterpret_cast<std::uintptr_t>(b.ptr) % alignment == 0u);
        fill_pattern(b, next_id);
        live.push_back({b, t, next_id++});
        in_use += bytes;
        ++allocs;
      }
    } else if (op < 75) {
      if (live.empty()) continue;
      const std::size_t k = rng() % live.size();
      const block b = live[k].b;
      p.exec([&] { alloc.deallocate(b); });  // allowed for an offloaded tag too
      in_use -= b.size;
      live[k] = live.back();
      live.pop_back();
    } else if (op < 83) {
      t = static_cast<std::uint16_t>(p.first_offloadable + rng() % (tags - p.first_offloadable));
      const std::size_t physical = backend.physical_bytes(), mapped = p.mapped(tag{t});
      const alloy::statistics before = p.statistics();
      const bool discard = rng() % 4 == 0;
      const tag_state state = alloc.state(tag{t});
      const offload_status s = discard ? alloc.discard(tag{t}) : alloc.offload(tag{t});
      if (state != tag_state::resident) {
        BOOST_TEST(s == offload_status::not_resident);
        BOOST_TEST(backend.physical_bytes() == physical);
        continue;
      }
      BOOST_TEST(s == offload_status::done);
      BOOST_TEST(alloc.state(tag{t}) == (discard ? tag_state::discarded : tag_state::offloaded));
      BOOST_TEST(backend.physical_bytes() == physical - mapped, "step " << step);  // exactly the tag's granules
      const alloy::statistics after = p.statistics();
      BOOST_TEST(after.bytes_reclaimed - before.bytes_reclaimed == mapped);
      BOOST_TEST(after.num_single_reclaims - before.num_single_reclaims == p.parts);
      ++offloads;
    } else if (op < 98) {
      if (alloc.state(tag{t}) == tag_state::resident) {
        BOOST_TEST(alloc.restore(tag{t}) == offload_status::already_resident);
        continue;
      }
      const bool discarded = alloc.state(tag{t}) == tag_state::discarded;
      BOOST_TEST(alloc.restore(tag{t}) == offload_status::done);
      BOOST_TEST(alloc.state(tag{t}) == tag_state::resident);
      for (const entry& e : live) {
        if (e.t != t) continue;
        if (discarded) {
          fill_pattern(e.b, e.id);
        } else {
          BOOST_TEST(has_pattern(e.b, e.id), "seed " << seed << " step " << step << " block " << e.id);
          ++checked;
        }
      }
      ++restores;
    } else {
      // Every resident tag's blocks still hold their pattern, at their addresses.
      for (const entry& e : live)
        if (alloc.state(tag{e.t}) == tag_state::resident) BOOST_TEST(has_pattern(e.b, e.id), "block " << e.id);
    }
    check_figures(step);
  }
  BOOST_TEST(checked > 100u);
  BOOST_TEST_MESSAGE("seed " << seed << ": " << allocs << " allocations, " << offloads << " offloads/discards, "
                             << restores << " restores, " << checked << " blocks checked after restores, " << refused
                             << " allocations refused for an offloaded tag");
  std::vector<tag_state> at_end;
  for (std::uint16_t t = 0; t < tags; ++t) at_end.push_back(alloc.state(tag{t}));
  for (std::uint16_t t = 0; t < tags; ++t) (void)alloc.restore(tag{t});
  for (const entry& e : live) {
    if (at_end[e.t] != tag_state::discarded) BOOST_TEST(has_pattern(e.b, e.id));
    p.exec([&] { alloc.deallocate(e.b); });
  }
  in_use = 0;
  check_figures(steps);
}

}  // namespace

BOOST_AUTO_TEST_CASE(random_cycles_through_synchronized_stats_arena) {
  for (const std::uint64_t seed : {1u, 2u}) {
    host_vmm backend{{.granularity = granule}};
    alloy::synchronized<alloy::stats<shared_arena>> alloc{
        alloy::stats<shared_arena>{shared_arena{alloy::vmm_ref<host_vmm>{backend}, {.release_threshold = 2 * granule}},
                                   {.introspect = false}}};  // the figures checked are exact without it
    const auto& arena = alloc.inner().inner();
    random_cycles(alloc, backend,
                  make_probes([&] { return alloc.with_lock([](auto& s) { return s.statistics(); }); },
                              [&](tag t) { return arena.mapped_bytes(t); }, [](auto&& f) { f(); }),
                  seed, 3000, 5);
    BOOST_TEST(arena.check_invariants());
    BOOST_TEST(alloc.mapped_bytes(tag{1}) == 0u);
  }
}

// One thread: it runs in the release and ASan builds; under ThreadSanitizer its thousands of maps
// and unmaps of fresh host memory took over six minutes and checked no race.
BOOST_AUTO_TEST_CASE(random_cycles_through_stats_virtual_allocator,
                     *boost::unit_test::enable_if<!alloy::testing::under_tsan>()) {
  for (const std::uint64_t seed : {3u, 4u}) {
    host_vmm backend{{.granularity = granule}};
    alloy::stats<alloy::virtual_allocator<alloy::vmm_ref<host_vmm>>> alloc{
        alloy::virtual_allocator<alloy::vmm_ref<host_vmm>>{alloy::vmm_ref<host_vmm>{backend}}, {.introspect = false}};
    const auto& arena = alloc.inner().arena();
    // Tag 0 (the pool's slabs) is offloaded too: its small requests are refused meanwhile.
    random_cycles(alloc, backend,
                  make_probes([&] { return alloc.statistics(); }, [&](tag t) { return arena.mapped_bytes(t); },
                              [](auto&& f) { f(); }, 1, 0),
                  seed, 20000, 5);  // longer: with tag 0 away too, more allocations are refused
    BOOST_TEST(arena.check_invariants());
    // The tags' blocks stay beside the heap: a few MiB of addresses used, not the terabyte reserved.
    BOOST_TEST(arena.used_address_space() <= 256_MiB, arena.used_address_space() << " bytes of addresses used");
  }
}

BOOST_AUTO_TEST_CASE(random_cycles_through_stats_sharded_arenas_on_one_backend) {
  for (const std::uint64_t seed : {5u, 6u}) {
    host_vmm backend{{.granularity = granule}};
    using shards = alloy::sharded<shared_arena>;
    alloy::stats<shards> alloc{shards{[&](std::size_t) {
                                        return shared_arena{alloy::vmm_ref<host_vmm>{backend},
                                                            {.release_threshold = granule}};
                                      },
                                      {.shards = 2}},
                               {.introspect = false}};
    worker left, right;
    std::mt19937_64 pick{seed};
    random_cycles(alloc, backend,
                  make_probes([&] { return alloc.statistics(); }, [&](tag t) { return alloc.mapped_bytes(t); },
                              [&](auto&& f) {
                                const std::function<void()> task = f;
                                (pick() % 2 == 0 ? left : right).run(task);
                              },
                              2, 0),
                  seed, 3000, 4);
    // Both shards were used: each has mapped memory or made maps.
    std::size_t shards_used = 0;
    for (std::size_t i = 0; i < 2; ++i)
      shards_used += alloc.inner().with_shard(i, [](const auto& a) { return a.counters().num_maps; }) != 0;
    BOOST_TEST(shards_used == 2u);
  }
}

namespace {

/// Host memory for offloaded copies that fails while `failing` is set, and counts what is out.
struct switchable_host {
  bool failing = false;
  std::size_t outstanding = 0;
  static void* allocate(std::size_t bytes, void* context) {
    auto& self = *static_cast<switchable_host*>(context);
    if (self.failing) return nullptr;
    ++self.outstanding;
    return ::operator new(bytes, std::nothrow);
  }
  static void deallocate(void* p, std::size_t, void* context) {
    --static_cast<switchable_host*>(context)->outstanding;
    ::operator delete(p);
  }
};

template <class Arena>
typename Arena::options host_options(switchable_host& h, std::size_t release_threshold = 0) {
  typename Arena::options o;
  o.release_threshold = release_threshold;
  o.host_allocate = &switchable_host::allocate;
  o.host_deallocate = &switchable_host::deallocate;
  o.host_context = &h;
  return o;
}

}  // namespace

// Misuse through synchronized<stats<>>: an allocation with an offloaded tag is refused and
// counted (the decorator's OOM, the arena's refusal), restore of a resident tag and offload of an
// offloaded one change nothing, a map failing at restore leaves the tag offloaded with nothing
// half-mapped and the figures exact, and the retry brings every byte back at its address.
BOOST_AUTO_TEST_CASE(misuse_and_failures_through_decorators_leave_the_tag_intact) {
  using failing = alloy::testing::failing_vmm<alloy::vmm_ref<host_vmm>>;
  using arena_t = alloy::virtual_arena<failing>;
  host_vmm physical{{.granularity = granule}};
  failing backend{alloy::vmm_ref<host_vmm>{physical}, {.kinds = failing::maps}};
  const failing observer = backend;  // shares the failure options and counts
  alloy::synchronized<alloy::stats<arena_t>> alloc{alloy::stats<arena_t>{arena_t{backend, {.release_threshold = 0}}}};
  std::vector<block> weights;
  for (std::size_t i = 0; i < 5; ++i) {
    weights.push_back(alloc.allocate(2 * granule - 64 * (i + 1), granule, tag{1}));  // two granules each
    BOOST_REQUIRE(weights.back());
    fill_pattern(weights.back(), 10 + i);
  }
  const block other = alloc.allocate(1000, 8);  // tag 0
  BOOST_REQUIRE(other);
  auto figures = [&] { return alloc.with_lock([](auto& s) { return s.statistics(); }); };
  const std::size_t in_use = figures().bytes_in_use;
  const std::size_t mapped_before = alloc.reserved_bytes();
  const std::size_t tag_mapped = alloc.mapped_bytes(tag{1});
  BOOST_TEST(tag_mapped == 10 * granule);

  BOOST_TEST(alloc.restore(tag{1}) == offload_status::already_resident);
  BOOST_TEST(alloc.offload(tag{1}) == offload_status::done);
  BOOST_TEST(alloc.offload(tag{1}) == offload_status::not_resident);
  BOOST_TEST(alloc.discard(tag{1}) == offload_status::not_resident);
  BOOST_TEST(alloc.reserved_bytes() == mapped_before - tag_mapped);
  BOOST_TEST(figures().bytes_reserved == mapped_before - tag_mapped);
  BOOST_TEST(figures().bytes_in_use == in_use);  // still the caller's blocks

  // Allocating with the offloaded tag, per call and through scoped_tag: refused and counted.
  BOOST_TEST(alloc.allocate(100, 8, tag{1}).ptr == nullptr);
  {
    scoped_tag guard{alloc, tag{1}};
    BOOST_TEST(alloc.allocate(100, 8).ptr == nullptr);
  }
  BOOST_TEST(figures().num_ooms == 2u);
  BOOST_TEST(alloc.offload_stats().num_refused_allocations == 2u);
  BOOST_TEST(figures().bytes_in_use == in_use);

  // Every map fails: restore fails cleanly, can be retried.
  backend.set_options({.fail_from = observer.calls(), .kinds = failing::maps});
  BOOST_TEST(alloc.restore(tag{1}) == offload_status::map_failed);
  BOOST_TEST(alloc.state(tag{1}) == tag_state::offloaded);
  BOOST_TEST(alloc.mapped_bytes(tag{1}) == 0u);
  BOOST_TEST(figures().bytes_reserved == mapped_before - tag_mapped);
  BOOST_TEST(physical.physical_bytes() == mapped_before - tag_mapped);
  BOOST_TEST(alloc.inner().inner().check_invariants());
  backend.set_options({.kinds = failing::maps});
  BOOST_TEST(alloc.restore(tag{1}) == offload_status::done);
  for (std::size_t i = 0; i < weights.size(); ++i) BOOST_TEST(has_pattern(weights[i], 10 + i));
  BOOST_TEST(figures().bytes_reserved == mapped_before);
  BOOST_TEST(alloc.offload_stats().num_restores == 1u);
  for (const block& b : weights) alloc.deallocate(b);
  alloc.deallocate(other);
  BOOST_TEST(figures().bytes_in_use == 0u);
  BOOST_TEST(alloc.offload_stats().bytes_on_host == 0u);
}

// The reserved peak stays exact when a restore raises the mapped bytes and an offload lowers them
// again before anyone asks (stats<>'s guard hook looks after every forwarded call that may change
// the part).
BOOST_AUTO_TEST_CASE(stats_sees_the_reserved_peak_of_a_restore) {
  using arena_t = alloy::virtual_arena<host_vmm>;
  alloy::stats<arena_t> s{arena_t{host_vmm{{.granularity = granule}}, {.release_threshold = 0}}, {.introspect = false}};
  const block w = s.allocate(3 * granule, 256, tag{1});
  const block c = s.allocate(granule, 256, tag{2});
  BOOST_TEST(s.offload(tag{1}) == offload_status::done);
  s.reset_peak();
  BOOST_TEST(s.statistics().peak_bytes_reserved == granule);
  BOOST_TEST(s.restore(tag{1}) == offload_status::done);  // 4 granules mapped
  BOOST_TEST(s.discard(tag{2}) == offload_status::done);  // 3
  const alloy::statistics st = s.statistics();
  BOOST_TEST(st.bytes_reserved == 3 * granule);
  BOOST_TEST(st.peak_bytes_reserved == 4 * granule);
  BOOST_TEST(st.bytes_reclaimed == 4 * granule);  // tag 1's three and tag 2's one
  BOOST_TEST(st.num_single_reclaims == 2u);
  BOOST_TEST(s.restore(tag{2}) == offload_status::done);
  s.deallocate(w);
  s.deallocate(c);
  BOOST_TEST(s.bytes_in_use() == 0u);
}

// limited<>: a block of an offloaded tag still counts until freed (the cap is on the blocks the
// caller holds, not on the memory behind them); an allocation refused for its offloaded tag is
// not counted, nor is it a refusal of the limit.
BOOST_AUTO_TEST_CASE(limited_counts_an_offloaded_tags_blocks_until_they_are_freed) {
  using arena_t = alloy::virtual_arena<host_vmm>;
  alloy::limited<arena_t> capped{arena_t{host_vmm{{.granularity = granule}}, {.release_threshold = 0}},
                                 {.bytes_limit = 3 * granule}};
  const block w = capped.allocate(2 * granule, 256, tag{1});
  BOOST_REQUIRE(w);
  BOOST_TEST(capped.offload(tag{1}) == offload_status::done);
  BOOST_TEST(capped.bytes_in_use() == 2 * granule);
  BOOST_TEST(capped.allocate(2 * granule, 256, tag{2}).ptr == nullptr);  // past the cap
  BOOST_TEST(capped.num_refused() == 1u);
  BOOST_TEST(capped.allocate(100, 8, tag{1}).ptr == nullptr);  // offloaded tag: the arena refuses
  BOOST_TEST(capped.num_refused() == 1u);
  // The arena counts its refusal in offload_stats(), not as an out-of-memory.
  BOOST_TEST(capped.counters().num_ooms == 1u);
  BOOST_TEST(capped.offload_stats().num_refused_allocations == 1u);
  BOOST_TEST(capped.bytes_in_use() == 2 * granule);
  capped.deallocate(w);  // allowed while offloaded: its range is freed, not restored
  BOOST_TEST(capped.bytes_in_use() == 0u);
  const block c = capped.allocate(2 * granule, 256, tag{2});
  BOOST_TEST(c.ptr != nullptr);
  BOOST_TEST(capped.restore(tag{1}) == offload_status::done);
  BOOST_TEST(capped.live_bytes(tag{1}) == 0u);
  capped.deallocate(c);
  BOOST_TEST(capped.inner().check_invariants());
}

/// Two shards over `backend`, shard i taking its host copies from `hosts[i]`.
alloy::sharded<shared_arena> two_shards_with_hosts(host_vmm& backend, switchable_host (&hosts)[2]) {
  return alloy::sharded<shared_arena>{[&](std::size_t i) {
                                        return shared_arena{alloy::vmm_ref<host_vmm>{backend},
                                                            host_options<shared_arena>(hosts[i])};
                                      },
                                      {.shards = 2}};
}

// sharded: offload of a tag whose blocks are in both shards, the host copy failing in shard 1:
// shard 0, done first, is restored; the tag is resident with every byte at its address, the
// backend holds what it held; with the host back, the offload succeeds and the restore too.
BOOST_AUTO_TEST_CASE(sharded_offload_is_all_or_nothing) {
  host_vmm backend{{.granularity = granule}};
  switchable_host hosts[2];
  using shards = alloy::sharded<shared_arena>;
  shards alloc = two_shards_with_hosts(backend, hosts);
  worker left, right;
  std::vector<block> blocks;
  for (std::size_t i = 0; i < 8; ++i) {
    block b;
    (i % 2 == 0 ? left : right).run([&] { b = alloc.allocate(granule / 2 + 64 * i, 64, tag{3}); });
    BOOST_REQUIRE(b);
    fill_pattern(b, 50 + i);
    blocks.push_back(b);
  }
  std::size_t in_shard[2] = {};
  for (std::size_t i = 0; i < 2; ++i) in_shard[i] = alloc.with_shard(i, [](auto& a) { return a.live_bytes(tag{3}); });
  BOOST_TEST(in_shard[0] != 0u);
  BOOST_TEST(in_shard[1] != 0u);
  BOOST_TEST(alloc.live_bytes(tag{3}) == in_shard[0] + in_shard[1]);
  const std::size_t physical = backend.physical_bytes();
  const std::size_t tag_mapped = alloc.mapped_bytes(tag{3});

  hosts[1].failing = true;
  BOOST_TEST(alloc.offload(tag{3}) == offload_status::host_out_of_memory);
  BOOST_TEST(alloc.state(tag{3}) == tag_state::resident);
  for (std::size_t i = 0; i < 2; ++i)
    BOOST_TEST(alloc.with_shard(i, [](auto& a) { return a.state(tag{3}); }) == tag_state::resident);
  BOOST_TEST(backend.physical_bytes() == physical);
  BOOST_TEST(alloc.mapped_bytes(tag{3}) == tag_mapped);
  for (std::size_t i = 0; i < blocks.size(); ++i) BOOST_TEST(has_pattern(blocks[i], 50 + i));
  BOOST_TEST(hosts[0].outstanding == 0u);  // the undone shard's copy was given back

  hosts[1].failing = false;
  BOOST_TEST(alloc.offload(tag{3}) == offload_status::done);
  BOOST_TEST(alloc.state(tag{3}) == tag_state::offloaded);
  BOOST_TEST(backend.physical_bytes() == physical - tag_mapped);
  BOOST_TEST(alloc.host_bytes(tag{3}) == in_shard[0] + in_shard[1]);
  // Restore shard by shard: shard 1 restored by hand first, the sharded restore completes it.
  BOOST_TEST(alloc.with_shard(1, [](auto& a) { return a.restore(tag{3}); }) == offload_status::done);
  BOOST_TEST(alloc.state(tag{3}) == tag_state::offloaded);
  BOOST_TEST(alloc.restore(tag{3}) == offload_status::done);
  BOOST_TEST(alloc.restore(tag{3}) == offload_status::already_resident);
  BOOST_TEST(backend.physical_bytes() == physical);
  for (std::size_t i = 0; i < blocks.size(); ++i) BOOST_TEST(has_pattern(blocks[i], 50 + i));
  const alloy::offload_statistics o = alloc.offload_stats();
  BOOST_TEST(o.num_offloads == 3u);  // shard 0 twice (once undone), shard 1 once
  BOOST_TEST(o.num_restores == 3u);  // the undo, shard 1 by hand, shard 0
  BOOST_TEST(o.bytes_copied_to_host == in_shard[0] * 2 + in_shard[1]);
  for (std::size_t i = 0; i < blocks.size(); ++i) (i % 2 == 0 ? left : right).run([&] { alloc.deallocate(blocks[i]); });
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

// A composite of two tagging parts (segregator over two arenas sharing a backend): the tag is set
// in both, an offload reaches both, and a failure in the second undoes the first.
BOOST_AUTO_TEST_CASE(segregator_of_two_arenas_offloads_both_or_neither) {
  host_vmm backend{{.granularity = granule}};
  switchable_host small_host, large_host;
  using composite = alloy::segregator<4096, shared_arena, shared_arena>;
  composite alloc{shared_arena{alloy::vmm_ref<host_vmm>{backend}, host_options<shared_arena>(small_host)},
                  shared_arena{alloy::vmm_ref<host_vmm>{backend}, host_options<shared_arena>(large_host)}};
  block small, large;
  {
    scoped_tag guard{alloc, tag{2}};
    BOOST_TEST(alloc.small().current_tag().value == 2u);
    BOOST_TEST(alloc.large().current_tag().value == 2u);
    small = alloc.allocate(1000, 8);
    large = alloc.allocate(3 * granule, 256);
  }
  BOOST_TEST(alloc.current_tag().value == 0u);
  fill_pattern(small, 1);
  fill_pattern(large, 2);
  BOOST_TEST(alloc.small().live_bytes(tag{2}) == 1000u);
  BOOST_TEST(alloc.large().live_bytes(tag{2}) == 3 * granule);
  const std::size_t physical = backend.physical_bytes();
  large_host.failing = true;
  BOOST_TEST(alloc.offload(tag{2}) == offload_status::host_out_of_memory);
  BOOST_TEST(alloc.state(tag{2}) == tag_state::resident);
  BOOST_TEST(backend.physical_bytes() == physical);
  BOOST_TEST(has_pattern(small, 1));
  BOOST_TEST(has_pattern(large, 2));
  large_host.failing = false;
  BOOST_TEST(alloc.offload(tag{2}) == offload_status::done);
  BOOST_TEST(alloc.host_bytes(tag{2}) == 1000u + 3 * granule);
  BOOST_TEST(alloc.offload_stats().bytes_on_host == 1000u + 3 * granule);
  BOOST_TEST(alloc.allocate(10, 8, tag{2}).ptr == nullptr);
  BOOST_TEST(alloc.restore(tag{2}) == offload_status::done);
  BOOST_TEST(has_pattern(small, 1));
  BOOST_TEST(has_pattern(large, 2));
  alloc.deallocate(small);
  alloc.deallocate(large);
}

/// Two threads, and a block of `bytes` with tag `t` from each (so one in each shard), filled with
/// patterns 1 and 2; `first` is the thread of shard 0, which `restore` and `offload_all` reach
/// first, `second` the other.
template <class Shards>
struct a_block_in_each_shard {
  a_block_in_each_shard(Shards& alloc, std::size_t bytes, tag t) {
    left.run([&] { a = alloc.allocate(bytes, 256, t); });
    right.run([&] { b = alloc.allocate(bytes, 256, t); });
    BOOST_REQUIRE(a);
    BOOST_REQUIRE(b);
    fill_pattern(a, 1);
    fill_pattern(b, 2);
    const bool left_is_first = alloc.with_shard(0, [&](auto& s) { return s.owns(a); });
    BOOST_REQUIRE(alloc.with_shard(left_is_first ? 1 : 0, [&](auto& s) { return s.owns(b); }));
    first = left_is_first ? &left : &right;
    second = left_is_first ? &right : &left;
  }
  /// `restore(t)` completes the tag: apart no more, both blocks intact, a request of it from `w`
  /// served.
  void restore_serves(Shards& alloc, tag t, worker& w) {
    BOOST_TEST(alloc.restore(t) == offload_status::done);
    BOOST_TEST(!alloc.tag_apart(t));
    BOOST_TEST(has_pattern(a, 1));
    BOOST_TEST(has_pattern(b, 2));
    block again{};
    w.run([&] { again = alloc.allocate(100, 8, t); });
    BOOST_REQUIRE(again);
    w.run([&] { alloc.deallocate(again); });
  }
  /// Allocations shard `i` refused for a tag not resident there.
  static std::size_t refused_in(Shards& alloc, std::size_t i) {
    return alloc.with_shard(i, [](auto& s) { return s.offload_stats().num_refused_allocations; });
  }
  void free(Shards& alloc) {
    left.run([&] { alloc.deallocate(a); });
    right.run([&] { alloc.deallocate(b); });
  }
  worker left, right;
  block a, b;  // from left, from right
  worker* first = nullptr;
  worker* second = nullptr;
};

// sharded: a restore that stops halfway (the device full after the first shard's part) leaves the
// shards holding the tag apart. The tag is then not resident, and a request of it fails, also one
// from the thread whose shard holds it resident (it would otherwise be served there), tagged or
// through the current tag; other tags are served; once the restore completes, the tag is served
// again. Discarding a tag in every shard and restoring it keeps the refusal to the shards' own.
BOOST_AUTO_TEST_CASE(sharded_refuses_a_tag_its_shards_hold_apart) {
  host_vmm backend{{.capacity = 8 * granule, .granularity = granule}};
  using shards = alloy::sharded<shared_arena>;
  shards alloc{[&](std::size_t) { return shared_arena{alloy::vmm_ref<host_vmm>{backend}}; }, {.shards = 2}};
  a_block_in_each_shard<shards> blocks(alloc, 2 * granule, tag{3});
  worker &first = *blocks.first, &second = *blocks.second;

  BOOST_TEST(alloc.offload(tag{3}) == offload_status::done);
  BOOST_TEST(backend.physical_bytes() == 0u);
  block filler;
  second.run([&] { filler = alloc.allocate(5 * granule, 256, tag{1}); });  // 3 granules left
  BOOST_REQUIRE(filler);
  BOOST_TEST(alloc.restore(tag{3}) == offload_status::device_out_of_memory);  // shard 0's 2, not shard 1's
  BOOST_TEST(alloc.with_shard(0, [](auto& s) { return s.state(tag{3}); }) == tag_state::resident);
  BOOST_TEST(alloc.with_shard(1, [](auto& s) { return s.state(tag{3}); }) == tag_state::offloaded);
  BOOST_TEST(alloc.state(tag{3}) == tag_state::offloaded);
  BOOST_TEST(alloc.tag_apart(tag{3}));
  BOOST_TEST(!alloc.tag_apart(tag{1}));
  const std::size_t in_use = alloc.bytes_in_use();
  const auto refused_in = [&](std::size_t i) { return blocks.refused_in(alloc, i); };
  const std::size_t refused_before[2] = {refused_in(0), refused_in(1)};
  block refused{}, refused_plain{}, other{};
  first.run([&] {
    refused = alloc.allocate(100, 8, tag{3});  // shard 0 holds tag 3 resident and has room
    scoped_tag guard{alloc, tag{3}};
    refused_plain = alloc.allocate(100, 8);
  });
  BOOST_TEST(refused.ptr == nullptr);
  BOOST_TEST(refused_plain.ptr == nullptr);
  BOOST_TEST(alloc.bytes_in_use() == in_use);
  BOOST_TEST(refused_in(0) == refused_before[0]);
  BOOST_TEST(refused_in(1) == refused_before[1] + 2);  // counted once each, where tag 3 is offloaded
  first.run([&] { other = alloc.allocate(100, 8, tag{1}); });
  BOOST_REQUIRE(other);

  second.run([&] { alloc.deallocate(filler); });
  blocks.restore_serves(alloc, tag{3}, first);

  // Apart no more: a tag discarded in every shard is refused by the shards themselves (the
  // thread's shard, then the other: each counts it).
  const std::size_t refused_all = alloc.offload_stats().num_refused_allocations;
  BOOST_TEST(alloc.discard(tag{3}) == offload_status::done);
  BOOST_TEST(!alloc.tag_apart(tag{3}));
  first.run([&] { refused = alloc.allocate(100, 8, tag{3}); });
  BOOST_TEST(refused.ptr == nullptr);
  BOOST_TEST(alloc.offload_stats().num_refused_allocations == refused_all + 2);
  BOOST_TEST(alloc.restore(tag{3}) == offload_status::done);
  blocks.free(alloc);
  first.run([&] { alloc.deallocate(other); });
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

// sharded: `offload_all` stopping at shard 1 (its host copy fails) leaves tag 3 offloaded in
// shard 0 and resident in shard 1: apart, so a request of it from shard 1's thread fails; the
// restore completes shard 0 and the tag is served again.
BOOST_AUTO_TEST_CASE(sharded_offload_all_that_stops_halfway_leaves_the_tag_refused) {
  host_vmm backend{{.granularity = granule}};
  switchable_host hosts[2];
  using shards = alloy::sharded<shared_arena>;
  shards alloc = two_shards_with_hosts(backend, hosts);
  a_block_in_each_shard<shards> blocks(alloc, granule, tag{3});
  worker& second = *blocks.second;

  hosts[1].failing = true;
  BOOST_TEST(alloc.offload_all() == offload_status::host_out_of_memory);
  BOOST_TEST(alloc.with_shard(0, [](auto& s) { return s.state(tag{3}); }) == tag_state::offloaded);
  BOOST_TEST(alloc.with_shard(1, [](auto& s) { return s.state(tag{3}); }) == tag_state::resident);
  BOOST_TEST(alloc.tag_apart(tag{3}));
  const std::size_t refused_before = blocks.refused_in(alloc, 0);
  block refused{};
  second.run([&] { refused = alloc.allocate(100, 8, tag{3}); });  // shard 1 holds it resident
  BOOST_TEST(refused.ptr == nullptr);
  BOOST_TEST(blocks.refused_in(alloc, 0) == refused_before + 1);  // shard 0, which holds it offloaded

  hosts[1].failing = false;
  blocks.restore_serves(alloc, tag{3}, second);
  blocks.free(alloc);
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

// Parts apart (here one restored by hand; after a failed undo or a restore that stopped halfway
// in general): the composite's tag is not resident, so a request of it fails, also one that would
// reach the part holding it resident (found by compositions_fuzz); once restored, it is served.
BOOST_AUTO_TEST_CASE(a_tag_resident_in_one_part_only_takes_nothing) {
  host_vmm backend{{.granularity = granule}};
  using composite = alloy::segregator<4096, shared_arena, shared_arena>;
  composite alloc{shared_arena{alloy::vmm_ref<host_vmm>{backend}}, shared_arena{alloy::vmm_ref<host_vmm>{backend}}};
  const block small = alloc.allocate(1000, 8, tag{2}), large = alloc.allocate(3 * granule, 256, tag{2});
  BOOST_REQUIRE(small);
  BOOST_REQUIRE(large);
  fill_pattern(small, 1);
  BOOST_TEST(alloc.offload(tag{2}) == offload_status::done);
  BOOST_TEST(alloc.small().restore(tag{2}) == offload_status::done);
  BOOST_TEST(alloc.small().state(tag{2}) == tag_state::resident);
  BOOST_TEST(alloc.state(tag{2}) == tag_state::offloaded);
  const std::size_t refused = alloc.large().offload_stats().num_refused_allocations;
  BOOST_TEST(alloc.allocate(100, 8, tag{2}).ptr == nullptr);  // the small part alone would serve it
  {
    scoped_tag guard{alloc, tag{2}};
    BOOST_TEST(alloc.allocate(100, 8).ptr == nullptr);
  }
  // Both counted once, by the part that holds the tag offloaded.
  BOOST_TEST(alloc.large().offload_stats().num_refused_allocations == refused + 2);
  BOOST_TEST(alloc.offload_stats().num_refused_allocations == refused + 2);
  const block other = alloc.allocate(100, 8, tag{1});  // other tags are served
  BOOST_REQUIRE(other);
  BOOST_TEST(alloc.restore(tag{2}) == offload_status::done);
  BOOST_TEST(has_pattern(small, 1));
  const block again = alloc.allocate(100, 8, tag{2});
  BOOST_REQUIRE(again);
  for (const block& b : {small, large, other, again}) alloc.deallocate(b);
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

// A std::pmr container built inside a scoped_tag on the decorated allocator under the resource:
// tagged from outside, offloaded and restored through the decorators with the same data pointer
// and content; the decorator's figures exact (memory_stats, memory_summary).
BOOST_AUTO_TEST_CASE(a_pmr_vector_is_tagged_through_the_decorators) {
  using va = alloy::virtual_allocator<host_vmm>;
  alloy::synchronized<alloy::stats<va>> alloc{alloy::stats<va>{va{host_vmm{{.granularity = granule}}}}};
  alloy::pmr_resource resource{alloc};
  std::vector<std::uint32_t> expected;
  {
    scoped_tag guard{alloc, tag{7}};  // on the decorated allocator: reaches virtual_allocator
    std::pmr::vector<std::uint32_t> weights{&resource};
    for (std::uint32_t i = 0; i < 100000; ++i) weights.push_back(i * 2654435761u);
    expected.assign(weights.begin(), weights.end());
    const auto& arena = alloc.inner().inner().arena();
    BOOST_TEST(arena.live_bytes(tag{7}) == weights.capacity() * sizeof(std::uint32_t));
    BOOST_TEST(alloc.bytes_in_use() == weights.capacity() * sizeof(std::uint32_t));
    const std::uint32_t* before = weights.data();
    const std::size_t mapped = arena.mapped_bytes(tag{7});
    BOOST_TEST(alloc.offload(tag{7}) == offload_status::done);
    BOOST_TEST(arena.mapped_bytes(tag{7}) == 0u);
    alloc.with_lock([&](auto& s) {
      const auto m = alloy::memory_stats(s);
      BOOST_TEST(m.at("reserved_bytes.all.current") == static_cast<std::int64_t>(s.inner().reserved_bytes()));
      BOOST_TEST(alloy::detail::virtual_memory_of(s).offloaded_bytes == arena.offloaded_bytes());
      BOOST_TEST(alloy::memory_summary(s).find("Offloaded blocks") != std::string::npos);
      BOOST_TEST(s.statistics().bytes_reclaimed == mapped);
    });
    BOOST_TEST(alloc.restore(tag{7}) == offload_status::done);
    BOOST_TEST(weights.data() == before);
    BOOST_TEST((std::vector<std::uint32_t>(weights.begin(), weights.end()) == expected));
  }
  BOOST_TEST(alloc.current_tag().value == 0u);
  BOOST_TEST(alloc.bytes_in_use() == 0u);
}

// Tagged allocations through a stack of counting decorators and a ref: each counts them exactly
// as plain ones (tracked's outstanding blocks, the quantizer's requested bytes, the arena's
// rounded chunks), scoped_tag on the outermost object reaches the arena, and the per-tag figures
// and offload pass through every layer.
BOOST_AUTO_TEST_CASE(decorator_stack_counts_tagged_blocks_as_plain_ones) {
  using arena_t = alloy::virtual_arena<host_vmm>;
  arena_t heap{host_vmm{{.granularity = granule}}, {.release_threshold = 0}};
  alloy::tracked<alloy::quantizer<alloy::ref<arena_t>, 4096>> stack{
      alloy::quantizer<alloy::ref<arena_t>, 4096>{alloy::ref<arena_t>{heap}}};
  std::vector<block> blocks;
  std::mt19937_64 rng{9};
  std::size_t requested[3] = {};
  for (std::size_t i = 0; i < 60; ++i) {
    const auto t = static_cast<std::uint16_t>(i % 3);
    const std::size_t bytes = 1 + rng() % 20000;
    block b;
    if (i % 2 == 0) {
      b = stack.allocate(bytes, 64, tag{t});
    } else {
      scoped_tag guard{stack, tag{t}};
      BOOST_TEST(heap.current_tag().value == t);
      b = stack.allocate(bytes, 64);
    }
    BOOST_REQUIRE(b);
    BOOST_TEST(b.size == bytes);
    fill_pattern(b, 300 + i);
    blocks.push_back(b);
    requested[t] += bytes;
  }
  BOOST_TEST(heap.current_tag().value == 0u);
  BOOST_TEST(stack.outstanding_count() == 60u);
  BOOST_TEST(stack.outstanding_bytes() == requested[0] + requested[1] + requested[2]);
  BOOST_TEST(stack.requested_bytes() == requested[0] + requested[1] + requested[2]);
  for (std::uint16_t t = 0; t < 3; ++t) {
    // The arena sees the quantizer's rounded sizes.
    std::size_t rounded = 0;
    for (std::size_t i = t; i < 60; i += 3) rounded += (blocks[i].size + 4095) / 4096 * 4096;
    BOOST_TEST(stack.live_bytes(tag{t}) == rounded);
  }
  const std::size_t mapped = stack.mapped_bytes(tag{1});
  const std::size_t physical = heap.reserved_bytes();
  BOOST_TEST(stack.offload(tag{1}) == offload_status::done);
  BOOST_TEST(heap.reserved_bytes() == physical - mapped);
  BOOST_TEST(stack.outstanding_count() == 60u);  // still the caller's
  BOOST_TEST(stack.allocate(10, 8, tag{1}).ptr == nullptr);
  BOOST_TEST(stack.outstanding_count() == 60u);
  BOOST_TEST(stack.offload_all() == offload_status::done);  // tags 0 and 2
  BOOST_TEST(heap.reserved_bytes() == 0u);
  for (std::uint16_t t = 0; t < 3; ++t) BOOST_TEST(stack.restore(tag{t}) == offload_status::done);
  for (std::size_t i = 0; i < blocks.size(); ++i) BOOST_TEST(has_pattern(blocks[i], 300 + i));
  for (const block& b : blocks) stack.deallocate(b);
  BOOST_TEST(stack.outstanding_count() == 0u);
  BOOST_TEST(stack.unknown_frees() == 0u);
  BOOST_TEST(heap.bytes_in_use() == 0u);
  const alloy::offload_statistics o = stack.offload_stats();
  BOOST_TEST(o.num_offloads == 3u);
  BOOST_TEST(o.num_full_reclaims == 1u);
  BOOST_TEST(o.num_single_reclaims == 1u);
  BOOST_TEST(o.num_refused_allocations == 1u);
}

// stream_ordered over a virtual arena: its stream-ordered calls allocate through the arena's
// keeping-cache call, which takes the current tag, so scoped_tag on the stream_ordered object
// tags them (there is no per-call tag there; the capability matrix records it), and offload and
// restore pass through.
BOOST_AUTO_TEST_CASE(stream_ordered_allocations_are_tagged_by_scoped_tag) {
  using arena_t = alloy::virtual_arena<host_vmm>;
  alloy::host_stream stream;
  alloy::stream_ordered<arena_t, alloy::host_stream*> ordered{
      arena_t{host_vmm{{.granularity = granule}}, {.release_threshold = 0}}};
  block weights;
  {
    scoped_tag guard{ordered, tag{4}};
    weights = ordered.allocate(3 * granule, 256, &stream);
  }
  BOOST_REQUIRE(weights);
  const block other = ordered.allocate(granule, 256, &stream);  // tag 0
  BOOST_REQUIRE(other);
  stream.synchronize();
  fill_pattern(weights, 77);
  BOOST_TEST(ordered.live_bytes(tag{4}) == 3 * granule);
  BOOST_TEST(ordered.mapped_bytes(tag{4}) == 3 * granule);
  BOOST_TEST(ordered.offload(tag{4}) == offload_status::done);
  BOOST_TEST(ordered.reserved_bytes() == granule);
  BOOST_TEST(ordered.restore(tag{4}) == offload_status::done);
  BOOST_TEST(has_pattern(weights, 77));
  ordered.deallocate(weights, &stream);
  ordered.deallocate(other, &stream);
  stream.synchronize();
}
