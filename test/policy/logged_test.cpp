// SPDX-License-Identifier: Apache-2.0
// logged<>: RMM's CSV, parsed back to the very operations that were made; conformance.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <alloy/alloy.hpp>
#include <alloy/policy/logged.hpp>
#include <alloy/policy/stats.hpp>

#include "policy/stats_toys.hpp"
#include "support/conformance.hpp"

using namespace alloy::literals;
using alloy::testing::checking_upstream;

namespace {

struct operation {
  std::string action;  // allocate, free, allocate failure
  std::uintptr_t pointer = 0;
  std::size_t size = 0;
  std::uint64_t stream = 0;
  friend bool operator==(const operation&, const operation&) = default;
};

std::ostream& operator<<(std::ostream& os, const operation& op) {
  return os << op.action << " " << std::hex << op.pointer << std::dec << " " << op.size << " " << op.stream;
}

/// Parses an RMM log the way RMM's replay reads it: header, then six comma-separated columns.
std::vector<operation> parse_log(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  BOOST_TEST(line == "Thread,Time,Action,Pointer,Size,Stream");
  std::vector<operation> ops;
  auto is_digits = [](const std::string& t, const char* alphabet) {
    return !t.empty() && t.find_first_not_of(alphabet) == std::string::npos;
  };
  while (std::getline(in, line)) {
    std::vector<std::string> col;
    std::size_t from = 0;
    for (std::size_t comma; (comma = line.find(',', from)) != std::string::npos; from = comma + 1)
      col.push_back(line.substr(from, comma - from));
    col.push_back(line.substr(from));
    BOOST_TEST_REQUIRE(col.size() == 6u, "malformed line: " << line);
    BOOST_TEST(is_digits(col[0], "0123456789"), line);
    const std::string& t = col[1];  // HH:MM:SS.uuuuuu
    BOOST_TEST_REQUIRE(t.size() == 15u, line);
    BOOST_TEST((t[2] == ':' && t[5] == ':' && t[8] == '.'), line);
    BOOST_TEST((is_digits(t.substr(0, 2), "0123456789") && is_digits(t.substr(3, 2), "0123456789") &&
                is_digits(t.substr(6, 2), "0123456789") && is_digits(t.substr(9), "0123456789")),
               line);
    BOOST_TEST(std::stoi(t.substr(0, 2)) < 24);
    BOOST_TEST(std::stoi(t.substr(3, 2)) < 60);
    BOOST_TEST((col[2] == "allocate" || col[2] == "free" || col[2] == "allocate failure"), line);
    BOOST_TEST((col[3] == "(nil)" || (col[3].rfind("0x", 0) == 0 && is_digits(col[3].substr(2), "0123456789abcdef"))),
               line);
    BOOST_TEST(is_digits(col[4], "0123456789"), line);
    BOOST_TEST(is_digits(col[5], "0123456789abcdef"), line);
    operation op;
    op.action = col[2];
    op.pointer = col[3] == "(nil)" ? 0 : static_cast<std::uintptr_t>(std::stoull(col[3], nullptr, 16));
    op.size = std::stoull(col[4]);
    op.stream = std::stoull(col[5], nullptr, 16);
    ops.push_back(op);
  }
  return ops;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(logged_policy)

BOOST_AUTO_TEST_CASE(log_parses_back_to_the_same_operations) {
  std::ostringstream log;
  using arena_t = alloy::testing::toy_arena<checking_upstream>;
  alloy::logged<arena_t> a{arena_t{checking_upstream{}, {.capacity = 64_MiB}}, log};
  std::mt19937_64 rng(5);
  std::vector<operation> expected;
  std::vector<alloy::block> live;
  for (int i = 0; i < 3000; ++i) {
    const bool on_stream = rng() % 3 == 0;
    const int stream = static_cast<int>(rng() % 16);
    if (live.empty() || rng() % 2 == 0) {
      const std::size_t bytes = rng() % 5 == 0 ? 100_MiB : rng() % 200'000;
      const alloy::block b = on_stream ? a.allocate(bytes, 256, stream) : a.allocate(bytes, 256);
      if (b) {
        expected.push_back({"allocate", reinterpret_cast<std::uintptr_t>(b.ptr), bytes,
                            on_stream ? static_cast<std::uint64_t>(stream) : 0});
        live.push_back(b);
      } else {
        expected.push_back({"allocate failure", 0, bytes, on_stream ? static_cast<std::uint64_t>(stream) : 0});
      }
    } else {
      const std::size_t v = rng() % live.size();
      const alloy::block b = live[v];
      live[v] = live.back();
      live.pop_back();
      if (on_stream) {
        a.deallocate(b, stream);
      } else {
        a.deallocate(b);
      }
      expected.push_back({"free", reinterpret_cast<std::uintptr_t>(b.ptr), b.size,
                          on_stream ? static_cast<std::uint64_t>(stream) : 0});
    }
  }
  a.deallocate(alloy::block{});  // not logged
  for (const alloy::block& b : live) {
    a.deallocate(b);
    expected.push_back({"free", reinterpret_cast<std::uintptr_t>(b.ptr), b.size, 0});
  }
  const std::vector<operation> got = parse_log(log.str());
  BOOST_TEST(got.size() == expected.size());
  BOOST_TEST(got == expected, boost::test_tools::per_element());
  bool some_failure = false;
  for (const operation& op : expected) some_failure |= op.action == "allocate failure";
  BOOST_TEST(some_failure, "the workload includes failures");
}

BOOST_AUTO_TEST_CASE(stream_in_hex_and_nil_pointer) {
  std::ostringstream log;
  alloy::logged<alloy::testing::toy_arena<alloy::null_upstream>> a{{}, log};
  BOOST_TEST(!a.allocate(4096, 256, 0xab));
  const std::string text = log.str();
  const std::string last = text.substr(text.rfind('\n', text.size() - 2) + 1);
  BOOST_TEST(last.find(",allocate failure,(nil),4096,ab\n") != std::string::npos, last);
}

BOOST_AUTO_TEST_CASE(log_to_a_file) {
  const auto path =
      std::filesystem::temp_directory_path() / ("alloy_logged_test_" + std::to_string(::getpid()) + ".csv");
  {
    alloy::logged<alloy::host_upstream> a{alloy::host_upstream{}, path.string(), {.flush_every_line = true}};
    const alloy::block b = a.allocate(123, 8);
    a.deallocate(b);
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const auto ops = parse_log(text.str());
  BOOST_REQUIRE(ops.size() == 2u);
  BOOST_TEST(ops[0].action == "allocate");
  BOOST_TEST(ops[1].action == "free");
  BOOST_TEST(ops[0].pointer == ops[1].pointer);
  BOOST_TEST(ops[1].size == 123u);
  std::filesystem::remove(path);
  BOOST_CHECK_THROW(
      (alloy::logged<alloy::host_upstream>{alloy::host_upstream{}, std::string("/nonexistent/dir/x.csv")}),
      alloy::logic_error);
}

BOOST_AUTO_TEST_CASE(capabilities_pass_through) {
  using arena_t = alloy::testing::toy_arena<checking_upstream>;
  using L = alloy::logged<arena_t>;
  static_assert(alloy::owning_allocator<L> && alloy::releasing_allocator<L> && alloy::reserving_allocator<L> &&
                alloy::introspectable_allocator<L> && alloy::counting_allocator<L> &&
                alloy::stream_ordered_allocator<L, int>);
  using P = alloy::logged<alloy::host_upstream>;
  static_assert(!alloy::owning_allocator<P> && !alloy::releasing_allocator<P> && !alloy::reserving_allocator<P>);
  // Under stats<>, the log still sees every call.
  std::ostringstream log;
  alloy::stats<L> s{L{arena_t{}, log}};
  const alloy::block b = s.allocate(10, 8);
  s.deallocate(b);
  BOOST_TEST(parse_log(log.str()).size() == 2u);
}

BOOST_AUTO_TEST_SUITE_END()

namespace recipes {

// The conformance suite writes its logs into a stream that is thrown away.
struct logged_recipe {
  template <class U>
  using type = alloy::logged<U>;
  template <class U>
  static type<U> make(U up) {
    return type<U>{std::move(up), sink()};
  }
  static std::ostream& sink() {
    static std::ofstream null("/dev/null");  // test code: a static is fine here
    return null;
  }
  static alloy::testing::conformance_options options() { return {.max_size = 64_MiB}; }
};

}  // namespace recipes

BOOST_AUTO_TEST_SUITE(logged_conformance)
BOOST_AUTO_TEST_CASE(conformance) { alloy::testing::conformance_suite<recipes::logged_recipe>(); }
BOOST_AUTO_TEST_SUITE_END()
