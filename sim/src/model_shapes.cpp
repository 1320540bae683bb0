#include "fp4lab/sim/model_shapes.hpp"

#include <unistd.h>

#include <algorithm>
#include <set>
#include <stdexcept>

#include "fp4lab/io/files.hpp"
#include "fp4lab/io/safetensors.hpp"  // io::Error
#include "fp4lab/text.hpp"            // shown()

namespace fp4lab::sim {

namespace {

using json = nlohmann::json;
constexpr int64_t kMax = kMaxShapeDim;
constexpr size_t kMaxConfigBytes = 16u << 20;

[[noreturn]] void fail(const std::string& field, const std::string& fault) {
  throw std::invalid_argument(field + ": " + fault);
}

std::string echo(const json& v) { return shown(v.dump(-1, ' ', false, json::error_handler_t::replace)); }

// A field by its name in config.json, and the other name its config class maps to it (PretrainedConfig's
// attribute_map: transformers writes some fields under the other name, e.g. Qwen3MoeConfig's num_local_experts for
// config.json's num_experts).
struct Key {
  const char* name;
  const char* alias = nullptr;
};

// The fields of one config.json object, each read with its range; a fault names the field.
class Fields {
 public:
  explicit Fields(const json& j) : j_(j) {}
  // The value under either name (null counts as given here), or nullptr; both names with different values is a fault.
  const json* find(Key k) const {
    const json* a = j_.contains(k.name) ? &j_.at(k.name) : nullptr;
    const json* b = k.alias && j_.contains(k.alias) ? &j_.at(k.alias) : nullptr;
    if (a && b && *a != *b)
      fail(k.name, "given as " + echo(*a) + " and, as " + std::string(k.alias) + ", " + echo(*b));
    return a ? a : b;
  }
  bool present(Key k) const { return find(k) != nullptr; }
  bool given(Key k) const { return find(k) && !find(k)->is_null(); }  // present and not null
  // A required integer in lo..hi.
  int64_t integer(Key k, int64_t lo = 1, int64_t hi = kMax, const std::string& why = "") const {
    const json* v = find(k);
    if (!v || v->is_null()) fail(k.name, v ? "null, where a number is needed" + why : "missing" + why);
    return check(k.name, *v, lo, hi);
  }
  std::string text(Key k) const {
    const json* v = find(k);
    if (!v) fail(k.name, "missing");
    if (!v->is_string()) fail(k.name, echo(*v) + " is not a string");
    return v->get<std::string>();
  }
  const json& at(Key k) const { return *find(k); }

  static int64_t check(const std::string& k, const json& v, int64_t lo, int64_t hi) {
    if (!v.is_number_integer()) fail(k, echo(v) + " is not an integer");
    const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(hi) && int64_t(v.get<uint64_t>()) >= lo
                                                 : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
    if (!in_range) fail(k, echo(v) + " is outside " + std::to_string(lo) + ".." + std::to_string(hi));
    return v.is_number_unsigned() ? int64_t(v.get<uint64_t>()) : v.get<int64_t>();
  }

 private:
  const json& j_;
};

// a * b as a layer dimension: at most kMaxShapeDim (the operands are each at most that, so no overflow).
int64_t dim(int64_t a, int64_t b, const std::string& what) {
  const int64_t r = a * b;
  if (r > kMax) fail(what, std::to_string(r) + " is over the " + std::to_string(kMax) + " a dimension may have");
  return r;
}

struct Experts {
  int64_t experts = 0, top_k = 0, tokens = 0;  // tokens: each expert's, ceil(tokens * top_k / experts)
};
Experts experts(const Fields& f, Key count_key, int64_t tokens) {
  Experts e;
  e.experts = f.integer(count_key);
  e.top_k = f.integer({"num_experts_per_tok"}, 1, e.experts);
  e.tokens = (tokens * e.top_k + e.experts - 1) / e.experts;  // at most 2^31 * 2^31: inside int64
  return e;
}
std::string experts_text(const Experts& e, int64_t ffn, int64_t tokens) {
  return std::to_string(e.experts) + " experts of FFN " + std::to_string(ffn) + ", top-" + std::to_string(e.top_k) +
         ", each expert " + std::to_string(e.tokens) + " tokens (balanced routing: ceil(" + std::to_string(tokens) +
         " x " + std::to_string(e.top_k) + " / " + std::to_string(e.experts) + "))";
}

ModelShapes gpt2(const Fields& f, int64_t tokens) {
  ModelShapes m;
  m.model_type = "gpt2";
  if (f.given({"add_cross_attention"}) && f.at({"add_cross_attention"}) != json(false))
    fail("add_cross_attention", echo(f.at({"add_cross_attention"})) + ": cross-attention layers are not supported");
  const int64_t d = f.integer({"n_embd", "hidden_size"}), layers = f.integer({"n_layer", "num_hidden_layers"});
  const int64_t heads = f.integer({"n_head", "num_attention_heads"});
  if (d % heads) fail("n_head", std::to_string(heads) + " does not divide n_embd " + std::to_string(d));
  const int64_t inner = f.given({"n_inner"}) ? f.integer({"n_inner"}) : dim(4, d, "4 x n_embd");
  const int64_t vocab = f.integer({"vocab_size"});
  const double n = double(layers);
  m.layers = {{"linear_qkv", tokens, d, dim(3, d, "3 x n_embd"), n},
              {"linear_proj", tokens, d, d, n},
              {"linear_fc1", tokens, d, inner, n},
              {"linear_fc2", tokens, inner, d, n},
              {"lm_head", tokens, d, vocab, 1}};
  m.summary = "gpt2: n_embd " + std::to_string(d) + ", " + std::to_string(layers) + " layers, " +
              std::to_string(heads) + " heads, MLP " + std::to_string(inner) + ", vocab " + std::to_string(vocab) +
              "; " + std::to_string(tokens) + " tokens";
  return m;
}

}  // namespace

const std::vector<std::string>& model_types() {
  static const std::vector<std::string> t = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe",
                                             "qwen3", "qwen3_moe", "gpt2"};
  return t;
}

