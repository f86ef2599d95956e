// SPDX-License-Identifier: Apache-2.0
// alloy::cuda::memory_info and friends, on the host: the error paths for real (no device, or an
// id that does not exist), and the answers when a device is there.
#include <boost/test/unit_test.hpp>

#include <alloy/config.hpp>

#if ALLOY_HAS_CUDA

#  include <string>

#  include <alloy/cuda_info.hpp>

BOOST_AUTO_TEST_SUITE(cuda_info)

BOOST_AUTO_TEST_CASE(clear_errors_for_bad_ids_and_no_device) {
  const int count = alloy::cuda::detail::device_count();
  BOOST_TEST_MESSAGE("CUDA devices here: " << count);
  if (count == 0) {
    // No GPU (or no driver): every question that needs one says so with a cuda_error.
    try {
      alloy::cuda::memory_info(0);
      BOOST_FAIL("memory_info(0) without a device must throw");
    } catch (const alloy::cuda_error& e) {
      const std::string what = e.what();
      BOOST_TEST_MESSAGE(what);
      BOOST_TEST(what.find("no CUDA device") != std::string::npos);
      BOOST_TEST(what.find("cudaGetDeviceCount") != std::string::npos);
    }
    BOOST_CHECK_THROW(alloy::cuda::device_with_most_free_memory(), alloy::cuda_error);
    BOOST_TEST(alloy::cuda::memory_info_all().empty());
  } else {
    const auto all = alloy::cuda::memory_info_all();
    BOOST_TEST(all.size() == static_cast<std::size_t>(count));
    for (const auto& m : all) {
      BOOST_TEST(m.total > 0u);
      BOOST_TEST(m.free <= m.total);
      BOOST_TEST(m.used == m.total - m.free);
    }
    const int best = alloy::cuda::device_with_most_free_memory();
    BOOST_TEST((best >= 0 && best < count));
  }
  for (int bad : {-1, count, count + 7, 1 << 20}) {
    if (count == 0 && bad == 0) continue;
    try {
      alloy::cuda::memory_info(bad);
      BOOST_FAIL("memory_info(" << bad << ") must throw");
    } catch (const alloy::logic_error& e) {
      BOOST_TEST(count > 0, "with devices present, a bad id is a logic_error");
      const std::string what = e.what();
      BOOST_TEST(what.find("invalid CUDA device id " + std::to_string(bad)) != std::string::npos, what);
    } catch (const alloy::cuda_error& e) {
      BOOST_TEST(count == 0, "without a device, any id is a cuda_error: " << e.what());
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

#else

BOOST_AUTO_TEST_CASE(cuda_info_needs_the_cuda_toolkit) { BOOST_TEST_MESSAGE("no CUDA toolkit: nothing to test"); }

#endif
