#!/usr/bin/env python3
"""Opcode mix of the loops of compiled kernels, from a SASS listing.

    nvdisasm -c gemm.cubin | python3 kernels/tools/sass_loops.py --function gemm_mma_kernel --marker IMMA
    cuobjdump -sass build/bin/fp4lab | python3 kernels/tools/sass_loops.py --function quantize_kernel --opcodes

For each function whose name matches --function, every loop (a backward branch and the instructions from its
target to it) that holds a --marker instruction is printed with its instruction count, its code size (16 bytes per
SASS instruction on SM90) and its instructions by class, so an epilogue's FP32 share and the overhead around it can
be read off without a GPU. With --opcodes, every instruction of the matching functions is counted by opcode
instead ("COUNT OPCODE" lines, most frequent first, then "N TOTAL"): a kernel without a loop, like the
quantiser's one group per thread, is read that way. Static counts: a loop runs its whole body each iteration, but predicated-off
instructions still count. A loop is the address range from a back edge's target to the back edge, so a nested
loop is printed on its own and again inside its outer loop, and code the compiler placed after the back edge
and jumps into is not counted (the GEMM and quantiser loops have no such code).
"""
import argparse
import collections
import re
import sys

FUNC_RE = re.compile(r"^(?:\.text\.(\S+):|\s*Function\s*:\s*(\S+))")
LABEL_RE = re.compile(r"^(\.L_x_\d+):")
INS_RE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
TARGET_RE = re.compile(r"\bBRA(?:\.\S+)?\s+(?:\S+,\s*)?`?\(?(\.L_x_\d+|0x[0-9a-f]+)\)?`?")

CLASSES = (  # first match wins; the classes a block-scaled GEMM's budget is read in
    ("FP32", r"F(ADD|MUL|FMA)$"),
    ("MMA", r"[IH]MMA$|HGMMA$|IGMMA$"),
    ("shared load", r"LDS$|LDSM$"),
    ("async copy", r"LDGSTS$|LDGDEPBAR$|DEPBAR$"),
    ("barrier", r"BAR$"),
    ("spill", r"LDL$|STL$"),
    ("integer/address", r"U?(IADD3|IMAD|LEA|ISETP|SHF|LOP3|SEL|PRMT|IABS|IMNMX|VIADD|ISCADD)$"),
    ("move", r"U?MOV$|CS2R$|S2R$|S2UR$|R2UR$"),
    ("branch", r"BRA$|BSSY$|BSYNC$|WARPSYNC$"),
)


def parse(lines):
    """{function: [(address, text)]}, {function: {label: address}}"""
    funcs, labels, cur, pending = {}, {}, None, []
    for line in lines:
        m = FUNC_RE.match(line)
        if m:
            cur = m.group(1) or m.group(2)
            funcs.setdefault(cur, [])
            labels.setdefault(cur, {})
            pending = []
            continue
        if cur is None:
            continue
        m = LABEL_RE.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = INS_RE.search(line)
        if m:
            addr = int(m.group(1), 16)
            for lab in pending:
                labels[cur][lab] = addr
            pending = []
            funcs[cur].append((addr, m.group(2)))
    return funcs, labels


def opcode(text):
    """The opcode without its modifiers or guard predicate: '@!P0 LDS.64 R2, [R3]' -> 'LDS'."""
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def classify(text):
    op = opcode(text)
    for name, pat in CLASSES:
        if re.match(pat, op):
            return name
    return "other"


def loops(ins, labels, marker):
    """(start, end, body) of every backward branch whose body holds the marker opcode."""
    out = []
    for addr, text in ins:
        m = TARGET_RE.search(text)
        if not m:
            continue
        t = m.group(1)
        target = int(t, 16) if t.startswith("0x") else labels.get(t)
        if target is None or target > addr:
            continue
        body = [(a, x) for a, x in ins if target <= a <= addr]
        if any(opcode(x) == marker for _, x in body):
            out.append((target, addr, body))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("listing", nargs="?", help="nvdisasm -c or cuobjdump -sass output (default: standard input)")
    ap.add_argument("--function", default="", help="regular expression a function's (mangled) name must match")
    ap.add_argument("--marker", default="IMMA", help="report only loops holding this opcode (default IMMA)")
    ap.add_argument("--opcodes", action="store_true", help="count every instruction by opcode, not loops")
    args = ap.parse_args(argv)
    try:
        text = open(args.listing, encoding="utf-8").read() if args.listing else sys.stdin.read()
    except (OSError, UnicodeDecodeError) as e:
        print(f"sass_loops.py: error: {args.listing}: {e}", file=sys.stderr)
        return 1
    try:
        name_re = re.compile(args.function)
    except re.error as e:
        print(f"sass_loops.py: error: --function '{args.function}': {e}", file=sys.stderr)
        return 1
    funcs, labels = parse(text.splitlines())
    if args.opcodes:
        ops = collections.Counter(opcode(x) for name, ins in funcs.items() if name_re.search(name) for _, x in ins)
        if not ops:
            print(f"sass_loops.py: error: no instruction in a function matching '{args.function}'", file=sys.stderr)
            return 1
        for op, k in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
            print(k, op)
        print(sum(ops.values()), "TOTAL")
        return 0
    found = 0
    for name, ins in funcs.items():
        if not name_re.search(name):
            continue
        for start, end, body in loops(ins, labels[name], args.marker):
            found += 1
            counts = collections.Counter(classify(x) for _, x in body)
            n = len(body)
            mix = ", ".join(f"{k} {v} ({100.0 * v / n:.1f}%)" for k, v in counts.most_common())
            print(f"{name}\n  loop {start:#06x}-{end:#06x}: {n} instructions, {16 * n} bytes; {mix}")
    if not found:
        print(f"sass_loops.py: error: no loop with {args.marker} in a function matching '{args.function}'",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
