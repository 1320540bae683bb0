#!/usr/bin/env python3
"""Benchmark of `fp4lab sim --sweep` on Llama-2-7B (docs/mpi.md, "Sweep speed"): today's engine beside the new one.

  scripts/bench_sweep.py --fp4lab build/bin/fp4lab [--old OLD_FP4LAB] [--old-name NAME] [--repeat 2]
                         [--budget 540] [--distinct-budget S] [--json docs/results/bench-sweep.json]

OLD is the engine compared against: another fp4lab binary (e.g. one built from an earlier commit), or, by default,
the same binary as one process simulating every job (OMP_NUM_THREADS=1 --no-job-cache), which is today's engine.
Run from the repository root. Four parts, old and new in the same run, taking turns (old, new, old, new ...):

  A  4 design points whose timing differs (mac.units x recipe): the per-point time of the simulation itself;
  B  12 design points that share their timing in groups (mac.kind, the DRAM energy): what the job memo saves;
  C  the 1,008-point design-space sweep (4 recipes x 3 MAC kinds x 2 MAC counts x 2 RHT rates x 7 leakage x 3 DRAM
     energies on sim/configs/h200-class-dual.cfg), new engine only, stopped at --budget seconds: the points
     finished by then are counted from its progress lines and, if it finished, its wall time;
  D  the 1,000-point timing-distinct sweep: a full Llama-2-7B training step (workloads/models/llama2-7b.json, 4,096
     tokens, ufp4) on sim/configs/h200-class-dual.cfg over 5 clocks x 5 MAC counts x 5 RHT rates x 8 DRAM
     bandwidths, every point with its own timing (the job memo prices nothing): old, then new, each timed whole
     (or stopped at --distinct-budget seconds, the points it finished counted from its progress lines). The goal:
     new under 600 s.

Every A, B and D pair's JSON (and D's CSV) is compared byte for byte. Writes OUT.json and OUT.txt (the command, machine load and the
figures). Plain Python, no dependencies.
"""
import argparse
import json
import os
import pty
import re
import select
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

SHAPES = "workloads/shapes/llama2-7b.csv"
PRICED = "sim/configs/h200-class-dual.cfg"

PART_A = f"""[defaults]
config = "sim/configs/h100-class.cfg"
shapes = "{SHAPES}"

[[grid]]
name = "u{{mac.units}}_{{recipe}}"
recipe = ["ufp4", "nvfp4"]
"mac.units" = [128, 256]
"""

PART_B = f"""[defaults]
config = "sim/configs/h100-class.cfg"
shapes = "{SHAPES}"

[[grid]]
name = "{{mac.kind}}_{{recipe}}_dram{{energy.dram_byte_pj}}"
recipe = ["ufp4", "e2m1-ref"]
"mac.kind" = ["e2m1", "e1m2", "dual"]
"energy.dram_byte_pj" = [14.0, 28.0]
"""

PART_D = """[defaults]
config = "sim/configs/h200-class-dual.cfg"
model = "workloads/models/llama2-7b.json"
tokens = 4096
recipe = "ufp4"

[[grid]]
name = "c{clock.ghz}_u{mac.units}_r{rht.lanes}_bw{dram.bandwidth}"
"clock.ghz" = [1.6, 1.7, 1.8, 1.9, 1.98]
"mac.units" = [128, 192, 256, 384, 512]
"rht.lanes" = [1.4, 2.8, 4.2, 5.6, 8.4]
"dram.bandwidth" = [1200, 1600, 2000, 2390, 2800, 3200, 3600, 4000]
"""

PART_C = f"""[defaults]
config = "{PRICED}"
shapes = "{SHAPES}"

[[grid]]
name = "{{recipe}}_{{mac.kind}}_u{{mac.units}}_rht{{rht.lanes}}_leak{{energy.leak_mw_per_mm2}}_dram{{energy.dram_byte_pj}}"
recipe = ["ufp4", "e2m1-ref", "nvfp4", "mxfp4"]
"mac.kind" = ["e2m1", "e1m2", "dual"]
"mac.units" = [256, 512]
"rht.lanes" = [2.8, 5.6]
"energy.leak_mw_per_mm2" = [25.0, 50.0, 75.0, 100.0, 125.0, 150.0, 200.0]
"energy.dram_byte_pj" = [14.0, 20.0, 28.0]
"""


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def engines(args):
    new = ([args.fp4lab], {})
    if args.old:
        old = ([args.old], {})
    else:
        old = ([args.fp4lab], {"OMP_NUM_THREADS": "1"}, )
    return old, new


