#!/usr/bin/env bash
# Runs training runs of fp4lab.study (fp4lab-train) on every GPU of a CUDA machine, PER_GPU at a time on each, and
# leaves each run's JSON and log in $LOGS/runs. Builds fp4lab._core for that machine's python3 first (build-gpu/,
# CUDA kernels for sm_$ARCHS). A run whose JSON is already in $LOGS/runs is skipped.
#
#   DATA=data/linux-doc LOGS=out PER_GPU=2 scripts/train_study.sh SIZE:RECIPE:MODE:SEED:STEPS[:EXTRA ARGS] ...
#
# EXTRA ARGS (split on spaces) go to that run alone, e.g. its trace capture options or `--sr-draw philox1` (a run's
# SR draw belongs there, where its name sees it: docs/spec.md §4); TRAIN_ARGS go to every run
# (e.g. --deterministic, for runs that repeat bit for bit on the GPU; run names do not say so, so give such runs
# their own LOGS).
# PREFIX may name a folder holding headers the machine lacks (Eigen, nlohmann-json, nanobind). CORE may name the
# fp4lab._core module (.so) of an earlier build-gpu/ for the same machine, used instead of building.
# TIME_LIMIT (seconds) stops each run at a step boundary after that long, its state in build-gpu/ckpt/NAME.pt; the
# same command run again (on the same machine) resumes it (bit for bit with --deterministic). Such runs count as
# continued, not failed. DEADLINE (whole seconds since the epoch) does the same for a whole batch: each run's limit
# is the time left until then (less 20 s for its start-up), so runs queued behind others also stop in time; one
# with under a minute left is not started, and the next invocation starts it.
# Exit status: the number of runs that failed (100: bad settings or no fp4lab._core); the last line counts the
# runs left unfinished.
set -u
LOGS=${LOGS:-gpu-out}
ARCHS=${ARCHS:-90a}
PER_GPU=${PER_GPU:-1}
DATA=${DATA:?DATA must name a training-data folder (train.bin, val.bin): python3 -m fp4lab_lab.study corpus makes the study corpora}
[[ ${DEADLINE:-0} =~ ^[0-9]+$ ]] || { echo "DEADLINE=$DEADLINE: not whole seconds since the epoch" >&2; exit 100; }
[[ ${TIME_LIMIT:-1} =~ ^[0-9]*\.?[0-9]+$ ]] && [ "${TIME_LIMIT:-1}" != 0 ] ||
  { echo "TIME_LIMIT=$TIME_LIMIT: not a positive number of seconds" >&2; exit 100; }
mkdir -p "$LOGS/runs"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
. scripts/gpu_step.sh
pp=$PWD/build-gpu/python
if [ -n "${CORE:-}" ]; then  # a module built earlier for this machine's python3: no build (about a minute saved)
  pp=$PWD/build-gpu/prebuilt
  rm -rf "$pp" && mkdir -p "$pp" && cp -r python/fp4lab "$pp/" && cp "$CORE" "$pp/fp4lab/" || exit 100
elif ! ls build-gpu/python/fp4lab/_core*.so >/dev/null 2>&1; then
  build_core || exit 100
fi
export PYTHONPATH=$pp:$PWD/lab  # lab/: the run names (fp4lab_lab.study), not in the package
ngpu=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,clocks.max.sm --format=csv,noheader
run_name() { python3 -m fp4lab_lab.study name --data "$DATA" "$1"; }  # SPEC: the one naming rule, the study's
run_one() {  # GPU SPEC
  local size recipe mode seed steps extra name
  IFS=: read -r size recipe mode seed steps extra <<<"$2"
  name=$(run_name "$2")
  [ -s "$LOGS/runs/$name.json" ] && { echo "skip $name (done)"; return 0; }
  echo "start $name on GPU $1 ($(date +%T))"
  local resume=() limit=${TIME_LIMIT:-}
  if [ -n "${DEADLINE:-}" ]; then
    local left=$((DEADLINE - $(date +%s) - 20))
    [ $left -lt 60 ] && { echo "not started $name: the deadline is near (run again to start it)"; return 0; }
    local whole=${limit%.*}
    [ -z "$limit" ] || [ "${whole:-0}" -gt $left ] && limit=$left
  fi
  [ -n "$limit" ] && mkdir -p build-gpu/ckpt && resume=(--checkpoint "build-gpu/ckpt/$name.pt" --time-limit "$limit")
  CUDA_VISIBLE_DEVICES=$1 python3 -m fp4lab.study train --data "$DATA" --size "$size" --recipe "$recipe" \
    --mode "$mode" --seed "$seed" --steps "$steps" --name "$name" --concurrent "$PER_GPU" \
    --out "$LOGS/runs/$name.json" "${resume[@]}" ${TRAIN_ARGS:-} $extra >>"$LOGS/runs/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 75 ] && { echo "paused $name at the time limit ($(date +%T)): run again to continue"; return 0; }
  echo "end $name: exit $rc ($(date +%T))"
  return $rc
}
gpu_queue() {  # GPU SPEC... : PER_GPU runs at a time on one GPU
  local gpu=$1 f=0
  shift
  for spec in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$PER_GPU" ]; do wait -n || f=$((f + 1)); done
    run_one "$gpu" "$spec" &
  done
  while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || f=$((f + 1)); done
  return $f
}
# The runs go to the GPUs round-robin, in the order given.
specs=("$@")
for ((g = 0; g < ngpu; g++)); do
  q=()
  for ((k = g; k < ${#specs[@]}; k += ngpu)); do q+=("${specs[k]}"); done
  gpu_queue "$g" "${q[@]}" &
done
fail=0
for ((g = 0; g < ngpu; g++)); do wait -n; fail=$((fail + $?)); done
for f in "$LOGS"/runs/*.log; do echo "--- $(basename "$f")"; tail -n 2 "$f"; done
left=0
for spec in "${specs[@]}"; do [ -s "$LOGS/runs/$(run_name "$spec").json" ] || left=$((left + 1)); done
echo "failed runs: $fail; unfinished runs: $left"
exit $fail
