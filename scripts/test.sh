#!/usr/bin/env bash
# Builds everything and runs every test: the unit label under AddressSanitizer + UndefinedBehaviorSanitizer,
# then the whole ctest suite (every label: unit, integration, slow, rtl, sim, cuda, mpi) on the Release build,
# then the cross-build comparison (tests/cross_build/check.py).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
# ctest runs tests side by side on 2 cores; spinning OpenMP workers then starve each other (4 s vs 29 s).
export OMP_WAIT_POLICY=passive

# (No Python module under the sanitizers: an instrumented extension cannot load into an uninstrumented python.)
# The Python package as users install it, first: `pip install .` builds the same CMake project with
# scikit-build-core (build-pip/ keeps its objects between runs). Without the CUDA kernels, whose tests need a GPU
# (the package builds them wherever nvcc is found); ctest's python_package_check tests the installed copy.
# -v: pip shows the build as it goes (quiet, it prints nothing for the minutes the first build takes).
echo "== pip install . (builds the package's module and command line into build-pip/) =="
PIP_ROOT_USER_ACTION=ignore python3 -m pip install -v --no-build-isolation -C build-dir=build-pip \
  -C cmake.define.FP4LAB_CUDA=OFF .

# -O1 -g (the optimisation level the sanitizers' documentation recommends) instead of RelWithDebInfo's -O2: about
# a third less compile time. A unity build (CMAKE_UNITY_BUILD) parses the shared headers once per batch of files.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" \
      -DCMAKE_UNITY_BUILD=ON -DFP4LAB_SANITIZE=ON -DFP4LAB_NATIVE=ON \
      -DFP4LAB_SIM=OFF -DFP4LAB_RTL=OFF -DFP4LAB_CUDA=OFF -DFP4LAB_BENCH=OFF -DFP4LAB_PYTHON=OFF >/dev/null
cmake --build build-asan -j"$JOBS"
ctest --test-dir build-asan -L unit --output-on-failure -j"$JOBS"

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$JOBS"
# Every label (unit, integration, slow, rtl, sim, cuda, mpi: docs/testing.md). ctest ends with a list of every test
# that did not run, which on a machine without a GPU is the ~900 CUDA tests: the full output goes to
# build/ctest.log, the terminal gets it without that list, and the summary at the end counts them.
ctest --test-dir build --output-on-failure -j"$JOBS" 2>&1 | tee build/ctest.log \
  | grep --line-buffered -v -E '^The following tests did not run:$|^[[:space:]]+[0-9]+ - .* \((Skipped|Disabled)\)$'
# The same bits on every machine: fp4lab built for baseline x86-64 and x86-64-v3 (where the CPU runs it) beside the
# native build, under 1-3 threads and 1-3 MPI ranks, must write byte-identical analyze, sim, bias, quantize and gemm
# outputs (docs/spec.md §6.1).
python3 tests/cross_build/check.py --main build/bin/fp4lab --work build-arch | tee build/cross-build.log
# The RTL and SystemC harnesses' own summaries (vectors checked, mismatches, verified vectors/s), which a
# passing ctest run does not show.
echo "== rtl / co-simulation vector counts (from build/Testing/Temporary/LastTest.log) =="
grep -h -E 'vectors checked|verified vectors/s|bit-exact|mismatches' build/Testing/Temporary/LastTest.log \
  | grep -E '^\[(fp|e4m3|ue4m3|format_table|rht16|trace_tiles|sc_)' || true

# The last lines: what passed, what did not run and why, and the cross-build verdict.
echo "== summary =="
grep -E '^[0-9]+% tests passed' build/ctest.log
skipped=$(grep -c -E '^[[:space:]]+[0-9]+ - .* \(Skipped\)$' build/ctest.log || true)
cuda=$(ctest --test-dir build -N -L cuda | sed -n 's/^Total Tests: //p')
echo "ctest: $skipped tests skipped (the $cuda CUDA tests skip where no GPU is present); list in build/ctest.log"
grep -E '^cross-build: [0-9]+ outputs compared' build/cross-build.log
