// The simulator's configuration (fp4lab/sim/config.hpp) as text: its keys as Boost.Program_options options, for
// configuration files (sim/configs/*.cfg, `[section]` + `key = value`, or JSON: option_file.hpp) and the command line
// (`--mac.units 8`), so any key of a file can be overridden when a run is started. One description, built from the
// simulator's key table (sim::config_keys()), serves both.
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <vector>

#include "fp4lab/sim/config.hpp"

namespace fp4lab::cli {

// Every key of sim::config_keys(), typed, with its default; keys without a default are required.
boost::program_options::options_description sim_config_options();
// The configuration the keys of `vm` give, validated (throws std::invalid_argument with a one-line reason).
sim::Config sim_config_from(const boost::program_options::variables_map& vm);
// Reads a configuration file (`key = value` lines or JSON); `overrides` are "key=value" pairs applied over it.
// Throws std::invalid_argument with a one-line reason that names the file.
sim::Config load_sim_config(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace fp4lab::cli
