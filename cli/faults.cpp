#include "faults.hpp"

#include <boost/program_options/errors.hpp>
#include <new>

#include "fp4lab/io/safetensors.hpp"  // io::Error
#include "options.hpp"

#ifdef FP4LAB_CLI_HAS_CUDA
#include "fp4lab/cuda/check.hpp"   // cuda::CheckFault
#include "fp4lab/cuda/device.hpp"  // cuda::NoDevice
#endif

namespace fp4lab::cli {

int describe(std::exception_ptr e, const std::string& cmd, std::string& msg) {
  try {
    std::rethrow_exception(e);
  } catch (const dist::Quiet& q) {
    msg.clear();
    return q.code;
  } catch (const Error& x) {
    msg = x.what();
    return x.exit_code;
  } catch (const dist::JobFault& x) {  // another rank's fault, as that rank described it
    msg = x.what();
    return x.code;
  } catch (const boost::program_options::error& x) {
    msg = std::string(x.what()) + " (see fp4lab " + cmd + " --help)";
    return kExitUsage;
  } catch (const fp4lab::io::Error& x) {  // already names the file and the fault
    msg = x.what();
    return kExitData;
#ifdef FP4LAB_CLI_HAS_CUDA
  } catch (const fp4lab::cuda::NoDevice& x) {
    msg = x.what();
    return kExitNoDevice;
  } catch (const fp4lab::cuda::CheckFault& x) {  // a trace record the check could not check: names it
    msg = x.what();
    return kExitData;
#endif
  } catch (const std::bad_alloc&) {
    msg = "out of memory";
    return kExitData;
  } catch (const std::exception& x) {
    msg = x.what();
    return kExitData;
  } catch (...) {
    msg = "unexpected internal error";
    return kExitData;
  }
}

}  // namespace fp4lab::cli
