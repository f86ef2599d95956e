// SPDX-License-Identifier: Apache-2.0
// The vocabulary: block, literals, concepts, ref, find, errors.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <string>

#include <alloy/alloy.hpp>

#include "support/checking_upstream.hpp"

using namespace alloy::literals;

namespace {
struct not_an_allocator {};
struct throwing_allocate {  // allocate is not noexcept: not an allocator
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  alloy::block allocate(std::size_t, std::size_t) { return {}; }
  void deallocate(alloy::block) noexcept {}
};
struct no_memory_kind {
  alloy::block allocate(std::size_t, std::size_t) noexcept { return {}; }
  void deallocate(alloy::block) noexcept {}
};
}  // namespace

BOOST_AUTO_TEST_SUITE(core)

BOOST_AUTO_TEST_CASE(block_is_empty_exactly_when_its_pointer_is_null) {
  BOOST_TEST(!alloy::block{});
  int x = 0;
  BOOST_TEST(static_cast<bool>(alloy::block{&x, 0}));
  BOOST_TEST((alloy::block{&x, 4} == alloy::block{&x, 4}));
  BOOST_TEST((alloy::block{&x, 4} != alloy::block{&x, 8}));
}

BOOST_AUTO_TEST_CASE(literals) {
  static_assert(1_KiB == 1024 && 3_MiB == 3u * 1024 * 1024 && 2_GiB == std::size_t{2} << 30);
  BOOST_TEST(64_MiB == std::size_t{64} << 20);
}

BOOST_AUTO_TEST_CASE(concepts_detect_capabilities) {
  static_assert(alloy::allocator<alloy::host_upstream>);
  static_assert(!alloy::allocator<not_an_allocator>);
  static_assert(!alloy::allocator<throwing_allocate>);
  static_assert(!alloy::allocator<no_memory_kind>);
  static_assert(!alloy::owning_allocator<alloy::host_upstream>);
  static_assert(alloy::owning_allocator<alloy::null_upstream>);
  static_assert(alloy::owning_allocator<alloy::limited<alloy::null_upstream>>);
  static_assert(!alloy::owning_allocator<alloy::limited<alloy::host_upstream>>);
  static_assert(!alloy::releasing_allocator<alloy::synchronized<alloy::host_upstream>>);
  static_assert(alloy::host_upstream::host_accessible && !alloy::host_upstream::device_accessible);
  // fallback's memory kind is what both parts share.
  using mixed = alloy::fallback<alloy::null_upstream, alloy::host_upstream>;
  static_assert(mixed::host_accessible && !mixed::device_accessible);
#if ALLOY_HAS_CUDA
  static_assert(alloy::stream_ordered_allocator<alloy::cuda_async_upstream, cudaStream_t>);
  static_assert(alloy::stream_ordered_allocator<alloy::limited<alloy::cuda_async_upstream>, cudaStream_t>);
  static_assert(!alloy::stream_ordered_allocator<alloy::cuda_malloc_upstream, cudaStream_t>);
  static_assert(!alloy::cuda_malloc_upstream::host_accessible && alloy::cuda_malloc_upstream::device_accessible);
  static_assert(alloy::pinned_host_upstream::host_accessible && alloy::managed_upstream::device_accessible);
#endif
}

BOOST_AUTO_TEST_CASE(ref_shares_one_allocator) {
  alloy::limited<alloy::testing::checking_upstream> shared;
  alloy::ref first{shared};
  alloy::ref second{shared};
  const alloy::block a = first.allocate(100, 16);
  const alloy::block b = second.allocate(50, 16);
  BOOST_TEST(shared.bytes_in_use() == 150u);
  BOOST_TEST(first.owns(b));  // ref passes on owns because checking_upstream has it
  second.deallocate(a);
  first.deallocate(b);
  BOOST_TEST(shared.bytes_in_use() == 0u);
  BOOST_TEST((first == second));
  BOOST_TEST(&first.get() == &shared);
}

