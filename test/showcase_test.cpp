// SPDX-License-Identifier: Apache-2.0
// The ready-made compositions of alloy/showcase.hpp: layout, conformance, a model-based randomized
// test, and every shipped trace replayed through both with nothing leaked.
#include <boost/test/unit_test.hpp>

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <alloy/find.hpp>
#include <alloy/showcase.hpp>

#include "replay/rmm_trace.hpp"
#include "support/conformance.hpp"

using namespace alloy::literals;
using alloy::testing::checking_upstream;

namespace recipes {

struct caching {
  template <class U>
  using type = alloy::caching_allocator<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up)};
  }
  // Sizes up to 12 MiB reach all three ranges; fewer operations keep the pattern fills cheap (the
  // model-based test below does many more, with patterns on the ends of blocks only).
  static alloy::testing::conformance_options options() {
    return {.max_size = 64_MiB, .random_ops = 3'000, .random_max_size = 12_MiB};
  }
};

struct caching_max_split {
  template <class U>
  using type = alloy::caching_allocator<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up), {.max_split_size = 4_MiB}};
  }
  // Sizes up to 12 MiB reach all three ranges; fewer operations keep the pattern fills cheap (the
  // model-based test below does many more, with patterns on the ends of blocks only).
  static alloy::testing::conformance_options options() {
    return {.max_size = 64_MiB, .random_ops = 3'000, .random_max_size = 12_MiB};
  }
};

struct default_alloc {
  template <class U>
  using type = alloy::default_allocator<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up)};
  }
};

}  // namespace recipes

namespace {

/// Address space from mmap (never touched, so traces with gigabytes live cost nothing), with the
/// checks of a checking upstream: sized deallocation of blocks it handed out, nothing left live.
class virtual_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  struct ledger {
    std::map<void*, std::size_t> live;
    std::size_t errors = 0;
    std::size_t reserved = 0;
  };
  virtual_upstream() : ledger_(std::make_shared<ledger>()) {}
  alloy::block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (!alloy::detail::is_power_of_two(alignment) || alignment > 4096 || bytes > (std::size_t{1} << 44)) return {};
    void* p = mmap(nullptr, bytes == 0 ? 1 : bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) return {};
    ledger_->live.emplace(p, bytes);
    ledger_->reserved += bytes;
    return {p, bytes};
  }
  void deallocate(alloy::block b) noexcept {
    const auto found = ledger_->live.find(b.ptr);
    if (found == ledger_->live.end() || found->second != b.size) {
      ++ledger_->errors;
      return;
    }
    munmap(b.ptr, b.size == 0 ? 1 : b.size);
    ledger_->reserved -= b.size;
    ledger_->live.erase(found);
  }
  const std::shared_ptr<ledger>& records() const noexcept { return ledger_; }

 private:
  std::shared_ptr<ledger> ledger_;
};

