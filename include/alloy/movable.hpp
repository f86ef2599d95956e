// alloy/movable.hpp: movable memory (DESIGN §4): handles, their table, the copy engine that moves
// and spills them, the counters of the movable policies, and the RAII `movable_buffer<A>`.
//
// Raw pointers never move. Memory that may be spilled to host or compacted is asked for as a
// handle, after `GlobalAlloc(GMEM_MOVEABLE)` / `GlobalLock`:
//
//   alloy::handle h = alloc.allocate_movable(bytes);  // resident, unlocked ("inactive")
//   void* p = alloc.lock(h);        // resident on the device and pinned in place ("active")
//   ...                             // p is valid until the matching unlock
//   alloc.unlock(h);                // may now be moved or spilled; p is no longer valid
//   alloc.deallocate(h);
//
// The handle calls are the throwing edge for handles, and every movable policy
// (`host_spill_reclaimer`, `compacting_defragmenter`) follows the same rules:
//
// - `allocate_movable(bytes)` is noexcept and returns an empty handle when the memory cannot be
//   found (out of memory is a normal event). Zero bytes is a valid request (a unique minimal
//   block, `size_of(h) == 0`). Movable blocks are aligned to `movable_alignment` (256 B).
// - `lock(h)` nests (a lock count, like `GlobalLock`): every `lock` needs one `unlock`. It returns
//   the block's address, fixed until the last `unlock`. When the block is spilled and cannot be
//   brought back (out of memory, or a failed copy) it returns nullptr and the block stays as it
//   was, spilled and intact; `lock` may then be tried again.
// - Bad input throws `alloy::logic_error` and changes nothing: a handle that is empty, unknown,
//   or already deallocated (handles carry a generation, so a stale handle is recognised even when
//   its slot was reused), `unlock` of a handle that is not locked, `deallocate` of a locked
//   handle.
// - Content is preserved bit for bit through every move and spill.
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

#if ALLOY_HAS_CUDA
#  include <alloy/detail/cuda.hpp>
#endif

namespace alloy {

/// Alignment of every movable block (what every CUDA allocation call guarantees).
inline constexpr std::size_t movable_alignment = 256;

/// What the movable policies count, with the meanings of IBM Large Model Support's statistics.
/// "Active" = locked movable blocks, "inactive" = unlocked movable blocks resident on the device.
/// Sizes are the sizes callers asked for. `stats<>` reads these (`movable_statistics()`).
struct movable_counters {
  std::size_t bytes_active = 0;          ///< now: bytes of locked movable blocks
  std::size_t peak_bytes_active = 0;     ///< peak of bytes_active (reset with reset_movable_peak())
  std::size_t bytes_inactive = 0;        ///< now: bytes of unlocked movable blocks on the device
  std::size_t bytes_spilled = 0;         ///< now: bytes of movable blocks held in host memory
  std::size_t bytes_reclaimed = 0;       ///< total: bytes spilled to host to serve requests
  std::size_t num_single_reclaims = 0;   ///< total: reclaims that spilled one chosen block
  std::size_t num_full_reclaims = 0;     ///< total: reclaims that spilled every unlocked block
  std::size_t num_spills = 0;            ///< total: blocks spilled to host
  std::size_t bytes_restored = 0;        ///< total: bytes brought back to the device by lock
  std::size_t num_restores = 0;          ///< total: blocks brought back to the device by lock
  std::size_t num_defragmentations = 0;  ///< total: defragmentations (hole openings and compact())
  std::size_t bytes_defragged = 0;       ///< total: bytes copied by defragmentation
  std::size_t num_moves = 0;             ///< total: blocks moved by defragmentation

