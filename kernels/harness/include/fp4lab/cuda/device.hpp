// Which GPU a tool runs on, and the faults of finding none: the part of the GPU tools (the conformance check,
// fp4lab/cuda/check.hpp, and the timing harness, fp4lab/cuda/timing.hpp) that every one of them needs first.
// A library over fp4lab_cuda, below the front-ends: a front-end maps NoDevice to its own exit code.
#pragma once

#include <stdexcept>
#include <string>

#include "fp4lab/cuda/kernels.hpp"

namespace fp4lab::cuda {

// No usable CUDA device here; what(): "no usable CUDA device (<the runtime's reason>)".
struct NoDevice : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws NoDevice unless the CUDA runtime finds a usable device. Called once a tool's arguments and inputs are
// checked, before any GPU work.
void require_device();

// Makes device `rank % device count` current (one process per GPU when several ranks share a host) and describes
// it. Throws Error on a CUDA error.
DeviceInfo use_device(int rank);

// The clocks and memory bus of device `id` as the CUDA runtime reports them (0 where it does not).
struct Clocks {
  int sm_khz = 0, memory_khz = 0, memory_bus_bits = 0;
};
Clocks device_clocks(int id);

}  // namespace fp4lab::cuda
