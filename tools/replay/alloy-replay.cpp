// SPDX-License-Identifier: Apache-2.0
// alloy-replay: replays real allocation traces through alloy's compositions and their peers over a
// simulated device, and reports what each did: ns per operation, peak in use, peak reserved,
// peak reserved ÷ peak live, upstream calls, failed requests, bytes moved — as a table, JSON,
// Markdown and an SVG chart. Run `alloy-replay --help`.
//
// The parsing, the device, the compositions and the reports are headers in this folder (the tests
// include them); this file is the command line.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "replay/compositions.hpp"
#include "replay/min_capacity.hpp"
#include "replay/report.hpp"
#include "replay/simulated_device.hpp"
#include "replay/trace_reader.hpp"

namespace {

using namespace alloy;

constexpr const char* usage_text = R"(usage: alloy-replay [options] TRACE...

Replays allocation traces through alloy's compositions and their peers over a simulated device
and reports, per composition: ns per operation, peak in use, peak reserved, peak reserved / peak
live, upstream calls, map + unmap calls per 1,000 operations (virtual compositions), failed
requests and bytes moved. Every block a composition serves is checked (aligned, inside the
device's memory, overlapping no live block); a wrong answer is reported as a FAULT of that
composition, not as a served request (exit status 3).

TRACE is one of (told apart by the first line; '-' reads standard input):
  RMM log CSV, plain or .gz     Thread,Time,Action,Pointer,Size,Stream (allocate, free,
                                allocate failure; stream in hex)
  MiniMalloc instance           id,lower,upper,size
  PyTorch snapshot              convert it first: scripts/snapshot-to-rmm-csv SNAPSHOT.pickle

options:
  --capacity SIZE        capacity of the simulated device, e.g. 80GiB, 1.5GiB, 512MiB
                         (default: unlimited). Nothing that large is touched: the device hands
                         out address space that replay never writes to.
  --min-capacity         for each composition, find the smallest device capacity (to 0.5 %) at
                         which every request is served and print it divided by the trace's
                         peak live bytes ("how big a GPU do I need"), with map and upstream
                         calls per 1,000 operations at --capacity, and why a little less does
                         not do: the first allocation that failed at the largest capacity the
                         search saw fail, with the bytes in use and reserved then; no timed
                         replays
  --compositions LIST    comma-separated names, or 'all' (default), 'alloy', 'peers'; the
                         whole_device_* ones (an arena holding the whole device from the
                         start) need --capacity and are chosen by name only
  --list                 print the compositions and exit
  --alignment N          alignment of every request (default 256)
  --scale N              multiply every MiniMalloc size by N (the shipped events use 1024)
  --resize F             multiply every size of every trace by F (e.g. 0.75; rounded down, at
                         least one byte) after reading: the same order and lifetimes with
                         another model's sizes, to check a figure on traces it was not tuned to
  --repeat N             timed replays per composition; ns/op (this thread's CPU time) is
                         their median (default 3)
  --warm                 each timed replay goes over the trace a second time through the same
                         allocator, timed apart ("warm": memory already held, as at a training
                         loop's next step); printed beside ns/op and in the JSON
  --on-error stop|skip   a bad row (malformed, free of an unknown pointer, truncated file):
                         stop at the first (default) or report each one and go on without it
  --json FILE            write every figure as JSON ('-': standard output)
  --markdown FILE        write Markdown tables ('-': standard output)
  --svg FILE             write the chart of reserved and in-use bytes over the trace (one TRACE)
  --progress, --no-progress
                         progress bar on standard error (default: when it is a terminal)
  -q, --quiet            no table on standard output
  -h, --help
)";

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "alloy-replay: " << message << "\n(alloy-replay --help for the options)\n";
  std::exit(2);
}

/// The number `text` starts with and how many characters it takes; none when it starts with none.
std::optional<std::pair<double, std::size_t>> leading_number(std::string_view text) {
  std::size_t used = 0;
  try {
    const double value = std::stod(std::string(text), &used);
    return std::pair{value, used};
  } catch (...) {
    return std::nullopt;
  }
}

/// "80GiB", "1.5 GiB", "512MiB", "4096", "2G" (binary), "2GB" (decimal), "unlimited".
std::optional<std::size_t> parse_size(std::string_view text) {
  if (text == "unlimited" || text == "none") return replay::unlimited;
  const auto number = leading_number(text);
  if (!number) return std::nullopt;
  const auto [value, used] = *number;
  std::string_view unit = text.substr(used);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  struct suffix {
    std::string_view name;
    double factor;
  };
  static constexpr suffix suffixes[] = {{"", 1},
                                        {"B", 1},
                                        {"K", 1024.0},
                                        {"KiB", 1024.0},
                                        {"KB", 1e3},
                                        {"M", 1048576.0},
                                        {"MiB", 1048576.0},
                                        {"MB", 1e6},
                                        {"G", 1073741824.0},
                                        {"GiB", 1073741824.0},
                                        {"GB", 1e9},
                                        {"T", 1099511627776.0},
                                        {"TiB", 1099511627776.0},
                                        {"TB", 1e12}};
  for (const suffix& s : suffixes) {
    if (unit == s.name) {
      const double bytes = value * s.factor;
      if (!(bytes >= 0) || bytes >= 1.8e19) return std::nullopt;
      return static_cast<std::size_t>(bytes);
    }
  }
  return std::nullopt;
}

/// A positive finite number ("0.75", "2"), the whole text.
std::optional<double> parse_factor(std::string_view text) {
  const auto number = leading_number(text);
  if (!number || number->second != text.size() || !(number->first > 0) || !std::isfinite(number->first))
    return std::nullopt;
  return number->first;
}

std::optional<std::size_t> parse_count(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::size_t n = 0;
  for (const char c : text) {
    if (c < '0' || c > '9' || n > (SIZE_MAX - 9) / 10) return std::nullopt;
    n = n * 10 + static_cast<std::size_t>(c - '0');
  }
  return n;
}

/// A one-line progress bar on standard error, drawn only once a replay has taken a moment.
class progress_bar {
 public:
  explicit progress_bar(bool enabled) : enabled_(enabled) {}
  void start(std::string label) {
    label_ = std::move(label);
    started_ = std::chrono::steady_clock::now();
    drawn_ = false;
  }
  void update(double fraction) {
    if (!enabled_) return;
    if (!drawn_ && std::chrono::steady_clock::now() - started_ < std::chrono::milliseconds(300)) return;
    drawn_ = true;
    const int width = 30;
    const int filled = static_cast<int>(fraction * width + 0.5);
    std::fprintf(stderr, "\r%-60.60s [%.*s%*s] %3d%%", label_.c_str(), filled, "##############################",
                 width - filled, "", static_cast<int>(fraction * 100 + 0.5));
    std::fflush(stderr);
  }
  void finish() {
    if (drawn_) std::fprintf(stderr, "\r%*s\r", 100, "");
    drawn_ = false;
  }

 private:
  bool enabled_;
  bool drawn_ = false;
  std::string label_;
  std::chrono::steady_clock::time_point started_;
};

/// Opens FILE for writing ('-' = standard output); exits with a message when it cannot.
std::ostream& open_output(const std::string& path, std::unique_ptr<std::ofstream>& holder) {
  if (path == "-") return std::cout;
  holder = std::make_unique<std::ofstream>(path, std::ios::out | std::ios::trunc);
  if (!*holder) {
    std::cerr << "alloy-replay: cannot write " << path << '\n';
    std::exit(1);
  }
  return *holder;
}

}  // namespace

int main(int argc, char** argv) {
  replay::replay_options opts;
  opts.repetitions = 3;
  bench::trace_read_options read_opts;
  bench::minimalloc_options mm;
  double resize = 1;
  std::string json_path, markdown_path, svg_path, wanted = "all";
  bool quiet = false, list = false, min_capacity = false;
  int show_progress = -1;  // -1: when standard error is a terminal
  std::vector<std::string> traces;

  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      const std::size_t eq = arg.find('=');
      if (arg.starts_with("--") && eq != std::string::npos) return arg.substr(eq + 1);
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    auto is = [&](std::string_view name) { return arg == name || (arg.starts_with(name) && arg[name.size()] == '='); };
    if (arg == "-h" || arg == "--help") {
      std::cout << usage_text;
      return 0;
    } else if (is("--capacity")) {
      const std::string v = value();
      const auto size = parse_size(v);
      if (!size || *size == 0) usage_error("--capacity: cannot read '" + v + "' as a size (e.g. 80GiB)");
      opts.capacity = *size;
    } else if (is("--compositions")) {
      wanted = value();
    } else if (arg == "--min-capacity") {
      min_capacity = true;
    } else if (arg == "--list") {
      list = true;
    } else if (is("--alignment")) {
      const std::string v = value();
      const auto n = parse_count(v);
      if (!n || *n == 0 || (*n & (*n - 1)) != 0) usage_error("--alignment: '" + v + "' is not a power of two");
      opts.alignment = *n;
    } else if (is("--scale")) {
      const std::string v = value();
      const auto n = parse_count(v);
      if (!n || *n == 0) usage_error("--scale: '" + v + "' is not a positive whole number");
      mm.scale = *n;
    } else if (is("--resize")) {
      const std::string v = value();
      const auto f = parse_factor(v);
      if (!f) usage_error("--resize: '" + v + "' is not a positive number");
      resize = *f;
    } else if (is("--repeat")) {
      const std::string v = value();
      const auto n = parse_count(v);
      if (!n || *n == 0 || *n > 1000) usage_error("--repeat: '" + v + "' is not a number from 1 to 1000");
      opts.repetitions = static_cast<int>(*n);
    } else if (is("--warm")) {
      opts.warm = true;
    } else if (is("--on-error")) {
      const std::string v = value();
      if (v == "stop") {
        read_opts.on_bad_row = bench::bad_rows::stop;
      } else if (v == "skip") {
        read_opts.on_bad_row = bench::bad_rows::skip;
      } else {
        usage_error("--on-error: '" + v + "' is neither stop nor skip");
      }
    } else if (is("--json")) {
      json_path = value();
    } else if (is("--markdown")) {
      markdown_path = value();
    } else if (is("--svg")) {
      svg_path = value();
    } else if (arg == "--progress") {
      show_progress = 1;
    } else if (arg == "--no-progress") {
      show_progress = 0;
    } else if (arg == "-q" || arg == "--quiet") {
      quiet = true;
    } else if (arg.starts_with("-") && arg != "-") {
      usage_error("unknown option " + arg);
    } else {
      traces.push_back(arg);
    }
  }

