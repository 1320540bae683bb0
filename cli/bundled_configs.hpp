// The TCU configurations shipped with fp4lab (sim/configs/*.cfg), built into the tool (cmake/embed_configs.cmake):
// `fp4lab sim --config NAME` reads one by name where no file NAME exists, and `fp4lab sim --list-configs` lists
// them, from an installed tool as from the build tree.
#pragma once

#include <string>
#include <vector>

namespace fp4lab::cli {

struct BundledConfig {
  const char* name;  // the file name without .cfg
  const char* text;  // the file, byte for byte
};

// Sorted by name.
const std::vector<BundledConfig>& bundled_configs();
// The bundled configuration called `name`, or nullptr.
const BundledConfig* find_bundled_config(const std::string& name);
// Its one-line description: the first sentence of the file's leading comment block.
std::string bundled_config_description(const BundledConfig& c);

}  // namespace fp4lab::cli
