// SPDX-License-Identifier: Apache-2.0
// alloy/movable/buffer.hpp: the RAII movable_buffer<A> and its views.
// (Part of alloy/movable.hpp, which includes every part; the handle rules are there.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <alloy/concepts.hpp>
#include <alloy/config.hpp>
#include <alloy/detail/edge.hpp>
#include <alloy/error.hpp>
#include <alloy/movable/counters.hpp>

namespace alloy {
template <movable_allocator A>
class movable_buffer {
 public:
  /// A lock on the buffer: `data()` is valid and fixed while the view lives.
  class view {
   public:
    view() = default;
    view(view&& other) noexcept
        : alloc_(std::exchange(other.alloc_, nullptr)),
          handle_(other.handle_),
          data_(other.data_),
          size_(other.size_) {}
    view& operator=(view&& other) noexcept {
      if (this != &other) {
        reset();
        alloc_ = std::exchange(other.alloc_, nullptr);
        handle_ = other.handle_;
        data_ = other.data_;
        size_ = other.size_;
      }
      return *this;
    }
    ~view() { reset(); }

    void* data() const noexcept { return data_; }
    template <class T>
    T* as() const noexcept {
      return static_cast<T*>(data_);
    }
    std::size_t size() const noexcept { return size_; }
    explicit operator bool() const noexcept { return alloc_ != nullptr; }

    /// Unlocks now (the view becomes empty).
    void reset() noexcept {
      if (alloc_ != nullptr) {
        try {
          alloc_->unlock(handle_);
        } catch (...) {  // cannot happen for a view made by lock(): it holds one lock
        }
        alloc_ = nullptr;
        data_ = nullptr;
      }
    }

   private:
    friend class movable_buffer;
    view(A* alloc, handle h, void* data, std::size_t size) noexcept
        : alloc_(alloc), handle_(h), data_(data), size_(size) {}

    A* alloc_ = nullptr;
    handle handle_{};
    void* data_ = nullptr;
    std::size_t size_ = 0;
  };

  movable_buffer(A& alloc, std::size_t bytes) : alloc_(&alloc), handle_(alloc.allocate_movable(bytes)), size_(bytes) {
    if (!handle_) throw_out_of_memory(bytes);
  }
  movable_buffer(movable_buffer&& other) noexcept
      : alloc_(other.alloc_), handle_(std::exchange(other.handle_, handle{})), size_(other.size_) {}
  movable_buffer& operator=(movable_buffer&& other) {
    if (this != &other) {
      reset();  // throws, changing nothing, while a view of this buffer is alive
      alloc_ = other.alloc_;
      handle_ = std::exchange(other.handle_, handle{});
      size_ = other.size_;
    }
    return *this;
  }
  ~movable_buffer() {
    if (handle_) alloc_->deallocate(handle_);
  }

  /// Locks the block: resident and fixed in place until the view is destroyed.
  [[nodiscard]] view lock() {
    void* p = alloc_->lock(handle_);
    if (p == nullptr) throw_out_of_memory(size_);
    return view(alloc_, handle_, p, size_);
  }

  /// Deallocates now. While a view is alive the allocator refuses (`alloy::logic_error`) and the
  /// buffer keeps its block: the handle is given up only once the deallocation succeeded.
  void reset() {
    if (handle_) {
      alloc_->deallocate(handle_);
      handle_ = handle{};
    }
  }
  /// Gives up ownership: the caller deallocates the returned handle.
  handle release() noexcept { return std::exchange(handle_, handle{}); }

  handle get() const noexcept { return handle_; }
  std::size_t size() const noexcept { return size_; }
  A& allocator() const noexcept { return *alloc_; }
  explicit operator bool() const noexcept { return static_cast<bool>(handle_); }

 private:
  [[noreturn]] void throw_out_of_memory(std::size_t bytes) const {
    throw out_of_memory(detail::make_oom_report(*alloc_, bytes, movable_alignment));
  }

  A* alloc_;
  handle handle_;
  std::size_t size_;
};

}  // namespace alloy
