// SPDX-License-Identifier: Apache-2.0
// test/support/failing_vmm.hpp: a virtual-memory backend that fails chosen calls, for tests.
//
// `failing_vmm<V>` owns a backend `V` (host_vmm by default) and forwards every call to it, except
// that `create`, `map` and `reserve` calls fail (an empty result or false, the backend untouched)
// at chosen call numbers: every such call is numbered, 0-based, in one sequence over the kinds
// selected in `options::kinds`; calls numbered in `fail_at` fail, and every call from `fail_from`
// on. The options and the counts are shared by copies (as `failing_upstream`'s), so a test can
// change them while an arena owns the backend.
#pragma once

#include <cstddef>
#include <memory>
#include <set>
#include <utility>

#include <alloy/vmm/host_vmm.hpp>
#include <alloy/vmm/virtual_memory.hpp>

namespace alloy::testing {

template <virtual_memory V = host_vmm>
class failing_vmm {
 public:
  static constexpr bool host_accessible = V::host_accessible;
  static constexpr bool device_accessible = V::device_accessible;

  enum kind : unsigned { creates = 1, maps = 2, reserves = 4, all = 7 };

  struct options {
    std::set<std::size_t> fail_at{};
    std::size_t fail_from = static_cast<std::size_t>(-1);
    unsigned kinds = all;  ///< which calls are numbered (and may fail)
  };

  explicit failing_vmm(V backend, options opts = {})
      : backend_(std::move(backend)), options_(std::make_shared<options>(std::move(opts))) {}

  std::size_t granularity() const noexcept { return backend_.granularity(); }
  std::size_t capacity() const noexcept { return backend_.capacity(); }
  std::size_t physical_bytes() const noexcept { return backend_.physical_bytes(); }

  address_range reserve(std::size_t bytes) noexcept {
    if (should_fail(reserves)) return {};
    return backend_.reserve(bytes);
  }
  void unreserve(address_range range) noexcept { backend_.unreserve(range); }
  physical_memory create(std::size_t bytes) noexcept {
    if (should_fail(creates)) return {};
    return backend_.create(bytes);
  }
  void release(physical_memory piece) noexcept { backend_.release(piece); }
  bool map(void* at, physical_memory piece) noexcept {
    if (should_fail(maps)) return false;
    return backend_.map(at, piece);
  }
  void unmap(void* at, std::size_t bytes) noexcept { backend_.unmap(at, bytes); }

  /// Changes which calls fail from now on (numbering goes on).
  void set_options(options opts) { *options_ = std::move(opts); }
  /// Numbered calls so far, and how many of them failed.
  std::size_t calls() const noexcept { return *calls_; }
  std::size_t failures() const noexcept { return *failures_; }
  V& backend() noexcept { return backend_; }
  const V& backend() const noexcept { return backend_; }

 private:
  bool should_fail(kind k) noexcept {
    if ((options_->kinds & k) == 0) return false;
    const std::size_t call = (*calls_)++;
    if (call >= options_->fail_from || options_->fail_at.count(call) != 0) {
      ++*failures_;
      return true;
    }
    return false;
  }

  V backend_;
  std::shared_ptr<options> options_;
  std::shared_ptr<std::size_t> calls_ = std::make_shared<std::size_t>(0);
  std::shared_ptr<std::size_t> failures_ = std::make_shared<std::size_t>(0);
};

}  // namespace alloy::testing