ModelShapes model_shapes(const json& config, int64_t tokens) {
  if (tokens < 1 || tokens > kMax)
    fail("tokens", std::to_string(tokens) + " is outside 1.." + std::to_string(kMax));
  if (!config.is_object())
    throw std::invalid_argument(std::string("not a JSON object (a config.json is one; this is a JSON ") +
                                config.type_name() + ")");
  const Fields f(config);
  const std::string type = f.text({"model_type"});
  const auto& known = model_types();
  if (std::find(known.begin(), known.end(), type) == known.end()) {
    std::string list;
    for (const std::string& t : known) list += (list.empty() ? "" : ", ") + t;
    fail("model_type", "'" + shown(type) + "' is not supported (" + list + ")");
  }
  if (type == "gpt2") return gpt2(f, tokens);

  ModelShapes m;
  m.model_type = type;
  const int64_t hidden = f.integer({"hidden_size"}), layers = f.integer({"num_hidden_layers"});
  const int64_t heads = f.integer({"num_attention_heads"});
  // LlamaConfig takes an absent num_key_value_heads as num_attention_heads (multi-head attention); the other
  // config classes default it to a fixed number of their own, so their config.json must give it (null: MHA).
  int64_t kv = heads;
  if (f.given({"num_key_value_heads"}))
    kv = f.integer({"num_key_value_heads"}, 1, heads);
  else if (!f.present({"num_key_value_heads"}) && type != "llama")
    fail("num_key_value_heads", "missing (the " + type + " config class does not default it to num_attention_heads)");
  if (heads % kv)
    fail("num_key_value_heads", std::to_string(kv) + " does not divide num_attention_heads " + std::to_string(heads));
  // Qwen3Config defaults head_dim to 128 whatever the widths; the others derive it from them.
  int64_t head_dim = 0;
  if (f.given({"head_dim"}) || type == "qwen3") {
    head_dim = f.integer({"head_dim"}, 1, kMax, type == "qwen3" ? " (the qwen3 config class defaults it to 128, not to "
                                                               "hidden_size / num_attention_heads)" : "");
  } else {
    if (hidden % heads)
      fail("head_dim", "missing, and num_attention_heads " + std::to_string(heads) + " does not divide hidden_size " +
                           std::to_string(hidden));
    head_dim = hidden / heads;
  }
  const int64_t vocab = f.integer({"vocab_size"});
  const int64_t q_width = dim(heads, head_dim, "num_attention_heads x head_dim");
  const int64_t qkv = dim(heads + 2 * kv, head_dim, "(num_attention_heads + 2 x num_key_value_heads) x head_dim");
  const double n = double(layers);
  m.layers = {{"linear_qkv", tokens, hidden, qkv, n}, {"linear_proj", tokens, q_width, hidden, n}};
  m.summary = type + ": hidden " + std::to_string(hidden) + ", " + std::to_string(layers) + " layers, " +
              std::to_string(heads) + " query heads and " + std::to_string(kv) + " KV heads of " +
              std::to_string(head_dim);
  const auto dense_mlp = [&](int64_t ffn, double count, const std::string& prefix) {
    m.layers.push_back({prefix + "linear_fc1", tokens, hidden, dim(2, ffn, "2 x FFN width"), count});
    m.layers.push_back({prefix + "linear_fc2", tokens, ffn, hidden, count});
  };
  const auto expert_mlp = [&](const Experts& e, int64_t ffn, double sparse_layers) {
    m.layers.push_back({"router", tokens, hidden, e.experts, sparse_layers});
    const double count = sparse_layers * double(e.experts);
    m.layers.push_back({"expert.linear_fc1", e.tokens, hidden, dim(2, ffn, "2 x expert FFN width"), count});
    m.layers.push_back({"expert.linear_fc2", e.tokens, ffn, hidden, count});
  };

  if (type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3") {
    const int64_t ffn = f.integer({"intermediate_size"});
    dense_mlp(ffn, n, "");
    m.summary += ", FFN " + std::to_string(ffn);
  } else if (type == "mixtral") {
    const Experts e = experts(f, {"num_local_experts", "num_experts"}, tokens);
    const int64_t ffn = f.integer({"intermediate_size"});
    expert_mlp(e, ffn, n);
    m.summary += ", " + experts_text(e, ffn, tokens);
  } else {  // qwen2_moe, qwen3_moe
    // Layer i is sparse when num_experts > 0, i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
    // Qwen3MoeConfig maps num_experts to num_local_experts; Qwen2MoeConfig keeps num_experts.
    const Key n_experts = type == "qwen3_moe" ? Key{"num_experts", "num_local_experts"} : Key{"num_experts"};
    const int64_t num_experts = f.integer(n_experts, 0, kMax);
    const int64_t step = f.given({"decoder_sparse_step"}) ? f.integer({"decoder_sparse_step"}) : 1;
    std::set<int64_t> only;
    if (f.given({"mlp_only_layers"})) {
      const json& v = f.at({"mlp_only_layers"});
      if (!v.is_array()) fail("mlp_only_layers", echo(v) + " is not a list of layer indices");
      for (const json& i : v) only.insert(Fields::check("mlp_only_layers", i, 0, layers - 1));
    }
    int64_t sparse = 0;
    if (num_experts > 0) {
      sparse = layers / step;
      for (int64_t i : only) sparse -= (i + 1) % step == 0;
    }
    const int64_t dense = layers - sparse;
    m.summary += ", " + std::to_string(sparse) + " sparse and " + std::to_string(dense) + " dense MLP layers";
    if (dense > 0) {
      const int64_t ffn = f.integer({"intermediate_size"});
      dense_mlp(ffn, double(dense), "");
      m.summary += ", dense FFN " + std::to_string(ffn);
    }
    if (sparse > 0) {
      const Experts e = experts(f, n_experts, tokens);
      const int64_t ffn = f.integer({"moe_intermediate_size"});
      expert_mlp(e, ffn, double(sparse));
      m.summary += ", " + experts_text(e, ffn, tokens);
      if (type == "qwen2_moe") {
        const int64_t shared = f.integer({"shared_expert_intermediate_size"});
        dense_mlp(shared, double(sparse), "shared_expert.");
        m.layers.push_back({"shared_expert_gate", tokens, hidden, 1, double(sparse)});
        m.summary += ", shared expert FFN " + std::to_string(shared);
      }
    }
  }
  m.layers.push_back({"lm_head", tokens, hidden, vocab, 1});
  m.summary += ", vocab " + std::to_string(vocab) + "; " + std::to_string(tokens) + " tokens";
  for (const LayerShape& l : m.layers)  // layers x experts: a shape list's count is at most kMaxShapeDim too
    if (l.count > double(kMax))
      fail(l.gemm, "occurs " + std::to_string(int64_t(l.count)) + " times a step (layers x experts), over the " +
                       std::to_string(kMax) + " a shape list may count");
  return m;
}