def run(cmd, env_extra, sweep, out, extra=()):
    env = dict(os.environ, **env_extra)
    t = time.monotonic()
    p = subprocess.run([*cmd, "sim", "--sweep", sweep, "--out", out, *extra], env=env, capture_output=True, text=True)
    wall = time.monotonic() - t
    if p.returncode != 0:
        sys.exit(f"{cmd} --sweep {sweep}: exit {p.returncode}: {p.stderr.strip()}")
    return wall


def pair(args, tmp, name, text):
    sweep = os.path.join(tmp, name + ".toml")
    with open(sweep, "w") as f:
        f.write(text)
    (old_cmd, old_env), (new_cmd, new_env) = engines(args)
    old_extra = () if args.old else ("--no-job-cache",)
    rows = []
    for r in range(args.repeat):
        load0 = loadavg()
        t_old = run(old_cmd, old_env, sweep, os.path.join(tmp, name + "_old"), old_extra)
        t_new = run(new_cmd, new_env, sweep, os.path.join(tmp, name + "_new"))
        same = all(open(os.path.join(tmp, f"{name}_old{e}"), "rb").read() ==
                   open(os.path.join(tmp, f"{name}_new{e}"), "rb").read() for e in (".json",))
        rows.append({"old_s": t_old, "new_s": t_new, "ratio": t_old / t_new, "json_identical": same,
                     "load_before": load0, "load_after": loadavg()})
    points = len(json.load(open(os.path.join(tmp, name + "_new.json")))["runs"])
    med = lambda k: statistics.median(r[k] for r in rows)
    return {"points": points, "runs": rows, "old_s_per_point": med("old_s") / points,
            "new_s_per_point": med("new_s") / points, "ratio_median": med("ratio"),
            "json_identical": all(r["json_identical"] for r in rows)}


def big(args, tmp, binary=None, text=PART_C, name="design", budget=None, sweep_name=None):
    """A sweep under a pseudo-terminal (progress lines come only to a terminal), stopped at the budget."""
    binary = binary or args.fp4lab
    budget = args.budget if budget is None else budget
    sweep = os.path.join(tmp, (sweep_name or name) + ".toml")  # the JSON records the sweep file's name
    with open(sweep, "w") as f:
        f.write(text)
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(binary, [binary, "sim", "--sweep", sweep, "--out", os.path.join(tmp, name)])
    t0 = time.monotonic()
    load0 = loadavg()
    buf, done, finished, total = b"", 0, False, None
    while True:
        left = budget - (time.monotonic() - t0)
        if left <= 0:
            break
        r, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not r:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            finished = True
            break
        buf += chunk
        done = len(re.findall(rb"\] ", buf))  # one "[k/n] NAME" line per finished point, from every worker
        m = re.search(rb": (\d+) runs on", buf)
        if m:
            total = int(m.group(1))
    wall = time.monotonic() - t0
    if not finished:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    finished = finished and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    m = re.search(rb"(\d+) GEMM jobs priced from the job memo", buf)
    res = {"points": total, "finished": finished, "points_done": done, "wall_s": wall, "budget_s": budget,
           "load_before": load0, "load_after": loadavg(), "memo_jobs": int(m.group(1)) if m else None}
    if done:
        res["s_per_point"] = wall / done
    if finished:
        rows = json.load(open(os.path.join(tmp, name + ".json")))["runs"]
        res["points_done"] = len(rows)
        res["s_per_point"] = wall / len(rows)
    return res


