// SPDX-License-Identifier: Apache-2.0
// `free_misuse(block)` says what `try_deallocate` would do without freeing anything: a randomized
// model over every engine and the showcase compositions asks it of live, interior, wrong-size,
// freed and foreign blocks, then frees the block and checks that the verdict was right, and that
// the misuse counters moved by the kind it named.
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdio>
#include <random>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/literals.hpp>
#include <alloy/showcase.hpp>
#include <alloy/vmm/host_vmm.hpp>

using namespace alloy::literals;
using alloy::block;
using alloy::misuse;

namespace {

using arena = alloy::best_fit_arena<alloy::host_upstream>;

/// Checked builds print each refused free; thousands of them are expected here, so stderr is
/// closed while a model runs (the verdicts are what the test checks).
class quiet_stderr {
 public:
  quiet_stderr() {
    std::fflush(stderr);
    saved_ = ::dup(2);
    if (FILE* null = std::fopen("/dev/null", "w")) {
      ::dup2(::fileno(null), 2);
      std::fclose(null);
    }
  }
  ~quiet_stderr() {
    std::fflush(stderr);
    if (saved_ >= 0) {
      ::dup2(saved_, 2);
      ::close(saved_);
    }
  }
  quiet_stderr(const quiet_stderr&) = delete;
  quiet_stderr& operator=(const quiet_stderr&) = delete;

 private:
  int saved_ = -1;
};

template <class A>
void run_model(A& a, unsigned seed, std::size_t largest) {
  static_assert(alloy::free_screening_allocator<A>);
  std::mt19937_64 rng(seed);
  const auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
  std::vector<block> live;
  std::vector<block> freed;
  int foreign = 0;
  std::size_t refused = 0;
  std::size_t accepted = 0;
  const quiet_stderr quiet;
  for (int step = 0; step < 6000; ++step) {
    if (pick(10) < 4 && live.size() < 300) {
      const std::size_t bytes = (std::size_t{1} << pick(std::bit_width(largest))) + pick(256);
      const block b = a.allocate(std::min(bytes, largest), pick(8) == 0 ? 4096 : 256);
      if (!b) continue;
      BOOST_REQUIRE(a.free_misuse(b) == misuse::none);
      live.push_back(b);
      continue;
    }
    if (live.empty()) continue;
    const std::size_t i = pick(live.size());
    const block l = live[i];
    block probe = l;
    switch (pick(7)) {
      case 0: probe = l.size >= 512 ? block{static_cast<std::byte*>(l.ptr) + 256, 256} : l; break;
      case 1: probe.size = l.size + 1; break;
      case 2: probe.size = l.size + 8192; break;
      case 3: probe.size = l.size > 1 ? l.size - 1 : 2; break;
      case 4:
        if (!freed.empty()) probe = freed[pick(freed.size())];
        break;
      case 5: probe = block{&foreign, sizeof foreign}; break;
      default: break;  // the block itself
    }
    const misuse predicted = a.free_misuse(probe);
    constexpr bool counts_misuses = requires { a.misuses(); };
    alloy::misuse_counts expected{};
    if constexpr (counts_misuses) {
      expected = a.misuses();
      expected.add(predicted);
    }
    const bool ok = a.try_deallocate(probe);
    BOOST_REQUIRE_MESSAGE(ok == (predicted == misuse::none), "step " << step << ": free_misuse said "
                                                                     << static_cast<int>(predicted) << ", the free "
                                                                     << (ok ? "was accepted" : "was refused"));
    if (!ok) {
      if constexpr (counts_misuses)
        BOOST_REQUIRE_MESSAGE(a.misuses() == expected, "the refusal was counted as another kind");
      ++refused;
      continue;
    }
    // Accepted: it was a live block, at its size (in checked builds, the tests', the quantizer too
    // refuses a wrong size within its rounding).
    const auto found = std::find_if(live.begin(), live.end(), [&](const block& x) { return x.ptr == probe.ptr; });
    BOOST_REQUIRE_MESSAGE(found != live.end(), "step " << step << ": a free of no live block was accepted");
    freed.push_back(*found);
    if (freed.size() > 64) freed.erase(freed.begin());
    live.erase(found);
    ++accepted;
  }
  for (const block b : live) BOOST_REQUIRE(a.try_deallocate(b));
  BOOST_TEST(refused > 500u);
  BOOST_TEST(accepted > 500u);
}

template <class A, class Make>
void over_seeds(Make make, std::size_t largest) {
  for (unsigned seed = 1; seed <= 4; ++seed) {
    BOOST_TEST_CONTEXT("seed " << seed) {
      A a = make();
      run_model(a, seed, largest);
    }
  }
}

alloy::host_vmm::options vmm_options() { return {.capacity = 1_GiB}; }

}  // namespace

BOOST_AUTO_TEST_CASE(best_fit_arena_says_what_it_would_refuse) {
  over_seeds<arena>([] { return arena{}; }, 4_MiB);
}
BOOST_AUTO_TEST_CASE(size_class_pool_says_what_it_would_refuse) {
  using small = alloy::size_class_pool<alloy::host_upstream>;
  over_seeds<small>([] { return small{}; }, 64_KiB);
}
BOOST_AUTO_TEST_CASE(virtual_arena_says_what_it_would_refuse) {
  using varena = alloy::virtual_arena<alloy::host_vmm>;
  over_seeds<varena>([] { return varena{alloy::host_vmm{vmm_options()}}; }, 4_MiB);
}
BOOST_AUTO_TEST_CASE(compositions_say_what_they_would_refuse) {
  using def = alloy::default_allocator<alloy::host_upstream>;
  over_seeds<def>([] { return def{}; }, 4_MiB);
  using caching = alloy::caching_allocator<alloy::host_upstream>;
  over_seeds<caching>([] { return caching{}; }, 12_MiB);
  using virt = alloy::virtual_allocator<alloy::host_vmm>;
  over_seeds<virt>([] { return virt{alloy::host_vmm{vmm_options()}}; }, 4_MiB);
  using both = alloy::fallback<arena, arena>;
  over_seeds<both>([] { return both{}; }, 4_MiB);
  // Two virtual arenas over one backend: a block goes to the part whose range holds it.
  alloy::host_vmm device{vmm_options()};
  using shared_arena = alloy::virtual_arena<alloy::vmm_ref<alloy::host_vmm>>;
  using by_granule = alloy::granule_segregator<256_KiB, shared_arena, shared_arena>;
  over_seeds<by_granule>(
      [&] {
        return by_granule{shared_arena{alloy::vmm_ref<alloy::host_vmm>{device}},
                          shared_arena{alloy::vmm_ref<alloy::host_vmm>{device}}};
      },
      4_MiB);
}
BOOST_AUTO_TEST_CASE(wrappers_pass_the_verdict_on) {
  // The quantizer's verdict on a wrong size within its rounding (refused: the tests' checked build
  // keeps each caller's size) agrees with its free.
  using rounded = alloy::stats<alloy::quantizer<arena, 512>>;
  over_seeds<rounded>([] { return rounded{}; }, 4_MiB);
  using stack = alloy::synchronized<alloy::limited<alloy::tracked<alloy::default_allocator<alloy::host_upstream>>>>;
  over_seeds<stack>([] { return stack{}; }, 4_MiB);
}