// ref has exactly the capabilities of what it refers to: counters, introspection and handles.
BOOST_AUTO_TEST_CASE(ref_passes_on_every_capability) {
  using arena = alloy::best_fit_arena<alloy::host_upstream>;
  using movable = alloy::compacting_defragmenter<arena>;
  movable shared{arena{alloy::host_upstream{}, {.initial_size = 1_MiB, .maximum_size = 1_MiB}}};
  alloy::ref r{shared};
  static_assert(alloy::counting_allocator<decltype(r)>);
  static_assert(alloy::introspectable_allocator<decltype(r)>);
  static_assert(alloy::releasing_allocator<decltype(r)>);
  static_assert(alloy::movable_allocator<decltype(r)>);
  static_assert(!alloy::movable_allocator<alloy::ref<arena>>);
  const alloy::handle h = r.allocate_movable(4096);
  BOOST_REQUIRE(h);
  BOOST_TEST(r.size_of(h) == 4096u);
  void* p = r.lock(h);
  BOOST_TEST(p != nullptr);
  BOOST_TEST(r.movable_statistics().bytes_active == 4096u);
  r.unlock(h);
  std::size_t pieces = 0;
  r.for_each_block([&](const alloy::block_info&) { ++pieces; });
  BOOST_TEST(pieces == 2u, "the movable block and the free rest of the segment");
  BOOST_TEST(r.counters().num_device_alloc == 1u);
  r.deallocate(h);
  r.release();
  BOOST_TEST(r.counters().num_device_free == 1u);
}

BOOST_AUTO_TEST_CASE(find_reaches_parts_by_type) {
  using inner = alloy::limited<alloy::testing::checking_upstream>;
  using composition = alloy::synchronized<alloy::fallback<alloy::null_upstream, inner>>;
  composition alloc;
  static_assert(alloy::has_part<inner, composition>);
  static_assert(alloy::has_part<alloy::null_upstream, composition>);
  static_assert(!alloy::has_part<alloy::host_upstream, composition>);
  inner& found = alloy::find<inner>(alloc);
  BOOST_TEST(&found == &alloc.inner().secondary());
  BOOST_TEST(&alloy::find<alloy::testing::checking_upstream>(alloc) == &alloc.inner().secondary().inner());
  BOOST_TEST(&alloy::find<alloy::limited>(alloc) == &found);  // by template
  BOOST_TEST(&alloy::find<composition>(alloc) == &alloc);     // a composition contains itself
  const auto& const_alloc = alloc;
  BOOST_TEST(&alloy::find<alloy::null_upstream>(const_alloc) == &alloc.inner().primary());
}

BOOST_AUTO_TEST_CASE(out_of_memory_explains_itself) {
  const alloy::out_of_memory oom(alloy::oom_report{.requested = 3_GiB,
                                                   .alignment = 256,
                                                   .limit = 8_GiB,
                                                   .in_use = 6_GiB,
                                                   .reserved = 7_GiB,
                                                   .largest_free_block = 512_MiB,
                                                   .fragmentation = 0.5});
  const std::string what = oom.what();
  BOOST_TEST(what.find("tried to allocate 3.00 GiB") != std::string::npos, what);
  BOOST_TEST(what.find("limit 8.00 GiB") != std::string::npos, what);
  BOOST_TEST(what.find("in use 6.00 GiB") != std::string::npos, what);
  BOOST_TEST(what.find("reserved 7.00 GiB") != std::string::npos, what);
  BOOST_TEST(what.find("largest free block 512.00 MiB") != std::string::npos, what);
  BOOST_TEST(what.find("fragmentation 50.0%") != std::string::npos, what);
  const std::bad_alloc& as_bad_alloc = oom;  // catchable as std::bad_alloc
  BOOST_TEST(std::strcmp(as_bad_alloc.what(), oom.what()) == 0);
}

BOOST_AUTO_TEST_CASE(logic_error_names_file_and_line) {
  const alloy::logic_error error("double free");
  const std::string what = error.what();
  BOOST_TEST(what.find("double free") != std::string::npos);
  BOOST_TEST(what.find("core_test.cpp:") != std::string::npos, what);
  const std::logic_error& base = error;
  BOOST_TEST(std::string(base.what()) == what);
}

BOOST_AUTO_TEST_CASE(cuda_error_names_call_file_and_line) {
  const alloy::cuda_error error(2, "cudaErrorMemoryAllocation", "cudaMalloc(&p, n)", "x.cpp", 42);
  BOOST_TEST(std::string(error.what()) ==
             "alloy: CUDA call cudaMalloc(&p, n) failed with cudaErrorMemoryAllocation (2) at x.cpp:42");
  BOOST_TEST(error.code() == 2);
}

BOOST_AUTO_TEST_SUITE_END()
