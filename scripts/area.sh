#!/usr/bin/env bash
# What uniform-grid support costs: synthesises the RTL with Yosys (generic cells, ABC gate mapping) and
# writes docs/area.md (a table and a short reading) and rtl/area.json (the same numbers for the SystemC
# model's area/energy presets).
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
# Usage: scripts/area.sh [-j JOBS] [--check]   (from anywhere; needs yosys 0.23+ and python3)
#   --check: resynthesise only the fast builds (dot products and block MACs, seconds each) and compare their
#   own-logic gate and flip-flop counts and FP32 unit instances with rtl/area.json, writing nothing; exit 1
#   when the RTL has changed since docs/area.md was made (ctest rtl.area_current runs this).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cmdline="scripts/area.sh${*:+ $*}"
jobs=2 check=0
while [ $# -gt 0 ]; do
  case $1 in
    -j) jobs=$2; shift 2 ;;
    -j*) jobs=${1#-j}; shift ;;
    --check) check=1; shift ;;
    *) echo "usage: $0 [-j JOBS] [--check]" >&2; exit 2 ;;
  esac
done
command -v yosys >/dev/null || { echo "area.sh: yosys not found (apt-get install yosys)" >&2; exit 1; }
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
  python3 - "$work" "$root/rtl/area.json" "${fast[@]}" <<'PY'
import json, re, sys
work, area = sys.argv[1:3]
have = json.load(open(area))['builds']
stale = 0
for spec in sys.argv[3:]:
    name = spec.split('|')[0]
    txt = open(f'{work}/{name}.gates').read()
    types = {m.group(1): int(m.group(2)) for m in re.finditer(r'^\s+(\$\S+|fp32_\w+)\s+(\d+)\s*$', txt, re.M)}
    got = dict(own_gates=sum(v for k, v in types.items() if k.startswith('$') and 'DFF' not in k),
               ffs=sum(v for k, v in types.items() if 'DFF' in k),
               fp32_units={k: v for k, v in types.items() if k.startswith('fp32_')})
    want = {k: have.get(name, {}).get(k) for k in got}
    ok = got == want
    stale += not ok
    print(f"{'ok   ' if ok else 'STALE'} {name}: synthesised {got}" + ('' if ok else f", rtl/area.json has {want}"))
if stale:
    print(f"area.sh --check: {stale} build(s) differ from rtl/area.json: the RTL changed since docs/area.md was "
          "made; rerun scripts/area.sh and commit docs/area.md and rtl/area.json")
    sys.exit(1)
print("area.sh --check: rtl/area.json matches the RTL")
PY
  exit $?
fi

echo "area.sh: synthesising ${#prims[@]} FP32 units, then ${#builds[@]} builds, $jobs Yosys runs at a time" >&2
printf '%s\n' "${prims[@]}" "${builds[@]}" | xargs -P "$jobs" -I{} bash -c 'synth_one "$@"' _ {}

yosys_version=$(yosys -V)
python3 - "$work" "$root" "$yosys_version" "$cmdline" "${prims[@]}" "${builds[@]}" <<'PY'
import json, re, sys
work, root, yver, cmdline = sys.argv[1:5]
specs = [b.split('|') for b in sys.argv[5:]]
FP32 = ('fp32_add', 'fp32_mul', 'fp32_div', 'fp32_from_int')

def stat(path):  # cell counts by type ($_AND_ ..., and black-box instances by module name), transistors
    txt = open(path).read()
    types = {m.group(1): int(m.group(2)) for m in re.finditer(r'^\s+(\$\S+|fp32_\w+)\s+(\d+)\s*$', txt, re.M)}
    tr = re.search(r'Estimated number of transistors:\s+(\d+)', txt)
    return types, int(tr.group(1)) if tr else None

rows = {}
for name, top, params, boxes in specs:  # FP32 units come first: the builds are priced from them
    g, _ = stat(f'{work}/{name}.gates')
    c, trans = stat(f'{work}/{name}.cmos')
    units = {k: g.get(k, 0) for k in FP32 if g.get(k, 0)}
    # Longest register-to-register path in generic gates (Yosys ltp): a first-order timing proxy, only where
    # no black box hides part of the path.
    depth = int(re.search(r'Longest topological path .* \(length=(\d+)\)', open(f'{work}/{name}.ltp').read()).group(1))
    ff = sum(v for k, v in g.items() if 'DFF' in k)
    own_gates = sum(v for k, v in g.items() if k.startswith('$') and 'DFF' not in k)
    own_nnn = sum(v for k, v in c.items() if k.startswith('$') and 'DFF' not in k)
    r = dict(top=top, params=params.strip(), fp32_units=units, own_gates=own_gates, ffs=ff,
             gates=own_gates + sum(n * rows[k]['gates'] for k, n in units.items()),
             nand_nor_not=own_nnn + sum(n * rows[k]['nand_nor_not'] for k, n in units.items()),
             transistors=trans + sum(n * rows[k]['transistors'] for k, n in units.items()),
             depth=None if units else depth, cell_types=g, yosys_seconds=int(open(f'{work}/{name}.secs').read()))
    rows[name] = r
