#!/usr/bin/env bash
# The quantiser's GPU evidence in one call (kernels/README.md, "Quantiser speed"): the cuda tests, fp4lab cuda
# qbench (every variant beside a copy of the same bytes), ncu counters of the row-wise and transposed kernels,
# compute-sanitizer memcheck on the quantiser tests. Binaries in $CARRY/bin, the shared libraries the GPU image
# may lack in $CARRY/lib (as kernels/tools/h200_run.sh; CARRY defaults to build-cuda-bundle). Logs in $LOGS.
# STEPS picks steps (default: all).
#   [CARRY=build-cuda-bundle] BASE="old/bin/fp4lab cuda" kernels/tools/qbench_run.sh
set -u
CARRY=${CARRY:-build-cuda-bundle}
LOGS=${LOGS:-qbench-out}
STEPS=${STEPS:-tests qbench ncu mix sass memcheck}
mkdir -p "$LOGS"
export LD_LIBRARY_PATH="$PWD/$CARRY/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
command -v compute-sanitizer >/dev/null || PATH="$(dirname "$(find /usr/local /opt -name compute-sanitizer -type f 2>/dev/null | head -1)"):$PATH"
command -v cuobjdump >/dev/null || PATH="$(dirname "$(find /usr/local /opt -name cuobjdump -type f 2>/dev/null | head -1)"):$PATH"
command -v ncu >/dev/null || PATH="$(dirname "$(find /usr/local /opt -name ncu -type f 2>/dev/null | head -1)"):$PATH"
fail=0
. "$(dirname "$0")/../../scripts/gpu_step.sh"
has() { [[ " $STEPS " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >"$LOGS/env.log" 2>&1
cat "$LOGS/env.log"
has tests && TAIL=8 step tests timeout 300 "$CARRY/bin/fp4lab_kernels_tests" --gtest_brief=1
has qbench && TAIL=200 step qbench timeout 240 "$CARRY/bin/fp4lab" cuda qbench --json "$LOGS/qbench.json"
# BASE: the `fp4lab cuda` of another build (an earlier commit) timed in the same call, for before/after figures;
# a command of words, split here.
[ -n "${BASE:-}" ] && has qbench && TAIL=120 step qbench-base timeout 240 $BASE qbench --json "$LOGS/qbench-base.json"
if has ncu; then
  SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats
            --section WarpStateStats --section MemoryWorkloadAnalysis"
  # One launch each at 8192x1024 BF16 (kernel template: <T = BF16 bits, format index (0 E2M1, 1 E1M2), block, RHT>).
  while read -r name kernel recipe variant layout; do
    TAIL=80 step "ncu-$name" timeout 120 ncu --clock-control none --kernel-name-base mangled -k "regex:$kernel" \
      --launch-skip 1 --launch-count 1 $SECTIONS "$CARRY/bin/fp4lab" cuda qbench --shape 8192x1024 \
      --recipe "$recipe" --variant "$variant" --layout "$layout" --reps 3 </dev/null
  done <<'LIST'
ufp4-plain-row quantize_kernelItLi1ELi16ELi0E ufp4 plain row-wise
ufp4-sr-row quantize_kernelItLi1ELi16ELi0E ufp4 sr row-wise
ufp4-rht16-row quantize_kernelItLi1ELi16ELi16E ufp4 rht16 row-wise
ufp4-plain-transposed quantize_t_kernelItLi1ELi16ELi0E ufp4 plain transposed
nvfp4-amax-row amax_kernelItLi16ELi0E nvfp4 plain row-wise
nvfp4-plain-row quantize_kernelItLi0ELi16ELi0E nvfp4 plain row-wise
mxfp4-plain-transposed quantize_t_kernelItLi0ELi32ELi0E mxfp4 plain transposed
LIST
fi
# Executed instructions per opcode (whole launch) of the row-wise plain kernels (ufp4, mxfp4) and SR (ufp4).
if has mix; then
  while read -r name kernel recipe variant; do
    TAIL=60 step "mix-$name" timeout 120 ncu --clock-control none --kernel-name-base mangled -k "regex:$kernel" \
      --launch-skip 1 --launch-count 1 --metrics smsp__inst_executed.sum,sass__inst_executed_per_opcode \
      --print-metric-instances values "$CARRY/bin/fp4lab" cuda qbench --shape 8192x1024 --recipe "$recipe" \
      --variant "$variant" --layout row-wise --reps 3 </dev/null
  done <<'LIST'
ufp4-plain quantize_kernelItLi1ELi16ELi0E ufp4 plain
mxfp4-plain quantize_kernelItLi0ELi32ELi0E mxfp4 plain
ufp4-sr quantize_kernelItLi1ELi16ELi0E ufp4 sr
LIST
fi
# Static SASS opcode counts of the row-wise BF16 ufp4 kernel (E1M2, block 16, no RHT), for the instruction budget.
if has sass; then
  sass() {
    cuobjdump -sass "$CARRY/bin/fp4lab" |
      python3 "$(dirname "$0")/sass_loops.py" --function quantize_kernelItLi1ELi16ELi0E --opcodes
  }
  TAIL=40 step sass sass
fi
has memcheck && TAIL=4 step memcheck timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$CARRY/bin/fp4lab_kernels_tests" --gtest_brief=1 \
  --gtest_filter='Presets/*:QuantizeErrors.*:*TransposedAndBf16*e1m2_b16_fp32scale_rht16*:*TransposedAndBf16*e2m1_b16x16_ue4m3*:*TransposedAndBf16*e2m1_b32_ue8m0*rht0*'
echo "failed steps: $fail"
exit $fail
