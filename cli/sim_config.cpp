#include "sim_config.hpp"

#include <map>
#include <stdexcept>
#include <variant>

#include "fp4lab/io/files.hpp"
#include "fp4lab/io/safetensors.hpp"  // io::Error
#include "option_file.hpp"

namespace fp4lab::cli {

namespace po = boost::program_options;

namespace {
std::string joined(std::span<const char* const> names, const char* sep) {
  std::string r;
  for (const char* n : names) r.append(r.empty() ? "" : sep).append(n);
  return r;
}
}  // namespace

po::options_description sim_config_options() {
  po::options_description d("TCU model (config file keys; any of them also as --key VALUE)");
  const sim::Config defaults;
  for (const sim::ConfigKey& k : sim::config_keys()) {
    const std::span<const char* const> choices = sim::key_choices(k);
    const std::string help = choices.empty() ? k.help : joined(choices, " | ") + ": " + k.help;  // an enum by name
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          po::typed_value<T>* value = po::value<T>();
          if (!k.required) value->default_value(v);
          d.add_options()(k.name.c_str(), value, help.c_str());
        },
        defaults.value(k));
  }
  return d;
}

sim::Config sim_config_from(const po::variables_map& vm) {
  const sim::Config defaults;
  std::map<std::string, sim::ConfigValue> values;
  for (const sim::ConfigKey& k : sim::config_keys())
    if (vm.count(k.name))
      std::visit([&](const auto& v) { values[k.name] = vm[k.name].as<std::decay_t<decltype(v)>>(); },
                 defaults.value(k));
  return sim::Config::from(values);
}

sim::Config load_sim_config(const std::string& path, const std::vector<std::string>& overrides) {
  const po::options_description desc = sim_config_options();
  po::variables_map vm;
  try {
    std::vector<std::string> args;
    for (const std::string& o : overrides) {
      refuse_option_placeholders(o, "override");
      args.push_back("--" + o);
    }
    po::store(po::command_line_parser(args)
                  .options(desc)
                  .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
                  .run(),
              vm);
    // A FIFO or device is refused, not waited on; config files do not nest.
    const std::string text = io::read_regular_file(path, "config file");
    refuse_option_placeholders(text, path);
    const po::parsed_options parsed = parse_option_text(text, desc);  // `key = value` lines or JSON
    store_option_text(parsed, vm);
    po::notify(vm);
    return sim_config_from(vm);
  } catch (const io::Error& e) {  // already "<path>: <fault>"
    throw std::invalid_argument(e.what());
  } catch (const std::exception& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

}  // namespace fp4lab::cli
