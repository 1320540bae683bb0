"""``fp4lab decide``: from a model to a go/no-go on uniform-grid (E1M2/INT4) hardware, in one report.

The decision joins three things fp4lab measures elsewhere, and states what follows from them:

- **cost**, from the tensor-core model: every design point (a bundled native configuration such as
  ``h200-class-e1m2``, or a config file, with overrides) times one full-size training step of the model under each
  recipe (``fp4lab sim --model CONFIG --tokens N``, or a shape list, or a captured trace at full size): step time,
  tokens/s, energy per token (static energy grows with the area built) and the unit's area;
- **accuracy**, from ``fp4lab analyze`` on one or more captured traces: the trace metrics of ``fp4lab.accuracy`` per
  recipe, with 95% bootstrap intervals over the records (and steps), and the paired differences between recipes;
- **training evidence**: the project's paired training runs and the proxy study that tests whether any trace metric
  predicts their outcome (``fp4lab-train proxy-study``; the summary bundled with the package, or ``--evidence``).

The verdict rule (also printed in every report): a uniform-grid design D, training with the uniform recipe U
(ufp4), is held against the baseline design B training with the baseline recipe (nvfp4). Cost: throughput per unit
area of D/U over that of B, "better" or "worse" beyond ±1%, else "equal". Accuracy: "better"/"worse" where a
paired training effect U − baseline recipe has a 95% interval that excludes zero (the project's runs, or the user's
own through ``--evidence``), or, failing that, where a trace metric the evidence supports as a predictor has a
decided difference on the model's trace; else "not established". GO: accuracy better and cost not worse. NO-GO:
accuracy worse, or cost not better without an established accuracy gain. UNDECIDED: the rest (a design that is
cheaper per token, or buys accuracy at a cost, without the other side settled). Robustness: the cost side again
with each named assumption (clock, MAC units, RHT lanes, technology factor) scaled down and up.
"""
from __future__ import annotations

import concurrent.futures
import itertools
import json
import math
import os
import subprocess
import sys
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from . import accuracy
from ._base import analyze as _analyze, cli_path, recipes as _recipes
from ._files import (DataError, UsageError, ArgumentParser, check_outputs, console_main, read_json, write_atomic,
                     write_text)

VERSION = 1
BASELINE = "h200-class-e2m1"
DESIGNS = ("h200-class-e2m1", "h200-class-e1m2", "h200-class-dual", "h200-class-e1m2-area", "h200-class-dual-area")
UNIFORM_RECIPE = "ufp4"
BASELINE_RECIPE = "nvfp4"
TOLERANCE = 0.01  # cost ratios within ±1% are "equal": below the sim's calibration error (docs/sim.md)
RESAMPLES = 2000
# The assumptions the verdict names, each scaled down and up for the robustness table: (config key, what it is,
# factors). Integer keys are rounded.
ASSUMPTIONS = (
    ("clock.ghz", "clock", (0.8, 1.25)),
    ("mac.units", "MAC units per TCU", (0.5, 2.0)),
    ("rht.lanes", "RHT lanes", (0.5, 2.0)),
    ("area.um2_per_nand2", "technology factor (µm² per NAND2)", (0.5, 2.0)),
)
INTEGER_KEYS = {"mac.units"}
FILES = ("decision.json", "report.md", "fig_pareto.png", "fig_layers.png")
EVIDENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "training_evidence.json")


# ---- inputs ---------------------------------------------------------------------------------------------------

class Design:
    """A design point: a bundled configuration name or a config file, with ``key=value`` overrides."""

    def __init__(self, spec: str):
        if not isinstance(spec, str) or not spec.strip():
            raise UsageError(f"--design {spec!r}: not a design (NAME or NAME:key=value,...)")
        name, _, rest = spec.partition(":")
        self.config = name.strip()
        self.overrides: Dict[str, str] = {}
        for item in filter(None, (s.strip() for s in rest.split(","))):
            k, eq, v = item.partition("=")
            if not eq or not k.strip() or not v.strip():
                raise UsageError(f"--design {spec}: {item!r} is not key=value")
            self.overrides[k.strip()] = v.strip()
        base = os.path.basename(self.config)
        self.name = base[:-4] if base.endswith(".cfg") else base
        self.label = self.name + "".join(f" {k}={v}" for k, v in self.overrides.items())

    def with_overrides(self, extra: Mapping[str, str]) -> "Design":
        d = Design(self.config)
        d.overrides = dict(self.overrides, **extra)
        d.name = self.name
        d.label = self.name + "".join(f" {k}={v}" for k, v in d.overrides.items())
        return d

    def args(self) -> List[str]:
        out = ["--config", self.config]
        for k, v in self.overrides.items():
            out += [f"--{k}", v]
        return out


def _model_args(model: str, tokens: Optional[int]) -> List[str]:
    if os.path.isdir(model) or model.endswith(".safetensors"):
        return ["--trace", model, "--full-size"]
    if model.endswith(".csv"):
        return ["--shapes", model]
    if tokens is None:
        raise UsageError(f"--model {model}: a config.json needs --tokens N (the step's batch x sequence)")
    return ["--model", model, "--tokens", str(tokens)]


def _positive_int(name: str, v: Any, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise UsageError(f"{name} {v!r}: not an integer of at least {lo}")
    return v


# ---- the simulator ----------------------------------------------------------------------------------------------

def _cli() -> str:
    try:
        return cli_path()
    except RuntimeError as e:
        raise DataError(str(e)) from None


def _fault(cmd: Sequence[str], p: subprocess.CompletedProcess) -> Exception:
    lines = [ln for ln in (p.stderr or "").splitlines() if ln.strip()]
    msg = lines[-1] if lines else f"exit code {p.returncode}"
    msg = msg.split("error: ", 1)[-1] if "error: " in msg else msg
    return (UsageError if p.returncode == 2 else DataError)(msg)


def _check_sim(cli: str) -> None:
    p = subprocess.run([cli, "sim", "--list-configs"], capture_output=True, text=True)
    if p.returncode != 0:  # a build without the simulator says why in one line (docs/spec.md §11.1)
        why = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1].split("error: ", 1)[-1]
        raise DataError(f"{cli}: `fp4lab decide` needs `fp4lab sim`: {why}")


