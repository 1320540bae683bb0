#!/usr/bin/env python3
"""The simulator's validation against measured H200 kernel timings (docs/validation.md).

  sim_validation.py plan [--part quant|gemm]
                                the fp4lab-cuda timings arguments: every quantiser operand and GEMM shape of the
                                workloads/shapes models' three training GEMMs, and the square sweep
  sim_validation.py split       which half (calibration or validation) each measured shape falls in
  sim_validation.py predict TIMINGS.json.. --out docs/results/sim-validation.json [--plot PNG] [--set KEY=VALUE ..]
                                one fp4lab sim run per measured kernel and shape; rows, split, per-family metrics
  sim_validation.py calibrate TIMINGS.json.. --family quant|gemm --vary KEY=V1,V2,.. [--set KEY=VALUE ..]
                                calibration-half MAPE of the family for every combination of the values given
  sim_validation.py step --out docs/results/sim-h200-step.json [--validation docs/results/sim-validation.json]
                                training-step time and energy of the workloads/shapes models on an H200-class TCU
  sim_validation.py tables [--check DOC.md ..]
                                the tables of docs/validation.md and docs/sim.md (and README's line) from the result files; with --check,
                                require each to appear verbatim in the documents (a ctest)
  sim_validation.py check docs/results/sim-validation.json [--fp4lab BIN] [--split validation]
                                reruns each row's command and requires the recorded prediction (the ctest)

The split rule, fixed before any calibration: within each shape set (quantiser operands; GEMMs) the distinct
shapes are sorted by work (rows*K elements; M*N*K) and then by the shape's dimensions; the shapes at even
positions (0, 2, 4, ...) are the calibration half and those at odd positions the validation half. Every kernel
timed on a shape (the three quantiser passes; the GEMM's unpack, mma and whole call, under each recipe) falls in
that shape's half. Both halves thus span the whole size range, and no validation shape's time is ever used to
choose a configuration value.
"""
import argparse
import decimal
import csv
import glob
import itertools
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from fp4lab.paired import pearson, ranks  # the same bits on every machine (docs/spec.md §6.1)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = [256, 512, 1024, 2048, 4096, 8192, 16384]


def read_layers(path):
    """(gemm, tokens, in, out) of one workloads/shapes CSV (format: workloads/shapes/README.md)."""
    with open(path) as f:
        lines = [l for l in f if l.strip() and not l.lstrip().startswith("#")]
    return [(r["gemm"], int(r["tokens"]), int(r["in"]), int(r["out"])) for r in csv.DictReader(lines)]


def layer_shapes(tokens, din, dout):
    """The three training GEMMs of a linear layer (fwd_y = X.W^T, bwd_dx = dY.W, bwd_dw = dY^T.X) as (M, N, K),
    and the quantised operands, A [M, K] and B [N, K] of each, as (rows, K)."""
    gemms = [(tokens, dout, din), (tokens, din, dout), (dout, din, tokens)]
    operands = set()
    for m, n, k in gemms:
        operands |= {(m, k), (n, k)}
    return gemms, operands


def shape_sets(root=ROOT):
    gemms, quants = set(), set()
    for f in sorted(glob.glob(os.path.join(root, "workloads", "shapes", "*.csv"))):
        for _, t, i, o in read_layers(f):
            g, q = layer_shapes(t, i, o)
            gemms |= set(g)
            quants |= q
    for s in SWEEP:
        gemms.add((s, s, s))
        quants.add((s, s))
    return sorted(quants), sorted(gemms)


def split_of(shapes):
    """{shape: 'calibration' | 'validation'} by the rule in this module's docstring."""
    def work(s):
        w = 1
        for d in s:
            w *= d
        return w
    order = sorted(shapes, key=lambda s: (work(s), s))
    return {s: ("calibration" if i % 2 == 0 else "validation") for i, s in enumerate(order)}


def shape_text(s):
    return "x".join(str(d) for d in s)


