// SPDX-License-Identifier: Apache-2.0
// host_vmm: real memory behind reserved addresses, pieces that keep their content across maps,
// capacity refusals, holes punched on release (the host really gets the memory back), and failed
// calls that leave the backend as it was.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include <sys/stat.h>

#include <alloy/literals.hpp>
#include <alloy/vmm/host_vmm.hpp>

using namespace alloy::literals;
using alloy::host_vmm;

static_assert(alloy::virtual_memory<host_vmm>);
static_assert(alloy::virtual_memory<alloy::vmm_ref<host_vmm>>);
static_assert(!std::is_copy_constructible_v<host_vmm> && std::is_nothrow_move_constructible_v<host_vmm>);

namespace {

/// Bytes of memory the memfd holds now (allocated 512-byte blocks).
std::size_t file_bytes(const host_vmm& v) {
  struct stat st{};
  BOOST_REQUIRE(::fstat(v.file_descriptor(), &st) == 0);
  return static_cast<std::size_t>(st.st_blocks) * 512;
}

void fill(void* p, std::size_t n, std::uint8_t seed) {
  auto* b = static_cast<std::uint8_t*>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>(i * 31 + seed);
}
bool holds(const void* p, std::size_t n, std::uint8_t seed) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  for (std::size_t i = 0; i < n; ++i)
    if (b[i] != static_cast<std::uint8_t>(i * 31 + seed)) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(host_vmm_suite)

BOOST_AUTO_TEST_CASE(defaults_and_granularity) {
  host_vmm v;
  BOOST_TEST(v.valid());
  BOOST_TEST(v.granularity() == 2_MiB);
  BOOST_TEST(v.capacity() == std::numeric_limits<std::size_t>::max());
  BOOST_TEST(v.physical_bytes() == 0u);
  BOOST_TEST(host_vmm{{.granularity = 1}}.granularity() == 4096u);          // at least a page
  BOOST_TEST(host_vmm{{.granularity = 100_KiB}}.granularity() == 128_KiB);  // a power of two
}

BOOST_AUTO_TEST_CASE(reserve_is_aligned_and_maps_real_memory) {
  host_vmm v{{.granularity = 64_KiB}};
  for (int i = 0; i < 8; ++i) {
    const alloy::address_range r = v.reserve(1_MiB + 1);
    BOOST_REQUIRE(r);
    BOOST_TEST(r.size == 1_MiB + 64_KiB);
    BOOST_TEST(reinterpret_cast<std::uintptr_t>(r.ptr) % 64_KiB == 0u);
    v.unreserve(r);
  }
  const alloy::address_range r = v.reserve(1_MiB);
  const alloy::physical_memory piece = v.create(256_KiB);
  BOOST_REQUIRE(piece);
  BOOST_TEST(piece.size == 256_KiB);
  BOOST_TEST(v.physical_bytes() == 256_KiB);
  void* at = static_cast<char*>(r.ptr) + 512_KiB;
  BOOST_REQUIRE(v.map(at, piece));
  fill(at, piece.size, 7);
  BOOST_TEST(holds(at, piece.size, 7));
  v.unmap(at, piece.size);
  v.release(piece);
  v.unreserve(r);
  BOOST_TEST(v.physical_bytes() == 0u);
  const host_vmm::call_counts c = v.calls();
  BOOST_TEST(c.creates == 1u);
  BOOST_TEST(c.releases == 1u);
  BOOST_TEST(c.maps == 1u);
  BOOST_TEST(c.unmaps == 1u);
  BOOST_TEST(c.reserves == 9u);
  BOOST_TEST(c.unreserves == 9u);
  BOOST_TEST(c.failures == 0u);
}

BOOST_AUTO_TEST_CASE(a_piece_keeps_its_content_across_maps) {
  host_vmm v{{.granularity = 64_KiB}};
  const alloy::address_range first = v.reserve(256_KiB);
  const alloy::address_range second = v.reserve(256_KiB);
  BOOST_REQUIRE(first);
  BOOST_REQUIRE(second);
  const alloy::physical_memory piece = v.create(128_KiB);
  BOOST_REQUIRE(piece);
  BOOST_REQUIRE(v.map(first.ptr, piece));
  fill(first.ptr, piece.size, 42);
  // The same piece mapped at a second place at once: one memory, two addresses.
  void* other = static_cast<char*>(second.ptr) + 128_KiB;
  BOOST_REQUIRE(v.map(other, piece));
  BOOST_TEST(holds(other, piece.size, 42));
  static_cast<std::uint8_t*>(other)[5] = 0xAB;
  BOOST_TEST(static_cast<std::uint8_t*>(first.ptr)[5] == 0xABu);
  static_cast<std::uint8_t*>(other)[5] = static_cast<std::uint8_t>(5 * 31 + 42);
  // Unmapped from both, then mapped again elsewhere: the content is still there.
  v.unmap(first.ptr, piece.size);
  v.unmap(other, piece.size);
  void* again = static_cast<char*>(first.ptr) + 128_KiB;
  BOOST_REQUIRE(v.map(again, piece));
  BOOST_TEST(holds(again, piece.size, 42));
  v.unmap(again, piece.size);
  v.release(piece);
  v.unreserve(first);
  v.unreserve(second);
  BOOST_TEST(v.physical_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(capacity_refuses_and_recycles_offsets) {
  host_vmm v{{.capacity = 256_KiB, .granularity = 64_KiB}};
  alloy::physical_memory pieces[4];
  for (auto& p : pieces) {
    p = v.create(64_KiB);
    BOOST_REQUIRE(p);
  }
  BOOST_TEST(v.physical_bytes() == 256_KiB);
  BOOST_TEST(!v.create(1));  // one byte more is a whole granule more
  BOOST_TEST(v.physical_bytes() == 256_KiB);
  BOOST_TEST(v.calls().failures == 1u);
  v.release(pieces[1]);
  BOOST_TEST(!v.create(128_KiB));
  const alloy::physical_memory again = v.create(1);
  BOOST_REQUIRE(again);
  BOOST_TEST(again.size == 64_KiB);
  BOOST_TEST(again.id == pieces[1].id, "the released range is handed out again");
  pieces[1] = again;
  // Release two neighbours: their offsets merge into one range a two-granule piece can take.
  v.release(pieces[1]);
  v.release(pieces[2]);
  const alloy::physical_memory two = v.create(128_KiB);
  BOOST_REQUIRE(two);
  BOOST_TEST(two.id == pieces[1].id);
  v.release(two);
  v.release(pieces[0]);
  v.release(pieces[3]);
  BOOST_TEST(v.physical_bytes() == 0u);
  // Everything came back: the lowest offsets are used again.
  const alloy::physical_memory fresh = v.create(256_KiB);
  BOOST_REQUIRE(fresh);
  BOOST_TEST(fresh.id == pieces[0].id);
  v.release(fresh);
}

BOOST_AUTO_TEST_CASE(release_punches_the_memory_out_of_the_file) {
  host_vmm v{{.granularity = 2_MiB}};
  const alloy::address_range r = v.reserve(8_MiB);
  BOOST_REQUIRE(r);
  alloy::physical_memory pieces[3];
  for (std::size_t i = 0; i < 3; ++i) {
    pieces[i] = v.create(2_MiB);
    BOOST_REQUIRE(pieces[i]);
    void* at = static_cast<char*>(r.ptr) + i * 2_MiB;
    BOOST_REQUIRE(v.map(at, pieces[i]));
    std::memset(at, static_cast<int>(i + 1), 2_MiB);  // every page touched (a byte value, 1 to 3)
  }
  BOOST_TEST(file_bytes(v) >= 6_MiB, "the file holds the touched pages: " << file_bytes(v));
  v.unmap(static_cast<char*>(r.ptr) + 2_MiB, 2_MiB);
  v.release(pieces[1]);
  BOOST_TEST(file_bytes(v) <= 4_MiB + 64_KiB, "the released piece's pages went back: " << file_bytes(v));
  BOOST_TEST(static_cast<unsigned char*>(r.ptr)[0] == 1u);
  BOOST_TEST(static_cast<unsigned char*>(r.ptr)[4_MiB + 17] == 3u);
  // A piece created on the punched offsets reads zeros (nothing of the old content survives).
  const alloy::physical_memory reused = v.create(2_MiB);
  BOOST_REQUIRE(reused);
  BOOST_TEST(reused.id == pieces[1].id);
  BOOST_REQUIRE(v.map(static_cast<char*>(r.ptr) + 2_MiB, reused));
  BOOST_TEST(static_cast<unsigned char*>(r.ptr)[2_MiB + 100] == 0u);
  for (std::size_t i = 0; i < 3; ++i) v.unmap(static_cast<char*>(r.ptr) + i * 2_MiB, 2_MiB);
  v.release(pieces[0]);
  v.release(reused);
  v.release(pieces[2]);
  BOOST_TEST(file_bytes(v) <= 64_KiB, "every page went back: " << file_bytes(v));
  v.unreserve(r);
}

BOOST_AUTO_TEST_CASE(failed_calls_leave_it_as_it_was) {
  host_vmm v{{.capacity = 1_MiB, .granularity = 64_KiB}};
  BOOST_TEST(!v.reserve(0));
  BOOST_TEST(!v.reserve(std::numeric_limits<std::size_t>::max()));
  BOOST_TEST(!v.reserve(std::numeric_limits<std::size_t>::max() / 2));
  BOOST_TEST(!v.create(0));
  BOOST_TEST(!v.create(std::numeric_limits<std::size_t>::max()));
  BOOST_TEST(!v.create(2_MiB));
  const alloy::physical_memory piece = v.create(64_KiB);
  BOOST_REQUIRE(piece);
  BOOST_TEST(!v.map(nullptr, piece));
  const alloy::address_range r = v.reserve(256_KiB);
  BOOST_REQUIRE(r);
  BOOST_TEST(!v.map(static_cast<char*>(r.ptr) + 1, piece), "a misaligned address is refused");
  BOOST_TEST(!v.map(r.ptr, alloy::physical_memory{}));
  BOOST_TEST(v.calls().failures == 9u);
  BOOST_TEST(v.calls().maps == 0u);
  BOOST_TEST(v.physical_bytes() == 64_KiB);
  // Still fully usable.
  BOOST_REQUIRE(v.map(r.ptr, piece));
  fill(r.ptr, piece.size, 3);
  BOOST_TEST(holds(r.ptr, piece.size, 3));
  v.unmap(r.ptr, piece.size);
  v.release(piece);
  v.unreserve(r);
  BOOST_TEST(v.physical_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(moves_hand_over_the_file) {
  host_vmm a{{.capacity = 512_KiB, .granularity = 64_KiB}};
  const alloy::physical_memory piece = a.create(64_KiB);
  BOOST_REQUIRE(piece);
  host_vmm b = std::move(a);
  BOOST_TEST(!a.valid());
  BOOST_TEST(!a.create(64_KiB), "a moved-from backend creates nothing");
  BOOST_TEST(b.physical_bytes() == 64_KiB);
  BOOST_TEST(b.capacity() == 512_KiB);
  const alloy::address_range r = b.reserve(64_KiB);
  BOOST_REQUIRE(b.map(r.ptr, piece));
  fill(r.ptr, piece.size, 9);
  BOOST_TEST(holds(r.ptr, piece.size, 9));
  b.unmap(r.ptr, piece.size);
  b.release(piece);
  b.unreserve(r);
  BOOST_TEST(b.physical_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(vmm_ref_shares_one_capacity) {
  host_vmm v{{.capacity = 128_KiB, .granularity = 64_KiB}};
  alloy::vmm_ref<host_vmm> one{v}, two{v};
  const alloy::physical_memory a = one.create(64_KiB);
  const alloy::physical_memory b = two.create(64_KiB);
  BOOST_REQUIRE(a);
  BOOST_REQUIRE(b);
  BOOST_TEST(!one.create(64_KiB));
  BOOST_TEST(two.physical_bytes() == 128_KiB);
  BOOST_TEST(one.granularity() == 64_KiB);
  BOOST_TEST((one == alloy::vmm_ref<host_vmm>{v}));
  two.release(a);
  one.release(b);
  BOOST_TEST(v.physical_bytes() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
