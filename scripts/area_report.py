#!/usr/bin/env python3
"""The report half of scripts/area.sh: reads the Yosys `stat` / `ltp` outputs the script left in WORK and
either writes area.json and area.md (`write`) or compares the builds it finds with rtl/area.json (`check`, exit 1
on any difference); `hash` prints the key of a result (the RTL, the build list, the Yosys version) and `render`
writes area.json and area.md again from a result whose key matches (exit 3 when none does), without Yosys. Run by
area.sh, not by hand.

    area_report.py write WORK ROOT YOSYS_VERSION CMDLINE KEY JSON MD BUILD...
    area_report.py check WORK ROOT BUILD...         (BUILD = name|top|params|black boxes)
    area_report.py hash ROOT YOSYS_VERSION BUILD...
    area_report.py render CACHED_JSON KEY JSON MD
"""
import hashlib, json, os, re, sys

FP32 = ('fp32_add', 'fp32_mul', 'fp32_div', 'fp32_from_int')

# Area in NAND2 equivalents: Yosys `stat -tech cmos` counts 4 transistors per NAND or NOR and 2 per inverter, so the
# cmos2 mapping's transistors / 4 is its area in two-input NANDs; the flip-flops, counted apart, at 6 each (a D
# flip-flop with enable is about 24 transistors: an assumption). The simulator's [area] keys (sim/configs/
# h200-class-*.cfg, docs/sim.md) are these figures.
TRANSISTORS_PER_NAND2 = 4
NAND2_PER_FF = 6
# um^2 per NAND2 equivalent at a 4-5 nm-class node: four transistors at GH100's average density, 80 billion
# transistors on 814 mm^2 (NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022; TSMC 4N). An average over a
# whole die (SRAM, wiring and utilisation included), not a library cell's bare area.
UM2_PER_NAND2 = 814e6 / 80e9 * TRANSISTORS_PER_NAND2


def nand2(row):
    return row['transistors'] / TRANSISTORS_PER_NAND2 + NAND2_PER_FF * row['ffs']


def key(root, yver, specs):
    """What a result depends on: every RTL file area.sh reads (rtl/files.f, the files it lists, rtl/include), the
    build list and the Yosys version. A result under the same key is reused instead of synthesising again."""
    h = hashlib.sha256()
    rtl = os.path.join(root, 'rtl')
    names = ['files.f'] + [l.strip() for l in open(os.path.join(rtl, 'files.f')) if l.strip() and not l.strip().startswith('//')]
    for d, _, fs in sorted(os.walk(os.path.join(rtl, 'include'))):
        names += sorted(os.path.relpath(os.path.join(d, f), rtl) for f in fs)
    for n in names:
        data = open(os.path.join(rtl, n), 'rb').read()
        h.update(f'{n}\0{len(data)}\0'.encode() + data)
    h.update(('\0'.join(['|'.join(x) for x in specs] + [yver])).encode())
    return h.hexdigest()


def stat(path):  # cell counts by type ($_AND_ ..., and black-box instances by module name), transistors
    txt = open(path).read()
    types = {m.group(1): int(m.group(2)) for m in re.finditer(r'^\s+(\$\S+|fp32_\w+)\s+(\d+)\s*$', txt, re.M)}
    tr = re.search(r'Estimated number of transistors:\s+(\d+)', txt)
    return types, int(tr.group(1)) if tr else None


def own_figures(work, name):
    """What one build's netlist itself holds: logic gates, flip-flops and FP32 black boxes by kind, its
    NAND/NOR/NOT count and transistors, and its logic depth (None where a black box is on the path)."""
    g, _ = stat(f'{work}/{name}.gates')
    c, trans = stat(f'{work}/{name}.cmos')
    units = {k: g[k] for k in FP32 if g.get(k, 0)}
    # Longest register-to-register path in generic gates (Yosys ltp): a first-order timing proxy.
    depth = int(re.search(r'Longest topological path .* \(length=(\d+)\)', open(f'{work}/{name}.ltp').read()).group(1))
    return dict(fp32_units=units, own_gates=sum(v for k, v in g.items() if k.startswith('$') and 'DFF' not in k),
                ffs=sum(v for k, v in g.items() if 'DFF' in k),
                own_nnn=sum(v for k, v in c.items() if k.startswith('$') and 'DFF' not in k), own_transistors=trans,
                depth=None if units else depth, cell_types=g)


def check(work, root, specs):
    have = json.load(open(f'{root}/rtl/area.json'))['builds']
    stale = 0
    for name, *_ in specs:
        o = own_figures(work, name)
        got = {k: o[k] for k in ('own_gates', 'ffs', 'fp32_units')}
        want = {k: have.get(name, {}).get(k) for k in got}
        ok = got == want
        stale += not ok
        print(f"{'ok   ' if ok else 'STALE'} {name}: synthesised {got}" + ('' if ok else f", rtl/area.json has {want}"))
    if stale:
        print(f"area.sh --check: {stale} build(s) differ from rtl/area.json: the RTL changed since docs/area.md was "
              "made; rerun scripts/area.sh and commit docs/area.md and rtl/area.json")
        return 1
    print("area.sh --check: rtl/area.json matches the RTL")
    return 0


