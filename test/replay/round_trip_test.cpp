// SPDX-License-Identifier: Apache-2.0
// alloy-replay's device and replay loop: the simulated device keeps to its capacity without
// committing memory, and a run logged with `logged<>` and replayed through the same composition
// gives the same statistics as the original run (peaks, upstream calls, failures). Also the
// reports (table, JSON, Markdown, SVG) of such a replay.
#include <boost/test/unit_test.hpp>

#include <alloy/policy/logged.hpp>
#include <alloy/policy/stats.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "replay/compositions.hpp"
#include "replay/report.hpp"
#include "replay/simulated_device.hpp"
#include "replay/trace_reader.hpp"

namespace {

using namespace alloy::literals;
using alloy::replay::simulated_device;

/// A small workload with a live set that sometimes does not fit: sizes log-uniform 256 B .. 8 MiB,
/// frees of random live blocks, a few blocks never freed. Runs it through `a` (alignment 256) and
/// returns the blocks still live.
template <class A>
std::vector<alloy::block> run_workload(A& a, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_size(8.0, 23.0);
  std::vector<alloy::block> live;
  for (int i = 0; i < 6000; ++i) {
    if (!live.empty() && (live.size() > 120 || rng() % 2 == 0)) {
      const std::size_t victim = rng() % live.size();
      a.deallocate(live[victim]);
      live[victim] = live.back();
      live.pop_back();
    } else {
      const auto bytes = i % 97 == 0 ? std::size_t{0} : static_cast<std::size_t>(std::exp2(log_size(rng)));
      if (const alloy::block b = a.allocate(bytes, 256)) live.push_back(b);
    }
  }
  return live;
}

/// Runs the workload through logged<stats<A>> over a fresh device of `capacity`, replays the log
/// through the registry's composition `name` over another, and compares.
template <class A, class Make>
void check_round_trip(const std::string& name, Make make, std::size_t capacity) {
  BOOST_TEST_CONTEXT("composition " << name) {
    std::ostringstream log;
    alloy::statistics original;
    std::size_t log_size = 0;
    {
      simulated_device device(capacity);
      alloy::logged<alloy::stats<A>> a{alloy::stats<A>{make(alloy::replay::upstream_t{device})}, log};
      const std::vector<alloy::block> live = run_workload(a, 20261122);
      original = a.inner().statistics();  // what the original run says at the end of the workload
      a.flush();
      log_size = log.str().size();
      for (const alloy::block& b : live) a.deallocate(b);
    }
    // The trace is the log up to the reading (the frees of the blocks left are not part of it).
    const alloy::bench::rmm_trace trace = alloy::bench::parse_rmm_trace(log.str().substr(0, log_size), "log");
    BOOST_TEST(original.num_ooms > 0u, "the workload should run out of memory sometimes");
    BOOST_TEST(trace.failures == original.num_ooms);
    BOOST_TEST(trace.unfreed > 0u);

    const auto all = alloy::replay::compositions();
    const auto entry = std::find_if(all.begin(), all.end(), [&](const auto& c) { return c.name == name; });
    BOOST_TEST_REQUIRE((entry != all.end()));
    alloy::replay::devices device(capacity);
    const alloy::replay::replay_options opts{.alignment = 256, .capacity = capacity, .repetitions = 2};
    const alloy::replay::replay_result r = entry->run(trace, device, opts);

    BOOST_TEST(r.peak_in_use == original.peak_bytes_in_use);
    BOOST_TEST(r.peak_reserved == original.peak_bytes_reserved);
    BOOST_TEST(r.end_in_use == original.bytes_in_use);
    BOOST_TEST(r.end_reserved == original.bytes_reserved);
    BOOST_TEST(r.served == original.num_allocs);
    BOOST_TEST(r.failed == original.num_ooms);
    BOOST_TEST(r.upstream_allocs == original.num_device_alloc);
    BOOST_TEST(r.upstream_frees == original.num_device_free);
    BOOST_TEST(r.leaked == 0u);
    BOOST_TEST(r.faults == 0u);
    BOOST_TEST(r.ns_per_op_runs.size() == 2u);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(replay_device_and_round_trip)

BOOST_AUTO_TEST_CASE(device_keeps_to_its_capacity) {
  simulated_device device(10_MiB);
  void* a = device.allocate(6_MiB, 256);
  BOOST_TEST_REQUIRE(a != nullptr);
  BOOST_TEST(device.allocate(5_MiB, 256) == nullptr);  // 11 MiB > 10 MiB
  BOOST_TEST(device.refusals() == 1u);
  void* b = device.allocate(4_MiB, 2_MiB);
  BOOST_TEST_REQUIRE(b != nullptr);
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(b) % 2_MiB == 0u);
  BOOST_TEST(device.reserved() == 10_MiB);
  BOOST_TEST(device.allocate(0, 256) != nullptr);  // zero bytes: a unique address
  BOOST_TEST(device.allocate(1, 3) == nullptr);    // alignment not a power of two
  device.deallocate(a, 6_MiB);
  BOOST_TEST(device.reserved() == 4_MiB);
  BOOST_TEST(device.peak_reserved() == 10_MiB);
  BOOST_TEST(device.allocations() == 3u);
  BOOST_TEST(device.deallocations() == 1u);
  void* c = device.allocate(6_MiB, 256);  // the freed range again (best fit)
  BOOST_TEST(c == a);
  device.reset();
  BOOST_TEST(device.reserved() == 0u);
  BOOST_TEST(device.allocations() == 0u);
}

BOOST_AUTO_TEST_CASE(device_of_80_GiB_costs_no_memory) {
  simulated_device device(80_GiB);
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (int i = 0; i < 7; ++i) {
    void* p = device.allocate(10_GiB, 256);
    BOOST_TEST_REQUIRE(p != nullptr);
    blocks.emplace_back(p, 10_GiB);
  }
  BOOST_TEST(device.allocate(11_GiB, 256) == nullptr);
  BOOST_TEST(device.allocate(10_GiB, 256) != nullptr);
  BOOST_TEST(device.reserved() == 80_GiB);
  // The memory is readable and writable (peers keep bookkeeping in it).
  static_cast<char*>(blocks[3].first)[12345] = 42;
  BOOST_TEST(static_cast<char*>(blocks[3].first)[12345] == 42);
}

BOOST_AUTO_TEST_CASE(logged_run_replays_to_the_same_statistics) {
  check_round_trip<alloy::replay::arena_t>("best_fit_arena", alloy::replay::make_arena, 48_MiB);
  check_round_trip<alloy::replay::default_t>("default_allocator", alloy::replay::make_default, 48_MiB);
  check_round_trip<alloy::replay::pool1m_arena_t>("pool1M+arena", alloy::replay::make_pool1m_arena, 48_MiB);
  check_round_trip<alloy::replay::caching_t>("caching_allocator", alloy::replay::make_caching, 64_MiB);
}

BOOST_AUTO_TEST_CASE(replay_counts_failures_and_serves_recorded_failures_again) {
  const auto trace = alloy::bench::parse_rmm_trace(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,0,allocate,0x1000,4194304,0\n"
      "1,0,allocate,0x2000,8388608,0\n"         // does not fit 10 MiB beside the first
      "1,0,allocate failure,(nil),1048576,0\n"  // fits here: served, freed at once
      "1,0,free,0x2000,8388608,0\n"             // its allocate failed: skipped
      "1,0,free,0x1000,4194304,0\n"
      "1,0,allocate,0x3000,1024,0\n",  // never freed
      "t");
  alloy::replay::devices device(10_MiB);
  const auto all = alloy::replay::compositions();
  for (const auto& c : all) {
    BOOST_TEST_CONTEXT(c.name) {
      const auto r = c.run(trace, device, {.capacity = 10_MiB});
      BOOST_TEST(r.requests == 4u);
      BOOST_TEST(r.operations == 6u);
      BOOST_TEST(r.leaked == 0u);
      BOOST_TEST(r.faults == 0u);
      if (c.name == "best_fit_arena" || c.name == "default_allocator") {
        BOOST_TEST(r.failed == 1u);
        BOOST_TEST(r.served == 3u);
        BOOST_TEST(r.peak_in_use == 4_MiB + 1_MiB);
        BOOST_TEST(r.end_in_use == 1024u);
      }
      BOOST_TEST(!r.series.empty());
    }
  }
}

BOOST_AUTO_TEST_CASE(reports_are_written) {
  const auto trace = alloy::bench::parse_rmm_trace(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,0,allocate,0x1000,3000000,0\n"
      "1,0,allocate,0x2000,500,0\n"
      "1,0,free,0x1000,3000000,0\n"
      "1,0,allocate,0x3000,7000000,0\n",
      "dir/some \"trace\".rmm.csv.gz");
  alloy::replay::devices device(1_GiB);
  alloy::replay::trace_report report{trace.name, &trace, {}};
  for (const auto& c : alloy::replay::compositions())
    report.results.push_back(c.run(trace, device, {.capacity = 1_GiB}));
  const alloy::replay::report_settings settings{1_GiB, 256, 1};
  BOOST_TEST(alloy::replay::display_name(trace.name) == "some \"trace\"");

  std::ostringstream table, json, markdown, svg;
  alloy::replay::print_table(table, report, settings);
  alloy::replay::write_json(json, {report}, settings);
  alloy::replay::write_markdown(markdown, {report}, settings);
  alloy::replay::write_svg(svg, report, settings);
  BOOST_TEST(table.str().find("default_allocator") != std::string::npos);
  BOOST_TEST(json.str().find("\"name\": \"some \\\"trace\\\"\"") != std::string::npos);
  BOOST_TEST(json.str().find("\"peak_reserved\": ") != std::string::npos);
  BOOST_TEST(markdown.str().find("| some \"trace\" | 4 | 6.68 MiB |") != std::string::npos);
  BOOST_TEST(svg.str().starts_with("<svg"));
  BOOST_TEST(svg.str().ends_with("</svg>\n"));
  BOOST_TEST(svg.str().find("some &quot;trace&quot;") != std::string::npos);
  BOOST_TEST(alloy::replay::format_bytes(512) == "512 B");
  BOOST_TEST(alloy::replay::format_bytes(80.0 * (1 << 30)) == "80.0 GiB");
  BOOST_TEST(alloy::replay::format_count(1234567) == "1,234,567");
}

BOOST_AUTO_TEST_SUITE_END()
