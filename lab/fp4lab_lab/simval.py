"""The SystemC simulator's validation against measured H200 kernel timings (docs/validation.md): the shape sets of
the workloads/shapes models, the calibration/validation split, the `fp4lab sim` arguments that model each
measured kernel, the predictions and their error metrics, calibration over grids of config values, and the
training-step study of an H200-class TCU (docs/sim.md). scripts/sim_validation.py is its command line.

Functions that read the repository's files or run `fp4lab sim` take its root: the commands they record are
relative to it (sim/configs/..., workloads/shapes/...) and run with it as the working directory, so a recorded
command reruns as written from the root.

The split rule, fixed before any calibration: within each shape set (quantiser operands; GEMMs) the distinct
shapes are sorted by work (rows*K elements; M*N*K) and then by the shape's dimensions; the shapes at even
positions (0, 2, 4, ...) are the calibration half and those at odd positions the validation half. Every kernel
timed on a shape (the three quantiser passes; the GEMM's unpack, mma and whole call, under each recipe) falls in
that shape's half. Both halves thus span the whole size range, and no validation shape's time is ever used to
choose a configuration value.
"""
import csv
import decimal
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

SWEEP = [256, 512, 1024, 2048, 4096, 8192, 16384]
# Recorded in the validation JSON: where the split rule is stated.
# The name docs/results/sim-validation.json records for this docstring (kept, so a new run writes the same bytes;
# the module is lab/fp4lab_lab/simval.py, outside the installed package).
SPLIT_RULE = "fp4lab.simval (module docstring)"


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


def shape_sets(root):
    """(quantiser operands, GEMM shapes), each sorted: every workloads/shapes model's and the square sweep."""
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
# Measured kernel (fp4lab cuda timings) -> its family and the fp4lab sim arguments that model it.
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
    """fp4lab cuda timings' operand label -> the recipe preset it was timed under."""
    if label.startswith("e1m2_b16_fp32scale"):
        return "ufp4"
    if label.startswith("e2m1_b32_ue8m0scale"):
        return "mxfp4"
    raise ValueError("no recipe for operand label " + label)