  std::vector<replay::composition> all = replay::compositions();
  if (list) {
    for (const auto& c : all)
      std::printf("%-26s %s%s%s\n", c.name.c_str(), c.peer ? "(peer) " : "",
                  c.virtual_memory ? "(virtual memory) " : "", c.description.c_str());
    return 0;
  }
  if (traces.empty()) usage_error("no trace given");
  if (!svg_path.empty() && traces.size() != 1)
    usage_error("--svg draws one trace; " + std::to_string(traces.size()) + " given");

  // The compositions asked for, in the registry's order.
  std::vector<const replay::composition*> chosen;
  {
    std::set<std::string> names;
    for (std::size_t start = 0; start <= wanted.size();) {
      const std::size_t comma = std::min(wanted.find(',', start), wanted.size());
      if (comma > start) names.insert(wanted.substr(start, comma - start));
      start = comma + 1;
    }
    for (const std::string& n : names) {
      if (n == "all" || n == "alloy" || n == "peers") continue;
      bool known = false;
      for (const auto& c : all) known = known || c.name == n;
      if (!known) usage_error("unknown composition '" + n + "' (alloy-replay --list names them)");
    }
    for (const auto& c : all) {
      if (c.needs_capacity) {  // reserves the whole device: only when named
        if (names.count(c.name) && opts.capacity == replay::unlimited)
          usage_error(c.name + " needs a device of finite capacity (--capacity)");
        if (names.count(c.name)) chosen.push_back(&c);
        continue;
      }
      if (names.count("all") || names.count(c.name) || (names.count("alloy") && !c.peer) ||
          (names.count("peers") && c.peer))
        chosen.push_back(&c);
    }
    if (chosen.empty()) usage_error("no composition chosen");
  }

