// What the fp4lab cuda subcommands (cmd_cuda_*.cpp) share on the command line's side: --recipe names, the one line
// of a build without CUDA, and the columns of their tables. The GPU work is the library's: the conformance check
// (fp4lab/cuda/check.hpp) and the timing harness (fp4lab/cuda/timing.hpp), where the kernels are built
// (FP4LAB_CLI_HAS_CUDA).
#pragma once

#include <cstddef>
#include <string>

#include "fp4lab/recipe.hpp"

namespace fp4lab::cli::gpu {

// A named recipe preset; an unknown name is a usage fault (exit 2), as --recipe is for every subcommand.
Recipe preset(const std::string& name);

// Called once the arguments and inputs are checked, before any GPU work: throws cli::Error with kExitNoCuda in a
// build without CUDA; in a CUDA build, fp4lab::cuda::NoDevice (exit kExitNoDevice, faults.cpp) where no usable
// CUDA device is found.
#ifdef FP4LAB_CLI_HAS_CUDA
void require_gpu();
#else
[[noreturn]] void require_gpu();
#endif

std::string fixed(double x, int prec = 1);        // fixed-point text
std::string pad(const std::string& s, size_t w);  // right-aligned in w columns

}  // namespace fp4lab::cli::gpu