  friend bool operator==(const movable_counters&, const movable_counters&) = default;
};

/// A movable allocator that keeps `movable_counters` (`movable_statistics()`).
template <class A>
concept movable_counting_allocator = movable_allocator<A> && requires(const A& a) {
  { a.movable_statistics() } noexcept -> std::same_as<movable_counters>;
};

/// A movable allocator that can say how big a handle's block is (every alloy movable policy).
template <class A>
concept sized_movable_allocator = movable_allocator<A> && requires(const A& a, handle h) {
  { a.size_of(h) } -> std::convertible_to<std::size_t>;
};

namespace detail {

inline void note_active(movable_counters& c, std::size_t bytes) noexcept {
  c.bytes_active += bytes;
  if (c.bytes_active > c.peak_bytes_active) c.peak_bytes_active = c.bytes_active;
}

/// Slots named by handles. A handle's id is `(generation << 32) | (index + 1)`: never zero, and
/// a slot's generation changes when it is freed, so a stale handle never finds the new tenant.
/// Metadata: one `Entry` plus 8 bytes per slot, slots reused through a free list; O(1) everything.
template <class Entry>
class handle_table {
 public:
  /// Stores `e` and names it; an empty handle when memory for the table runs out.
  handle insert(Entry e) noexcept {
    try {
      std::uint32_t index;
      if (!free_.empty()) {
        index = free_.back();
        free_.pop_back();
      } else {
        if (slots_.size() >= std::numeric_limits<std::uint32_t>::max() - 1) return {};
        slots_.emplace_back();
        index = static_cast<std::uint32_t>(slots_.size() - 1);
      }
      slot& s = slots_[index];
      s.entry = std::move(e);
      s.used = true;
      ++live_;
      return handle{(std::uint64_t{s.generation} << 32) | (std::uint64_t{index} + 1)};
    } catch (...) {
      return {};
    }
  }

  /// The entry `h` names, or nullptr when `h` is empty, unknown or stale.
  Entry* find(handle h) noexcept {
    const std::uint64_t low = h.id & 0xFFFF'FFFFu;
    if (low == 0 || low > slots_.size()) return nullptr;
    slot& s = slots_[low - 1];
    if (!s.used || s.generation != static_cast<std::uint32_t>(h.id >> 32)) return nullptr;
    return &s.entry;
  }
  const Entry* find(handle h) const noexcept { return const_cast<handle_table*>(this)->find(h); }

  /// Forgets `h` (which must be live).
  void erase(handle h) noexcept {
    const std::uint32_t index = static_cast<std::uint32_t>((h.id & 0xFFFF'FFFFu) - 1);
    slot& s = slots_[index];
    s.used = false;
    s.entry = Entry{};
    if (++s.generation == 0) s.generation = 1;
    --live_;
    try {
      free_.push_back(index);
    } catch (...) {  // the slot is simply not reused
    }
  }

  /// Calls `f(handle, Entry&)` for every live entry.
  template <class F>
  void for_each(F&& f) {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].used) f(handle{(std::uint64_t{slots_[i].generation} << 32) | (i + 1)}, slots_[i].entry);
    }
  }
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].used) f(handle{(std::uint64_t{slots_[i].generation} << 32) | (i + 1)}, slots_[i].entry);
    }
  }

  std::size_t size() const noexcept { return live_; }

 private:
  struct slot {
    Entry entry{};
    std::uint32_t generation = 1;
    bool used = false;
  };
  std::vector<slot> slots_;
  std::vector<std::uint32_t> free_;
  std::size_t live_ = 0;
};

/// Finds a live entry or throws the logic error every handle call reports for bad handles.
template <class Table>
auto& entry_or_throw(Table& table, handle h, const char* call,
                     alloy::source_location at = alloy::source_location::current()) {
  auto* e = table.find(h);
  if (e == nullptr) {
    throw logic_error(std::string(call) + " of " + (h ? "an unknown or already deallocated" : "an empty") +
                          " handle (id " + std::to_string(h.id) + ")",
                      at);
  }
  return *e;
}

}  // namespace detail

/// Copies bytes between two allocators' memory, keeping every bit.
///
/// - `copy<DstHost, SrcHost>(dst, src, bytes)`: `std::memcpy` when both sides are host-accessible;
///   otherwise (CUDA builds only) `cudaMemcpyAsync(..., cudaMemcpyDefault, stream)` followed by
///   `cudaStreamSynchronize(stream)`, so the copy is complete when it returns. Without CUDA a
///   copy that needs the device does not compile. The regions must not overlap (the movable
///   policies always copy into a freshly allocated block).
/// - Failure: returns false (a CUDA error is kept in `last_error()`, the runtime's sticky error
///   cleared); the destination's content is then unspecified, the source's untouched.
/// - `options::stream`: the stream copies run on (default: the legacy default stream).
/// - Counts the bytes it copied (`bytes_copied()`). Thread safety: none.
class copy_engine {
 public:
#if ALLOY_HAS_CUDA
  using stream_type = cudaStream_t;
#else
  using stream_type = std::nullptr_t;
#endif

  struct options {
    stream_type stream = nullptr;
  };

  copy_engine() = default;
  explicit copy_engine(options opts) noexcept : stream_(opts.stream) {}