CONFIG = "sim/configs/h200.cfg"
# Measured kernel (fp4lab-cuda timings) -> its family and the fp4lab sim arguments that model it.
QUANT_KERNELS = {
    "quantize_plain": ["--kernel", "quantize", "--rht", "0", "--prep.mode", "fused"],
    "quantize_fused_rht16": ["--kernel", "quantize", "--prep.mode", "fused"],
    "quantize_unfused_rht16": ["--kernel", "quantize", "--prep.mode", "unfused"],
}
GEMM_KERNELS = {
    "gemm_unpack": ["--kernel", "unpack"],
    "gemm_fast": ["--kernel", "gemm"],
}
GOALS = {"quant": {"mape": 10.0, "pearson_log": 0.95}, "gemm": {"mape": 20.0, "pearson_log": 0.95}}
# Tile variants of the fast GEMM (kernels/src/gemm.cu): h200.cfg describes the default, variant 1 (64 x 128, two
# CTAs per SM); variant 0 is 128 x 128 with one CTA per SM.
VARIANT_ARGS = {0: ["--tile.m", "128", "--tcu.ctas", "1"], 1: []}


def family(kernel):
    return "quant" if kernel.startswith("quantize") else "gemm"


def recipe_of(label):
    """fp4lab-cuda's operand label -> the recipe preset it was timed under."""
    if label.startswith("e1m2_b16_fp32scale"):
        return "ufp4"
    if label.startswith("e2m1_b32_ue8m0scale"):
        return "mxfp4"
    raise ValueError("no recipe for operand label " + label)


def load_measured(paths):
    """Rows of fp4lab-cuda timings JSON files: the kernels the simulator models (copies are the bandwidth
    reference, not a kernel of the model; gemm_mma is the whole call's second half, reported beside it)."""
    rows, seen = [], set()
    for p in paths:
        with open(p) as f:
            j = json.load(f)
        for r in j["rows"]:
            k = r["kernel"]
            if k not in QUANT_KERNELS and k not in GEMM_KERNELS:
                continue
            key = (k, r["recipe"], r["shape"])
            if key in seen:
                raise ValueError(f"{p}: {key} measured twice (pass one run's files; repeats are compared apart)")
            seen.add(key)
            rows.append({"kernel": k, "recipe": recipe_of(r["recipe"]), "shape": r["shape"],
                         "measured_us": r["median_us"], "variant": r.get("variant"), "samples_us": r["samples_us"]})
    return rows


def command_for(row, overrides=()):
    k = row["kernel"]
    args = ["fp4lab", "sim", "--config", CONFIG, "--recipe", row["recipe"], "--rounding", "rtne"]
    if k in QUANT_KERNELS:
        args += QUANT_KERNELS[k] + ["--launch.mode", "graph"]
    else:
        args += GEMM_KERNELS[k] + ["--rht", "0"] + VARIANT_ARGS[row["variant"]]
    args += ["--shape", row["shape"]]
    for o in overrides:
        key, val = o.split("=", 1)
        args += ["--" + key, val]
    return args