std::vector<std::filesystem::path> trace_files() {
  std::vector<std::filesystem::path> files;
  for (const char* dir : {"pytorch", "minimalloc"}) {
    const std::filesystem::path d = std::filesystem::path(ALLOY_TRACE_DIR) / dir;
    if (!std::filesystem::is_directory(d)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(d)) {
      if (entry.path().filename().string().find(".rmm.csv") != std::string::npos) files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

template <class A>
void replay_trace(const alloy::bench::rmm_trace& t) {
  virtual_upstream up;
  const auto records = up.records();
  {
    A a{up};
    std::vector<alloy::block> blocks(t.allocations);
    std::size_t failed = 0, live = 0;
    for (const auto& e : t.events) {
      if (e.action == alloy::bench::trace_action::allocate) {
        const alloy::block b = a.allocate(e.size, 256);
        if (!b) {
          ++failed;
          continue;
        }
        BOOST_REQUIRE(alloy::detail::is_aligned(b.ptr, 256));
        blocks[e.allocation] = b;
        live += e.size;
      } else if (e.action == alloy::bench::trace_action::free) {
        if (!blocks[e.allocation]) continue;
        live -= blocks[e.allocation].size;
        a.deallocate(blocks[e.allocation]);
        blocks[e.allocation] = {};
      }
      if (a.reserved_bytes() < live) BOOST_FAIL("reserved below live");
    }
    BOOST_TEST(failed == 0u, t.name << ": " << failed << " requests failed");
    for (const alloy::block& b : blocks) {
      if (b) a.deallocate(b);
    }
    BOOST_TEST(a.bytes_in_use() == 0u, t.name);
    BOOST_TEST(a.requested_bytes() == 0u, t.name);
    BOOST_TEST(alloy::find<alloy::size_class_pool>(a).misuse_count() == 0u);
    a.release();
    BOOST_TEST(a.reserved_bytes() == 0u, t.name);
    BOOST_TEST(records->live.empty(), t.name << ": upstream blocks left after release()");
  }
  BOOST_TEST(records->live.empty(), t.name << ": leaked");
  BOOST_TEST(records->errors == 0u, t.name << ": bad deallocations at the upstream");
}

constexpr std::size_t stripe = 64;
void stamp(alloy::block b, std::uint64_t id) {
  if (b.size <= 2 * stripe) return alloy::testing::fill_pattern(b, id);
  alloy::testing::fill_pattern({b.ptr, stripe}, id);
  alloy::testing::fill_pattern({static_cast<char*>(b.ptr) + b.size - stripe, stripe}, ~id);
}
bool stamped(alloy::block b, std::uint64_t id) {
  if (b.size <= 2 * stripe) return alloy::testing::has_pattern(b, id);
  return alloy::testing::has_pattern({b.ptr, stripe}, id) &&
         alloy::testing::has_pattern({static_cast<char*>(b.ptr) + b.size - stripe, stripe}, ~id);
}

template <class A>
void model_based(std::uint64_t seed) {
  checking_upstream up;
  const auto records = up.records();
  {
    A a{up};
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> log_size(0.0, std::log2(32.0 * 1024 * 1024));
    std::map<const char*, alloy::testing::live_block> live;
    std::vector<const char*> order;
    std::uint64_t next_id = 1;
    std::size_t requested = 0;
    for (std::size_t op = 0; op < 200'000; ++op) {
      const bool grow = order.empty() || (order.size() < 200 && rng() % 2 == 0);
      if (grow) {
        const std::size_t bytes = static_cast<std::size_t>(std::exp2(log_size(rng))) - 1;
        const std::size_t alignment = std::size_t{1} << (rng() % 13);
        const alloy::block b = a.allocate(bytes, alignment);
        BOOST_REQUIRE(b);
        BOOST_REQUIRE(b.size == bytes);
        BOOST_REQUIRE(alloy::detail::is_aligned(b.ptr, alignment));
        const char* p = static_cast<const char*>(b.ptr);
        const auto next = live.lower_bound(p);
        BOOST_REQUIRE((next == live.end() || p + std::max<std::size_t>(bytes, 1) <= next->first));
        if (next != live.begin()) {
          const auto prev = std::prev(next);
          BOOST_REQUIRE(prev->first + std::max<std::size_t>(prev->second.b.size, 1) <= p);
        }
        stamp(b, next_id);
        live.emplace(p, alloy::testing::live_block{b, next_id++, alignment});
        order.push_back(p);
        requested += bytes;
      } else {
        const std::size_t victim = rng() % order.size();
        const auto it = live.find(order[victim]);
        BOOST_REQUIRE(stamped(it->second.b, it->second.id));
        a.deallocate(it->second.b);
        requested -= it->second.b.size;
        live.erase(it);
        order[victim] = order.back();
        order.pop_back();
      }
      if (op % 10'000 == 0) {
        BOOST_TEST(a.requested_bytes() == requested);
        BOOST_TEST(a.reserved_bytes() == records->live_bytes);
        BOOST_TEST(a.reserved_bytes() >= a.bytes_in_use());
        a.release();
        BOOST_TEST(a.reserved_bytes() == records->live_bytes);
      }
    }
    for (const auto& [p, l] : live) {
      BOOST_TEST(stamped(l.b, l.id));
      a.deallocate(l.b);
    }
    BOOST_TEST(a.bytes_in_use() == 0u);
    a.release();
    BOOST_TEST(a.reserved_bytes() == 0u);
    BOOST_TEST(records->live_count() == 0u);
  }
  BOOST_TEST(records->live_count() == 0u);
  BOOST_TEST(records->errors.empty());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(showcase)

using all_recipes = std::tuple<recipes::caching, recipes::default_alloc>;

BOOST_AUTO_TEST_CASE_TEMPLATE(conformance, Recipe, all_recipes) { alloy::testing::conformance_suite<Recipe>(); }

BOOST_AUTO_TEST_CASE(conformance_caching_max_split) {
  alloy::testing::conformance_suite_checked<recipes::caching_max_split>();
}

BOOST_AUTO_TEST_CASE(caching_allocator_layout) {
  using caching = alloy::caching_allocator<checking_upstream>;
  static_assert(caching::threshold == 1_MiB);
  static_assert(std::remove_cvref_t<decltype(std::declval<caching&>().large())>::threshold == 10_MiB - 1);
  static_assert(alloy::owning_allocator<caching> && alloy::releasing_allocator<caching> &&
                alloy::reserving_allocator<caching> && alloy::counting_allocator<caching> &&
                alloy::introspectable_allocator<caching>);
  caching a;
  auto& small = a.small();
  auto& mid = a.large().small();
  auto& huge = a.large().large();
  const alloy::block s1 = a.allocate(1_MiB, 256);  // small pool: a 2 MiB slab
  BOOST_REQUIRE(s1);
  BOOST_TEST(small.reserved_bytes() == 2_MiB);
  BOOST_TEST(small.class_size(small.class_index(1_MiB)) == 1_MiB);
  const alloy::block s2 = a.allocate(300, 256);  // rounded to 512 (kMinBlockSize)
  BOOST_REQUIRE(s2);
  BOOST_TEST(small.bytes_in_use() == 1_MiB + 512);
  const alloy::block m1 = a.allocate(1_MiB + 1, 256);  // 20 MiB segment
  BOOST_REQUIRE(m1);
  BOOST_TEST(mid.reserved_bytes() == 20_MiB);
  const alloy::block m2 = a.allocate(10_MiB - 1, 256);  // still the 20 MiB segment
  BOOST_REQUIRE(m2);
  BOOST_TEST(mid.reserved_bytes() == 20_MiB);
  const alloy::block h1 = a.allocate(10_MiB, 256);  // its own segment of exactly 10 MiB
  BOOST_REQUIRE(h1);
  BOOST_TEST(huge.reserved_bytes() == 10_MiB);
  const alloy::block h2 = a.allocate(11_MiB + 5, 256);  // rounded to 12 MiB
  BOOST_REQUIRE(h2);
  BOOST_TEST(huge.reserved_bytes() == 22_MiB);
  BOOST_TEST(h2.size == 11_MiB + 5);
  BOOST_TEST(a.requested_bytes() == 1_MiB + 300 + 1_MiB + 1 + 10_MiB - 1 + 10_MiB + 11_MiB + 5);
  a.deallocate(h2);
  const alloy::block h3 = a.allocate(12_MiB, 256);  // reuses the cached 12 MiB chunk
  BOOST_REQUIRE(h3);
  BOOST_TEST(huge.reserved_bytes() == 22_MiB);
  for (const alloy::block& b : {s1, s2, m1, m2, h1, h3}) a.deallocate(b);
  BOOST_TEST(a.bytes_in_use() == 0u);
  BOOST_TEST(a.requested_bytes() == 0u);
  a.release();
  BOOST_TEST(a.reserved_bytes() == 0u);
  BOOST_TEST(alloy::find<checking_upstream>(a).records()->live_count() == 0u);
}

BOOST_AUTO_TEST_CASE(default_allocator_layout) {
  using alloc_t = alloy::default_allocator<checking_upstream>;
  static_assert(alloc_t::threshold == 64_KiB);
  alloc_t a;
  const alloy::block s = a.allocate(64_KiB, 256);
  const alloy::block l = a.allocate(64_KiB + 1, 256);
  BOOST_REQUIRE(s);
  BOOST_REQUIRE(l);
  BOOST_TEST(a.small().owns(s));
  BOOST_TEST(a.large().owns(l));
  BOOST_TEST(a.small().reserved_bytes() == 64_KiB, "first slabs are 64 KiB");
  const alloy::block aligned = a.allocate(64_KiB, 4096);  // alignment slack fits the 128 KiB classes
  BOOST_REQUIRE(aligned);
  BOOST_TEST(alloy::detail::is_aligned(aligned.ptr, 4096));
  for (const alloy::block& b : {s, l, aligned}) a.deallocate(b);
  a.release();
  BOOST_TEST(a.reserved_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(model_based_randomized) {
  model_based<alloy::caching_allocator<checking_upstream>>(31);
  model_based<alloy::default_allocator<checking_upstream>>(32);
}

BOOST_AUTO_TEST_CASE(every_shipped_trace_replays_without_leaks) {
  const auto files = trace_files();
  if (files.empty()) {
    BOOST_TEST_MESSAGE("skipped: no traces in " ALLOY_TRACE_DIR);
    return;
  }
  for (const auto& file : files) {
    const alloy::bench::rmm_trace t = alloy::bench::read_rmm_trace(file.string());
    replay_trace<alloy::caching_allocator<virtual_upstream>>(t);
    replay_trace<alloy::default_allocator<virtual_upstream>>(t);
  }
  BOOST_TEST(files.size() >= 15u);
}

BOOST_AUTO_TEST_SUITE_END()
