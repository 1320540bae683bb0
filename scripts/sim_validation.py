#!/usr/bin/env python3
"""The simulator's validation against measured H200 kernel timings (docs/validation.md); the logic is the
lab's (lab/fp4lab_lab/simval.py, not in the installed package), the tables of this repository's docs are made and checked here.

  sim_validation.py plan [--part quant|gemm]
                                the fp4lab cuda timings arguments: every quantiser operand and GEMM shape of the
                                workloads/shapes models' three training GEMMs, and the square sweep
  sim_validation.py split       which half (calibration or validation) each measured shape falls in
  sim_validation.py predict TIMINGS.json.. --out docs/results/sim-validation.json [--plot PNG] [--set KEY=VALUE ..]
                                one fp4lab sim run per measured kernel and shape; rows, split, per-family metrics
  sim_validation.py calibrate TIMINGS.json.. --family quant|gemm --vary KEY=V1,V2,.. [--set KEY=VALUE ..]
                                calibration-half MAPE of the family for every combination of the values given
  sim_validation.py step --out docs/results/sim-h200-step.json [--validation docs/results/sim-validation.json]
                                training-step time and energy of the workloads/shapes models on an H200-class TCU
  sim_validation.py tables [--check DOC.md ..]
                                the tables of docs/validation.md and docs/sim.md (and README's line) from the result
                                files; with --check, require each to appear verbatim in the documents (a ctest)
  sim_validation.py check docs/results/sim-validation.json [--fp4lab BIN] [--split validation]
                                reruns each row's command and requires the recorded prediction (the ctest)

The split rule, fixed before any calibration, is stated in fp4lab_lab.simval's docstring (lab/fp4lab_lab/simval.py).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lab"))
from fp4lab_lab import simval  # noqa: E402  (the lab imports the fp4lab package)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
        m, goal = v["summary"]["validation"][g], simval.GOALS[fam]
        ok = m["mape"] <= goal["mape"] and m["pearson_log"] >= goal["pearson_log"]
        lines.append(f"| {NAMES[g]} | MAPE ≤ {goal['mape']:.0f} %, Pearson ≥ {goal['pearson_log']} | "
                     f"{m['mape']:.1f} % | "
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
            lines.append(f"| {os.path.basename(m)[:-4]} | {r['recipe']} on {r['mac_kind']} | {t:,.2f} | "
                         f"± {band:,.2f} | "
                         f"{prep:,.2f} | {t - prep:,.2f} | {r['energy_pj'] / 1e12:,.2f} | "
                         f"{r['time_us'] / base['time_us']:.3f} | {r['energy_pj'] / base['energy_pj']:.3f} |")
    return "\n".join(lines)


def sr_table(st):
    """Markdown: the native-unit rows with SR at h200.cfg's assumed rate and as fast as RTNE."""
    lines = ["| model | recipe on units | step, SR at quant.sr_lanes (ms) | step, SR as fast as RTNE (ms) | "
             "e2m1-ref / ufp4 time, as assumed | the same, SR free |", "|---|---|---:|---:|---:|---:|"]
    key = {(r["shapes"], r["recipe"], r["mac_kind"], r["sr_as_fast_as_rtne"]): r["time_us"] for r in st["rows"]}
    for m in sorted({r["shapes"] for r in st["rows"]}):
        for recipe, kind in simval.SR_FREE:
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


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("plan", help="print the fp4lab cuda timings shape arguments")
    pl.add_argument("--part", choices=["all", "quant", "gemm"], default="all")
    sub.add_parser("split", help="print each shape's half")
    pr = sub.add_parser("predict", help="simulate every measured row; write the validation JSON")
    pr.add_argument("timings", nargs="+")
    pr.add_argument("--out", required=True)
    pr.add_argument("--plot")
    pr.add_argument("--set", action="append", default=[], help="KEY=VALUE config override (calibration only)")
    ca = sub.add_parser("calibrate", help="calibration-half error for combinations of config values")
    ca.add_argument("timings", nargs="+")
    ca.add_argument("--family", choices=["quant", "gemm"], required=True)
    ca.add_argument("--kernels", default="", help="comma-separated kernels of the family (default: all)")
    ca.add_argument("--vary", action="append", default=[], help="KEY=V1,V2,...")
    ca.add_argument("--set", action="append", default=[])
    st = sub.add_parser("step", help="training-step time and energy of the workloads/shapes models on an "
                                     "H200-class TCU (docs/sim.md)")
    st.add_argument("--out", required=True)
    st.add_argument("--validation", help="sim-validation.json: its validation-half errors give the band")
    tb = sub.add_parser("tables", help="the docs' tables from the result files; --check: each must be in a doc")
    tb.add_argument("--validation", default=os.path.join(ROOT, "docs", "results", "sim-validation.json"))
    tb.add_argument("--step", default=os.path.join(ROOT, "docs", "results", "sim-h200-step.json"))
    tb.add_argument("--check", nargs="*", help="markdown files that must contain the tables, verbatim")
    ch = sub.add_parser("check", help="rerun the recorded commands; require the recorded predictions")
    for p in (pr, ca, st):
        p.add_argument("--fp4lab", default=default_fp4lab())
        p.add_argument("--jobs", type=int, default=2)
    ch.add_argument("validation_json")
    ch.add_argument("--fp4lab", default=default_fp4lab())
    ch.add_argument("--split", default="validation")
    ch.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    quants, gemms = simval.shape_sets(ROOT)
    if a.cmd == "plan":
        words = []
        if a.part in ("all", "quant"):
            words += ["--quant"] + [simval.shape_text(s) for s in quants]
        if a.part in ("all", "gemm"):
            words += ["--gemm"] + [simval.shape_text(s) for s in gemms]
        print(" ".join(words))
    elif a.cmd == "split":
        for kind, shapes in (("quant", quants), ("gemm", gemms)):
            for s, half in sorted(simval.split_of(shapes).items()):
                print(kind, simval.shape_text(s), half)
    elif a.cmd == "predict":
        rows, out = simval.validate(ROOT, a.timings, a.fp4lab, a.set, a.jobs)
        simval.print_summary(out["summary"])
        write_json(a.out, out)
        if a.plot:
            simval.plot(rows, a.plot)
    elif a.cmd == "calibrate":
        best = None
        for settings, m in simval.calibrate(ROOT, a.timings, a.fp4lab, a.family, a.vary,
                                            a.kernels.split(",") if a.kernels else (), a.set, a.jobs):
            if best is None or m["mape"] < best[0]:  # the first of equal MAPEs
                best = (m["mape"], settings)
            print(f"{' '.join(settings)}: MAPE {m['mape']:.2f}%  mean "
                  f"{m['mean_signed_error']:+.1f}%  worst {m['worst_error']:+.1f}% ({m['worst']})  "
                  f"pearson {m['pearson_log']:.3f}", flush=True)
        print("best:", " ".join(best[1]), f"MAPE {best[0]:.2f}%")
    elif a.cmd == "step":
        out = simval.step_study(ROOT, a.fp4lab, a.jobs, a.validation)
        write_json(a.out, out)
        for r in out["rows"]:
            print(f"{r['shapes']:40} {r['recipe']:9} {r['mac_kind']:5} "
                  f"{'SR free' if r['sr_as_fast_as_rtne'] else '':7} "
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
        bad = simval.rerun_differences(ROOT, rows, a.fp4lab, a.jobs)
        for r, g in bad:
            print(f"DIFFERS {r['kernel']} {r['recipe']} {r['shape']}: recorded {r['predicted_us']}, now {g}\n"
                  f"  {r['command']}")
        print(f"{len(rows) - len(bad)} of {len(rows)} {a.split} rows reproduce their recorded prediction")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
