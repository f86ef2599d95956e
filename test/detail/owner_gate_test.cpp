// SPDX-License-Identifier: Apache-2.0
// The owner's way past sharded's shard locks, in both its forms (the fence pair where the
// platform has it, the compare-exchange elsewhere): a closer waits while the owner is inside, and
// an owner racing three closers over a plain counter loses no increment (run under
// ThreadSanitizer too, where a missing happens-before edge is a reported race).
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <alloy/detail/owner_gate.hpp>

using alloy::detail::owner_gate;

namespace {

std::vector<bool> modes() {
  std::vector<bool> m{false};
  if (alloy::detail::asymmetric_fences()) m.push_back(true);
  else BOOST_TEST_MESSAGE("no membarrier here: only the compare-exchange form is tested");
  return m;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_owner_alone_always_enters) {
  for (const bool fenced : modes()) {
    owner_gate g(fenced);
    for (int i = 0; i < 1000; ++i) {
      BOOST_TEST_REQUIRE(g.enter());
      g.leave();
    }
  }
}

BOOST_AUTO_TEST_CASE(a_closer_waits_for_the_owner_to_leave_and_the_gate_stays_shut) {
  for (const bool fenced : modes()) {
    owner_gate g(fenced);
    BOOST_TEST_REQUIRE(g.enter());
    std::atomic<bool> closed{false};
    std::thread closer([&] {
      g.close();
      closed.store(true);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    BOOST_TEST(!closed.load());  // the owner is still inside
    g.leave();
    closer.join();
    BOOST_TEST(closed.load());
    BOOST_TEST(!g.enter());  // shut for good: the owner takes the mutex from now on
    g.close();               // a second close returns at once
  }
}

BOOST_AUTO_TEST_CASE(an_owner_racing_three_closers_loses_no_increment) {
  constexpr int owner_turns = 200000, closer_turns = 20000, closers = 3;
  for (const bool fenced : modes()) {
    for (int round = 0; round < 4; ++round) {
      owner_gate g(fenced);
      std::mutex m;
      long counter = 0;  // plain: only the gate or the mutex keeps the increments apart
      int through_gate = 0, through_mutex = 0;
      std::atomic<bool> go{false};
      std::thread owner([&] {
        for (int i = 0; i < owner_turns; ++i) {
          if (i == owner_turns / 8 * (round + 1)) go.store(true, std::memory_order_relaxed);
          if (g.enter()) {
            ++counter;
            ++through_gate;
            g.leave();
          } else {
            const std::lock_guard lock(m);
            ++counter;
            ++through_mutex;
          }
        }
        go.store(true, std::memory_order_relaxed);
      });
      std::vector<std::thread> others;
      for (int t = 0; t < closers; ++t) {
        others.emplace_back([&] {
          while (!go.load(std::memory_order_relaxed)) std::this_thread::yield();
          for (int i = 0; i < closer_turns; ++i) {
            g.close();
            const std::lock_guard lock(m);
            ++counter;
          }
        });
      }
      owner.join();
      for (auto& t : others) t.join();
      BOOST_TEST(counter == long{owner_turns} + long{closers} * closer_turns);
      BOOST_TEST(through_gate + through_mutex == owner_turns);
      BOOST_TEST(through_gate >= owner_turns / 8);  // alone until the others started
      BOOST_TEST(!g.enter());
    }
  }
}
