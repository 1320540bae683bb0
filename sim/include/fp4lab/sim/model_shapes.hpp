// The linear-layer GEMMs of one training step of a model, derived from its Hugging Face config.json
// (docs/spec.md §13 gives the rule: which fields, which defaults). The rows are a shape list's (workload.hpp
// LayerShape, the format of workloads/shapes/*.csv), the model's own dimensions, unpadded; no SystemC here, so the
// Python module links it too (fp4lab.model_shapes).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fp4lab/sim/workload.hpp"

namespace fp4lab::sim {

struct ModelShapes {
  std::string model_type;
  std::string summary;             // one line: the dimensions the rows follow from
  std::vector<LayerShape> layers;  // in model order; count = occurrences in one training step
};

// The model types model_shapes knows, in the order of docs/spec.md §13.
const std::vector<std::string>& model_types();

// One training step of `tokens` tokens (batch x sequence, at most kMaxShapeDim) through the model `config`
// describes. Throws std::invalid_argument "FIELD: fault" (one line) for an unsupported model_type, a missing
// field, or a value that is not a positive integer in range.
ModelShapes model_shapes(const nlohmann::json& config, int64_t tokens);

// A config.json's text as JSON: an object, each key once in each object. Throws std::invalid_argument
// "NAME: fault"; `name` stands for the file in the message.
nlohmann::json parse_model_config(const std::string& text, const std::string& name);
// parse_model_config of a regular file, then model_shapes; every fault "PATH: fault".
ModelShapes read_model_shapes(const std::string& path, int64_t tokens);

}  // namespace fp4lab::sim
