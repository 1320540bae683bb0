#!/usr/bin/env bash
# The four TCU-model experiments of docs/sim.md: sim/experiments/sweep.toml plus experiment 1's same-area rows
# (unit counts from gate counts), run as one `fp4lab sim --sweep` into OUT_DIR/sweep.json and sweep.csv, then
# the summary tables (sim/experiments/summarize.py).
# Usage: sim/experiments/run.sh [OUT_DIR]     (from the repository root; FP4LAB=path/to/fp4lab, default
#        build/bin/fp4lab; MPIRUN="mpirun -np 4" spreads the runs over ranks, same results). DOT_E2M1, DOT_E1M2,
#        DOT_DUAL, MAC_E2M1, MAC_E1M2, MAC_DUAL: gate counts of the block dot-product unit and the block MAC of
#        each kind for the "same area" rows (default: rtl/area.json, written by scripts/area.sh; AREA_JSON=FILE
#        reads another copy).
set -euo pipefail
FP4LAB=${FP4LAB:-build/bin/fp4lab}
MPIRUN=${MPIRUN:-}
OUT=${1:-sim-experiments}
BIG=workloads/shapes/llama2-7b.csv       # MAC-array questions (1, 3): larger, mostly compute-bound GEMMs
# Logic-gate counts from rtl/area.json (scripts/area.sh, tabulated in docs/area.md) unless given: the block
# dot-product unit (fp4_dot_unit, N = 16) and the whole block MAC (fp4_mac_unit: dot product + block-scale
# multiply + FP32 accumulate), each built for E2M1 only, E1M2 only and both grids.
AREA_JSON=${AREA_JSON:-rtl/area.json}
area() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['builds'][sys.argv[2]]['gates'])" "$AREA_JSON" "$1"; }
for v in DOT_E2M1 DOT_E1M2 DOT_DUAL MAC_E2M1 MAC_E1M2 MAC_DUAL; do
  if [ -z "${!v:-}" ]; then
    [ -f "$AREA_JSON" ] || { echo "run.sh: $AREA_JSON missing: run scripts/area.sh or set $v" >&2; exit 2; }
    printf -v "$v" '%s' "$(area "$(echo "$v" | tr 'A-Z' 'a-z')")"
  fi
done
AREA_NOTE=${AREA_NOTE:-"logic gates (Yosys, scripts/area.sh): block dot product E2M1-only ${DOT_E2M1}, E1M2-only ${DOT_E1M2}, dual ${DOT_DUAL}; block MAC (dot product + scale + FP32 accumulate) ${MAC_E2M1}, ${MAC_E1M2}, ${MAC_DUAL}"}
mkdir -p "$OUT"

# 1. (same area) at the same dot-product area (that of 256 dual dot products; the 256-lane accumulator
#    unchanged) and at the same block-MAC area (that of 256 dual block MACs, each with its own
#    scale-and-accumulate: accumulator lanes = units). Appended to the static sweep as generated grids.
SWEEP="$OUT/sweep.toml"
{
  cat "$(dirname "$0")/sweep.toml"
  for kind in e2m1 e1m2 dual; do
    K=$(echo "$kind" | tr 'a-z' 'A-Z')
    dot_var="DOT_$K" mac_var="MAC_$K"
    dot_units=$(( 256 * DOT_DUAL / ${!dot_var} ))
    mac_units=$(( 256 * MAC_DUAL / ${!mac_var} ))
    printf '\n[[grid]]\nname = "1_dot_%s_{recipe}"\nshapes = "%s"\nrecipe = ["ufp4", "e2m1-ref"]\nmac.kind = "%s"\nmac.units = %d\n' \
      "$kind" "$BIG" "$kind" "$dot_units"
    printf '\n[[grid]]\nname = "1_unit_%s_{recipe}"\nshapes = "%s"\nrecipe = ["ufp4", "e2m1-ref"]\nmac.kind = "%s"\nmac.units = %d\nacc.lanes = %d\n' \
      "$kind" "$BIG" "$kind" "$mac_units" "$mac_units"
  done
  printf '\n[meta]\nshapes = "%s"\narea_note = "%s"\n' "$BIG" "$AREA_NOTE"
} > "$SWEEP"

# shellcheck disable=SC2086  # MPIRUN is a command prefix, split on purpose
$MPIRUN "$FP4LAB" sim --sweep "$SWEEP" --out "$OUT/sweep"
python3 "$(dirname "$0")/summarize.py" "$OUT/sweep.json"
