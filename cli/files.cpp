#include "files.hpp"

#include "options.hpp"
#include "fp4lab/io/outputs.hpp"

namespace fp4lab::cli {

void check_outputs(const boost::program_options::variables_map& vm, std::vector<std::string> outputs,
                   std::vector<std::string> inputs) {
  if (vm.count("json") && vm["json"].as<std::string>() != "-") outputs.push_back(vm["json"].as<std::string>());
  if (vm.count("config")) inputs.push_back(vm["config"].as<std::string>());
  if (const auto f = io::output_fault(outputs, inputs)) throw Error(f->usage ? kExitUsage : kExitData, f->message);
}

}  // namespace fp4lab::cli
