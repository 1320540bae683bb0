#!/usr/bin/env python3
"""Where a kernel's warps wait, per SASS opcode and per instruction, from ncu's source page.

    ncu --section WarpStateStats --section SourceCounters -k regex:gemm_mma_kernel -o rep <app>
    ncu --import rep.ncu-rep --page source --csv --print-source sass > rep.csv
    python3 kernels/tools/ncu_stalls.py rep.csv [--top N]

Prints the share of every stall reason in the warp-state samples, the opcodes that hold each of the largest
reasons, the executed instruction counts by opcode, and the N instructions of the hottest loop (the instructions
executed most often) with the most dispatch-stall samples, each with the distance back to the tensor instruction
(IMMA/HMMA) that wrote one of its source registers.
"""
import argparse
import collections
import csv
import re
import sys

REASONS = ("stall_selected", "stall_not_selected", "stall_dispatch", "stall_math", "stall_wait", "stall_short_sb", "stall_long_sb",
           "stall_no_inst", "stall_barrier")


TENSOR = re.compile(r"[IH]MMA")


def operation(src):
    """The instruction without its predicate: 'OPCODE.MODS operands'."""
    return re.sub(r"^@\S+\s+", "", src)


def destinations(src):
    """Registers an instruction writes: its first operand when that is a register, widened by the opcode's width
    (.64: 2, .128 or a tensor instruction's quad: 4, LDSM .x2/.x4: 2/4)."""
    m = re.match(r"(\S+)\s+R(\d+)\b", operation(src))
    if not m:
        return set()  # no register destination (stores, predicates, branches)
    op, r = m.group(1), int(m.group(2))
    if TENSOR.match(op) or ".128" in op or op.endswith(".4"):
        n = 4
    else:
        n = 2 if ".64" in op or ".WIDE" in op or op.endswith(".2") else 1
    return set(range(r, r + n))


def sources(src):
    """Registers an instruction reads: every register operand but a register destination."""
    ops = operation(src).split(None, 1)
    if len(ops) < 2:
        return []
    regs = [int(g) for g in re.findall(r"\bR(\d+)", ops[1])]
    return regs[1:] if destinations(src) else regs


def opcode(src):
    words = src.split()
    if not words:
        return "?"
    w = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return w.split(".")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv, newline="")))
    head = next((i for i, r in enumerate(rows) if "Source" in r and "stall_dispatch" in r), None)
    if head is None:
        sys.exit(f"{args.csv}: no ncu source page with stall columns (need --section SourceCounters)")
    hdr = rows[head]
    ix = {h: i for i, h in enumerate(hdr)}
    data = [r for r in rows[head + 1:] if len(r) >= len(hdr)]
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    total, by_op, executed = collections.Counter(), collections.defaultdict(collections.Counter), collections.Counter()
    for r in data:
        op = opcode(r[ix["Source"]].strip())
        executed[op] += int(r[ix["Instructions Executed"]] or 0)
        for h in reasons:
            v = int(r[ix[h]] or 0)
            total[h] += v
            by_op[op][h] += v
    n = sum(total.values())
    print(f"{args.csv}: {n} warp-state samples")
    for h, v in total.most_common():
        if v:
            print(f"  {h:24s} {v / n:6.3f}")
    for h in REASONS:
        if total[h]:
            tops = sorted(by_op, key=lambda o: -by_op[o][h])[:5]
            print(f"  {h} by opcode: " + ", ".join(f"{o} {by_op[o][h] / total[h]:.2f}" for o in tops))
    print("  executed (warp instructions): " + ", ".join(f"{o} {c}" for o, c in executed.most_common(8)))
    most = max(int(r[ix["Instructions Executed"]] or 0) for r in data)
    loop = [i for i, r in enumerate(data) if int(r[ix["Instructions Executed"]] or 0) == most]
    print(f"  hottest loop: {len(loop)} instructions executed {most} times each; "
          f"its dispatch stalls {sum(int(data[i][ix['stall_dispatch']]) for i in loop)}")
    for i in sorted(loop, key=lambda i: -int(data[i][ix["stall_dispatch"]]))[:args.top]:
        src = data[i][ix["Source"]].strip()
        regs = set(sources(src))
        back = None
        for j in range(i - 1, max(i - 80, -1), -1):  # the nearest earlier writer of each; stop at a tensor one
            prev = data[j][ix["Source"]].strip()
            written = destinations(prev)
            if TENSOR.match(operation(prev)) and regs & written:
                back = i - j
                break
            regs -= written
        print(f"    +{i - loop[0]:5d} dispatch {data[i][ix['stall_dispatch']]:>6s} not_selected "
              f"{data[i][ix['stall_not_selected']]:>6s} math {data[i][ix['stall_math']]:>6s}  {src[:60]}"
              + (f"  (tensor result {back} instructions back)" if back else ""))


if __name__ == "__main__":
    main()