flow = ('synth; flatten; opt -full; gates: abc -g AND,NAND,OR,NOR,XOR,XNOR,ANDNOT,ORNOT,MUX; '
        'transistors: abc -g cmos2 then stat -tech cmos (flip-flops excluded); FP32 units synthesised once '
        'and priced per instance')
json.dump({'generated_by': cmdline, 'yosys': yver, 'flow': flow, 'builds': rows},
          open(f'{root}/rtl/area.json', 'w'), indent=1, sort_keys=True)

label = {
    'fp32_div': 'FP32 divide (RTNE, subnormals)', 'fp32_mul': 'FP32 multiply', 'fp32_add': 'FP32 add',
    'fp32_from_int': 'int32 to FP32',
    'dot_e2m1': 'block dot product, E2M1 only', 'dot_e1m2': 'block dot product, E1M2 only',
    'dot_int4': 'block dot product, INT4 only', 'dot_dual': 'block dot product, dual (E2M1 + E1M2/INT4)',
    'mac_e2m1': 'block MAC, E2M1 only', 'mac_e1m2': 'block MAC, E1M2 only', 'mac_int4': 'block MAC, INT4 only',
    'mac_dual': 'block MAC, dual',
    'quant_e2m1_ue4m3': 'quantiser, E2M1, ue4m3 scale (NVFP4)', 'quant_e1m2_ue4m3': 'quantiser, E1M2, ue4m3 scale',
    'quant_dual_ue4m3': 'quantiser, dual, ue4m3 scale', 'quant_e2m1_fp32': 'quantiser, E2M1, fp32 scale',
    'quant_e1m2_fp32': 'quantiser, E1M2, fp32 scale (UFP4)',
    'quant_all': 'quantiser, every format and scale kind', 'rht16': 'RHT-16 butterfly (FP32)'}
short = {'fp32_div': 'div', 'fp32_mul': 'mul', 'fp32_add': 'add', 'fp32_from_int': 'i2f'}
md = ['# Area: what uniform-grid support costs', '',
      'Generated by `' + cmdline + '` (' + yver + '); do not edit by hand. Machine-readable copy: '
      '[`rtl/area.json`](../rtl/area.json).', '',
      'Flow per build: `read_verilog -sv` of every file in `rtl/files.f`, `hierarchy -chparam ...`, '
      '`synth` (each module once), `flatten`, `opt -full`, then two technology mappings of the same netlist: '
      '`abc -g AND,NAND,OR,NOR,XOR,XNOR,ANDNOT,ORNOT,MUX` for the cell and gate counts, and '
      '`abc -g cmos2` (NAND, NOR, NOT) with `stat -tech cmos` for a transistor estimate. Flip-flops are '
      'counted apart and are not in the transistor figure. Generic cells, no timing constraints: these '
      'are relative costs of one design family, not a standard-cell area.', '',
      'The FP32 units are synthesised once each (first four rows). A build that uses them keeps them as '
      'black boxes; its "own logic" column is everything else, and its totals add each unit at its own '
      'count per instance. A constant operand therefore does not simplify the unit it feeds (the fixed '
      'gmax divisor of a single-format quantiser, for example); the RHT\'s multiplies by 0.25 are left '
      'flat for that reason.', '',
      'Logic depth is the longest path between registers and ports in the generic-gate netlist, in gates '
      '(Yosys `ltp -noff`), a first-order proxy for timing; it is given only for builds with no black box on '
      'the path.', '',
      '| build | top | parameters | FP32 units | own logic gates | flip-flops | logic gates | NAND/NOR/NOT gates | transistors (logic) | logic depth |',
      '|---|---|---|---|---:|---:|---:|---:|---:|---:|']
for name, r in rows.items():
    units = ', '.join(f"{n} {short[k]}" for k, n in r['fp32_units'].items()) or '—'
    md.append(f"| {label.get(name, name)} | `{r['top']}` | `{r['params'] or '—'}` | {units} | {r['own_gates']:,} | "
              f"{r['ffs']:,} | **{r['gates']:,}** | {r['nand_nor_not']:,} | {r['transistors']:,} | "
              f"{r['depth'] if r['depth'] is not None else '—'} |")
md += ['', '## Reading', '']

def over(a, b, key='gates'):
    return 100.0 * (rows[a][key] - rows[b][key]) / rows[b][key]

md.append(f"- **Dual-format dot product vs E2M1 only: {over('dot_dual', 'dot_e2m1'):+.1f}% logic gates "
          f"({over('dot_dual', 'dot_e2m1', 'transistors'):+.1f}% transistors).** Both grids share one "
          "datapath (`fp4_decode` maps every code to a {sign, 3-bit significand, 2-bit shift} super format); "
          "the overhead is the 3x3-bit significand multiplier where E2M1 needs 2x2, and the shifter and "
          "wider adder tree that must hold E2M1's products (up to 144) at the same time.")
