// SPDX-License-Identifier: Apache-2.0
// cuda_error_slot, the last-error record of the CUDA upstreams: what it keeps (not an
// out-of-memory), copies, and that threads may record, read and clear it at once (the upstreams
// are thread_safe): four threads record failures of their own while two read and one clears;
// every status read must be one thread's record whole, never fields of two (in the ThreadSanitizer
// stage too). Needs the CUDA runtime's headers and library, not a device.
#include <boost/test/unit_test.hpp>

#include <alloy/config.hpp>

#if ALLOY_HAS_CUDA

#  include <array>
#  include <atomic>
#  include <cstring>
#  include <thread>
#  include <vector>

#  include <alloy/detail/cuda.hpp>

#  include "support/sanitizers.hpp"

namespace {

/// The slot with its `record` reachable, as an upstream's failing call reaches it.
struct recording_slot : alloy::detail::cuda_error_slot {
  using cuda_error_slot::record;
};

constexpr std::array<cudaError_t, 4> codes{cudaErrorInvalidValue, cudaErrorInvalidDevicePointer, cudaErrorLaunchFailure,
                                           cudaErrorInvalidDevice};
constexpr std::array<const char*, 4> calls{"call of thread 0", "call of thread 1", "call of thread 2",
                                           "call of thread 3"};
constexpr std::array<const char*, 4> files{"file 0", "file 1", "file 2", "file 3"};

}  // namespace

BOOST_AUTO_TEST_CASE(keeps_the_last_failure_but_no_out_of_memory) {
  recording_slot slot;
  BOOST_TEST(!slot.last_error());
  slot.record(cudaErrorMemoryAllocation, "cudaMalloc(&ptr, bytes)", __FILE__, __LINE__);
  BOOST_TEST(!slot.last_error(), "out of memory is a normal event, not kept");
  const int line = __LINE__;
  slot.record(cudaErrorInvalidValue, "cudaFree(ptr)", "here.cpp", line);
  const alloy::cuda_status kept = slot.last_error();
  BOOST_TEST(static_cast<bool>(kept));
  BOOST_TEST(kept.code == cudaErrorInvalidValue);
  BOOST_TEST(std::strcmp(kept.call, "cudaFree(ptr)") == 0);
  BOOST_TEST(std::strcmp(kept.file, "here.cpp") == 0);
  BOOST_TEST(kept.line == line);
  slot.record(cudaErrorMemoryAllocation, "cudaMalloc(&ptr, bytes)", __FILE__, __LINE__);
  BOOST_TEST(slot.last_error().code == cudaErrorInvalidValue, "an out of memory does not replace a kept failure");

  recording_slot copy = slot;  // upstreams are copied into the parts that use them
  BOOST_TEST(copy.last_error().code == cudaErrorInvalidValue);
  BOOST_TEST(copy.last_error().line == line);
  slot.clear_error();
  BOOST_TEST(!slot.last_error());
  BOOST_TEST(static_cast<bool>(copy.last_error()), "the copy keeps its own record");
  copy = slot;
  BOOST_TEST(!copy.last_error());
}

BOOST_AUTO_TEST_CASE(threads_record_read_and_clear_at_once) {
  // Writers go on until the readers have read this often (and have each recorded this often).
  constexpr std::size_t enough_reads = alloy::testing::under_tsan ? 20'000 : 400'000;
  constexpr int least_records = alloy::testing::under_tsan ? 2'000 : 20'000;
  recording_slot slot;
  std::atomic<int> writers_left{4};
  std::atomic<std::size_t> torn{0}, seen_records{0}, reads{0};
  std::array<int, 4> last_line{};
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        const auto i = static_cast<std::size_t>(t);
        int n = 1;
        for (; n <= least_records || reads.load(std::memory_order_relaxed) < enough_reads; ++n) {
          slot.record(codes[i], calls[i], files[i], n);
        }
        last_line[i] = n - 1;
        writers_left.fetch_sub(1);
      });
    }
    auto reader = [&](bool clears) {
      std::size_t count = 0;
      while (writers_left.load() != 0) {
        const alloy::cuda_status s = slot.last_error();
        ++count;
        reads.fetch_add(1, std::memory_order_relaxed);
        if (!s) {
          if (s.call != nullptr || s.file != nullptr || s.line != 0) torn.fetch_add(1);
        } else {
          std::size_t owner = codes.size();
          for (std::size_t i = 0; i < codes.size(); ++i) {
            if (s.code == codes[i]) owner = i;
          }
          if (owner == codes.size() || s.call != calls[owner] || s.file != files[owner] || s.line < 1) {
            torn.fetch_add(1);
          } else {
            seen_records.fetch_add(1);
          }
        }
        if (clears && count % 64 == 0) slot.clear_error();
      }
    };
    threads.emplace_back(reader, false);
    threads.emplace_back(reader, false);
    threads.emplace_back(reader, true);
  }
  BOOST_TEST_MESSAGE("  " << reads.load() << " reads, " << seen_records.load() << " of them a record");
  BOOST_TEST(torn.load() == 0u, "a read saw fields of two records (or of a record and a clear)");
  BOOST_TEST(reads.load() >= enough_reads);
  BOOST_TEST(seen_records.load() > 0u);
  const alloy::cuda_status last = slot.last_error();  // one writer's last record, or cleared
  if (last) {
    bool whole = false;
    for (std::size_t i = 0; i < codes.size(); ++i) {
      whole = whole || (last.code == codes[i] && last.call == calls[i] && last.line == last_line[i]);
    }
    BOOST_TEST(whole, "the slot ends with a writer's last record");
  }
}

#else

BOOST_AUTO_TEST_CASE(cuda_error_slot_needs_the_cuda_runtime,
                     *boost::unit_test::precondition([](boost::unit_test::test_unit_id) {
                       boost::test_tools::assertion_result r(false);
                       r.message() << "built without the CUDA runtime (ALLOY_HAS_CUDA is 0)";
                       return r;
                     })) {}

#endif
