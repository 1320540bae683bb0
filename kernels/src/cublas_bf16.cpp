// cuBLAS BF16 GEMM, the baseline `fp4lab cuda bench` prints beside the block-scaled kernels. Loaded with
// dlopen so that the library, the tests and `check` run without cuBLAS; only `bench` needs it. A toolkit
// without cuBLAS's headers builds the rest: the baseline then reports itself unavailable (FP4LAB_HAVE_CUBLAS=0).
#include <string>

#include "fp4lab/cuda/kernels.hpp"

#if !FP4LAB_HAVE_CUBLAS
namespace fp4lab::cuda {
struct CublasBf16::Impl {};
CublasBf16::CublasBf16() {
  throw Error("this build has no cuBLAS baseline: cublas_v2.h was not found when it was compiled");
}
CublasBf16::~CublasBf16() = default;
void CublasBf16::gemm(const uint16_t*, const uint16_t*, float*, int64_t, int64_t, int64_t, cudaStream_t) {
  throw Error("this build has no cuBLAS baseline");
}
}  // namespace fp4lab::cuda
#else
#include <cublas_v2.h>
#include <dlfcn.h>

namespace fp4lab::cuda {

struct CublasBf16::Impl {
  void* lib = nullptr;
  cublasHandle_t handle = nullptr;
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  // cublas_api.h overloads cublasGemmEx for C++: name the C entry point's type.
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmEx gemm_ex = nullptr;
};

namespace {
template <class F>
void bind(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f) throw Error(std::string("cuBLAS: symbol ") + name + " not found");
}
void check_status(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuBLAS ") + what + " failed with status " + std::to_string(int(s)));
}
}  // namespace

CublasBf16::CublasBf16() : impl_(new Impl) {
  const char* names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  for (const char* n : names)
    if ((impl_->lib = dlopen(n, RTLD_NOW | RTLD_LOCAL))) break;
  if (!impl_->lib) {
    delete impl_;
    impl_ = nullptr;
    throw Error("cannot load libcublas.so.13 (or .12): put the CUDA toolkit's lib64 on LD_LIBRARY_PATH");
  }
  try {
    bind(impl_->lib, "cublasCreate_v2", impl_->create);
    bind(impl_->lib, "cublasDestroy_v2", impl_->destroy);
    bind(impl_->lib, "cublasSetStream_v2", impl_->set_stream);
    bind(impl_->lib, "cublasGemmEx", impl_->gemm_ex);
    check_status(impl_->create(&impl_->handle), "create");
  } catch (...) {
    dlclose(impl_->lib);
    delete impl_;
    impl_ = nullptr;
    throw;
  }
}

CublasBf16::~CublasBf16() {
  if (!impl_) return;
  if (impl_->handle) impl_->destroy(impl_->handle);
  // The library stays loaded: unloading cuBLAS while the CUDA runtime is live is not worth the risk.
  delete impl_;
}

void CublasBf16::gemm(const uint16_t* d_a, const uint16_t* d_b, float* d_c, int64_t M, int64_t N, int64_t K,
                      cudaStream_t stream) {
  check_status(impl_->set_stream(impl_->handle, stream), "set stream");
  const float one = 1.0f, zero = 0.0f;
  // Row-major C[M,N] = A[M,K] B[N,K]^T is column-major C^T[N,M] = B[N,K] (as K x N, transposed) . A^T.
  check_status(impl_->gemm_ex(impl_->handle, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, d_b,
                              CUDA_R_16BF, int(K), d_a, CUDA_R_16BF, int(K), &zero, d_c, CUDA_R_32F, int(N),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "GemmEx (BF16 in, FP32 out, FP32 compute)");
}

}  // namespace fp4lab::cuda
#endif  // FP4LAB_HAVE_CUBLAS
