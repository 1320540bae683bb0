#!/usr/bin/env bash
# Everything the CUDA layer needs a GPU for, in one call on an H200 (see kernels/README.md):
# the cuda tests, fp4lab cuda check on the bundled trace under every recipe, compute-sanitizer memcheck, and the
# bench. The binaries are built on a machine with nvcc (cmake -DFP4LAB_NATIVE=OFF -DFP4LAB_SIM=OFF, and
# -DFP4LAB_MPI=OFF unless the GPU image has libmpi: kernels/README.md) and are copied, with the shared
# libraries the GPU image may lack, to the folder CARRY names (default build-cuda-bundle):
#   $CARRY/bin/{fp4lab,fp4lab_kernels_tests}
#   $CARRY/lib/{libboost_program_options.so.1.74.0,libgomp.so.1,libmpfr.so.6,libgmp.so.10}
#   [CARRY=build-cuda-bundle] [LOGS=h200-out] [TRACE=workloads/tiny-lm/step_005000] [NCU=1] kernels/tools/h200_run.sh
# Logs go to $LOGS (default ./h200-out), each step's also appended to $COMBINED when set. Exit status: the
# number of failed steps.
set -u
CARRY=${CARRY:-build-cuda-bundle}
LOGS=${LOGS:-h200-out}
TRACE=${TRACE:-workloads/tiny-lm/step_005000}
mkdir -p "$LOGS"
export LD_LIBRARY_PATH="$PWD/$CARRY/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
command -v compute-sanitizer >/dev/null || PATH="$(dirname "$(find /usr/local /opt -name compute-sanitizer -type f 2>/dev/null | head -1)"):$PATH"
# cuBLAS for the bench's BF16 baseline: the toolkit's, else the one PyTorch carries.
if ! ldconfig -p | grep -q libcublas.so.13 && [ ! -e /usr/local/cuda/lib64/libcublas.so.13 ]; then
  c=$(find /usr/local /opt -name 'libcublas.so.13' 2>/dev/null | head -1)
  [ -n "$c" ] && export LD_LIBRARY_PATH="$(dirname "$c"):$LD_LIBRARY_PATH"
fi
fail=0
. "$(dirname "$0")/../../scripts/gpu_step.sh"

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >"$LOGS/env.log" 2>&1
uname -r >>"$LOGS/env.log"
cat "$LOGS/env.log"

step tests timeout 120 "$CARRY/bin/fp4lab_kernels_tests" --gtest_brief=1
for r in ufp4 e2m1-ref nvfp4 mxfp4; do
  TAIL=3 step "check-$r" timeout 45 "$CARRY/bin/fp4lab" cuda check --trace "$TRACE" --recipe "$r"
done
TAIL=60 step bench timeout 120 "$CARRY/bin/fp4lab" cuda bench --trace "$TRACE" --json "$LOGS/bench.json"
TAIL=30 step bench-repeat timeout 90 "$CARRY/bin/fp4lab" cuda bench  # the 8192 shapes again: run-to-run spread
TAIL=3 step memcheck-tests timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$CARRY/bin/fp4lab_kernels_tests" --gtest_brief=1 \
  --gtest_filter='*e1m2_b16_fp32scale_rht16*:*e2m1_b16_ue4m3scale*:*e2m1_b32_ue8m0scale*:*int4_b16x16*:*Gemm*:*Errors*-*1024*:*1088*'
TAIL=3 step memcheck-check timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$CARRY/bin/fp4lab" cuda check --trace "$TRACE" --recipe nvfp4 --limit 1
if [ -n "${NCU:-}" ]; then  # hardware counters: one 8192^3 fast-GEMM launch (default block-16 variant), one fused quantise
  NCU_SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats"
  TAIL=40 step ncu-gemm timeout 150 ncu --clock-control none --kernel-name-base mangled \
    -k regex:gemm_mma_kernelILi16ENS1_4TileILi2ELi4ELi4ELi4E --launch-skip 2 --launch-count 1 \
    $NCU_SECTIONS "$CARRY/bin/fp4lab" cuda bench --reps 3
  TAIL=40 step ncu-quantize timeout 100 ncu --clock-control none --kernel-name-base mangled \
    -k regex:quantize_kernelILi1ELi16ELi16E --launch-skip 2 --launch-count 1 \
    $NCU_SECTIONS "$CARRY/bin/fp4lab" cuda bench --reps 3 --size 8192
fi
echo "failed steps: $fail"
exit $fail
