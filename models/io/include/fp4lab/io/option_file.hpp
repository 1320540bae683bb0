// The two forms of an fp4lab configuration file, read by one function for every reader (fp4lab --config FILE,
// sim::Config::load):
//  - `key = value` lines under `[section]` headers (Boost.Program_options' config-file syntax);
//  - JSON (first non-blank byte '{'): an object {"key": value, ...} with the same keys, or a document whose
//    "config" member is such an object -- what `fp4lab sim --json` writes, so a report is its run's config.
// A JSON value is a string, a number, a boolean, or an array of those (an option taking several values).
// Header-only: its users link Boost.Program_options; fp4lab_io does not.
#pragma once

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4lab/io/files.hpp"

namespace fp4lab::io {

inline bool is_json_text(const std::string& text) {
  const size_t i = text.find_first_not_of(" \t\r\n");
  return i != std::string::npos && text[i] == '{';
}

// JSON escapes can spell a placeholder (io::refuse_option_placeholders) that a check of the raw text misses.
inline void refuse_decoded_placeholders(const std::string& text, const std::string& where) {
  try {
    refuse_option_placeholders(text, where);
  } catch (const std::runtime_error& e) {  // io::Error
    throw boost::program_options::error(e.what());
  }
}

// The JSON value of an option as Boost.Program_options tokens (the text a command line would give).
// Numbers keep their exact value: nlohmann writes the shortest text that reads back to the same double.
inline std::vector<std::string> json_option_tokens(const std::string& key, const nlohmann::json& v) {
  auto scalar = [&](const nlohmann::json& s) -> std::string {
    if (s.is_string()) return s.get<std::string>();
    if (s.is_boolean()) return s.get<bool>() ? "true" : "false";
    if (s.is_number()) return s.dump();
    throw boost::program_options::error("option '" + key +
                                        "': a value must be a string, a number, a boolean or an array of them");
  };
  std::vector<std::string> out;
  if (v.is_array())
    for (const auto& e : v) out.push_back(scalar(e));
  else
    out.push_back(scalar(v));
  for (const std::string& t : out) refuse_decoded_placeholders(t, "option '" + key + "'");
  return out;
}

// Parses `text` in either form against `desc`. Throws boost::program_options::error (unknown key, bad JSON,
// a value of the wrong kind); callers prefix the file name.
inline boost::program_options::parsed_options parse_option_text(const std::string& text,
                                                                 const boost::program_options::options_description& desc) {
  namespace po = boost::program_options;
  if (!is_json_text(text)) {
    std::istringstream in(text);
    return po::parse_config_file(in, desc);
  }
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw po::error(std::string("not valid JSON: ") + e.what());
  }
  const nlohmann::json& obj = doc.contains("config") && doc["config"].is_object() ? doc["config"] : doc;
  po::parsed_options parsed(&desc);
  for (const auto& [key, value] : obj.items()) {
    refuse_decoded_placeholders(key, "a key");
    if (!desc.find_nothrow(key, /*approx=*/false)) throw po::unknown_option(key);
    po::option o(key, json_option_tokens(key, value));
    o.original_tokens = o.value;
    o.original_tokens.insert(o.original_tokens.begin(), key);
    parsed.options.push_back(std::move(o));
  }
  return parsed;
}

}  // namespace fp4lab::io
