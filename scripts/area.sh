#!/usr/bin/env bash
# What uniform-grid support costs: synthesises the RTL with Yosys (generic cells, ABC gate mapping) and
# writes (through scripts/area_report.py) area.md (a table and a short reading) and area.json (the same numbers for
# the SystemC model's area/energy presets) into an output folder; --in-tree writes the checkout's docs/area.md and
# rtl/area.json instead.
#
# Builds: the block dot-product unit (fp4_dot_unit, N = 16, one pipeline stage) for E2M1 only, E1M2
# only, INT4 only and both grids (dual: e2m1, e1m2, int4, e2m1_max2 at run time); the block MAC
# (fp4_mac_unit, the dot product plus block-scale multiply and FP32 accumulation) in the same four
# builds; the quantiser (fp4_quant_unit) with NVFP4's ue4m3 block scale for E2M1 only, E1M2 only and
# dual, with the fp32 block scale (true divisions) for E2M1 only and E1M2 only, and with every format and
# scale kind; the RHT-16 unit.
#
# The FP32 units (fp32_add, fp32_mul, fp32_div, fp32_from_int) are synthesised once each, flat, and the
# builds that use them keep them as black boxes: their instances are counted and priced at the unit's own
# figures. One FP32 divider alone takes ABC minutes, and the quantiser has 19 of them, so flattening
# everything would cost it tens of minutes per build and mapping; the price is that a constant operand (dividing by a fixed gmax in a
# single-format quantiser) does not simplify the unit it feeds. The RHT's 16 multiplies by 0.25 are left
# flat for that reason: they fold to exponent arithmetic.
#
# Two mappings per build, both after `synth` (each module once), `flatten` and `opt -full` (so constants
# and format selects propagate across the remaining module boundaries):
#   gates:  abc -g AND,NAND,OR,NOR,XOR,XNOR,ANDNOT,ORNOT,MUX  -> cell and gate counts
#   cmos2:  abc -g cmos2 (NAND, NOR, NOT)                     -> `stat -tech cmos` transistor estimate
# Flip-flops are counted apart (they are not in either gate set) and left out of the transistor figure.
#
# Usage: scripts/area.sh [-j JOBS] [--out DIR | --in-tree] [--no-cache] [--check]
#   (from anywhere; needs yosys 0.23+ and python3)
#   --out DIR: write DIR/area.json and DIR/area.md (default ./fp4lab-area, created; never the checkout).
#   --in-tree: write rtl/area.json and docs/area.md of the checkout (the committed copies).
#   A result is keyed by the RTL it was made from (rtl/files.f, every file it lists, rtl/include), the build list
#   and the Yosys version (area_report.py hash; stored as "key" in area.json): when DIR/area.json or the checkout's
#   rtl/area.json holds the current key, the outputs are written from it in a second instead of synthesising for
#   minutes. --no-cache synthesises anyway; --key prints the current key and stops.
#   --check: resynthesise only the fast builds (dot products and block MACs, seconds each) and compare their
#   own-logic gate and flip-flop counts and FP32 unit instances with rtl/area.json, writing nothing; exit 1
#   when the RTL has changed since docs/area.md was made (ctest rtl.area_current runs this).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cmdline="scripts/area.sh${*:+ $*}"
jobs=2 check=0 out=fp4lab-area in_tree=0 cache=1 print_key=0
usage="usage: $0 [-j JOBS] [--out DIR | --in-tree] [--no-cache] [--key] [--check]"
while [ $# -gt 0 ]; do
  case $1 in
    -j) [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }; jobs=$2; shift 2 ;;
    -j*) jobs=${1#-j}; shift ;;
    --out) [ $# -ge 2 ] && [ -n "$2" ] || { echo "$usage" >&2; exit 2; }; out=$2; shift 2 ;;
    --in-tree) in_tree=1; shift ;;
    --no-cache) cache=0; shift ;;
    --key) print_key=1; shift ;;
    --check) check=1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "area.sh: -j $jobs: not a positive integer" >&2; exit 2; }
if [ $print_key = 1 ] || [ $check = 1 ]; then
  :  # writes nothing
elif [ $in_tree = 1 ]; then
  out_json=$root/rtl/area.json out_md=$root/docs/area.md
else
  mkdir -p -- "$out"
  out=$(cd -- "$out" && pwd)
  out_json=$out/area.json out_md=$out/area.md
