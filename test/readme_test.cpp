// SPDX-License-Identifier: Apache-2.0
// Every C++ and Python snippet in README.md is part of an example that is built or checked: each
// ```cpp or ```python block must appear, line for line (indentation aside), in one file of
// examples/.
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Lines without leading and trailing blanks, empty lines dropped.
std::vector<std::string> normalized_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    const auto last = line.find_last_not_of(" \t\r");
    lines.push_back(line.substr(first, last - first + 1));
  }
  return lines;
}

bool contains_block(const std::vector<std::string>& haystack, const std::vector<std::string>& block) {
  if (block.empty() || block.size() > haystack.size()) return block.empty();
  for (std::size_t start = 0; start + block.size() <= haystack.size(); ++start) {
    std::size_t i = 0;
    while (i < block.size() && haystack[start + i] == block[i]) ++i;
    if (i == block.size()) return true;
  }
  return false;
}

}  // namespace

BOOST_AUTO_TEST_CASE(readme_snippets_are_compiled_examples) {
  const std::filesystem::path root = ALLOY_SOURCE_DIR;
  const std::string readme = read(root / "README.md");
  std::vector<std::vector<std::string>> examples;
  for (const auto& entry : std::filesystem::directory_iterator(root / "examples"))
    examples.push_back(normalized_lines(read(entry.path())));

  std::size_t snippets = 0;
  for (const std::string fence : {"```cpp\n", "```python\n"})
    for (std::size_t at = readme.find(fence); at != std::string::npos; at = readme.find(fence, at)) {
      const std::size_t begin = at + fence.size();
      const std::size_t end = readme.find("```", begin);
      BOOST_REQUIRE(end != std::string::npos);
      const std::vector<std::string> block = normalized_lines(readme.substr(begin, end - begin));
      bool found = false;
      for (const auto& example : examples) found = found || contains_block(example, block);
      BOOST_TEST(found, "README snippet " << snippets + 1 << " (starting '" << (block.empty() ? "" : block[0])
                                          << "') is in no file of examples/");
      ++snippets;
      at = end + 3;
    }
  BOOST_TEST(snippets >= 4u);
}
