#!/usr/bin/env bash
# Installs every package fp4lab needs: Debian packages, then the Python helpers from PyPI.
# Idempotent: does nothing (and touches no network) when everything is already there.
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake pkg-config
  libeigen3-dev libboost-program-options-dev nlohmann-json3-dev
  libmpfr-dev                      # correctly rounded log/exp of the reported statistics
  googletest libgtest-dev
  libsystemc-dev verilator yosys
  clang libclang-rt-14-dev        # libFuzzer for the trace-reader fuzz target
  libopenmpi-dev openmpi-bin       # MPI-sharded analyze / sim sweeps / fp4lab cuda check (FP4LAB_MPI)
  libtomlplusplus-dev              # TOML sweep files of `fp4lab sim --sweep`
  python3 python3-pip python3-dev
)
# module:pip requirement; only a module that does not import is installed, so an installed PyTorch (a CPU build
# saves gigabytes) is kept, and a missing one gets the version the tests run against. nanobind and
# scikit-build-core build the Python package (pip install .).
PY_PACKAGES=(numpy ml_dtypes safetensors matplotlib pytest torch:torch==2.13.0 nanobind
             transformers:transformers==5.24.0
             scikit_build_core:scikit-build-core)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
pymissing=()
for p in "${PY_PACKAGES[@]}"; do
  "$PY" -c "import ${p%%:*}" 2>/dev/null || pymissing+=("${p#*:}")
done
if [ ${#pymissing[@]} -gt 0 ]; then
  echo "install-deps: pip install ${pymissing[*]}"
  "$PY" -m pip install -q "${pymissing[@]}" 2>/dev/null || "$PY" -m pip install -q --break-system-packages "${pymissing[@]}"
fi
echo "install-deps: all dependencies present"
