// SPDX-License-Identifier: Apache-2.0
// Writes compositions_fuzz's seed inputs from their readable form (seed_operations.txt):
//
//   write_seeds OPERATIONS OUT_DIR NAME=COMPOSITION...
//
// Each OUT_DIR/NAME.bin is the composition's number as one byte, then the hex bytes of the
// operations file (`#` to the end of a line is a comment), so the seeds stay text in git.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: write_seeds OPERATIONS OUT_DIR NAME=COMPOSITION...\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  std::vector<char> body;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line.substr(0, line.find('#')));
    for (std::string hex; words >> hex;) body.push_back(static_cast<char>(std::stoul(hex, nullptr, 16)));
  }
  if (!in.eof() || body.empty()) {
    std::fprintf(stderr, "write_seeds: cannot read operations from %s\n", argv[1]);
    return 1;
  }
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::size_t eq = arg.find('=');
    std::ofstream out(std::string(argv[2]) + "/" + arg.substr(0, eq) + ".bin", std::ios::binary);
    out.put(static_cast<char>(std::atoi(arg.c_str() + eq + 1)));
    out.write(body.data(), static_cast<std::streamsize>(body.size()));
    if (!out) return 1;
  }
  return 0;
}