fi
command -v yosys >/dev/null || { echo "area.sh: yosys not found (apt-get install yosys)" >&2; exit 1; }
yosys_version=$(yosys -V)
cd "$root/rtl"
files=$(grep -v -E '^\s*(//|$)' files.f | tr '\n' ' ')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name | top | chparams | FP32 units kept as black boxes
prims=(
  "fp32_div|fp32_div||"
  "fp32_mul|fp32_mul||"
  "fp32_add|fp32_add||"
  "fp32_from_int|fp32_from_int||"
)
fp="fp32_add fp32_mul fp32_div fp32_from_int"
builds=(
  "dot_e2m1|fp4_dot_unit|-chparam FORMATS 1 -chparam DEPTH 1|"
  "dot_e1m2|fp4_dot_unit|-chparam FORMATS 2 -chparam DEPTH 1|"
  "dot_int4|fp4_dot_unit|-chparam FORMATS 4 -chparam DEPTH 1|"
  "dot_dual|fp4_dot_unit|-chparam FORMATS 15 -chparam DEPTH 1|"
  "mac_e2m1|fp4_mac_unit|-chparam FORMATS 1 -chparam DEPTH 1|$fp"
  "mac_e1m2|fp4_mac_unit|-chparam FORMATS 2 -chparam DEPTH 1|$fp"
  "mac_int4|fp4_mac_unit|-chparam FORMATS 4 -chparam DEPTH 1|$fp"
  "mac_dual|fp4_mac_unit|-chparam FORMATS 15 -chparam DEPTH 1|$fp"
  "quant_e2m1_ue4m3|fp4_quant_unit|-chparam FORMATS 1 -chparam SCALES 2 -chparam DEPTH 1|$fp"
  "quant_e1m2_ue4m3|fp4_quant_unit|-chparam FORMATS 2 -chparam SCALES 2 -chparam DEPTH 1|$fp"
  "quant_dual_ue4m3|fp4_quant_unit|-chparam FORMATS 15 -chparam SCALES 2 -chparam DEPTH 1|$fp"
  "quant_e2m1_fp32|fp4_quant_unit|-chparam FORMATS 1 -chparam SCALES 1 -chparam DEPTH 1|$fp"
  "quant_e1m2_fp32|fp4_quant_unit|-chparam FORMATS 2 -chparam SCALES 1 -chparam DEPTH 1|$fp"
  "quant_all|fp4_quant_unit|-chparam FORMATS 15 -chparam SCALES 15 -chparam DEPTH 1|$fp"
  "rht16|fp32_rht16_unit|-chparam DEPTH 1|fp32_add"
)

synth_one() {  # synth_one "name|top|params|blackboxes"
  IFS='|' read -r name top params boxes <<<"$1"
  local script="read_verilog -sv $files; ${boxes:+blackbox $boxes;} hierarchy -check -top $top $params; synth -top $top; \
flatten; opt -full; design -save synthed; \
abc -g AND,NAND,OR,NOR,XOR,XNOR,ANDNOT,ORNOT,MUX; opt_clean; tee -q -o $work/$name.gates stat; \
tee -q -o $work/$name.ltp ltp -noff; \
design -load synthed; abc -g cmos2; opt_clean; tee -q -o $work/$name.cmos stat -tech cmos"
  local t0=$SECONDS
  if ! yosys -q -l "$work/$name.log" -p "$script" >/dev/null 2>&1; then
    echo "area.sh: yosys failed on $name; log follows" >&2
    tail -20 "$work/$name.log" >&2
    return 1
  fi
  echo "$((SECONDS - t0))" >"$work/$name.secs"
  echo "  $name ($top $params): $((SECONDS - t0)) s" >&2
}
export -f synth_one
export files work

if [ $check = 1 ]; then
  fast=()
  for b in "${builds[@]}"; do [[ $b == dot_* || $b == mac_* ]] && fast+=("$b"); done
  printf '%s\n' "${fast[@]}" | xargs -P "$jobs" -I{} bash -c 'synth_one "$@"' _ {} || exit 1
  python3 "$root/scripts/area_report.py" check "$work" "$root" "${fast[@]}"
  exit $?
fi

key=$(python3 "$root/scripts/area_report.py" hash "$root" "$yosys_version" "${prims[@]}" "${builds[@]}")
if [ $print_key = 1 ]; then echo "$key"; exit 0; fi
if [ $cache = 1 ]; then
  for cached in "$out_json" "$root/rtl/area.json"; do
    rc=0
    python3 "$root/scripts/area_report.py" render "$cached" "$key" "$out_json" "$out_md" || rc=$?
    if [ $rc = 0 ]; then
      echo "area.sh: the RTL is as in $cached (key ${key:0:12}): wrote $out_md and $out_json without Yosys" >&2
      exit 0
    fi
    [ $rc = 3 ] || exit $rc
  done
fi

echo "area.sh: synthesising ${#prims[@]} FP32 units, then ${#builds[@]} builds, $jobs Yosys runs at a time" >&2
printf '%s\n' "${prims[@]}" "${builds[@]}" | xargs -P "$jobs" -I{} bash -c 'synth_one "$@"' _ {}

python3 "$root/scripts/area_report.py" write "$work" "$root" "$yosys_version" "$cmdline" "$key" "$out_json" "$out_md" \
  "${prims[@]}" "${builds[@]}"
echo "area.sh: wrote $out_md and $out_json" >&2
