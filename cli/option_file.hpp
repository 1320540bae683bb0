// The two forms of an fp4lab configuration file, read by one function for every reader (fp4lab --config FILE,
// the simulator's configuration files: sim_config.hpp):
//  - `key = value` lines under `[section]` headers (Boost.Program_options' config-file syntax);
//  - JSON (first non-blank byte '{'): an object {"key": value, ...} with the same keys, or a document whose
//    "config" member is such an object -- what `fp4lab sim --json` writes, so a report is its run's config.
// A JSON value is a string, a number, a boolean, or an array of those (an option taking several values).
#pragma once

#include <algorithm>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4lab/io/files.hpp"
#include "fp4lab/io/safetensors.hpp"  // io::Error
#include "fp4lab/text.hpp"            // shown(): a value as a message echoes it

namespace fp4lab::cli {

// Boost.Program_options 1.74 words its errors by replacing placeholders (%value%, %option%, %invalid_line%, ...)
// in a loop that never ends when the text put in holds the placeholder again (a hang on `--block %value%`, or on
// such a line in a config file). Option text goes through this first: io::Error("<where>: ...") naming the first
// %name% it holds (lower-case letters and '_' between two '%').
inline void refuse_option_placeholders(const std::string& text, const std::string& where) {
  // Any %name% (lower-case letters and '_'): the parser's placeholders (%value%, %option%, %invalid_line%, ...)
  // are all of that form, so the rule does not depend on the parser version's list.
  for (size_t i = text.find('%'); i != std::string::npos; i = text.find('%', i + 1)) {
    size_t j = i + 1;
    while (j < text.size() && ((text[j] >= 'a' && text[j] <= 'z') || text[j] == '_')) ++j;
    if (j > i + 1 && j < text.size() && text[j] == '%')
      throw io::Error(where + ": holds '" + text.substr(i, j - i + 1) +
                      "', a placeholder the option parser cannot quote in a message; fp4lab refuses it");
  }
}

inline bool is_json_text(const std::string& text) {
  const size_t i = text.find_first_not_of(" \t\r\n");
  return i != std::string::npos && text[i] == '{';
}

// A placeholder (refuse_option_placeholders) as a Boost.Program_options error: in the `key = value` text, and in
// JSON, whose escapes can spell one that a check of the raw text misses.
inline void refuse_decoded_placeholders(const std::string& text, const std::string& where) {
  try {
    refuse_option_placeholders(text, where);
  } catch (const io::Error& e) {
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

// The longest option value a config file may give, in bytes: far above any path (PATH_MAX is 4096) or list, and
// low enough that a hostile file is refused before its value is copied into every message and parsed option.
inline constexpr size_t kMaxOptionValue = 65536;

// Every value of a parsed file, in either form: no NUL byte (the option would act on the text before it, a file
// name cut short) and at most kMaxOptionValue bytes.
inline void check_option_values(const boost::program_options::parsed_options& parsed) {
  namespace po = boost::program_options;
  for (const po::option& o : parsed.options)
    for (const std::string& v : o.value) {
      if (v.size() > kMaxOptionValue)
        throw po::error("option '" + shown(o.string_key) + "': a value of " + std::to_string(v.size()) +
                        " bytes (at most " + std::to_string(kMaxOptionValue) + ")");
      if (const size_t nul = v.find('\0'); nul != std::string::npos)
        throw po::error("option '" + shown(o.string_key) + "': the value '" + shown(v) +
                        "' holds a NUL byte at byte " + std::to_string(nul));
    }
}

// Parses `text` in either form against `desc`. Throws boost::program_options::error (unknown, empty or repeated
// key, bad JSON, a value of the wrong kind, too long or holding a NUL byte); callers prefix the file name.
inline boost::program_options::parsed_options parse_option_text_whole(
    const std::string& text, const boost::program_options::options_description& desc) {
  namespace po = boost::program_options;
  if (!is_json_text(text)) {
    // Boost expands its placeholders in a message until none is left: a key holding one never ends (the callers
    // check the text too; the reader does not rely on it).
    refuse_decoded_placeholders(text, "the file");
    std::istringstream in(text);
    po::parsed_options parsed = po::parse_config_file(in, desc);
    check_option_values(parsed);
    return parsed;
  }
  // nlohmann keeps the last of a repeated key; the `key = value` form refuses a repeated option, and so does this
  // one, in any object of the document (the keys of each object open so far, innermost last).
  std::vector<std::vector<std::string>> open_keys;
  std::string repeated;
  const auto on_event = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) open_keys.emplace_back();
    if (ev == E::object_end && !open_keys.empty()) open_keys.pop_back();
    if (ev == E::key && !open_keys.empty() && repeated.empty()) {
      const std::string k = parsed.get<std::string>();
      std::vector<std::string>& seen = open_keys.back();
      if (std::find(seen.begin(), seen.end(), k) != seen.end()) repeated = k;
      seen.push_back(k);
    }
    return true;
  };
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text, on_event);
  } catch (const nlohmann::json::exception& e) {
    throw po::error(std::string("not valid JSON: ") + e.what());
  }
  if (!repeated.empty())
    throw po::error("key '" + shown(repeated) + "' is given twice in one object (each option once)");
  const nlohmann::json& obj = doc.contains("config") && doc["config"].is_object() ? doc["config"] : doc;
  po::parsed_options parsed(&desc);
  for (const auto& [key, value] : obj.items()) {
    if (key.empty()) throw po::error("an empty key \"\" (the keys are option names)");
    if (key.find('\0') != std::string::npos)
      throw po::error("key '" + shown(key) + "' holds a NUL byte");
    refuse_decoded_placeholders(key, "a key");
    if (!desc.find_nothrow(key, /*approx=*/false)) throw po::unknown_option(key);
    po::option o(key, json_option_tokens(key, value));
    o.original_tokens = o.value;
    o.original_tokens.insert(o.original_tokens.begin(), key);
    parsed.options.push_back(std::move(o));
  }
  check_option_values(parsed);
  return parsed;
}

// A message of Boost's or nlohmann's as one printable line of at most 300 bytes: they echo an unknown key, an
// invalid line, the last token read or a value of the wrong type whole, which a hostile file makes megabytes long.
inline std::string bounded_message(const std::string& what) {
  std::string m = printable(what);
  if (m.size() > 300) m = m.substr(0, 300) + "... (" + std::to_string(what.size()) + " bytes)";
  return m;
}

// parse_option_text_whole with every message through bounded_message.
inline boost::program_options::parsed_options parse_option_text(const std::string& text,
                                                                 const boost::program_options::options_description& desc) {
  namespace po = boost::program_options;
  try {
    return parse_option_text_whole(text, desc);
  } catch (const po::error& e) {
    const std::string m = bounded_message(e.what());
    if (m == e.what()) throw;
    throw po::error(m);
  }
}

// po::store of options read from text, its messages (a value of the wrong type, echoed) through bounded_message.
inline void store_option_text(const boost::program_options::parsed_options& parsed,
                              boost::program_options::variables_map& vm) {
  namespace po = boost::program_options;
  try {
    po::store(parsed, vm);
  } catch (const po::error& e) {
    const std::string m = bounded_message(e.what());
    if (m == e.what()) throw;
    throw po::error(m);
  }
}

}  // namespace fp4lab::cli