  template <bool DstHost, bool SrcHost>
  bool copy(void* dst, const void* src, std::size_t bytes) noexcept {
    if (bytes == 0) return true;
    if constexpr (DstHost && SrcHost) {
      std::memcpy(dst, src, bytes);
    } else {
#if ALLOY_HAS_CUDA
      cudaError_t status = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_);
      if (status == cudaSuccess) status = cudaStreamSynchronize(stream_);
      if (status != cudaSuccess) {
        cudaGetLastError();
        last_error_ = {status, "cudaMemcpyAsync/cudaStreamSynchronize", __FILE__, __LINE__};
        return false;
      }
#else
      static_assert(DstHost && SrcHost, "alloy: copying device memory needs the CUDA runtime (ALLOY_HAS_CUDA)");
#endif
    }
    bytes_copied_ += bytes;
    return true;
  }

  /// Moves `bytes` from `src` to `dst` within one allocator's memory, the two ranges possibly
  /// overlapping: `std::memmove` on the host; on the device, chunks of `|src - dst|` bytes (no
  /// chunk overlaps its own source) copied front to back when moving down and back to front when
  /// moving up, then one synchronisation. On a failed device copy the content of the block is
  /// lost (the device is then in an unrecoverable state).
  template <bool Host>
  bool move_within(void* dst, const void* src, std::size_t bytes) noexcept {
    if (bytes == 0 || dst == src) return true;
    if constexpr (Host) {
      std::memmove(dst, src, bytes);
    } else {
#if ALLOY_HAS_CUDA
      auto* d = static_cast<char*>(dst);
      const auto* s = static_cast<const char*>(src);
      const bool down = d < s;
      const std::size_t step = down ? static_cast<std::size_t>(s - d) : static_cast<std::size_t>(d - s);
      cudaError_t status = cudaSuccess;
      for (std::size_t done = 0; done < bytes && status == cudaSuccess; done += step) {
        const std::size_t n = bytes - done < step ? bytes - done : step;
        const std::size_t at = down ? done : bytes - done - n;
        status = cudaMemcpyAsync(d + at, s + at, n, cudaMemcpyDefault, stream_);
      }
      if (status == cudaSuccess) status = cudaStreamSynchronize(stream_);
      if (status != cudaSuccess) {
        cudaGetLastError();
        last_error_ = {status, "cudaMemcpyAsync/cudaStreamSynchronize", __FILE__, __LINE__};
        return false;
      }
#else
      static_assert(Host, "alloy: moving device memory needs the CUDA runtime (ALLOY_HAS_CUDA)");
#endif
    }
    bytes_copied_ += bytes;
    return true;
  }

  /// Copies between memory of allocator kinds `To` and `From`.
  template <class To, class From>
  bool copy_between(void* dst, const void* src, std::size_t bytes) noexcept {
    return copy<To::host_accessible, From::host_accessible>(dst, src, bytes);
  }

  std::size_t bytes_copied() const noexcept { return bytes_copied_; }
  stream_type stream() const noexcept { return stream_; }
#if ALLOY_HAS_CUDA
  const cuda_status& last_error() const noexcept { return last_error_; }
#endif

 private:
  stream_type stream_ = nullptr;
  std::size_t bytes_copied_ = 0;
#if ALLOY_HAS_CUDA
  cuda_status last_error_{};
#endif
};

/// A movable block owned by RAII: allocated on construction, deallocated on destruction.
///
///   alloy::movable_buffer buf{alloc, 1_MiB};
///   { auto view = buf.lock(); kernel<<<...>>>(view.data()); }   // unlocked when view dies
///
/// - Construction throws `alloy::out_of_memory` when the allocator cannot serve the request;
///   `lock()` throws it when a spilled block cannot be brought back; the message describes the
///   allocator the buffer refers to (its limit, bytes in use and reserved, largest free block).
///   Bad use of the handle (see the handle rules above) throws `alloy::logic_error` from the
///   allocator, and a refused operation changes nothing: `reset()` or a move assignment while a
///   view is alive throws and the buffer still owns its block.
/// - Views nest (each one is one lock); every view must be gone before its buffer is destroyed
///   (deallocating a locked handle is an error). Buffers and views are move-only.
/// - The allocator must outlive the buffer.
template <movable_allocator A>
class movable_buffer {
 public:
  /// A lock on the buffer: `data()` is valid and fixed while the view lives.
  class view {
   public:
    view() = default;
    view(view&& other) noexcept
        : alloc_(std::exchange(other.alloc_, nullptr)), handle_(other.handle_), data_(other.data_), size_(other.size_) {}
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
    view(A* alloc, handle h, void* data, std::size_t size) noexcept : alloc_(alloc), handle_(h), data_(data), size_(size) {}

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