json parse_model_config(const std::string& text, const std::string& name) {
  // json.load keeps the last of a repeated key; a config that says two things is refused instead.
  std::vector<std::vector<std::string>> open_keys;
  std::string repeated;
  const auto on_event = [&](int, json::parse_event_t ev, json& parsed) {
    using E = json::parse_event_t;
    if (ev == E::object_start) open_keys.emplace_back();
    if (ev == E::object_end && !open_keys.empty()) open_keys.pop_back();
    if (ev == E::key && !open_keys.empty() && repeated.empty()) {
      std::vector<std::string>& seen = open_keys.back();
      const std::string k = parsed.get<std::string>();
      if (std::find(seen.begin(), seen.end(), k) != seen.end()) repeated = k;
      seen.push_back(k);
    }
    return true;
  };
  json doc;
  try {
    doc = json::parse(text, on_event);
  } catch (const json::parse_error& e) {
    throw std::invalid_argument(name + ": not valid JSON (syntax error near byte " + std::to_string(e.byte) + ")");
  } catch (const json::exception&) {  // 1e999: out_of_range
    throw std::invalid_argument(name + ": not valid JSON (a number is out of range)");
  }
  if (!repeated.empty()) throw std::invalid_argument(name + ": key '" + shown(repeated) + "' is given twice in one object");
  return doc;
}

ModelShapes read_model_shapes(const std::string& path, int64_t tokens) {
  std::string text;
  try {
    size_t size = 0;
    ::close(io::open_regular(path, size, "model config"));  // a FIFO or device is refused, not waited on
    // A config.json is kilobytes; a file far past that is refused before it is read into memory.
    if (size > kMaxConfigBytes)
      throw std::invalid_argument(path + ": " + std::to_string(size) + " bytes, over the " +
                                  std::to_string(kMaxConfigBytes) + " a model config may have");
    text = io::read_regular_file(path, "model config");
  } catch (const io::Error& e) {
    throw std::invalid_argument(e.what());
  }
  const json doc = parse_model_config(text, path);
  try {
    return model_shapes(doc, tokens);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

}  // namespace fp4lab::sim
