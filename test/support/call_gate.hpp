// SPDX-License-Identifier: Apache-2.0
// test/support/call_gate.hpp: holds one call of a test backend or upstream until the test lets it
// go, so that a test can see what other threads do meanwhile.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace alloy::testing {

/// While armed, the next `pass()` (called by the gated function, from any thread) blocks once,
/// until `let_go()`; `wait_inside` tells the test that a caller is held there.
class call_gate {
 public:
  void arm() {
    std::lock_guard lock(mutex_);
    armed_ = true;
    inside_ = open_ = false;
  }
  /// Whether a caller reached the gate within `limit`.
  bool wait_inside(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return inside_; });
  }
  void let_go() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    changed_.notify_all();
  }
  /// Called by the gated function: returns at once unless armed; else holds until `let_go()`.
  void pass() {
    std::unique_lock lock(mutex_);
    if (!armed_) return;
    armed_ = false;
    inside_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool armed_ = false, inside_ = false, open_ = false;
};

}  // namespace alloy::testing
