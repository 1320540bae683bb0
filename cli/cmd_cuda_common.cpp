#include "cmd_cuda_common.hpp"

#include <sstream>
#include <stdexcept>

#include "options.hpp"

#ifdef FP4LAB_CLI_HAS_CUDA
#include "fp4lab/cuda/device.hpp"
#endif

namespace fp4lab::cli::gpu {

Recipe preset(const std::string& name) {
  try {
    return Recipe::preset(name);
  } catch (const std::invalid_argument& e) {
    usage_error(e.what());
  }
}

#ifndef FP4LAB_CLI_HAS_CUDA
void require_gpu() {
  throw Error(kExitNoCuda, "this fp4lab was built without CUDA (FP4LAB_CUDA=OFF or no nvcc found when configured)");
}
#else
void require_gpu() { fp4lab::cuda::require_device(); }
#endif

std::string fixed(double x, int prec) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(prec);
  o << x;
  return o.str();
}

std::string pad(const std::string& s, size_t w) { return s.size() >= w ? s : std::string(w - s.size(), ' ') + s; }

}  // namespace fp4lab::cli::gpu
