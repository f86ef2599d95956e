// SPDX-License-Identifier: Apache-2.0
// tools/ab-time/ab_driver.cpp: times two builds of alloy's headers against each other in one
// process (tools/ab-time/ab-time builds them and runs this).
//
//   alloy-ab-time A.so B.so [--rounds N] [--w1 SEEDS | --w1-only] [--composition NAME]... [TRACE...]
//
// Why: on a shared virtual machine the speed of a process drifts by up to 2x between processes
// and minutes, so two builds timed one after the other differ by more than most changes do. Here
// both sides are loaded into one process (each its own copy of the headers: hidden symbols, local
// binding) and take turns, round by round, in alternating order (A B, B A, ...); each round's B ÷ A
// is a paired ratio, and the median of the rounds is the figure. A build timed against itself
// reads within about 1 % over the traces and 0.5 % on W1 (bench/README.md, "Timing a code change").
//
// Before timing, one checked run per side says whether B behaves as A does (requests served,
// device calls, peak bytes, wrong answers such as overlapping blocks); a difference is printed,
// so that "behaviour unchanged" is checked.
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ab_side.hpp"

namespace {

using replay_fn = int (*)(const char*, const char*, int, alloy_ab_figures*);
using w1_fn = int (*)(unsigned, const char*, alloy_ab_figures*);

struct side {
  void* handle = nullptr;
  replay_fn replay = nullptr;
  w1_fn w1 = nullptr;
};

std::string copied_side;  // removed on the way out

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "alloy-ab-time: %s\n", why.c_str());
  if (!copied_side.empty()) std::filesystem::remove(copied_side);
  std::exit(2);
}

/// dlopen returns the handle already loaded for a path it has seen, so a side loaded twice (A
/// against itself) is copied to a file of its own first.
std::string private_copy(const std::string& path) {
  char name[] = "/tmp/alloy-ab-side-XXXXXX";
  const int fd = mkstemp(name);
  if (fd < 0) fail("cannot make a temporary file");
  close(fd);
  copied_side = name;
  std::filesystem::copy_file(path, name, std::filesystem::copy_options::overwrite_existing);
  return name;
}

