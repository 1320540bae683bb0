#!/usr/bin/env bash
# The four TCU-model experiments of docs/sim.md. Writes every `fp4lab sim --json` report into OUT_DIR, then
# prints the summary tables (sim/experiments/summarize.py).
# Usage: sim/experiments/run.sh [OUT_DIR]     (from the repository root; FP4LAB=path/to/fp4lab, default
#        build/bin/fp4lab). DOT_E2M1, DOT_E1M2, DOT_DUAL, MAC_E2M1, MAC_E1M2, MAC_DUAL: gate counts of the block
#        dot-product unit and the block MAC of each kind for the "same area" rows (default: rtl/area.json,
#        written by scripts/area.sh; AREA_JSON=FILE reads another copy).
set -euo pipefail
FP4LAB=${FP4LAB:-build/bin/fp4lab}
OUT=${1:-sim-experiments}
CFG=sim/configs/h100-class.cfg
TRACE=workloads/tiny-lm/step_005000
SHAPES=workloads/shapes/dense-1.5b.csv   # passes and recipes (2, 4)
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
sim() { "$FP4LAB" sim --config "$CFG" "$@" > /dev/null; }

# 1. Unit kinds at the same MAC budget (256 units per SM), at the same dot-product area (that of 256 dual dot
#    products; the 256-lane accumulator unchanged) and at the same block-MAC area (that of 256 dual block MACs,
#    each with its own scale-and-accumulate: accumulator lanes = units).
python3 - "$OUT" "$BIG" "$AREA_NOTE" <<'PY'
import json, sys
json.dump({"shapes": sys.argv[2], "area_note": sys.argv[3]}, open(sys.argv[1] + "/1_meta.json", "w"))
PY
for kind in e2m1 e1m2 dual; do
  K=$(echo "$kind" | tr 'a-z' 'A-Z')
  dot_var="DOT_$K" mac_var="MAC_$K"
  dot_units=$(( 256 * DOT_DUAL / ${!dot_var} ))
  mac_units=$(( 256 * MAC_DUAL / ${!mac_var} ))
  for recipe in ufp4 e2m1-ref; do
    sim --shapes "$BIG" --recipe "$recipe" --mac.kind "$kind" --json "$OUT/1_mac_${kind}_${recipe}.json"
    sim --shapes "$BIG" --recipe "$recipe" --mac.kind "$kind" --mac.units "$dot_units" \
        --json "$OUT/1_dot_${kind}_${recipe}.json"
    sim --shapes "$BIG" --recipe "$recipe" --mac.kind "$kind" --mac.units "$mac_units" --acc.lanes "$mac_units" \
        --json "$OUT/1_unit_${kind}_${recipe}.json"
  done
done

# 2. Plain quantisation (RHT off), fused RHT + quantise pass, unfused RHT and quantise passes, TCU front-end.
for src in trace shapes; do
  if [ "$src" = trace ]; then in=(--trace "$TRACE"); else in=(--shapes "$SHAPES"); fi
  sim "${in[@]}" --recipe ufp4 --rht 0 --prep.mode fused --json "$OUT/2_${src}_plain.json"
  for mode in fused unfused frontend; do
    sim "${in[@]}" --recipe ufp4 --prep.mode "$mode" --json "$OUT/2_${src}_${mode}.json"
  done
done

# 3. Block 16 vs 32 with the accumulator at 1, 1/2 and 1/4 of the block units' rate.
for lanes in 256 128 64; do
  for b in 16 32; do
    sim --shapes "$BIG" --recipe ufp4 --block "$b" --acc.lanes "$lanes" --json "$OUT/3_acc${lanes}_b${b}.json"
  done
done

# 4. A training step, ufp4 vs e2m1-ref, on the bundled trace and on the dense 1.5B shapes.
for recipe in ufp4 e2m1-ref; do
  sim --trace "$TRACE" --recipe "$recipe" --json "$OUT/4_trace_${recipe}.json"
  sim --shapes "$SHAPES" --recipe "$recipe" --json "$OUT/4_shapes_${recipe}.json"
done

python3 "$(dirname "$0")/summarize.py" "$OUT"