  if (show_progress < 0) show_progress = isatty(STDERR_FILENO) ? 1 : 0;
  progress_bar bar(show_progress == 1);
  read_opts.report = [](const std::string& name, const bench::trace_problem& p) {
    std::cerr << "alloy-replay: " << bench::describe(name, p) << " (skipped)\n";
  };

  if (min_capacity) {
    if (!svg_path.empty()) usage_error("--svg draws one replay; it does not go with --min-capacity");
    opts.repetitions = 0;  // figures only: the search replays each composition a dozen times
  }
  const replay::report_settings settings{opts.capacity, opts.alignment, opts.repetitions};
  std::vector<std::unique_ptr<bench::rmm_trace>> loaded;
  std::vector<replay::trace_report> reports;
  int status = 0;
  replay::devices device(opts.capacity);
  for (const std::string& path : traces) {
    auto trace = std::make_unique<bench::rmm_trace>();
    try {
      *trace = bench::read_trace(path, read_opts, mm);
      if (resize != 1) bench::resize_trace(*trace, resize);
    } catch (const std::exception& e) {
      std::cerr << "alloy-replay: " << e.what() << '\n';
      status = 1;
      if (read_opts.on_bad_row == bench::bad_rows::stop) {
        std::cerr << "alloy-replay: stopped (with --on-error=skip, bad rows and unreadable files are reported and the "
                     "rest is replayed)\n";
        return status;
      }
      continue;
    }
    replay::trace_report report{path, trace.get(), {}};
    for (const replay::composition* c : chosen) {
      bar.start(replay::display_name(path) + "  " + c->name);
      opts.progress = [&bar](double f) { bar.update(f); };
      device.set_capacity(opts.capacity);
      report.results.push_back(c->run(*trace, device, opts));
      if (min_capacity) {
        replay::replay_options probe = opts;
        probe.progress = {};
        probe.series_points = 1;
        report.min_capacity.push_back(replay::find_min_capacity(*trace, [&](std::size_t capacity) {
          probe.capacity = capacity;
          device.set_capacity(capacity);
          return c->run(*trace, device, probe);
        }));
        device.set_capacity(opts.capacity);
      }
      bar.finish();
      const replay::replay_result& x = report.results.back();
      if (x.faults != 0) {
        std::cerr << "alloy-replay: " << replay::display_name(path) << ": " << c->name << ": " << replay::fault_text(x)
                  << '\n';
        if (status == 0) status = 3;
      }
    }
    if (!quiet) {
      if (min_capacity) {
        replay::print_min_capacity_table(std::cout, report, settings);
      } else {
        replay::print_table(std::cout, report, settings);
      }
    }
    std::cout.flush();
    reports.push_back(std::move(report));
    loaded.push_back(std::move(trace));
  }

  if (!json_path.empty()) {
    std::unique_ptr<std::ofstream> file;
    replay::write_json(open_output(json_path, file), reports, settings);
  }
  if (!markdown_path.empty()) {
    std::unique_ptr<std::ofstream> file;
    if (min_capacity) {
      replay::write_min_capacity_markdown(open_output(markdown_path, file), reports, settings);
    } else {
      replay::write_markdown(open_output(markdown_path, file), reports, settings);
    }
  }
  if (!svg_path.empty() && !reports.empty()) {
    std::unique_ptr<std::ofstream> file;
    replay::write_svg(open_output(svg_path, file), reports.front(), settings);
  }
  return status;
}
