#!/usr/bin/env bash
# The simulator's validation set (docs/validation.md), measured in one call on an H200: fp4lab cuda timings over
# every quantiser operand and GEMM shape of workloads/shapes/*.csv and the square sweep 256..16384
# (scripts/sim_validation.py plan; it imports the fp4lab package and lab/fp4lab_lab/simval.py): copies and the three quantiser
# passes, then the fast GEMM under ufp4 and under mxfp4, each a separate process with its own JSON; then, unless
# REPEAT=0, the same again (the run-to-run spread). The SM clock, memory clock and power are sampled every 200 ms
# throughout.
#
# The binary is built on a machine with nvcc (cmake -DFP4LAB_NATIVE=OFF -DFP4LAB_CUDA_ARCHS=90a -DFP4LAB_SIM=OFF,
# target fp4lab; -DFP4LAB_MPI=OFF unless the GPU image has libmpi: kernels/README.md) and is copied, with the
# shared libraries the GPU image may lack, to the folder CARRY names (default build-cuda-bundle):
#   $CARRY/bin/fp4lab  $CARRY/lib/{libboost_program_options.so.1.74.0,libgomp.so.1,libmpfr.so.6,libgmp.so.10}
#   OUT=h200-timings [CARRY=build-cuda-bundle] [REPS=9] [REPEAT=1|0] scripts/h200_measure.sh
# Everything goes to $OUT: timings-{quant,gemm-ufp4,gemm-mxfp4}[-repeat].json, env.log, plan.txt, clocks.csv,
# one log per step. REPS: timed repeats per kernel and shape; REPEAT=0 skips the second round. Exit status: the
# number of failed steps.
set -u
CARRY=${CARRY:-build-cuda-bundle}
OUT=${OUT:?set OUT to the output folder}
LOGS=$OUT
REPS=${REPS:-9}
REPEAT=${REPEAT:-1}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$CARRY/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
fail=0
. "$(dirname "$0")/gpu_step.sh"
BIN="$CARRY/bin/fp4lab"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit \
    --format=csv
  nvidia-smi -q -d CLOCK,POWER,PERFORMANCE
  uname -r
  nproc
  "$BIN" --version
} >"$OUT/env.log" 2>&1
head -2 "$OUT/env.log"

nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
  --format=csv -lms 200 >"$OUT/clocks.csv" 2>&1 &
smi=$!

python3 "$(dirname "$0")/sim_validation.py" plan --part quant >"$OUT/plan-quant.txt" &&
  python3 "$(dirname "$0")/sim_validation.py" plan --part gemm >"$OUT/plan-gemm.txt" || { echo "plan failed"; exit 1; }
QUANT=$(cat "$OUT/plan-quant.txt")
GEMM=$(cat "$OUT/plan-gemm.txt")
one_round() {  # $1: file suffix
  # shellcheck disable=SC2086  # the plans are lists of shape words
  TAIL=3 step "quant$1" timeout 150 "$BIN" cuda timings $QUANT --reps "$REPS" --json "$OUT/timings-quant$1.json"
  for r in ufp4 mxfp4; do
    # shellcheck disable=SC2086
    TAIL=3 step "gemm-$r$1" timeout 150 "$BIN" cuda timings $GEMM --gemm-recipe $r --copy 1073741824 --reps "$REPS" \
      --json "$OUT/timings-gemm-$r$1.json"
  done
}
one_round ""
if [ "$REPEAT" != 0 ]; then one_round -repeat; fi

kill "$smi" 2>/dev/null
wait "$smi" 2>/dev/null
echo "total ${SECONDS} s; failed steps: $fail"
exit $fail
