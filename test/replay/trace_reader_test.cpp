// SPDX-License-Identifier: Apache-2.0
// The readers behind alloy-replay (tools/replay/rmm_trace.hpp, tools/replay/trace_reader.hpp):
// RMM log CSV and MiniMalloc instances, good and malformed, stopping or skipping bad rows with
// their line numbers, truncated files, and the shipped traces when they are there.
#include <boost/test/unit_test.hpp>

#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <unistd.h>
#include <vector>

#include "replay/trace_reader.hpp"

namespace {

using alloy::bench::bad_rows;
using alloy::bench::trace_action;
using alloy::bench::trace_read_options;

const std::string header = "Thread,Time,Action,Pointer,Size,Stream\n";

std::string error_of(const std::string& text, const std::string& name = "t.csv") {
  try {
    alloy::bench::parse_rmm_trace(text, name);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

trace_read_options skipping() { return {.on_bad_row = bad_rows::skip}; }

/// A file in the test's temporary folder, removed at the end.
struct temp_file {
  std::filesystem::path path;
  explicit temp_file(const std::string& name)
      : path(std::filesystem::temp_directory_path() / ("alloy_replay_" + std::to_string(::getpid()) + "_" + name)) {}
  ~temp_file() { std::filesystem::remove(path); }
  void write(const std::string& bytes) const { std::ofstream(path, std::ios::binary) << bytes; }
  void write_gz(const std::string& text) const {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
    gzclose(f);
  }
};

std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(replay_trace_reader)

BOOST_AUTO_TEST_CASE(rmm_rows_failures_and_hex_streams) {
  const auto t =
      alloy::bench::parse_rmm_trace(header +
                                        "1,23:00:53.858957,allocate,0x7f0000000000,100,0\n"
                                        "1,23:00:53.858958,allocate,0x7f0000000100,200,7f3a00\n"
                                        "2,23:00:53.858959,allocate failure,(nil),99999999999,10\n"
                                        "1,23:00:53.858960,free,0x7f0000000000,100,0\n"
                                        "1,23:00:53.858961,free,0x7f0000000100,200,7f3a00",  // no final newline
                                    "inline");
  BOOST_TEST(t.events.size() == 5u);
  BOOST_TEST(t.failures == 1u);
  BOOST_TEST(t.allocations == 2u);
  BOOST_TEST(t.unfreed == 0u);
  BOOST_TEST(t.peak_live_bytes == 300u);
  BOOST_TEST(t.events[1].stream == 0x7f3a00u);  // hex, as RMM writes it (not decimal 7)
  BOOST_TEST(t.events[2].stream == 0x10u);
  BOOST_TEST((t.events[2].action == trace_action::allocate_failure));
  BOOST_TEST(t.events[2].size == 99999999999u);
  BOOST_TEST(t.events[4].allocation == 1u);
  BOOST_TEST(t.problems.empty());
}

BOOST_AUTO_TEST_CASE(rmm_bad_rows_stop_with_the_line_number) {
  BOOST_TEST(error_of(header + "1,0,allocate,0x10,12\n").starts_with("t.csv:2: expected 6 fields, found 5"));
  BOOST_TEST(
      error_of(header + "1,0,allocate,0x10,12,0\n1,0,allocate,0x20,-5,0\n").starts_with("t.csv:3: bad size '-5'"));
  BOOST_TEST(error_of(header + "1,0,allocate,0xzz,12,0\n").starts_with("t.csv:2: bad pointer"));
  BOOST_TEST(error_of(header + "1,0,allocate,0x10,12,g\n").starts_with("t.csv:2: bad stream 'g'"));
  BOOST_TEST(error_of(header + "1,0,alloc,0x10,12,0\n").starts_with("t.csv:2: unknown action 'alloc'"));
  BOOST_TEST(error_of(header + "1,0,free,0x10,12,0\n").starts_with("t.csv:2: free of pointer 0x10 that is not live"));
  BOOST_TEST(error_of(header + "1,0,allocate,0x10,12,0\n1,0,allocate,0x10,12,0\n")
                 .starts_with("t.csv:3: allocate of pointer 0x10 already live"));
  BOOST_TEST(
      error_of(header + "1,0,allocate,0x10,99999999999999999999999,0\n").starts_with("t.csv:2: size out of range"));
  BOOST_TEST(error_of("id,lower,upper,size\n").starts_with("t.csv:1: expected the header"));
  BOOST_TEST(error_of("").starts_with("t.csv:0: empty file"));
  // A row cut off by the end of the file says so.
  BOOST_TEST(error_of(header + "1,0,allocate,0x10,12,0\n1,0,allo").starts_with("t.csv:3: truncated row"));
}

BOOST_AUTO_TEST_CASE(rmm_bad_rows_skipped_and_reported) {
  std::vector<std::string> reported;
  trace_read_options opts = skipping();
  opts.report = [&](const std::string& name, const alloy::bench::trace_problem& p) {
    reported.push_back(alloy::bench::describe(name, p));
  };
  const auto t = alloy::bench::parse_rmm_trace(header +
                                                   "1,0,allocate,0x10,100,0\n"  // 2
                                                   "1,0,free,0x99,5,0\n"        // 3: unknown pointer
                                                   "1,0,allocate,0x20\n"        // 4: 4 fields
                                                   "1,0,allocate,0x10,50,0\n"   // 5: 0x10 still live
                                                   "x,0,free,0x10,50,0\n"       // 6: bad thread
                                                   "1,0,free,0x10,50,0\n"       // 7
                                                   "1,0,allocate,0x30,7",       // 8: truncated
                                               "s.csv", opts);
  BOOST_TEST(t.problem_count == 5u);
  BOOST_TEST_REQUIRE(reported.size() == 5u);
  BOOST_TEST(reported[0] == "s.csv:3: free of pointer 0x99 that is not live");
  BOOST_TEST(reported[1] == "s.csv:4: expected 6 fields, found 4");
  BOOST_TEST(reported[2].starts_with("s.csv:5: allocate of pointer 0x10 already live"));
  BOOST_TEST(reported[3] == "s.csv:6: bad thread 'x'");
  BOOST_TEST(reported[4].starts_with("s.csv:8: truncated row"));
  BOOST_TEST(t.problems[0].line == 3u);
  // Kept: allocate 0x10 (100), the implied free of it, allocate 0x10 (50), its free.
  BOOST_TEST_REQUIRE(t.events.size() == 4u);
  BOOST_TEST((t.events[1].action == trace_action::free));
  BOOST_TEST(t.events[1].allocation == 0u);
  BOOST_TEST(t.events[1].size == 100u);
  BOOST_TEST(t.events[3].allocation == 1u);
  BOOST_TEST(t.unfreed == 0u);
  BOOST_TEST(t.peak_live_bytes == 100u);
}

BOOST_AUTO_TEST_CASE(rmm_files_plain_gzip_and_truncated) {
  std::string text = header;
  for (int i = 0; i < 4000; ++i)
    text +=
        "1,0,allocate,0x" + std::to_string(1000 + i) + ",256,0\n1,0,free,0x" + std::to_string(1000 + i) + ",256,0\n";
  temp_file plain("plain.csv"), gz("good.csv.gz"), cut("cut.csv.gz");
  plain.write(text);
  gz.write_gz(text);
  BOOST_TEST(alloy::bench::read_rmm_trace(plain.path.string()).events.size() == 8000u);
  BOOST_TEST(alloy::bench::read_trace(gz.path.string()).events.size() == 8000u);

  // A gzip file cut in the middle: stop says where; skip keeps the complete rows before it.
  const std::string compressed = read_bytes(gz.path);
  cut.write(compressed.substr(0, compressed.size() * 2 / 3));
  std::string message;
  try {
    alloy::bench::read_trace(cut.path.string());
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  BOOST_TEST_INFO(message);
  BOOST_TEST(message.find("truncated or corrupt after this line") != std::string::npos);
  BOOST_TEST(message.starts_with(cut.path.string() + ":"));
  const auto partial = alloy::bench::read_trace(cut.path.string(), skipping());
  BOOST_TEST(partial.problem_count == 1u);
  BOOST_TEST(partial.events.size() > 0u);
  BOOST_TEST(partial.events.size() < 8000u);

  BOOST_CHECK_THROW(alloy::bench::read_trace("/nonexistent/trace.csv"), std::runtime_error);
}

BOOST_AUTO_TEST_CASE(minimalloc_instances) {
  const auto t = alloy::bench::parse_minimalloc(
      "id,lower,upper,size\n"
      "0,0,10,100\n"
      "1,5,10,50\n"
      "2,10,20,70\n"
      "3,0,5,30\n",
      "m.csv", {}, {.scale = 2});
  BOOST_TEST(t.format == "minimalloc");
  BOOST_TEST_REQUIRE(t.events.size() == 8u);
  // t=0: allocate 0, 3; t=5: free 3, allocate 1; t=10: free 0, free 1, allocate 2; t=20: free 2.
  const trace_action a = trace_action::allocate, f = trace_action::free;
  const trace_action actions[] = {a, a, f, a, f, f, a, f};
  const std::size_t sizes[] = {200, 60, 60, 100, 200, 100, 140, 140};
  for (std::size_t i = 0; i < 8; ++i) {
    BOOST_TEST((t.events[i].action == actions[i]), "event " << i);
    BOOST_TEST(t.events[i].size == sizes[i], "event " << i);
  }
  BOOST_TEST(t.peak_live_bytes == 300u);
  BOOST_TEST(t.allocations == 4u);

  auto error_of_mm = [](const std::string& text) -> std::string {
    try {
      alloy::bench::parse_minimalloc(text, "m.csv");
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  BOOST_TEST(error_of_mm("id,lower,upper,size\n0,0,10\n").starts_with("m.csv:2: expected 4 fields, found 3"));
  BOOST_TEST(error_of_mm("id,lower,upper,size\n0,0,10,5\n0,1,3,5\n").starts_with("m.csv:3: duplicate id 0"));
  BOOST_TEST(error_of_mm("id,lower,upper,size\n0,7,7,5\n").starts_with("m.csv:2: empty lifetime"));
  BOOST_TEST(error_of_mm("id,lower,upper,size\n0,0,x,5\n").starts_with("m.csv:2: bad upper 'x'"));
  BOOST_TEST(error_of_mm("id,start,end\n").starts_with("m.csv:1: expected a MiniMalloc header"));
  const auto skipped =
      alloy::bench::parse_minimalloc("id,lower,upper,size\n0,0,10,5\nbad\n1,2,3,4\n", "m.csv", skipping());
  BOOST_TEST(skipped.events.size() == 4u);
  BOOST_TEST(skipped.problem_count == 1u);
  BOOST_TEST(skipped.problems.at(0).line == 3u);
}

BOOST_AUTO_TEST_CASE(formats_are_told_apart) {
  using alloy::bench::detect_format;
  using alloy::bench::trace_format;
  BOOST_TEST((detect_format(header) == trace_format::rmm));
  BOOST_TEST((detect_format("id,lower,upper,size\r\n0,0,1,1\n") == trace_format::minimalloc));
  BOOST_TEST((detect_format(std::string("\x80\x04\x95", 3)) == trace_format::pytorch_pickle));
  BOOST_TEST((detect_format("hello\n") == trace_format::unknown));

  temp_file pickle("snapshot.pickle"), other("other.txt");
  pickle.write(std::string("\x80\x04\x95\x00\x00", 5));
  other.write("a,b,c\n");
  try {
    alloy::bench::read_trace(pickle.path.string());
    BOOST_FAIL("a pickle was read");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find("scripts/snapshot-to-rmm-csv") != std::string::npos);
  }
  try {
    alloy::bench::read_trace(other.path.string());
    BOOST_FAIL("an unknown format was read");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find(":1: unknown format") != std::string::npos);
  }
}

// A trace resized: every size times the factor, rounded down; order, lifetimes and frees kept.
BOOST_AUTO_TEST_CASE(resized_traces_keep_order_and_lifetimes) {
  const std::string text = header +
                           "1,0,allocate,0x10,1000,0\n"
                           "1,0,allocate,0x20,301,0\n"
                           "1,0,free,0x10,1000,0\n"
                           "1,0,allocate failure,(nil),5000,0\n"
                           "1,0,allocate,0x30,1,0\n"
                           "1,0,free,0x20,301,0\n";
  const auto original = alloy::bench::parse_rmm_trace(text, "t.csv");
  BOOST_TEST(original.peak_live_bytes == 1301u);
  auto t = original;
  alloy::bench::resize_trace(t, 0.5);
  // Rounded down, at least one byte; a free names its allocation's new size.
  const std::size_t sizes[] = {500, 150, 500, 2500, 1, 150};
  BOOST_TEST_REQUIRE(t.events.size() == 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    BOOST_TEST((t.events[i].action == original.events[i].action), "event " << i);
    BOOST_TEST(t.events[i].allocation == original.events[i].allocation, "event " << i);
    BOOST_TEST(t.events[i].size == sizes[i], "event " << i);
  }
  BOOST_TEST(t.peak_live_bytes == 650u);
  BOOST_TEST(t.size_factor == 0.5);
  alloy::bench::resize_trace(t, 3.0);
  BOOST_TEST(t.events[0].size == 1500u);
  BOOST_TEST(t.peak_live_bytes == 1950u);  // 1500 + 450: rounded at each resize (301 x 1.5 would be 451)
  BOOST_TEST(t.size_factor == 1.5);

  // Bad factors and sizes out of range: an exception, the trace as it was.
  const auto before = t;
  for (const double bad :
       {0.0, -1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()})
    BOOST_CHECK_THROW(alloy::bench::resize_trace(t, bad), std::invalid_argument);
  BOOST_CHECK_THROW(alloy::bench::resize_trace(t, 1e18), std::out_of_range);
  BOOST_TEST(t.peak_live_bytes == before.peak_live_bytes);
  BOOST_TEST(t.size_factor == before.size_factor);
  for (std::size_t i = 0; i < 6; ++i) BOOST_TEST(t.events[i].size == before.events[i].size, "event " << i);
}

// The shipped MiniMalloc instances, read as instances with sizes x1024, are the shipped event files.
BOOST_AUTO_TEST_CASE(shipped_minimalloc_instances_match_their_event_files) {
  const std::filesystem::path dir = std::filesystem::path(ALLOY_TRACE_DIR) / "minimalloc";
  std::size_t compared = 0;
  if (std::filesystem::is_directory(dir)) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string file = entry.path().filename().string();
      if (!file.ends_with(".x1024.events.rmm.csv")) continue;
      const std::string instance = file.substr(0, file.size() - std::string(".x1024.events.rmm.csv").size()) + ".csv";
      const auto events = alloy::bench::read_trace(entry.path().string());
      const auto built = alloy::bench::read_trace((dir / instance).string(), {}, {.scale = 1024});
      BOOST_TEST_INFO(file);
      BOOST_TEST_REQUIRE(events.events.size() == built.events.size());
      for (std::size_t i = 0; i < events.events.size(); ++i) {
        const auto& x = events.events[i];
        const auto& y = built.events[i];
        if (x.action != y.action || x.size != y.size || x.allocation != y.allocation) {
          BOOST_ERROR(file << ": event " << i << " differs");
          break;
        }
      }
      BOOST_TEST(events.peak_live_bytes == built.peak_live_bytes);
      ++compared;
    }
  }
  if (compared == 0) {
    BOOST_TEST_MESSAGE("SKIPPED: no MiniMalloc traces under " << ALLOY_TRACE_DIR
                                                              << " (the shared trace folder is missing)");
    BOOST_WARN_MESSAGE(false, "MiniMalloc comparison skipped: no traces in " << ALLOY_TRACE_DIR);
  }
}

BOOST_AUTO_TEST_SUITE_END()
