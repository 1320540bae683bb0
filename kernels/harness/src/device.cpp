#include "fp4lab/cuda/device.hpp"

namespace fp4lab::cuda {

void require_device() {
  std::string why;
  if (!device_available(&why)) throw NoDevice("no usable CUDA device (" + why + ")");
}

DeviceInfo use_device(int rank) {
  int devices = 1;
  check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  check(cudaSetDevice(rank % devices), "cudaSetDevice");
  return device_info();
}

Clocks device_clocks(int id) {
  Clocks c;  // an attribute the runtime cannot read stays 0
  cudaDeviceGetAttribute(&c.sm_khz, cudaDevAttrClockRate, id);
  cudaDeviceGetAttribute(&c.memory_khz, cudaDevAttrMemoryClockRate, id);
  cudaDeviceGetAttribute(&c.memory_bus_bits, cudaDevAttrGlobalMemoryBusWidth, id);
  return c;
}

}  // namespace fp4lab::cuda
