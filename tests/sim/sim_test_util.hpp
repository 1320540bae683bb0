// Shared helpers of the sim tests.
#pragma once

#include <string>
#include <vector>

#include "fp4lab/quantize.hpp"
#include "fp4lab/sim/config.hpp"
#include "fp4lab/sim/simulator.hpp"
#include "fp4lab/sim/workload.hpp"
#include "sim_config.hpp"  // cli/: configuration files are read as the command line reads them

namespace fp4lab::sim::test {

inline std::string root() { return FP4LAB_ROOT; }
inline std::string config_path(const std::string& name) { return root() + "/sim/configs/" + name + ".cfg"; }
inline Config load(const std::string& path, const std::vector<std::string>& overrides = {}) {
  return cli::load_sim_config(path, overrides);
}
inline Config config(const std::string& name, const std::vector<std::string>& overrides = {}) {
  return load(config_path(name), overrides);
}

// e1m2, block 16, fp32 scale, RTNE, optionally an RHT of size d with Transformer Engine's signs.
inline QuantConfig plain(int rht = 0, int block = 16) {
  QuantConfig q;
  q.format = kE1M2;
  q.block = block;
  if (rht) {
    q.rht = rht;
    q.rht_signs.assign(size_t(rht), 1.0f);
  }
  return q;
}

inline GemmJob job(int64_t M, int64_t N, int64_t K, const QuantConfig& q = plain()) {
  GemmJob j;
  j.layer = std::string(1, 't');  // (a literal here trips GCC 12's -Wrestrict false positive, PR 105329)
  j.M = M;
  j.N = N;
  j.K = K;
  j.a = q;
  j.b = q;
  return j;
}

}  // namespace fp4lab::sim::test