def _sim(cli: str, design: Design, model_args: Sequence[str], recipe: str) -> dict:
    cmd = [cli, "sim", *design.args(), *model_args, "--recipe", recipe, "--json", "-"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise _fault(cmd, p)
    try:
        return json.loads(p.stdout)
    except ValueError:
        raise DataError(f"{cli} sim: its --json output is not JSON") from None


def _run_all(cli: str, jobs: int, tasks: Sequence[tuple], may_fail=lambda task: False) -> List[Any]:
    """Every (design, model args, recipe) through the simulator, ``jobs`` processes at a time, in task order. A
    task for which ``may_fail`` is true gives its DataError in its place instead of ending the decision."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_sim, cli, *t) for t in tasks]
        out: List[Any] = []
        try:
            for t, f in zip(tasks, futures):
                try:
                    out.append(f.result())
                except DataError as e:
                    if not may_fail(t):
                        raise
                    out.append(e)
            return out
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _summary(design: Design, recipe: str, sim: Mapping, tokens: Optional[int]) -> dict:
    """One run's figures, read from the sim JSON (the keys say which field each comes from)."""
    tot, area = sim["total"], sim.get("area") or {}
    if "unit_mm2" not in area:
        raise DataError(f"design {design.label}: its configuration has no [area] keys (docs/sim.md, \"Area and "
                        "static energy\"): the decision needs the area of what is built")
    time_s = tot["time_us"] * 1e-6
    n_tokens = tot.get("tokens", tokens)
    cycles = tot["cycles"]
    out = {
        "design": design.label, "config": design.config, "overrides": dict(design.overrides), "recipe": recipe,
        "native": all(g.get("native", True) for g in sim["gemms"]),
        "time_ms": tot["time_us"] * 1e-3,
        "tokens": n_tokens,
        "tokens_per_s": (n_tokens / time_s) if n_tokens else None,
        "steps_per_s": 1.0 / time_s,
        "energy_j": tot["energy_total_pj"] * 1e-12,
        "energy_per_token_mj": (tot["energy_total_pj"] * 1e-9 / n_tokens) if n_tokens else None,
        "unit_mm2": area["unit_mm2"], "mac_array_mm2": area["mac_array_mm2"],
        "unit_nand2": area["unit_nand2"], "mac_array_nand2": area["mac_array_nand2"],
        "static_w": area["static_mw"] * 1e-3,
        "mac_util": tot["mac_util"],
        "stall_share": {k: v / cycles for k, v in sorted(tot["stall_cycles"].items())} if cycles else {},
    }
    thr = out["tokens_per_s"] if out["tokens_per_s"] is not None else out["steps_per_s"]
    out["throughput_per_mm2"] = thr / area["unit_mm2"]
    return out


def _layers(sim: Mapping) -> List[dict]:
    """Per layer: time per pass (ms, weighted by count) and the shares of its cycles stalled on prep (the RHT and
    quantise passes through memory), RHT and quantise inside the unit."""
    by: Dict[str, dict] = {}
    for g in sim["gemms"]:
        n = g.get("count", 1)
        d = by.setdefault(g["layer"], {"layer": g["layer"], "fwd_y": 0.0, "bwd_dx": 0.0, "bwd_dw": 0.0,
                                       "cycles": 0.0, "prep": 0.0, "rht": 0.0, "quant": 0.0})
        d[g["pass"]] += g["time_us"] * n * 1e-3
        d["cycles"] += g["cycles"] * n
        for k in ("prep", "rht", "quant"):
            d[k] += g["stall_cycles"].get(k, 0.0) * n
    out = []
    for d in by.values():
        c = d.pop("cycles")
        for k in ("prep", "rht", "quant"):
            d[k + "_share"] = d.pop(k) / c if c else 0.0
        d["time_ms"] = d["fwd_y"] + d["bwd_dx"] + d["bwd_dw"]
        out.append(d)
    return sorted(out, key=lambda d: -d["time_ms"])


# ---- training evidence --------------------------------------------------------------------------------------------

def evidence_summary(proxy_study: Mapping, source: str) -> dict:
    """The part of a proxy-study JSON (``fp4lab-train proxy-study --json``) the decision
    reads: the paired training effects and, per trace metric, its rank correlation with them and that correlation's
    95% interval over the effects on each trace; the best-supported metric (the highest lower end, the lowest over
    the traces) and whether it is supported at all (that lower end above zero)."""
    try:
        effects = [{"study": e["study"], "a": e["a"], "b": e["b"], "seeds": len(e["seeds"]),
                    "mean": e["mean"], "low": e["low"], "high": e["high"]} for e in proxy_study["effects"]]
        metrics = []
        for m in proxy_study["metrics"]:
            per = []
            for t in proxy_study["traces"]:
                a = t["metrics"][m["key"]]["all"]
                per.append({"trace": t["label"], "spearman": a["spearman"], "low": a["interval_effects"]["low"],
                            "high": a["interval_effects"]["high"]})
            metrics.append({"key": m["key"], "name": m["name"], "traces": per})
    except (KeyError, TypeError) as e:
        raise DataError(f"{source}: not a proxy-study JSON (missing {e})") from None

    def low(m):
        lows = [t["low"] for t in m["traces"]]
        return -math.inf if (not lows or None in lows) else min(lows)
    best = max(metrics, key=low) if metrics else None
    return {"source": source, "effects": effects, "metrics": metrics,
            "best": best["key"] if best else None,
            "supported": bool(best and low(best) > 0)}


def _load_evidence(path: Optional[str]) -> dict:
    if path is None:
        return read_json(EVIDENCE)
    return evidence_summary(read_json(path), path)


def _training(evidence: Mapping, a: str, b: str) -> dict:
    """The paired training effects of A − B (either orientation), oriented as A − B: a positive difference is a
    higher loss of A. kind: worse/better (of A) where the 95% interval excludes zero, else undetected."""
    rows = []
    for e in evidence["effects"]:
        if (e["a"], e["b"]) == (a, b):
            mean, lo, hi = e["mean"], e["low"], e["high"]
        elif (e["a"], e["b"]) == (b, a):
            mean, lo, hi = -e["mean"], -e["high"], -e["low"]
        else:
            continue
        kind = "worse" if lo > 0 else "better" if hi < 0 else "undetected"
        rows.append({"study": e["study"], "seeds": e["seeds"], "mean": mean, "low": lo, "high": hi, "kind": kind})
    better = sum(r["kind"] == "better" for r in rows)
    worse = sum(r["kind"] == "worse" for r in rows)
    status = ("mixed" if better and worse else "better" if better else "worse" if worse else "not established")
    return {"a": a, "b": b, "effects": rows, "better": better, "worse": worse, "status": status}


# ---- the verdict ------------------------------------------------------------------------------------------------

def _cost(d: Mapping, b: Mapping) -> dict:
    r = d["throughput_per_mm2"] / b["throughput_per_mm2"]
    out = {"throughput_per_mm2": r,
           "throughput": (d["tokens_per_s"] or d["steps_per_s"]) / (b["tokens_per_s"] or b["steps_per_s"]),
           "area": d["unit_mm2"] / b["unit_mm2"],
           "energy": d["energy_j"] / b["energy_j"]}
    out["status"] = "better" if r > 1 + TOLERANCE else "worse" if r < 1 - TOLERANCE else "equal"
    return out


def _decide(cost: str, acc: str) -> str:
    if acc == "worse":
        return "NO-GO"
    if acc == "better":
        return "GO" if cost in ("better", "equal") else "UNDECIDED"
    return "UNDECIDED" if cost == "better" else "NO-GO"


def _pct(r: float) -> str:
    return f"{(r - 1) * 100:+.1f}%"


def _accuracy_status(training: Mapping, acc: Optional[Mapping], evidence: Mapping, u: str, b: str) -> dict:
    if training["status"] != "not established":
        return {"status": training["status"], "from": "training"}
    if acc is not None and evidence.get("supported") and evidence.get("best"):
        for d in acc["differences"]:
            if (d["a"], d["b"]) == (u, b):
                m = d["metrics"][evidence["best"]]
                if m["decided"]:
                    return {"status": "better" if m["favours"] == u else "worse", "from": "proxy"}
    return {"status": "not established", "from": None}


# ---- the report -------------------------------------------------------------------------------------------------

def _rule() -> str:
    """The verdict rule as the module docstring states it, in one paragraph."""
    text = __doc__.split("The verdict rule (also printed in every report): ", 1)[1]
    text = " ".join(text.split()).replace("``", "`")
    return text[0].upper() + text[1:]


def _fmt(v: Optional[float], spec: str = ".3g") -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _markdown(doc: Mapping) -> str:
    runs = doc["runs"]
    base = doc["baseline"]
    thr_unit = "tokens/s" if runs[0]["tokens_per_s"] is not None else "steps/s"
    L = [f"# fp4lab decision: {doc['model']['label']}", ""]
    L += [f"**{doc['verdict']['sentence']}**", ""]
    L += [f"Model: `{doc['model']['source']}`" + (f", {doc['model']['tokens']} tokens per training step"
                                                   if doc['model']['tokens'] else "") +
          f"; every GEMM of the step timed at full size ({doc['model']['gemms']} GEMM shapes, "
          f"fwd_y, bwd_dx and bwd_dw). Baseline: **{base['design']}** training with **{base['recipe']}**; "
          f"uniform-grid recipe: **{doc['uniform_recipe']}**.", ""]
    L += ["## Verdict per uniform-grid design", "",
          f"| design | recipe | {thr_unit} per mm² vs baseline | {thr_unit} | area | energy per step | accuracy "
          "| robust to | verdict |", "|---|---|---:|---:|---:|---:|---|---|---|"]
    for v in doc["verdicts"]:
        c = v["cost"]
        L.append(f"| {v['design']} | {v['recipe']} | {_pct(c['throughput_per_mm2'])} | {_pct(c['throughput'])} | "
                 f"{_pct(c['area'])} | {_pct(c['energy'])} | {v['accuracy']['status']}"
                 f"{' (' + v['accuracy']['from'] + ')' if v['accuracy']['from'] else ''} | "
                 f"{v['robust']} | **{v['verdict']}** |")
    L += ["", "Each ratio is the design under the uniform recipe over the baseline under the baseline recipe "
          f"(+: more). Cost is *better*/*worse* beyond ±{TOLERANCE:.0%} throughput per mm², else *equal*.", ""]
    brecs = [r for r in runs if r["design"] == base["design"] and r["native"]]
    if len(brecs) > 1:
        L += ["### Against the baseline under each recipe it runs natively", "",
              "The recipes differ in more than the grid (RHT on which GEMMs, the block-scale kind, 2-D weight tiles, "
              "a per-tensor amax pass), and those passes cost time: the design's ratio against each recipe the "
              f"baseline runs natively shows how much of the ratio above is the recipe's passes rather than the grid "
              f"({thr_unit} per mm², design under "
              f"{doc['uniform_recipe']} over the baseline under the column's recipe).", "",
              "| design | " + " | ".join(f"vs {r['recipe']} ({r['time_ms']:.1f} ms)" for r in brecs) + " |",
              "|---|" + "---:|" * len(brecs)]
        for v in doc["verdicts"]:
            d = next(r for r in runs if (r["design"], r["recipe"]) == (v["design"], v["recipe"]))
            L.append(f"| {v['design']} ({d['time_ms']:.1f} ms) | " +
                     " | ".join(_pct(d["throughput_per_mm2"] / r["throughput_per_mm2"]) for r in brecs) + " |")
        L.append("")
    L += ["### The rule", "", doc["rule"], ""]
    L += ["## Every design point", "",
          f"| design | recipe | native | step, ms | {thr_unit} | energy per token, mJ | unit, mm² | MAC array, mm² "
          f"| {thr_unit} per mm² | MAC util | prep stall |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        thr = r["tokens_per_s"] if r["tokens_per_s"] is not None else r["steps_per_s"]
        L.append(f"| {r['design']} | {r['recipe']} | {'yes' if r['native'] else 'no (fallback rate)'} | "
                 f"{_fmt(r['time_ms'], '.1f')} | {_fmt(thr, '.4g')} | {_fmt(r['energy_per_token_mj'], '.3g')} | "
                 f"{_fmt(r['unit_mm2'], '.2f')} | {_fmt(r['mac_array_mm2'], '.2f')} | "
                 f"{_fmt(r['throughput_per_mm2'], '.4g')} | {r['mac_util']:.1%} | "
                 f"{r['stall_share'].get('prep', 0.0):.1%} |")
    if doc["figures"].get("fig_pareto.png") == "written":
        L += ["", "![area against step time and energy per token](fig_pareto.png)"]
    L += ["", "## Accuracy", ""]
    acc = doc["accuracy"]
    if acc is None:
        L += ["No trace was given (`--trace`): the accuracy side rests on the training evidence alone.", ""]
    else:
        L += [f"From `fp4lab analyze` on {', '.join('`' + t + '`' for t in acc['traces'])}: {acc['records']} records, "
              f"95% percentile bootstrap intervals over the records ({acc['resamples']} resamples, seed "
              f"{acc['seed']}). Δ is {doc['uniform_recipe']} minus the other recipe.", ""]
        recs = list(acc["recipes"])
        ev = {m["key"]: m for m in doc["evidence"]["metrics"]}
        L += ["| metric | better | " + " | ".join(recs) + " | " +
              " | ".join(f"Δ vs {d['b']}" for d in acc["differences"]) + " | predicts training? ρ (95%) on " +
              "; ".join(t["trace"] for t in doc["evidence"]["metrics"][0]["traces"]) + " |",
              "|---|---|" + "---:|" * (len(recs) + len(acc["differences"])) + "---|"]
        for m in accuracy.METRICS:
            cells = [f"{acc['recipes'][r][m.key]['value']:.4g} ({acc['recipes'][r][m.key]['low']:.4g}–"
                     f"{acc['recipes'][r][m.key]['high']:.4g})" for r in recs]
            diffs = [f"{d['metrics'][m.key]['value']:+.3g} ({d['metrics'][m.key]['low']:+.3g} to "
                     f"{d['metrics'][m.key]['high']:+.3g})" for d in acc["differences"]]
            e = ev.get(m.key)
            rho = "; ".join(f"{t['spearman']:+.2f} ({t['low']:+.2f} to {t['high']:+.2f})" for t in e["traces"]) \
                if e else "–"
            L.append(f"| {m.name} | {'higher' if m.better > 0 else 'lower'} | " + " | ".join(cells) + " | " +
                     " | ".join(diffs) + f" | {rho} |")
        L.append("")
    evd = doc["evidence"]
    best = next((m for m in evd["metrics"] if m["key"] == evd["best"]), None)
    L += ["### What the training evidence says", ""]
    if best:
        L.append(f"The proxy study (`{evd['source']}`) held every metric above against {len(evd['effects'])} paired "
                 f"training effects. The best-supported metric is *{best['name']}*, ρ = " +
                 "; ".join(f"{t['spearman']:+.2f} (95% {t['low']:+.2f} to {t['high']:+.2f}) on {t['trace']}"
                           for t in best["traces"]) +
                 (": its interval lies above zero, so it is used as a predictor." if evd["supported"] else
                  ": its interval reaches zero or below, so **no trace metric is supported as a predictor of "
                  "training outcome**, and the accuracy figures above rank the recipes' GEMM error, not their "
                  "training loss."))
        L.append("")
    t = doc["training"]
    if t["effects"]:
        L += [f"Paired training effects {t['a']} − {t['b']} (final validation loss, points of the BF16-relative "
              "loss error; + is a higher loss of " + t["a"] + "):", "",
              "| study | seeds | mean | 95% interval | outcome |", "|---|---:|---:|---|---|"]
        for e in t["effects"]:
            L.append(f"| {e['study']} | {e['seeds']} | {e['mean']:+.2f} | {e['low']:+.2f} to {e['high']:+.2f} | "
                     f"{ {'worse': t['a'] + ' worse', 'better': t['a'] + ' better'}.get(e['kind'], 'no difference detectable')} |")
        L.append("")
    else:
        L += [f"No paired training effect of {t['a']} against {t['b']} is in the evidence.", ""]
    L += ["## Robustness", "", "The cost side again with one assumption scaled (every design alike): throughput per "
          "mm² and energy per step against the baseline, and the verdict under that assumption.", "",
          "| assumption | factor | " + " | ".join(v["design"] for v in doc["verdicts"]) + " |",
          "|---|---:|" + "---|" * len(doc["verdicts"])]
    for r in doc["robustness"]:
        L.append(f"| {r['name']} (`{r['key']}`) | ×{r['factor']:g} | " +
                 " | ".join(f"{_pct(x['throughput_per_mm2'])} (energy {_pct(x['energy'])}) → {x['verdict']}"
                            for x in r["designs"]) + " |")
    if not doc["robustness"]:
        L.append("| (not run: --no-robustness) | | " + " | " * len(doc["verdicts"]))
    L += ["", "## Where the time goes", ""]
    for lay in doc["layers"]:
        L += [f"**{lay['design']}, {lay['recipe']}** (step {lay['time_ms']:.1f} ms):", "",
              "| layer | fwd_y, ms | bwd_dx, ms | bwd_dw, ms | share of step | stalled on prep | on RHT | on quantise |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in lay["layers"]:
            L.append(f"| {r['layer']} | {r['fwd_y']:.2f} | {r['bwd_dx']:.2f} | {r['bwd_dw']:.2f} | "
                     f"{r['time_ms'] / lay['time_ms']:.1%} | {r['prep_share']:.1%} | {r['rht_share']:.1%} | "
                     f"{r['quant_share']:.1%} |")
        L.append("")
    if doc["figures"].get("fig_layers.png") == "written":
        L += ["![time per layer and pass](fig_layers.png)", ""]
    L += ["## What this report cannot decide", ""]
    L += [f"- {x}" for x in doc["limits"]]
    L += ["", "## Reproduce", "", "```", doc["command"], "```", ""]
    return "\n".join(L)


def _figures(doc: Mapping, out: str) -> Dict[str, str]:
    """fig_pareto.png and fig_layers.png, labelled from the data; {file: 'written' or why not}."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        why = "not written: matplotlib is not installed (pip install matplotlib)"
        print(f"fp4lab decide: figures {why}", file=sys.stderr)
        return {"fig_pareto.png": why, "fig_layers.png": why}
    import io
    runs = [r for r in doc["runs"] if r["native"]]
    acc = doc["accuracy"]
    key = doc["evidence"]["best"] or "sqnr"
    name = accuracy.BY_KEY[key].name if key in accuracy.BY_KEY else key
    colour = {r: acc["recipes"][r][key]["value"] for r in acc["recipes"]} if acc else {}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"wspace": 0.3})
    markers = dict(zip(sorted({r["recipe"] for r in runs}), "osD^vP*X"))
    vals = [colour[r["recipe"]] for r in runs if r["recipe"] in colour]
    vmin, vmax = (min(vals), max(vals)) if vals else (0, 1)
    sc = None
    for ax, field, label in ((axes[0], "time_ms", "training step, ms"),
                             (axes[1], "energy_per_token_mj" if runs and runs[0]["energy_per_token_mj"] is not None
                              else "energy_j", "energy per token, mJ" if runs and runs[0]["energy_per_token_mj"]
                              is not None else "energy per step, J")):
        for rec, m in markers.items():
            pts = [r for r in runs if r["recipe"] == rec]
            xs, ys = [r["unit_mm2"] for r in pts], [r[field] for r in pts]
            if rec in colour:
                sc = ax.scatter(xs, ys, c=[colour[rec]] * len(pts), marker=m, s=60, cmap="viridis", vmin=vmin,
                                vmax=vmax, edgecolors="k", linewidths=0.5, label=rec)
            else:  # no trace: no accuracy to colour by
                ax.scatter(xs, ys, color="0.6", marker=m, s=60, edgecolors="k", linewidths=0.5, label=rec)
        # Pareto front in (area, this figure): no other point has both less area and less of it
        front = sorted((r for r in runs if not any(o["unit_mm2"] <= r["unit_mm2"] and o[field] <= r[field] and
                                                   (o["unit_mm2"], o[field]) != (r["unit_mm2"], r[field])
                                                   for o in runs)), key=lambda r: r["unit_mm2"])
        ax.plot([r["unit_mm2"] for r in front], [r[field] for r in front], "k--", lw=0.8, label="Pareto front")
        for r in runs:
            if r["recipe"] in (doc["uniform_recipe"], doc["baseline"]["recipe"]):
                ax.annotate(r["design"].replace("h200-class-", ""), (r["unit_mm2"], r[field]), fontsize=7,
                            xytext=(4, 3), textcoords="offset points")
        ax.set(xlabel="unit area, mm²", ylabel=label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    if colour and sc is not None:
        fig.colorbar(sc, ax=axes, label=name.split(" (")[0] + " on the trace", shrink=0.9)
    fig.suptitle(f"{doc['model']['label']}: native design points (each recipe where it runs natively)", fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    write_atomic(os.path.join(out, "fig_pareto.png"), buf.getvalue())

    lays = doc["layers"]
    fig, axes = plt.subplots(1, len(lays), figsize=(4.2 * len(lays), 0.35 * max(len(l["layers"]) for l in lays) + 1.6),
                             sharex=True, squeeze=False)
    for ax, lay in zip(axes[0], lays):
        names = [r["layer"] for r in lay["layers"]][::-1]
        left = [0.0] * len(names)
        for p, c in (("fwd_y", "#4c72b0"), ("bwd_dx", "#dd8452"), ("bwd_dw", "#55a868")):
            w = [r[p] for r in lay["layers"]][::-1]
            ax.barh(names, w, left=left, color=c, label=p)
            left = [a + b for a, b in zip(left, w)]
        ax.set_title(f"{lay['design']}\n{lay['recipe']}, step {lay['time_ms']:.1f} ms", fontsize=9)
        ax.set_xlabel("ms per step")
        ax.tick_params(axis="y", labelsize=7)
    axes[0][0].legend(fontsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    write_atomic(os.path.join(out, "fig_layers.png"), buf.getvalue())
    return {"fig_pareto.png": "written", "fig_layers.png": "written"}


# ---- the decision -----------------------------------------------------------------------------------------------

def _label(model: str) -> str:
    norm = os.path.normpath(model)
    base = os.path.basename(norm)
    if os.path.isdir(norm) and os.path.dirname(norm):  # a trace's step folder: name its run too
        return os.path.join(os.path.basename(os.path.dirname(os.path.abspath(norm))), base)
    return base[:-5] if base.endswith(".json") else base[:-4] if base.endswith(".csv") else base


def decide(model: Any, *, tokens: Optional[int] = None, traces: Iterable[Any] = (),
           designs: Optional[Iterable[str]] = None, baseline: str = BASELINE,
           grid: Optional[Mapping[str, Sequence[Any]]] = None, recipes: Optional[Iterable[str]] = None,
           uniform_recipe: str = UNIFORM_RECIPE, baseline_recipe: str = BASELINE_RECIPE,
           evidence: Optional[str] = None, resamples: int = RESAMPLES, seed: int = 0, jobs: Optional[int] = None,
           robustness: bool = True, out: Any = None, command: Optional[str] = None) -> dict:
    """Decide whether native uniform-grid (E1M2/INT4) support is worth its silicon for a model.

    Args:
        model: a Hugging Face ``config.json`` (with ``tokens``), a shape list (``.csv``), or a captured trace (folder
            or ``.safetensors``; replayed at full size from its metadata).
        tokens: the training step's batch × sequence, for a config.json.
        traces: captured traces (folders or files) for the accuracy side; none: the training evidence alone.
        designs: design points, ``NAME`` (a bundled configuration, ``fp4lab sim --list-configs``) or a ``.cfg``
            path, optionally ``:key=value,...`` overrides of config keys. Default: the five bundled native
            H200-class units (E2M1-only, E1M2-only, dual; the latter two also at equal block-MAC area).
        baseline: the design the others are held against (default ``h200-class-e2m1``); added if missing.
        grid: ``{config key: [values]}``: every non-baseline design is expanded over their product (a sweep).
        recipes: the recipes timed and analysed (default: the four presets).
        uniform_recipe, baseline_recipe: the recipes the verdict compares (default ufp4 on the design against nvfp4
            on the baseline).
        evidence: a proxy-study JSON (``fp4lab-train proxy-study --json``) of your own paired
            training runs; default: the project's, bundled with the package.
        resamples, seed: the accuracy bootstrap.
        jobs: simulator processes at a time (default: the CPUs this process may use).
        robustness: also rerun the cost side under each assumption scaled (ASSUMPTIONS).
        out: a folder for decision.json, report.md, fig_pareto.png and fig_layers.png (created if missing; each file
            written through a temporary name; refused before any work if one is an input or cannot be written).

    Returns:
        The decision document (what decision.json holds): ``verdict`` (``decision`` GO / NO-GO / UNDECIDED and a
        ``sentence``), ``verdicts`` per uniform-grid design, ``runs`` (every design × recipe), ``accuracy``,
        ``training``, ``evidence``, ``robustness``, ``layers``, ``limits``.

    Raises:
        UsageError (exit 2) for a bad argument, DataError (exit 1) for an input the tools refuse; both are
        ValueErrors with a one-line message.
    """
    model = os.fspath(model)
    if tokens is not None:
        tokens = _positive_int("--tokens", tokens)
    resamples = _positive_int("--resamples", resamples, 100)
    seed = _positive_int("--seed", seed, 0)
    jobs = _positive_int("--jobs", jobs if jobs is not None else len(os.sched_getaffinity(0)))
    traces = [os.fspath(t) for t in traces]
    known = list(_recipes())
    recipes = list(recipes) if recipes is not None else known
    for r in recipes + [uniform_recipe, baseline_recipe]:
        if r not in known:
            raise UsageError(f"--recipes {r}: not a preset ({', '.join(known)})")
    for r in (uniform_recipe, baseline_recipe):
        if r not in recipes:
            recipes.append(r)
    base = Design(baseline)
    others = [Design(s) for s in (designs if designs is not None else DESIGNS)]
    others = [d for d in others if d.label != base.label]
    if grid:
        keys = list(grid)
        vals = [[str(v) for v in grid[k]] for k in keys]
        if any(not v for v in vals):
            raise UsageError("--grid: a key without values")
        others = [d.with_overrides(dict(zip(keys, combo))) for d in others for combo in itertools.product(*vals)]
    for p in [model] + traces + ([evidence] if evidence else []):
        if not os.path.exists(p):
            raise DataError(f"{p}: no such file or folder")
    files = [os.path.join(out, f) for f in FILES] if out is not None else []
    if out is not None:
        out = os.fspath(out)
        if os.path.exists(out) and not os.path.isdir(out):
            raise DataError(f"{out}: not a folder")
        os.makedirs(out, exist_ok=True)
        from ._files import output_inputs
        check_outputs(files, output_inputs([model] + traces + ([evidence] if evidence else [])))
    ev = _load_evidence(evidence)
    cli = _cli()
    _check_sim(cli)
    margs = _model_args(model, tokens)

    # Cost: every design x recipe, full size. A recipe the verdict does not need and the model cannot take (a
    # dimension that is not a whole number of its blocks) is left out, and the report says why.
    skipped: Dict[str, str] = {}
    needed = (uniform_recipe, baseline_recipe)
    all_designs = [base] + others
    tasks = [(d, margs, r) for d in all_designs for r in recipes]
    sims = _run_all(cli, jobs, tasks, may_fail=lambda t: t[2] not in needed)
    for (d, _, r), s in zip(tasks, sims):
        if isinstance(s, Exception):
            skipped.setdefault(r, f"not timed on {d.label}: {s}")
    recipes = [r for r in recipes if r not in skipped]
    kept = [(t, s) for t, s in zip(tasks, sims) if t[2] in recipes]
    runs = [_summary(d, r, s, tokens) for (d, _, r), s in kept]
    by = {(r["design"], r["recipe"]): (r, s) for r, (_, s) in zip(runs, kept)}
    b_run, b_sim = by[(base.label, baseline_recipe)]
    if not b_run["native"]:
        raise UsageError(f"--baseline {base.label}: it does not run {baseline_recipe} natively")

    # Accuracy: the trace metrics per recipe with intervals over the records.
    acc = None
    if traces:
        rows: Dict[str, list] = {}
        for r in list(recipes):
            try:
                got = {t: accuracy.recipe_rows(_analyze(t, recipe=[r]), t).get(r, []) for t in traces}
            except DataError as e:
                if r in needed:
                    raise
                skipped.setdefault(r, f"not analysed: {e}")
                continue
            for t in traces:
                rows.setdefault(r, []).extend(got[t])
        for rec, rs in rows.items():
            try:
                accuracy.check_rows(rs, f"recipe {rec}")
            except ValueError as e:
                raise DataError(f"{', '.join(traces)}: {e}") from None
        pairs = [(uniform_recipe, r) for r in recipes if r != uniform_recipe and r in rows]
        acc = accuracy.bootstrap(rows, pairs, resamples, seed)
        acc["traces"] = traces
    training = _training(ev, uniform_recipe, baseline_recipe)
    acc_status = _accuracy_status(training, acc, ev, uniform_recipe, baseline_recipe)

    # Verdict per design that runs the uniform recipe natively.
    verdicts = []
    for d in others:
        r, _ = by[(d.label, uniform_recipe)]
        if not r["native"]:
            continue
        c = _cost(r, b_run)
        verdicts.append({"design": d.label, "recipe": uniform_recipe, "cost": c, "accuracy": acc_status,
                         "verdict": _decide(c["status"], acc_status["status"])})

    # Robustness: the cost side with each assumption scaled, every design alike.
    robust = []
    if robustness and verdicts:
        vdesigns = [d for d in others if any(v["design"] == d.label for v in verdicts)]
        variants, vtasks = [], []
        for key, what, factors in ASSUMPTIONS:
            for f in factors:
                row_tasks = []
                for d, rec in [(base, baseline_recipe)] + [(d, uniform_recipe) for d in vdesigns]:
                    cfg = by[(d.label, rec)][1]["config"]
                    if key not in cfg:
                        raise DataError(f"design {d.label}: its configuration has no {key} (an assumption the "
                                        "verdict names)")
                    v = cfg[key] * f
                    v = str(int(round(v))) if key in INTEGER_KEYS else repr(float(v))
                    row_tasks.append((d.with_overrides({key: v}), margs, rec))
                variants.append((key, what, f, len(vtasks), len(row_tasks)))
                vtasks += row_tasks
        vsims = _run_all(cli, jobs, vtasks)
        for key, what, f, at, n in variants:
            sums = [_summary(t[0], t[2], s, tokens) for t, s in zip(vtasks[at:at + n], vsims[at:at + n])]
            row = {"key": key, "name": what, "factor": f, "designs": []}
            for v, s in zip(verdicts, sums[1:]):
                c = _cost(s, sums[0])
                row["designs"].append({"design": v["design"], "throughput_per_mm2": c["throughput_per_mm2"],
                                       "energy": c["energy"],
                                       "status": c["status"], "verdict": _decide(c["status"], acc_status["status"])})
            robust.append(row)
        for i, v in enumerate(verdicts):
            flips = sorted({f"{r['name']} ×{r['factor']:g}" for r in robust
                            if r["designs"][i]["verdict"] != v["verdict"]})
            v["flips"] = flips
            v["robust"] = "all" if not flips else "flips under " + ", ".join(flips)
    for v in verdicts:
        v.setdefault("flips", None)
        v.setdefault("robust", "not tested")

    # Per-layer breakdown: the baseline and the best uniform design.
    best = max(verdicts, key=lambda v: v["cost"]["throughput_per_mm2"]) if verdicts else None
    layers = [{"design": b_run["design"], "recipe": baseline_recipe, "time_ms": b_run["time_ms"],
               "layers": _layers(b_sim)}]
    if best:
        r, s = by[(best["design"], uniform_recipe)]
        layers.append({"design": best["design"], "recipe": uniform_recipe, "time_ms": r["time_ms"],
                       "layers": _layers(s)})

    # The verdict in words.
    counts = {k: [v for v in verdicts if v["verdict"] == k] for k in ("GO", "UNDECIDED", "NO-GO")}
    label = _label(model)
    what = (f"{label}" + (f" at {tokens} tokens per step" if tokens else ""))
    acc_words = {"better": f"{uniform_recipe} trains better than {baseline_recipe}",
                 "worse": f"{uniform_recipe} trains worse than {baseline_recipe}",
                 "mixed": f"the training evidence on {uniform_recipe} against {baseline_recipe} points both ways",
                 "not established": f"no accuracy gain of {uniform_recipe} over {baseline_recipe} is established"}
    n_eff = len(training["effects"])
    src = {"training": f" (paired training runs: worse in {training['worse']} of {n_eff} comparisons, better in "
                       f"{training['better']})",
           "proxy": " (predicted by the supported trace proxy)", None: ""}
    acc_text = acc_words[acc_status["status"]] + src[acc_status["from"]]
    if not verdicts:
        decision, sentence = "NO-GO", (f"NO-GO for {what}: no design point runs {uniform_recipe} natively.")
    elif counts["GO"]:
        g = max(counts["GO"], key=lambda v: v["cost"]["throughput_per_mm2"])
        decision = "GO"
        sentence = (f"GO for {what}: {g['design']} running {uniform_recipe} gives "
                    f"{_pct(g['cost']['throughput_per_mm2'])} throughput per mm² against {base.label} running "
                    f"{baseline_recipe}, and {acc_text}.")
    elif counts["UNDECIDED"]:
        u = max(counts["UNDECIDED"], key=lambda v: v["cost"]["throughput_per_mm2"])
        decision = "UNDECIDED"
        sentence = (f"UNDECIDED for {what}: {u['design']} running {uniform_recipe} gives "
                    f"{_pct(u['cost']['throughput_per_mm2'])} throughput per mm² against {base.label} running "
                    f"{baseline_recipe}, but {acc_text}.")
    else:
        bst = max(verdicts, key=lambda v: v["cost"]["throughput_per_mm2"])
        decision = "NO-GO"
        gain = (f"the best uniform-grid design, {bst['design']}, gives {_pct(bst['cost']['throughput_per_mm2'])} "
                f"throughput per mm² against {base.label} running {baseline_recipe}")
        if acc_status["status"] == "worse":
            sentence = f"NO-GO for {what}: {acc_text}, although {gain}."
        else:
            sentence = f"NO-GO for {what}: {acc_text}, and {gain}."
    if verdicts and all(v["flips"] == [] for v in verdicts):
        cost_flips = any(x["status"] != v["cost"]["status"] for r in robust for v, x in zip(verdicts, r["designs"]))
        sentence += (" No design's verdict changes under any assumption scaled" +
                     (" (the cost side alone does under some: see Robustness)." if cost_flips else "."))
    elif verdicts and any(v["flips"] for v in verdicts):
        sentence += " Some verdicts change under a scaled assumption (see Robustness)."

    limits = [
        "Accuracy is measured on the traces given, which may come from a smaller model or an earlier step than the "
        "model timed; GEMM error is not training loss.",
        "The training evidence comes from " + (f"`{ev['source']}`" if evidence else
                                               "the project's own paired runs of small GPT-style models "
                                               "(docs/results/training.md)") +
        ", not from the model above; pass your own with --evidence (fp4lab-train proxy-study).",
        "Area counts the TCU's block MACs, RHT and quantiser lanes only (NAND2 equivalents from Yosys, "
        "docs/sim.md): no SRAM, interconnect or wiring; leakage per mm² and the flip-flop size are assumptions.",
        "Time covers the linear-layer GEMMs and their quantise/RHT passes; attention's own matmuls, "
        "normalisation, optimizer and communication are not modelled.",
    ]
    if not traces:
        limits.insert(0, "No trace was given: the accuracy of the recipes on this model was not measured.")
    for r, why in skipped.items():
        limits.insert(0, f"Recipe {r} is left out: {why}")
    doc = {
        "fp4lab.decision.version": VERSION,
        "command": command or "fp4lab.decide(...)",
        "model": {"source": model, "label": label, "tokens": tokens if tokens else runs[0]["tokens"],
                  "gemms": len(b_sim["gemms"])},
        "baseline": {"design": base.label, "recipe": baseline_recipe},
        "uniform_recipe": uniform_recipe,
        "rule": _rule(),
        "verdict": {"decision": decision, "sentence": sentence},
        "verdicts": verdicts, "runs": runs, "accuracy": acc, "training": training, "evidence": ev,
        "robustness": robust, "layers": layers, "limits": limits, "skipped": skipped, "figures": {},
        "assumptions": [{"key": k, "name": n, "factors": list(f)} for k, n, f in ASSUMPTIONS],
        "tolerance": TOLERANCE,
    }
    if out is not None:
        doc["figures"] = _figures(doc, out)
        write_text(os.path.join(out, "decision.json"), json.dumps(doc, indent=1, allow_nan=False) + "\n")
        write_text(os.path.join(out, "report.md"), _markdown(doc))
    return doc


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = ArgumentParser(prog="fp4lab decide", description="From a model to a go/no-go on uniform-grid (E1M2/INT4) "
                        "hardware: times every design point on the model's full training step, measures the "
                        "recipes' accuracy on the traces, and writes the verdict with its evidence.")
    ap.add_argument("--model", required=True, help="a Hugging Face config.json (with --tokens), a shape list .csv, "
                    "or a captured trace (replayed at full size)")
    ap.add_argument("--tokens", type=int, help="tokens per training step (batch x sequence), for a config.json")
    ap.add_argument("--trace", action="append", default=[], help="a captured trace for the accuracy side "
                    "(repeatable: several steps or models)")
    ap.add_argument("--design", action="append", help="a design point: NAME (fp4lab sim --list-configs) or a .cfg, "
                    "with optional :key=value,... overrides (repeatable; default: the five h200-class units)")
    ap.add_argument("--baseline", default=BASELINE, help=f"the design the others are held against ({BASELINE})")
    ap.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                    help="expand every design over these values of a config key (repeatable: their product)")
    ap.add_argument("--recipes", help="recipes to time and analyse, comma-separated (default: the four presets)")
    ap.add_argument("--uniform-recipe", default=UNIFORM_RECIPE)
    ap.add_argument("--baseline-recipe", default=BASELINE_RECIPE)
    ap.add_argument("--evidence", help="a proxy-study JSON of your own paired training runs (default: the "
                    "project's, bundled)")
    ap.add_argument("--resamples", type=int, default=RESAMPLES)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, help="simulator processes at a time (default: the CPUs available)")
    ap.add_argument("--no-robustness", action="store_true", help="skip the scaled-assumption reruns")
    ap.add_argument("--out", required=True, help="output folder (decision.json, report.md, figures)")
    a = ap.parse_args(argv)
    grid = {}
    for g in a.grid:
        k, eq, v = g.partition("=")
        if not eq or not k or not v:
            raise UsageError(f"--grid {g}: not KEY=V1,V2,...")
        grid[k] = [x for x in v.split(",") if x]
    cmd = "fp4lab decide " + " ".join(_quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    doc = decide(a.model, tokens=a.tokens, traces=a.trace, designs=a.design, baseline=a.baseline, grid=grid,
                 recipes=a.recipes.split(",") if a.recipes else None, uniform_recipe=a.uniform_recipe,
                 baseline_recipe=a.baseline_recipe, evidence=a.evidence, resamples=a.resamples, seed=a.seed,
                 jobs=a.jobs, robustness=not a.no_robustness, out=a.out, command=cmd)
    print(doc["verdict"]["sentence"])
    print(f"report: {os.path.join(a.out, 'report.md')}")
    return 0


def _quote(s: str) -> str:
    import shlex
    return shlex.quote(s)


def console(argv: Optional[Sequence[str]] = None) -> int:
    """``fp4lab decide ...`` (the console script passes what follows ``decide``): one line and the exit code on a
    fault, as every fp4lab command ends (docs/spec.md §11.1)."""
    return console_main("fp4lab decide", lambda: main(argv))


if __name__ == "__main__":
    sys.exit(console(sys.argv[1:]))