dd = lambda k: rows[k]['depth']
md.append(f"- **Logic depth of the dot product: E2M1 only {dd('dot_e2m1')}, E1M2 only {dd('dot_e1m2')}, dual "
          f"{dd('dot_dual')} gates** ({dd('dot_dual') - dd('dot_e2m1'):+d} for dual against E2M1 only): the "
          "run-time format select and the wider products lengthen the path less than they grow the area. "
          f"The FP32 units behind it are {dd('fp32_mul')} (multiply), {dd('fp32_add')} (add) and "
          f"{dd('fp32_div')} (divide) gates deep.")
md.append(f"- **E1M2 only vs E2M1 only: {over('dot_e1m2', 'dot_e2m1'):+.1f}% logic gates.** The uniform grid's "
          "products are at most 7x7 = 49 with no shift, so its 16-lane adder tree is narrower "
          "(a sum of 16 fits 11 bits against 13 for E2M1).")
d = rows['dot_int4']['gates'] - rows['dot_e1m2']['gates']
md.append(f"- **INT4 only and E1M2 only are the same datapath** ({rows['dot_int4']['gates']:,} vs "
          f"{rows['dot_e1m2']['gates']:,} logic gates"
          + ('' if d == 0 else f"; ABC maps the same logic {abs(d)} gate{'s' if abs(d) > 1 else ''} apart") + "): "
          "the two grids have the same integer view 0..7 and differ only by the power of two 2^-int_shift, "
          "which the contract folds into the per-tensor factor g of the final FP32 multiply.")
fp32_mac = rows['mac_e2m1']['gates'] - rows['mac_e2m1']['own_gates']
md.append(f"- **Whole block MAC (dot product + block-scale multiply + FP32 accumulate): dual vs E2M1 only "
          f"{over('mac_dual', 'mac_e2m1'):+.1f}% logic gates, E1M2 only vs E2M1 only "
          f"{over('mac_e1m2', 'mac_e2m1'):+.1f}%.** The FP32 units (int-to-float, "
          f"{rows['mac_e2m1']['fp32_units']['fp32_mul']} multipliers, one adder: {fp32_mac:,} gates) are the same in every build and dilute the format cost: per block of 16, "
          f"scaling and accumulating in FP32 costs {fp32_mac / rows['dot_e2m1']['gates']:.1f}x the E2M1 dot product itself.")
q = lambda k: rows[k]['gates']
md.append(f"- **Quantiser, at NVFP4's ue4m3 block scale: E1M2 only vs E2M1 only "
          f"{over('quant_e1m2_ue4m3', 'quant_e2m1_ue4m3'):+.1f}% logic gates, dual vs E2M1 only "
          f"{over('quant_dual_ue4m3', 'quant_e2m1_ue4m3'):+.1f}%.** The grid is a small part of a quantiser: "
          f"{q('quant_e2m1_ue4m3') - rows['quant_e2m1_ue4m3']['own_gates']:,} of the E2M1 build's "
          f"{q('quant_e2m1_ue4m3'):,} gates are its FP32 units ({rows['quant_e2m1_ue4m3']['fp32_units'].get('fp32_mul', 0)} "
          f"multipliers, one per element plus the scale's, and {rows['quant_e2m1_ue4m3']['fp32_units'].get('fp32_div', 0)} "
          "dividers for the encode reciprocals); the amax tree, E4M3 scale and grid rounding are the rest.")
u = lambda k, key: rows[k][key]
md.append(f"- **fp32 vs ue4m3 block scale: E1M2 with the fp32 scale (the ufp4 and e2m1-ref presets) is "
          f"{over('quant_e1m2_fp32', 'quant_e1m2_ue4m3'):+.1f}% logic gates and "
          f"{over('quant_e1m2_fp32', 'quant_e1m2_ue4m3', 'transistors'):+.1f}% transistors against E1M2 with ue4m3.** "
          "The fp32 scale divides every element where ue4m3 multiplies by a reciprocal; a divider is "
          f"{u('fp32_div', 'gates') / u('fp32_mul', 'gates'):.2f}x a multiplier in generic gates but "
          f"{u('fp32_div', 'transistors') / u('fp32_mul', 'transistors'):.2f}x in transistors, and ue4m3 pays "
          "for its E4M3 scale and two reciprocals. Next to the grid's ~1%, the scale kind moves more, but "
          "what prices a quantiser is its per-element FP32 arithmetic, whichever the kind.")
md.append(f"- **Every format and scale kind in one quantiser:** {q('quant_all'):,} logic gates, "
          f"{q('quant_all') / q('quant_e2m1_ue4m3'):.2f}x the NVFP4-only build.")
md.append(f"- **RHT-16:** {rows['rht16']['gates']:,} logic gates ({q('rht16') / q('quant_e2m1_ue4m3'):.2f}x "
          "the NVFP4 quantiser) for 64 FP32 adders (4 butterfly stages of 16) and 16 multiplies by 0.25, one "
          "block of 16 per cycle. A front-end that rotates before quantising adds this to each quantiser lane.")
open(f'{root}/docs/area.md', 'w').write('\n'.join(md) + '\n')
PY
echo "area.sh: wrote docs/area.md and rtl/area.json" >&2