def run_sim(args, fp4lab):
    with tempfile.NamedTemporaryFile(suffix=".json") as t:
        subprocess.run([fp4lab] + args[1:] + ["--json", t.name], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        with open(t.name) as f:
            j = json.load(f)
    return j["gemms"][0]["time_us"]


def predict(rows, fp4lab, overrides=(), jobs=2):
    cmds = [command_for(r, overrides) for r in rows]
    with ThreadPoolExecutor(jobs) as ex:
        preds = list(ex.map(lambda c: run_sim(c, fp4lab), cmds))
    for r, c, p in zip(rows, cmds, preds):
        r["predicted_us"] = p
        r["command"] = " ".join(shlex.quote(a) for a in c)
    return rows


def assign_split(rows):
    quants, gemms = shape_sets()
    half = {("quant",) + s: h for s, h in split_of(quants).items()}
    half.update({("gemm",) + s: h for s, h in split_of(gemms).items()})
    for r in rows:
        dims = tuple(int(d) for d in r["shape"].split("x"))
        r["split"] = half[(family(r["kernel"]),) + dims]
    return rows


def exact_log(x):
    """ln x from the decimal module (exact integer arithmetic, correctly rounded to 40 digits) rounded to a float:
    libm's log is picked by the CPU and not correctly rounded, so its last bit can differ between machines."""
    return float(decimal.Context(prec=40).ln(decimal.Decimal(x)))


def metrics(rows):
    if not rows:
        return None
    m = [r["measured_us"] for r in rows]
    p = [r["predicted_us"] for r in rows]
    err = [(b - a) / a * 100.0 for a, b in zip(m, p)]
    worst = max(range(len(err)), key=lambda i: abs(err[i]))
    return {"n": len(rows), "mape": sum(abs(e) for e in err) / len(err), "mean_signed_error": sum(err) / len(err),
            "worst_error": err[worst], "worst": rows[worst]["kernel"] + " " + rows[worst]["recipe"] + " " +
            rows[worst]["shape"],
            "pearson_log": pearson([exact_log(a) for a in m], [exact_log(b) for b in p]),
            "spearman": pearson(ranks(m), ranks(p))}


def summary(rows):
    out = {}
    for split in ("calibration", "validation"):
        rs = [r for r in rows if r["split"] == split]
        groups = {}
        for r in rs:
            groups.setdefault(r["kernel"], []).append(r)
            groups.setdefault(family(r["kernel"]) + " (all)", []).append(r)
        out[split] = {g: metrics(v) for g, v in sorted(groups.items())}
    return out


def print_summary(s, file=sys.stdout):
    for split, groups in s.items():
        print(f"== {split} half", file=file)
        print(f"{'family':28}{'n':>4}{'MAPE %':>9}{'mean %':>9}{'worst %':>9}{'Pearson(log)':>14}{'Spearman':>10}  worst",
              file=file)
        for g, m in groups.items():
            print(f"{g:28}{m['n']:>4}{m['mape']:>9.1f}{m['mean_signed_error']:>+9.1f}{m['worst_error']:>+9.1f}"
                  f"{m['pearson_log']:>14.3f}{m['spearman']:>10.3f}  {m['worst']}", file=file)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    colours = {"quantize_plain": "C0", "quantize_fused_rht16": "C1", "quantize_unfused_rht16": "C2",
               "gemm_unpack": "C3", "gemm_fast": "C4"}
    for ax, fam, title in ((axes[0], "quant", "quantiser passes"), (axes[1], "gemm", "emulation GEMM")):
        rs = [r for r in rows if family(r["kernel"]) == fam]
        for k in sorted({r["kernel"] for r in rs}):
            for split, face in (("calibration", "none"), ("validation", colours[k])):
                sel = [r for r in rs if r["kernel"] == k and r["split"] == split]
                if not sel:
                    continue
                ax.scatter([r["measured_us"] for r in sel], [r["predicted_us"] for r in sel], s=18,
                           facecolors=face, edgecolors=colours[k], label=f"{k} ({split[:3]}.)")
        lo = min(min(r["measured_us"], r["predicted_us"]) for r in rs) / 1.5
        hi = max(max(r["measured_us"], r["predicted_us"]) for r in rs) * 1.5
        band = GOALS[fam]["mape"] / 100
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.plot([lo, hi], [lo * (1 + band), hi * (1 + band)], "k:", lw=0.6)
        ax.plot([lo, hi], [lo * (1 - band), hi * (1 - band)], "k:", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured on the H200 (us, median)")
        ax.set_ylabel("fp4lab sim, sim/configs/h200.cfg (us)")
        ax.set_title(f"{title}: filled = validation half; dotted = ±{GOALS[fam]['mape']:.0f}%")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


# The training-step study (docs/sim.md, "An H200-class TCU"): the tensor-core unit of h100-class.cfg (native
# block-scaled MAC units and accumulator, tile, buffer, energy table) with what h200.cfg measured of the H200
# itself: clock, SMs, memory system, launch overheads, and the RHT + quantise passes as SM kernels. Keys are read
# from the two files, not restated here.
H200_KEYS = ["clock.ghz", "tcu.count", "dram.bandwidth", "dram.latency", "dram.write_cost", "l2.bytes",
             "l2.bandwidth", "l2.latency", "launch.stream_us", "launch.graph_us", "rht.lanes", "quant.lanes",
             "quant.sr_lanes"]
STEP_RUNS = [("ufp4", "e1m2"), ("e2m1-ref", "e2m1"), ("ufp4", "dual"), ("e2m1-ref", "dual")]
# Stochastic rounding's rate on the SMs was not measured (h200.cfg's quant.sr_lanes is an assumption): the two
# native-unit runs again with SR as fast as RTNE bound what that assumption can move.
SR_FREE = [("ufp4", "e1m2"), ("e2m1-ref", "e2m1")]


def read_cfg(path):
    """key -> value of a sim/configs/*.cfg file ([section] then key = value; '#' comments)."""
    out, section = {}, ""
    with open(os.path.join(ROOT, path)) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("["):
                section = line.strip("[]").strip()
                continue
            k, v = (x.strip() for x in line.split("=", 1))
            out[f"{section}.{k}" if section else k] = v
    return out


def step_command(shapes, recipe, kind, sr_free=False):
    h200 = read_cfg(CONFIG)
    args = ["fp4lab", "sim", "--shapes", shapes, "--config", "sim/configs/h100-class.cfg", "--recipe", recipe,
            "--mac.kind", kind, "--name", "h200-class-" + kind]
    for k in H200_KEYS:
        args += ["--" + k, h200["quant.lanes"] if sr_free and k == "quant.sr_lanes" else h200[k]]
    return args


def run_steps(fp4lab, jobs):
    files = sorted(glob.glob(os.path.join(ROOT, "workloads", "shapes", "*.csv")))
    todo = [(os.path.relpath(f, ROOT), r, k, False) for f in files for r, k in STEP_RUNS]
    todo += [(os.path.relpath(f, ROOT), r, k, True) for f in files for r, k in SR_FREE]

    def one(t):
        args = step_command(*t)
        with tempfile.NamedTemporaryFile(suffix=".json") as tf:
            subprocess.run([fp4lab] + args[1:] + ["--json", tf.name], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            with open(tf.name) as f:
                j = json.load(f)
        tot = j["total"]
        prep = sum(g["count"] * g["prep_cycles"] for g in j["gemms"]) / float(j["config"]["clock.ghz"]) / 1e3
        return {"shapes": t[0], "recipe": t[1], "mac_kind": t[2], "sr_as_fast_as_rtne": t[3],
                "time_us": tot["time_us"], "prep_us": prep,
                "energy_pj": tot["energy_total_pj"], "energy_by_part_pj": tot["energy_pj"], "mac_util": tot["mac_util"],
                "command": " ".join(shlex.quote(a) for a in args)}

    with ThreadPoolExecutor(jobs) as ex:
        return list(ex.map(one, todo))


NAMES = {"quantize_plain": "quantise, plain", "quantize_fused_rht16": "quantise, fused RHT-16",
         "quantize_unfused_rht16": "quantise, unfused RHT-16", "quant (all)": "**quantiser passes**",
         "gemm_unpack": "GEMM unpack pass", "gemm_fast": "GEMM, whole call (unpack + mma)",
         "gemm (all)": "**GEMM kernels**"}
ORDER = ["quantize_plain", "quantize_fused_rht16", "quantize_unfused_rht16", "quant (all)", "gemm_unpack",
         "gemm_fast", "gemm (all)"]


def validation_table(v):
    """Markdown: per family, both halves (docs/validation.md)."""
    lines = ["| kernel family | half | rows | MAPE | mean error | worst error (row) | Pearson, log times | Spearman |",
             "|---|---|---:|---:|---:|---|---:|---:|"]
    for g in ORDER:
        for split in ("calibration", "validation"):
            m = v["summary"][split][g]
            lines.append(f"| {NAMES[g]} | {split} | {m['n']} | {m['mape']:.1f} % | {m['mean_signed_error']:+.1f} % | "
                         f"{m['worst_error']:+.1f} % ({m['worst'].split(' ', 1)[1]}) | {m['pearson_log']:.3f} | "
                         f"{m['spearman']:.3f} |")
    return "\n".join(lines)


def goals_table(v):
    lines = ["| family | goal (validation half) | MAPE | Pearson, log times | met |", "|---|---|---:|---:|---|"]
    for fam, g in (("quant", "quant (all)"), ("gemm", "gemm (all)")):
        m, goal = v["summary"]["validation"][g], GOALS[fam]
        ok = m["mape"] <= goal["mape"] and m["pearson_log"] >= goal["pearson_log"]
        lines.append(f"| {NAMES[g]} | MAPE ≤ {goal['mape']:.0f} %, Pearson ≥ {goal['pearson_log']} | {m['mape']:.1f} % | "
                     f"{m['pearson_log']:.3f} | {'yes' if ok else 'no'} |")
    return "\n".join(lines)


def step_table(st):
    """Markdown: the training-step study (docs/sim.md), with the band the validation half implies: the fused
    quantiser's MAPE on the prep passes, the whole GEMM call's on the rest."""
    v = st["band_from"]["validation"]
    bq, bg = v["quantize_fused_rht16"]["mape"] / 100, v["gemm_fast"]["mape"] / 100
    rows_all = st["rows"]
    st = dict(st, rows=[r for r in rows_all if not r["sr_as_fast_as_rtne"]])
    models = sorted({r["shapes"] for r in st["rows"]})
    lines = ["| model | recipe on units | step (ms) | band (ms) | of which RHT + quantise (ms) | GEMMs (ms) | "
             "energy (J) | × ufp4 on E1M2 time | × energy |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for m in models:
        rows = [r for r in st["rows"] if r["shapes"] == m]
        base = next(r for r in rows if r["recipe"] == "ufp4" and r["mac_kind"] == "e1m2")
        for r in rows:
            prep, t = r["prep_us"] / 1e3, r["time_us"] / 1e3
            band = prep * bq + (t - prep) * bg
            lines.append(f"| {os.path.basename(m)[:-4]} | {r['recipe']} on {r['mac_kind']} | {t:,.2f} | ± {band:,.2f} | "
                         f"{prep:,.2f} | {t - prep:,.2f} | {r['energy_pj'] / 1e12:,.2f} | "
                         f"{r['time_us'] / base['time_us']:.3f} | {r['energy_pj'] / base['energy_pj']:.3f} |")
    return "\n".join(lines)


def sr_table(st):
    """Markdown: the native-unit rows with SR at h200.cfg's assumed rate and as fast as RTNE."""
    lines = ["| model | recipe on units | step, SR at quant.sr_lanes (ms) | step, SR as fast as RTNE (ms) | "
             "e2m1-ref / ufp4 time, as assumed | the same, SR free |", "|---|---|---:|---:|---:|---:|"]
    key = {(r["shapes"], r["recipe"], r["mac_kind"], r["sr_as_fast_as_rtne"]): r["time_us"] for r in st["rows"]}
    for m in sorted({r["shapes"] for r in st["rows"]}):
        for recipe, kind in SR_FREE:
            a, b = key[(m, recipe, kind, False)], key[(m, recipe, kind, True)]
            ra = key[(m, "e2m1-ref", "e2m1", False)] / key[(m, "ufp4", "e1m2", False)]
            rb = key[(m, "e2m1-ref", "e2m1", True)] / key[(m, "ufp4", "e1m2", True)]
            lines.append(f"| {os.path.basename(m)[:-4]} | {recipe} on {kind} | {a / 1e3:,.2f} | {b / 1e3:,.2f} | "
                         f"{ra:.3f} | {rb:.3f} |")
    return "\n".join(lines)


def tables(validation_json, step_json):
    with open(validation_json) as f:
        v = json.load(f)
    q, g = v["summary"]["validation"]["quant (all)"], v["summary"]["validation"]["gemm (all)"]
    out = {"validation": validation_table(v), "goals": goals_table(v),
           "readme": f"quantiser passes MAPE {q['mape']:.1f}% ({q['n']} rows), GEMM kernels {g['mape']:.1f}% "
                     f"({g['n']} rows); Pearson of log times {q['pearson_log']:.3f} and {g['pearson_log']:.3f}"}
    if step_json:
        with open(step_json) as f:
            st = json.load(f)
        out["step"] = step_table(st)
        out["sr"] = sr_table(st)
    return out


def default_fp4lab():
    return os.path.join(ROOT, "build", "bin", "fp4lab")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("plan", help="print the fp4lab-cuda timings shape arguments")
    pl.add_argument("--part", choices=["all", "quant", "gemm"], default="all")
    sub.add_parser("split", help="print each shape's half")
    pr = sub.add_parser("predict", help="simulate every measured row; write the validation JSON")
    pr.add_argument("timings", nargs="+")
    pr.add_argument("--out", required=True)
    pr.add_argument("--plot")
    pr.add_argument("--set", action="append", default=[], help="KEY=VALUE config override (calibration only)")
    pr.add_argument("--fp4lab", default=default_fp4lab())
    pr.add_argument("--jobs", type=int, default=2)
    ca = sub.add_parser("calibrate", help="calibration-half error for combinations of config values")
    ca.add_argument("timings", nargs="+")
    ca.add_argument("--family", choices=["quant", "gemm"], required=True)
    ca.add_argument("--kernels", default="", help="comma-separated kernels of the family (default: all)")
    ca.add_argument("--vary", action="append", default=[], help="KEY=V1,V2,...")
    ca.add_argument("--set", action="append", default=[])
    ca.add_argument("--fp4lab", default=default_fp4lab())
    ca.add_argument("--jobs", type=int, default=2)
    st = sub.add_parser("step", help="training-step time and energy of the workloads/shapes models on an "
                                     "H200-class TCU (docs/sim.md)")
    st.add_argument("--out", required=True)
    st.add_argument("--validation", help="sim-validation.json: its validation-half errors give the band")
    st.add_argument("--fp4lab", default=default_fp4lab())
    st.add_argument("--jobs", type=int, default=2)
    tb = sub.add_parser("tables", help="the docs' tables from the result files; --check: each must be in a doc")
    tb.add_argument("--validation", default=os.path.join(ROOT, "docs", "results", "sim-validation.json"))
    tb.add_argument("--step", default=os.path.join(ROOT, "docs", "results", "sim-h200-step.json"))
    tb.add_argument("--check", nargs="*", help="markdown files that must contain the tables, verbatim")
    ch = sub.add_parser("check", help="rerun the recorded commands; require the recorded predictions")
    ch.add_argument("validation_json")
    ch.add_argument("--fp4lab", default=default_fp4lab())
    ch.add_argument("--split", default="validation")
    ch.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    quants, gemms = shape_sets()
    if a.cmd == "plan":
        words = []
        if a.part in ("all", "quant"):
            words += ["--quant"] + [shape_text(s) for s in quants]
        if a.part in ("all", "gemm"):
            words += ["--gemm"] + [shape_text(s) for s in gemms]
        print(" ".join(words))
    elif a.cmd == "split":
        for kind, shapes in (("quant", quants), ("gemm", gemms)):
            for s, half in sorted(split_of(shapes).items()):
                print(kind, shape_text(s), half)
    elif a.cmd == "predict":
        rows = assign_split(load_measured(a.timings))
        predict(rows, a.fp4lab, a.set, a.jobs)
        s = summary(rows)
        print_summary(s)
        out = {"source": [os.path.relpath(os.path.abspath(t), ROOT) for t in a.timings], "config": CONFIG,
               "split_rule": "scripts/sim_validation.py (module docstring)", "goals": GOALS, "summary": s,
               "rows": [{k: r[k] for k in ("kernel", "recipe", "shape", "split", "measured_us", "predicted_us",
                                           "command", "variant")} for r in rows]}
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
        if a.plot:
            plot(rows, a.plot)
    elif a.cmd == "calibrate":
        rows = [r for r in assign_split(load_measured(a.timings))
                if r["split"] == "calibration" and family(r["kernel"]) == a.family
                and (not a.kernels or r["kernel"] in a.kernels.split(","))]
        keys = [v.split("=", 1)[0] for v in a.vary]
        values = [v.split("=", 1)[1].split(",") for v in a.vary]
        results = []
        for combo in itertools.product(*values):
            sets = a.set + [f"{k}={v}" for k, v in zip(keys, combo)]
            predict(rows, a.fp4lab, sets, a.jobs)
            m = metrics(rows)
            results.append((m["mape"], combo, m))
            print(f"{' '.join(f'{k}={v}' for k, v in zip(keys, combo))}: MAPE {m['mape']:.2f}%  mean "
                  f"{m['mean_signed_error']:+.1f}%  worst {m['worst_error']:+.1f}% ({m['worst']})  "
                  f"pearson {m['pearson_log']:.3f}", flush=True)
        best = min(results, key=lambda t: t[0])
        print("best:", " ".join(f"{k}={v}" for k, v in zip(keys, best[1])), f"MAPE {best[0]:.2f}%")
    elif a.cmd == "step":
        rows = run_steps(a.fp4lab, a.jobs)
        out = {"tcu": "sim/configs/h100-class.cfg with " + ", ".join(H200_KEYS) + " from " + CONFIG, "rows": rows}
        if a.validation:
            with open(a.validation) as f:
                out["band_from"] = {"file": os.path.relpath(os.path.abspath(a.validation), ROOT),
                                    "validation": json.load(f)["summary"]["validation"]}
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
        for r in rows:
            print(f"{r['shapes']:40} {r['recipe']:9} {r['mac_kind']:5} {'SR free' if r['sr_as_fast_as_rtne'] else '':7} "
                  f"{r['time_us'] / 1e3:10.3f} ms "
                  f"(prep {r['prep_us'] / 1e3:8.3f}) {r['energy_pj'] / 1e9:10.1f} mJ  util {r['mac_util']:.3f}")
    elif a.cmd == "tables":
        t = tables(a.validation, a.step if os.path.exists(a.step) else None)
        if a.check is None:
            for k, v in t.items():
                print(f"<!-- {k} -->\n{v}\n")
            return 0
        text = ""
        for path in a.check:
            with open(path) as f:
                text += f.read()
        missing = [k for k, v in t.items() if v not in text]
        for k in missing:
            print(f"the {k} table from the result files is not in {', '.join(a.check)}:\n{t[k]}\n")
        print(f"{len(t) - len(missing)} of {len(t)} tables match their result files")
        return 1 if missing else 0
    elif a.cmd == "check":
        with open(a.validation_json) as f:
            rows = [r for r in json.load(f)["rows"] if r["split"] == a.split]
        if not rows:
            print(f"no {a.split} rows in {a.validation_json}")
            return 1

        def rerun(r):
            args = shlex.split(r["command"])
            if args[:2] != ["fp4lab", "sim"] or "--json" in args:
                raise ValueError("not an fp4lab sim command: " + r["command"])
            return run_sim(args, a.fp4lab)

        with ThreadPoolExecutor(a.jobs) as ex:
            got = list(ex.map(rerun, rows))
        bad = [(r, g) for r, g in zip(rows, got) if not math.isclose(g, r["predicted_us"], rel_tol=1e-9)]
        for r, g in bad:
            print(f"DIFFERS {r['kernel']} {r['recipe']} {r['shape']}: recorded {r['predicted_us']}, now {g}\n"
                  f"  {r['command']}")
        print(f"{len(rows) - len(bad)} of {len(rows)} {a.split} rows reproduce their recorded prediction")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
