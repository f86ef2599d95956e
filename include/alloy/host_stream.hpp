// SPDX-License-Identifier: Apache-2.0
// alloy/host_stream.hpp
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include <alloy/stream.hpp>

namespace alloy {

/// `host_stream`: an in-order queue of work run by its own thread, with events: a CUDA stream's
/// ordering semantics on the host, so stream-ordered allocation is tested for real without a GPU
/// (a host "kernel" enqueued on a stream may still be writing to a block the host thread has
/// already freed, exactly as on a device).
///
/// - `enqueue(f)` appends `f` (a `void()` callable that must not throw) and returns at once;
///   tasks run one at a time, in order, on the stream's thread. `synchronize()` blocks until every
///   task enqueued before it has run. `pending()` counts tasks not yet finished.
/// - The stream type of the allocation calls is `host_stream*` (as `cudaStream_t` is a pointer),
///   with `stream_traits<host_stream*>`: `host_event`s are recorded by enqueueing a task that
///   marks them done; `wait` enqueues a task that blocks the stream (not the host) until done.
/// - Thread safety: every member may be called from any thread.
/// - Destruction runs the tasks still queued, then joins the thread. Not copyable or movable.
class host_stream {
 public:
  host_stream() : worker_([this] { run(); }) {}
  host_stream(const host_stream&) = delete;
  host_stream& operator=(const host_stream&) = delete;
  ~host_stream() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_ready_.notify_one();
    worker_.join();
  }

  /// Throws `std::bad_alloc` if the task cannot be stored; nothing is enqueued then.
  template <class F>
  void enqueue(F&& task) {
    {
      std::lock_guard lock(mutex_);
      queue_.emplace_back(std::forward<F>(task));
      ++enqueued_;
    }
    work_ready_.notify_one();
  }

  void synchronize() noexcept {
    std::unique_lock lock(mutex_);
    const std::size_t target = enqueued_;
    drained_.wait(lock, [&] { return finished_ >= target; });
  }

  std::size_t pending() const noexcept {
    std::lock_guard lock(mutex_);
    return enqueued_ - finished_;
  }

 private:
  void run() noexcept {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything ran
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      task = nullptr;  // whatever the task owned goes before it counts as finished
      lock.lock();
      ++finished_;
      drained_.notify_all();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable drained_;
  std::deque<std::function<void()>> queue_;
  std::size_t enqueued_ = 0;
  std::size_t finished_ = 0;
  bool stopping_ = false;
  std::thread worker_;  // last: starts after everything it reads is constructed
};

/// A point in a `host_stream`'s work. A default-constructed event, or one whose recording failed,
/// is done.
class host_event {
 public:
  host_event() = default;

  bool done() const noexcept {
    if (!state_) return true;
    std::lock_guard lock(state_->mutex);
    return state_->done;
  }
  void wait() const noexcept {
    if (!state_) return;
    std::unique_lock lock(state_->mutex);
    state_->signalled.wait(lock, [&] { return state_->done; });
  }

 private:
  friend struct stream_traits<host_stream*>;
  struct state {
    std::mutex mutex;
    std::condition_variable signalled;
    bool done = false;
  };
  std::shared_ptr<state> state_;
};

template <>
struct stream_traits<host_stream*> {
  using event_type = host_event;

  static bool create(host_event&) noexcept { return true; }
  static void destroy(host_event& e) noexcept { e = host_event{}; }
  static bool record(host_event& e, host_stream* s) noexcept {
    try {
      auto fresh = std::make_shared<host_event::state>();  // earlier waits keep the old state
      s->enqueue([fresh] {
        {
          std::lock_guard lock(fresh->mutex);
          fresh->done = true;
        }
        fresh->signalled.notify_all();
      });
      e.state_ = std::move(fresh);
      return true;
    } catch (const std::bad_alloc&) {
      return false;
    }
  }
  static bool wait(host_stream* s, const host_event& e) noexcept {
    try {
      s->enqueue([e] { e.wait(); });
      return true;
    } catch (const std::bad_alloc&) {
      return false;
    }
  }
  static bool ready(const host_event& e) noexcept { return e.done(); }
  static void synchronize(const host_event& e) noexcept { e.wait(); }
  static void synchronize(host_stream* s) noexcept { s->synchronize(); }
  // A host stream is never captured (`capturable_stream`, so the capture-aware paths run).
  static capture_state capture(host_stream*) noexcept { return {}; }
  static bool wait_external(host_stream* s, const host_event& e) noexcept { return wait(s, e); }
};

}  // namespace alloy