side load(const std::string& path) {
  side s;
  s.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (s.handle == nullptr) fail(std::string("dlopen: ") + dlerror());
  s.replay = reinterpret_cast<replay_fn>(dlsym(s.handle, "alloy_ab_replay"));
  s.w1 = reinterpret_cast<w1_fn>(dlsym(s.handle, "alloy_ab_w1"));
  if (s.replay == nullptr || s.w1 == nullptr) fail(path + ": not a side built from tools/ab-time/ab_side.cpp");
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

/// Paired ratios B ÷ A of one workload's rounds, cold (and warm for traces).
struct ratios {
  std::vector<double> cold, warm;
  double a_cold_ns = 0;  // A's median, for scale
};

bool same_behaviour(const alloy_ab_figures& a, const alloy_ab_figures& b) {
  return a.served == b.served && a.device_calls == b.device_calls && a.peak_bytes == b.peak_bytes &&
         a.faults == b.faults;
}

std::string behaviour(const alloy_ab_figures& f) {
  return std::to_string(f.served) + " served, " + std::to_string(f.device_calls) + " device calls, peak " +
         std::to_string(f.peak_bytes) + " B" + (f.faults != 0 ? ", " + std::to_string(f.faults) + " FAULTS" : "");
}

/// Runs `one(side, figures)` for A and B in turns, `rounds` times, alternating which goes first.
template <class One>
ratios in_turns(const side& a, const side& b, int rounds, bool warm, One&& one) {
  ratios r;
  std::vector<double> a_ns;
  for (int i = 0; i < rounds; ++i) {
    alloy_ab_figures fa{}, fb{};
    if (i % 2 == 0) {
      one(a, fa);
      one(b, fb);
    } else {
      one(b, fb);
      one(a, fa);
    }
    r.cold.push_back(fb.cold_ns_per_op / fa.cold_ns_per_op);
    a_ns.push_back(fa.cold_ns_per_op);
    if (warm) r.warm.push_back(fb.warm_ns_per_op / fa.warm_ns_per_op);
  }
  r.a_cold_ns = median(a_ns);
  return r;
}

/// A trace's file name without the format's suffixes.
std::string short_name(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  for (const char* suffix : {".gz", ".csv", ".rmm", ".events"})
    if (name.ends_with(suffix)) name.resize(name.size() - std::strlen(suffix));
  return name;
}

std::vector<std::string> default_traces() {
  std::vector<std::string> found;
  for (const char* dir : {"../shared/traces/pytorch", "../shared/traces/minimalloc"}) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const std::string p = e.path().string();
      if (p.ends_with(".rmm.csv.gz") || p.ends_with(".rmm.csv")) found.push_back(p);
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(
        stderr,
        "usage: alloy-ab-time A.so B.so [--rounds N] [--w1 SEEDS | --w1-only] [--composition NAME]... [TRACE...]\n"
        "  compositions: virtual_allocator (default), virtual_arena, virtual_arena_pair, default_allocator\n"
        "  traces: default every one in ../shared/traces; --w1 0 skips W1 (default 5 seeds)\n");
    return 2;
  }
  const std::string a_path = argv[1];
  std::string b_path = argv[2];
  std::error_code ec;
  const bool itself = std::filesystem::equivalent(a_path, b_path, ec);
  if (itself) b_path = private_copy(b_path);
  int rounds = 101, w1_seeds = 5;
  bool w1_only = false;
  std::vector<std::string> compositions, traces;
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--rounds" && has_value) rounds = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--w1" && has_value) w1_seeds = std::max(0, std::atoi(argv[++i]));
    else if (arg == "--w1-only") w1_only = true;
    else if (arg == "--composition" && has_value) compositions.emplace_back(argv[++i]);
    else if (arg.starts_with("--")) fail("unknown option " + arg);
    else traces.push_back(arg);
  }
  if (compositions.empty()) compositions.emplace_back("virtual_allocator");
  if (traces.empty() && !w1_only) traces = default_traces();
  if (traces.empty() && w1_seeds == 0) fail("nothing to time: no traces and --w1 0");

  const side a = load(a_path), b = load(b_path);
  if (itself) std::filesystem::remove(b_path);  // loaded: the file is no longer needed
  copied_side.clear();
  std::printf(
      "A: %s\nB: %s%s\n%d rounds each, in turns; B ÷ A = median of the rounds' paired ratios "
      "(25th-75th percentile)\n",
      a_path.c_str(), argv[2], itself ? " (the same build: A against itself)" : "", rounds);
  int differing = 0;
  for (const std::string& c : compositions) {
    std::printf("\n%s\n\n| workload | A ns/op | B ÷ A cold | B ÷ A warm | behaviour |\n|---|---:|---:|---:|---|\n",
                c.c_str());
    double log_cold = 0, log_warm = 0;
    int n = 0;
    for (const std::string& t : traces) {
      alloy_ab_figures fa{}, fb{};
      const int ra = a.replay(t.c_str(), c.c_str(), 1, &fa);
      const int rb = b.replay(t.c_str(), c.c_str(), 1, &fb);
      if (ra == -1 || rb == -1) fail("unknown composition " + c);
      if (ra != 0 || rb != 0) fail("cannot read " + t);
      const bool same = same_behaviour(fa, fb);
      differing += same ? 0 : 1;
      const ratios r = in_turns(
          a, b, rounds, true, [&](const side& s, alloy_ab_figures& f) { (void)s.replay(t.c_str(), c.c_str(), 0, &f); });
      const double cold = median(r.cold), warm = median(r.warm);
      log_cold += std::log(cold);
      log_warm += std::log(warm);
      ++n;
      std::printf("| %s | %.1f | %.3f (%.3f-%.3f) | %.3f (%.3f-%.3f) | %s |\n", short_name(t).c_str(), r.a_cold_ns,
                  cold, quantile(r.cold, 0.25), quantile(r.cold, 0.75), warm, quantile(r.warm, 0.25),
                  quantile(r.warm, 0.75), same ? "same" : ("A " + behaviour(fa) + "; B " + behaviour(fb)).c_str());
      std::fflush(stdout);
    }
    if (n > 0)
      std::printf("| geometric mean over %d traces | | %.3f | %.3f | |\n", n, std::exp(log_cold / n),
                  std::exp(log_warm / n));
    double log_w1 = 0;
    for (int s = 0; s < w1_seeds; ++s) {
      alloy_ab_figures fa{}, fb{};
      (void)a.w1(static_cast<unsigned>(s), c.c_str(), &fa);  // also makes the workload, untimed
      (void)b.w1(static_cast<unsigned>(s), c.c_str(), &fb);
      const bool same = same_behaviour(fa, fb);
      differing += same ? 0 : 1;
      const ratios r = in_turns(a, b, std::max(1, rounds / 4), false, [&](const side& x, alloy_ab_figures& f) {
        (void)x.w1(static_cast<unsigned>(s), c.c_str(), &f);
      });
      const double cold = median(r.cold);
      log_w1 += std::log(cold);
      std::printf("| W1 seed index %d | %.1f | %.3f (%.3f-%.3f) | | %s |\n", s, r.a_cold_ns, cold,
                  quantile(r.cold, 0.25), quantile(r.cold, 0.75),
                  same ? "same" : ("A " + behaviour(fa) + "; B " + behaviour(fb)).c_str());
      std::fflush(stdout);
    }
    if (w1_seeds > 0)
      std::printf("| W1 geometric mean over %d seeds | | %.3f | | |\n", w1_seeds, std::exp(log_w1 / w1_seeds));
  }
  if (differing != 0) std::printf("\n%d workload(s) behaved differently on B.\n", differing);
  return 0;
}
