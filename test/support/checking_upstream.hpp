// SPDX-License-Identifier: Apache-2.0
// test/support/checking_upstream.hpp: a host upstream that validates every call it receives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <alloy/block.hpp>
#include <alloy/detail/align.hpp>

namespace alloy::testing {

/// What a checking upstream saw. Shared (through a shared_ptr) by every copy of the upstream so a
/// test can still read it after the composition holding the upstream is gone.
struct ledger {
  struct allocation {
    std::size_t size;
    std::size_t alignment;
  };
  std::map<const void*, allocation> live;
  std::vector<std::string> errors;  // every misuse seen: foreign pointer, wrong size, ...
  std::size_t allocations = 0;      // successful allocate calls
  std::size_t deallocations = 0;    // deallocate calls of non-empty blocks
  std::size_t live_bytes = 0;
  std::size_t peak_live_bytes = 0;

  std::size_t live_count() const noexcept { return live.size(); }
};

/// A host upstream (real memory, `std::aligned_alloc`) that checks sized deallocation: every
/// freed block must be one it handed out, with the very size it was handed out with. It checks
/// the alignment of what it returns too, and knows what it owns.
class checking_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;

  checking_upstream() : ledger_(std::make_shared<ledger>()) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (!detail::is_power_of_two(alignment)) return {};
    const std::size_t effective = alignment < alignof(std::max_align_t) ? alignof(std::max_align_t) : alignment;
    const std::size_t rounded = detail::round_up(bytes == 0 ? 1 : bytes, effective);
    if (rounded == 0) return {};
    void* p = std::aligned_alloc(effective, rounded);
    if (p == nullptr) return {};
    if (!detail::is_aligned(p, alignment)) ledger_->errors.push_back("aligned_alloc returned a misaligned pointer");
    ledger_->live.emplace(p, ledger::allocation{bytes, alignment});
    ++ledger_->allocations;
    ledger_->live_bytes += bytes;
    if (ledger_->live_bytes > ledger_->peak_live_bytes) ledger_->peak_live_bytes = ledger_->live_bytes;
    return {p, bytes};
  }

  void deallocate(block b) noexcept {
    if (!b) return;
    const auto found = ledger_->live.find(b.ptr);
    if (found == ledger_->live.end()) {
      ledger_->errors.push_back("deallocate of a pointer this upstream does not own");
      return;
    }
    if (found->second.size != b.size) {
      ledger_->errors.push_back("deallocate with size " + std::to_string(b.size) + " of a block allocated with " +
                                std::to_string(found->second.size));
    }
    ledger_->live_bytes -= found->second.size;
    ledger_->live.erase(found);
    ++ledger_->deallocations;
    std::free(b.ptr);
  }

  bool owns(block b) const noexcept { return ledger_->live.count(b.ptr) != 0; }

  const std::shared_ptr<ledger>& records() const noexcept { return ledger_; }

 private:
  std::shared_ptr<ledger> ledger_;
};

/// A checking upstream that fails (returns an empty block) at chosen calls: the call numbers in
/// `fail_at` (0-based, counting every allocate call), and every call from `fail_from` on.
class failing_upstream {
 public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;

  struct options {
    std::set<std::size_t> fail_at{};
    std::size_t fail_from = static_cast<std::size_t>(-1);
  };

  failing_upstream() = default;
  explicit failing_upstream(options opts) : options_(std::make_shared<options>(std::move(opts))) {}

  block allocate(std::size_t bytes, std::size_t alignment) noexcept {
    const std::size_t call = (*calls_)++;
    if (call >= options_->fail_from || options_->fail_at.count(call) != 0) {
      ++*failures_;
      return {};
    }
    return checked_.allocate(bytes, alignment);
  }
  void deallocate(block b) noexcept { checked_.deallocate(b); }
  bool owns(block b) const noexcept { return checked_.owns(b); }

  /// Changes which calls fail from now on (shared by every copy).
  void set_options(options opts) { *options_ = std::move(opts); }
  std::size_t calls() const noexcept { return *calls_; }
  std::size_t failures() const noexcept { return *failures_; }
  const std::shared_ptr<ledger>& records() const noexcept { return checked_.records(); }

 private:
  checking_upstream checked_{};
  std::shared_ptr<options> options_ = std::make_shared<options>();
  std::shared_ptr<std::size_t> calls_ = std::make_shared<std::size_t>(0);
  std::shared_ptr<std::size_t> failures_ = std::make_shared<std::size_t>(0);
};

}  // namespace alloy::testing