def load_measured(paths):
    """Rows of fp4lab cuda timings JSON files: the kernels the simulator models (copies are the bandwidth
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
    """The fp4lab sim command (a list, relative paths) that models one measured row; overrides are KEY=VALUE."""
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


def _sim_json(root, args, fp4lab):
    """Run `fp4lab sim` (args[0:2] == ['fp4lab', 'sim'], run as the binary fp4lab) in root; its JSON report."""
    with tempfile.NamedTemporaryFile(suffix=".json") as t:
        subprocess.run([fp4lab] + args[1:] + ["--json", t.name], cwd=root, check=True, stdout=subprocess.DEVNULL)
        with open(t.name) as f:
            return json.load(f)


def run_sim(root, args, fp4lab):
    """The predicted time (us) of the one kernel a command simulates."""
    return _sim_json(root, args, fp4lab)["gemms"][0]["time_us"]


def predict(root, rows, fp4lab, overrides=(), jobs=2):
    """Simulate every row (jobs processes at a time); set its predicted_us and its command (a shell line)."""
    cmds = [command_for(r, overrides) for r in rows]
    with ThreadPoolExecutor(jobs) as ex:
        preds = list(ex.map(lambda c: run_sim(root, c, fp4lab), cmds))
    for r, c, p in zip(rows, cmds, preds):
        r["predicted_us"] = p
        r["command"] = " ".join(shlex.quote(a) for a in c)
    return rows


def assign_split(root, rows):
    """Set each row's split: the half of its shape within its family's shape set."""
    quants, gemms = shape_sets(root)
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
    """Errors of predicted_us against measured_us, in percent of the measurement, and the correlations."""
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
    """{half: {kernel or 'family (all)': metrics}} for both halves."""
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
        print(f"{'family':28}{'n':>4}{'MAPE %':>9}{'mean %':>9}{'worst %':>9}{'Pearson(log)':>14}{'Spearman':>10}"
              "  worst", file=file)
        for g, m in groups.items():
            print(f"{g:28}{m['n']:>4}{m['mape']:>9.1f}{m['mean_signed_error']:>+9.1f}{m['worst_error']:>+9.1f}"
                  f"{m['pearson_log']:>14.3f}{m['spearman']:>10.3f}  {m['worst']}", file=file)


def validate(root, timings, fp4lab, overrides=(), jobs=2):
    """Every measured row of the timings files, split and predicted: (rows, the validation record)."""
    rows = predict(root, assign_split(root, load_measured(timings)), fp4lab, overrides, jobs)
    record = {"source": [os.path.relpath(os.path.abspath(t), root) for t in timings], "config": CONFIG,
              "split_rule": SPLIT_RULE, "goals": GOALS, "summary": summary(rows),
              "rows": [{k: r[k] for k in ("kernel", "recipe", "shape", "split", "measured_us", "predicted_us",
                                          "command", "variant")} for r in rows]}
    return rows, record


def calibrate(root, timings, fp4lab, fam, vary, kernels=(), sets=(), jobs=2):
    """Yield (the settings 'KEY=V', the calibration half's metrics) for every combination of the values in vary
    ('KEY=V1,V2,...'), over the calibration rows of family fam (of the kernels named, if any)."""
    rows = [r for r in assign_split(root, load_measured(timings))
            if r["split"] == "calibration" and family(r["kernel"]) == fam and (not kernels or r["kernel"] in kernels)]
    keys = [v.split("=", 1)[0] for v in vary]
    values = [v.split("=", 1)[1].split(",") for v in vary]
    for combo in itertools.product(*values):
        settings = [f"{k}={v}" for k, v in zip(keys, combo)]
        predict(root, rows, fp4lab, list(sets) + settings, jobs)
        yield settings, metrics(rows)


def rerun_differences(root, rows, fp4lab, jobs=2):
    """Rerun each recorded row's command; [(row, new prediction)] for those that no longer give predicted_us."""
    def rerun(r):
        args = shlex.split(r["command"])
        if args[:2] != ["fp4lab", "sim"] or "--json" in args:
            raise ValueError("not an fp4lab sim command: " + r["command"])
        return run_sim(root, args, fp4lab)

    with ThreadPoolExecutor(jobs) as ex:
        got = list(ex.map(rerun, rows))
    return [(r, g) for r, g in zip(rows, got) if not math.isclose(g, r["predicted_us"], rel_tol=1e-9)]


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


def read_cfg(root, path):
    """key -> value of a sim/configs/*.cfg file ([section] then key = value; '#' comments), path relative to root."""
    out, section = {}, ""
    with open(os.path.join(root, path)) as f:
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


def step_command(root, shapes, recipe, kind, sr_free=False):
    h200 = read_cfg(root, CONFIG)
    args = ["fp4lab", "sim", "--shapes", shapes, "--config", "sim/configs/h100-class.cfg", "--recipe", recipe,
            "--mac.kind", kind, "--name", "h200-class-" + kind]
    for k in H200_KEYS:
        args += ["--" + k, h200["quant.lanes"] if sr_free and k == "quant.sr_lanes" else h200[k]]
    return args


def run_steps(root, fp4lab, jobs):
    """One row per workloads/shapes model and STEP_RUNS (then SR_FREE) run: step time, prep time, energy."""
    files = sorted(glob.glob(os.path.join(root, "workloads", "shapes", "*.csv")))
    todo = [(os.path.relpath(f, root), r, k, False) for f in files for r, k in STEP_RUNS]
    todo += [(os.path.relpath(f, root), r, k, True) for f in files for r, k in SR_FREE]

    def one(t):
        args = step_command(root, *t)
        j = _sim_json(root, args, fp4lab)
        tot = j["total"]
        prep = sum(g["count"] * g["prep_cycles"] for g in j["gemms"]) / float(j["config"]["clock.ghz"]) / 1e3
        return {"shapes": t[0], "recipe": t[1], "mac_kind": t[2], "sr_as_fast_as_rtne": t[3],
                "time_us": tot["time_us"], "prep_us": prep,
                "energy_pj": tot["energy_total_pj"], "energy_by_part_pj": tot["energy_pj"], "mac_util": tot["mac_util"],
                "command": " ".join(shlex.quote(a) for a in args)}

    with ThreadPoolExecutor(jobs) as ex:
        return list(ex.map(one, todo))


def step_study(root, fp4lab, jobs=2, validation=None):
    """The training-step study's record; with a validation JSON, its validation-half errors (the band)."""
    out = {"tcu": "sim/configs/h100-class.cfg with " + ", ".join(H200_KEYS) + " from " + CONFIG,
           "rows": run_steps(root, fp4lab, jobs)}
    if validation:
        with open(validation) as f:
            out["band_from"] = {"file": os.path.relpath(os.path.abspath(validation), root),
                                "validation": json.load(f)["summary"]["validation"]}
    return out