def distinct(args, tmp):
    """Part D: the timing-distinct sweep, today's engine then the new one; outputs compared byte for byte."""
    if not args.old:  # the memo prices nothing here, so one binary would time itself twice
        return {"skipped": "part D compares two binaries: give --old"}
    res = {"old": big(args, tmp, args.old, PART_D, "distinct_old", args.distinct_budget, "distinct"),
           "new": big(args, tmp, args.fp4lab, PART_D, "distinct_new", args.distinct_budget, "distinct")}
    o, n = res["old"], res["new"]
    res["points"] = n["points"]
    res["goal_s"] = 600.0
    res["goal_met"] = bool(n["finished"] and n["wall_s"] < res["goal_s"])
    if o.get("s_per_point") and n.get("s_per_point"):
        res["ratio"] = o["s_per_point"] / n["s_per_point"]
    if o["finished"] and n["finished"]:
        res["identical"] = {e: open(os.path.join(tmp, "distinct_old" + e), "rb").read() ==
                            open(os.path.join(tmp, "distinct_new" + e), "rb").read() for e in (".json", ".csv")}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fp4lab", required=True)
    ap.add_argument("--old", help="the fp4lab binary of today's engine (default: --fp4lab as one process, no memo)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--old-name", help="how the recorded command names --old (default: as given)")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds part C may run")
    ap.add_argument("--distinct-budget", type=float, default=3600.0, help="seconds each engine may run in part D")
    ap.add_argument("--json", help="write the figures to JSON (a .json name) and the table beside it (.txt)")
    args = ap.parse_args()
    args.fp4lab = os.path.abspath(args.fp4lab)
    if args.old:
        args.old = os.path.abspath(args.old)
    argv = list(sys.argv)
    if args.old_name:  # the command as the docs give it, naming the old build by its role
        for i, a in enumerate(argv):
            if a is None:
                continue
            if a.startswith("--old-name"):
                argv[i] = None
                if a == "--old-name":
                    argv[i + 1] = None
            elif a == "--old" and i + 1 < len(argv):
                argv[i + 1] = args.old_name
            elif a.startswith("--old="):
                argv[i] = "--old=" + args.old_name
        argv = [a for a in argv if a is not None]
    res = {"command": " ".join(shlex.quote(a) for a in argv), "cores": os.cpu_count(),
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "")}
    with tempfile.TemporaryDirectory() as tmp:
        res["a_timing_distinct"] = pair(args, tmp, "distinct", PART_A)
        res["b_shared_timing"] = pair(args, tmp, "shared", PART_B)
        res["c_design_space"] = big(args, tmp)
        res["d_timing_distinct_1000"] = distinct(args, tmp)
    lines = [f"$ {res['command']}", f"{res['cores']} cores, OMP_NUM_THREADS={res['omp_num_threads'] or 'unset'}; "
             f"old = {'--old binary' if args.old else 'one process, --no-job-cache'}"]
    for key, what in (("a_timing_distinct", "A: 4 points, timing differs"),
                      ("b_shared_timing", "B: 12 points sharing timing in groups")):
        p = res[key]
        lines.append(f"{what}: old {p['old_s_per_point']:.2f} s/point, new {p['new_s_per_point']:.2f} s/point, "
                     f"ratio {p['ratio_median']:.2f}x (median of {len(p['runs'])} pairs), JSON byte-identical: "
                     f"{p['json_identical']}")
        for r in p["runs"]:
            lines.append(f"    old {r['old_s']:.1f} s, new {r['new_s']:.1f} s, ratio {r['ratio']:.2f}, "
                         f"load {r['load_before']:.2f} -> {r['load_after']:.2f}")
    c = res["c_design_space"]
    if c["finished"]:
        lines.append(f"C: {c['points_done']}-point Llama-2-7B design sweep finished in {c['wall_s']:.1f} s "
                     f"({c['s_per_point']:.3f} s/point), load {c['load_before']:.2f} -> {c['load_after']:.2f}")
    else:
        lines.append(f"C: {c['points']}-point Llama-2-7B design sweep did not finish within {c['budget_s']:.0f} s: "
                     f"{c['points_done']} points done, measured {c.get('s_per_point', float('nan')):.3f} s/point")
    d = res["d_timing_distinct_1000"]
    for who in ("old", "new") if "skipped" not in d else ():
        r = d[who]
        if r["finished"]:
            lines.append(f"D {who}: {r['points_done']}-point timing-distinct Llama-2-7B sweep finished in {r['wall_s']:.1f} s "
                         f"({r['s_per_point']:.3f} s/point, {r['memo_jobs']} jobs from the memo), "
                         f"load {r['load_before']:.2f} -> {r['load_after']:.2f}")
        else:
            lines.append(f"D {who}: {r['points']}-point timing-distinct sweep did not finish within {r['budget_s']:.0f} s: "
                         f"{r['points_done']} points done, {r.get('s_per_point', float('nan')):.3f} s/point, "
                         f"load {r['load_before']:.2f} -> {r['load_after']:.2f}")
    if "skipped" in d:
        lines.append(f"D: skipped ({d['skipped']})")
    elif "ratio" in d:
        same = d.get("identical")
        same = ", ".join(f"{e[1:].upper()} {v}" for e, v in same.items()) if same else "not compared (a run stopped)"
        lines.append(f"D: old / new {d['ratio']:.2f}x per point; byte-identical: {same}; "
                     f"new under {d['goal_s']:.0f} s: {d['goal_met']}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
        with open(os.path.splitext(args.json)[0] + ".txt", "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
