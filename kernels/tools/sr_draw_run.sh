#!/usr/bin/env bash
# The SR draws (docs/spec.md §4) on a CUDA machine, in one run: the whole kernel suite (every draw), fp4lab cuda
# check on both bundled traces under every preset and every draw, compute-sanitizer memcheck on the SR quantiser
# tests, and fp4lab cuda qbench at the training step's shapes (sr = philox4, sr1 = philox1, sr16 = philox16, beside
# the device-to-device copy). Binaries as for h200_run.sh, in $CARRY/{bin,lib}; the steps of a binary that is absent
# are left out, so that the two can come in two calls. Logs to $LOGS (default sr-draw-out).
# Exit status: the number of failed steps.
set -u
CARRY=${CARRY:-build-cuda-bundle}
LOGS=${LOGS:-sr-draw-out}
mkdir -p "$LOGS"
export LD_LIBRARY_PATH="$CARRY/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
command -v compute-sanitizer >/dev/null || PATH="$(dirname "$(find /usr/local /opt -name compute-sanitizer -type f 2>/dev/null | head -1)"):$PATH"
fail=0
. "$(dirname "$0")/../../scripts/gpu_step.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$LOGS/env.log"

if [ -x "$CARRY/bin/fp4lab_kernels_tests" ]; then
  TAIL=4 step tests timeout 300 "$CARRY/bin/fp4lab_kernels_tests" --gtest_brief=1
  TAIL=3 step memcheck-sr timeout 250 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$CARRY/bin/fp4lab_kernels_tests" --gtest_brief=1 \
    --gtest_filter='*e1m2_b16_fp32scale_rht16_sr*:*e2m1_b16x16_ue4m3scale_rht16_sr*:*e2m1_b32_ue8m0scale_rht0_sr_philox16*:QuantizeRowsErrors.*:QuantizeDeviceSeed.*'
fi
[ -x "$CARRY/bin/fp4lab" ] || { echo "failed steps: $fail"; exit $fail; }
for t in workloads/tiny-lm/step_005000 workloads/doc-lm/step_001999; do
  for r in ufp4 e2m1-ref nvfp4 mxfp4; do
    for d in philox4 philox1 philox16; do
      TAIL=1 step "check-$(basename "$(dirname "$t")")-$r-$d" timeout 90 \
        "$CARRY/bin/fp4lab" cuda check --trace "$t" --recipe "$r" --sr-draw "$d"
    done
  done
done
TAIL=80 step qbench timeout 300 "$CARRY/bin/fp4lab" cuda qbench --shape 8192x1024 8192x2816 1024x8192 2816x1024 \
  --recipe ufp4 nvfp4 --reps 20 --json "$LOGS/qbench.json"
echo "failed steps: $fail"
exit $fail