def write(work, root, yver, cmdline, cache_key, json_path, md_path, specs):
    rows = {}
    for name, top, params, boxes in specs:  # FP32 units come first: the builds are priced from them
        o = own_figures(work, name)
        units = o['fp32_units']
        rows[name] = dict(top=top, params=params.strip(), fp32_units=units, own_gates=o['own_gates'], ffs=o['ffs'],
                          gates=o['own_gates'] + sum(n * rows[k]['gates'] for k, n in units.items()),
                          nand_nor_not=o['own_nnn'] + sum(n * rows[k]['nand_nor_not'] for k, n in units.items()),
                          transistors=o['own_transistors'] + sum(n * rows[k]['transistors'] for k, n in units.items()),
                          depth=o['depth'], cell_types=o['cell_types'],
                          yosys_seconds=int(open(f'{work}/{name}.secs').read()))
    flow = ('synth; flatten; opt -full; gates: abc -g AND,NAND,OR,NOR,XOR,XNOR,ANDNOT,ORNOT,MUX; '
            'transistors: abc -g cmos2 then stat -tech cmos (flip-flops excluded); FP32 units synthesised once '
            'and priced per instance')
    emit({'generated_by': cmdline, 'yosys': yver, 'flow': flow, 'key': cache_key, 'builds': rows}, json_path, md_path)


def render(cached, cache_key, json_path, md_path):
    """area.json and area.md from an earlier result with the same key; 3 when there is none."""
    try:
        res = json.load(open(cached))
    except (OSError, ValueError):
        return 3
    if res.get('key') != cache_key:
        return 3
    emit(res, json_path, md_path)
    return 0


def write_file(path, text):  # whole or not at all: a temporary beside it, renamed over it
    tmp = f'{path}.tmp-{os.getpid()}'
    with open(tmp, 'w') as f:
        f.write(text)
    os.replace(tmp, path)


def emit(res, json_path, md_path):
    rows, cmdline, yver = res['builds'], res['generated_by'], res['yosys']
    for r in rows.values():
        r['nand2_eq'] = nand2(r)
    res['nand2'] = {'transistors_per_nand2': TRANSISTORS_PER_NAND2, 'per_flip_flop': NAND2_PER_FF,
                    'um2_per_nand2': UM2_PER_NAND2}
    write_file(json_path, json.dumps(res, indent=1, sort_keys=True))
    json_link = os.path.relpath(os.path.abspath(json_path), os.path.dirname(os.path.abspath(md_path)))

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
          f'[`{json_link[3:] if json_link.startswith("../") else json_link}`]({json_link}).', '',
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
          f'NAND2 equivalents are the transistors / {TRANSISTORS_PER_NAND2} (`stat -tech cmos` counts '
          f'{TRANSISTORS_PER_NAND2} per NAND or NOR, 2 per inverter) plus {NAND2_PER_FF} per flip-flop (about 24 '
          f'transistors; an assumption). At {UM2_PER_NAND2:.4f} µm² each (four transistors at GH100\'s average '
          'density: 80 billion on 814 mm², NVIDIA\'s H100 whitepaper; TSMC 4N), a column gives mm². The '
          'simulator\'s `[area]` keys are these figures (docs/sim.md).', '',
          '| build | top | parameters | FP32 units | own logic gates | flip-flops | logic gates | NAND/NOR/NOT gates | transistors (logic) | NAND2 equivalents | mm² at 4N density | logic depth |',
          '|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|']
    for name, r in rows.items():
        units = ', '.join(f"{n} {short[k]}" for k, n in r['fp32_units'].items()) or '—'
        md.append(f"| {label.get(name, name)} | `{r['top']}` | `{r['params'] or '—'}` | {units} | {r['own_gates']:,} | "
                  f"{r['ffs']:,} | **{r['gates']:,}** | {r['nand_nor_not']:,} | {r['transistors']:,} | "
                  f"{r['nand2_eq']:,.1f} | {r['nand2_eq'] * UM2_PER_NAND2 * 1e-6:.5f} | "
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
    write_file(md_path, '\n'.join(md) + '\n')


if __name__ == '__main__':
    mode, a = sys.argv[1], sys.argv[2:]
    if mode == 'check':
        sys.exit(check(a[0], a[1], [b.split('|') for b in a[2:]]))
    if mode == 'hash':
        print(key(a[0], a[1], [b.split('|') for b in a[2:]]))
    elif mode == 'render':
        sys.exit(render(*a[:4]))
    else:
        write(a[0], a[1], a[2], a[3], a[4], a[5], a[6], [b.split('|') for b in a[7:]])
