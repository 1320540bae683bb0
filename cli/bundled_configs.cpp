#include "bundled_configs.hpp"

#include <sstream>

namespace fp4lab::cli {

const BundledConfig* find_bundled_config(const std::string& name) {
  for (const BundledConfig& c : bundled_configs())
    if (name == c.name) return &c;
  return nullptr;
}

std::string bundled_config_description(const BundledConfig& c) {
  std::istringstream in(c.text);
  std::string line, text;
  while (std::getline(in, line) && line.rfind('#', 0) == 0) {
    const size_t from = line.find_first_not_of("# ");
    if (from == std::string::npos) break;  // an empty comment line ends the first paragraph
    if (!text.empty()) text += ' ';
    text.append(line, from, std::string::npos);
  }
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] == '.' && (i + 1 == text.size() || text[i + 1] == ' ')) return text.substr(0, i + 1);
  return text;
}

}  // namespace fp4lab::cli
