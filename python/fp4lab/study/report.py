"""The study's report: metrics, paired comparisons (fp4lab.paired), tables, verdicts, figures, and the SQNR proxy."""
import io
import json
import math
import os
from typing import Optional

from .. import ABLATIONS as _ABLATIONS
from .. import paired as pm
from .._files import DataError, UsageError, check_outputs, read_json, read_text
from .corpus import DEFAULT_CORPUS, write_atomic
from .model import SIZES, SR_DRAWS

CORE = ["bf16", "nvfp4", "mxfp4", "e2m1-ref", "ufp4"]
ABLATIONS = list(_ABLATIONS)  # the paper's ablation study, ufp4 among them (fp4lab.ABLATIONS)
PAPER = {"e2m1-ref": "Dense 1.5B 1.2570, MoE 7.9B 2.3596, MoE 124B 1.7308",
         "ufp4": "Dense 1.5B 0.9673, MoE 7.9B 1.8469, MoE 124B 1.3863"}


def tail_mean(run, frac=0.1):
    n = len(run["train_loss"])
    k = max(1, int(round(n * frac)))
    return sum(run["train_loss"][-k:]) / k


def _stats(xs):
    """Mean and sample standard deviation, summed in list order with IEEE + - * / and sqrt only (no libm pow,
    no numpy reduction), so the same bits on every machine (docs/spec.md §6.1)."""
    n = len(xs)
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) * (x - mean) for x in xs) / (n - 1)) if n > 1 else float("nan")
    return mean, sd


def corpus_of(run):
    """A run's corpus; runs made before the second corpus name none, and were made on the first."""
    return run.get("corpus") or DEFAULT_CORPUS


def study_label(model, length, corpus, named):
    """"small, 6000 steps", and ", linux-doc" where the runs hold more than one corpus (`named`)."""
    return f"{model}, {length} steps" + (f", {corpus}" if named else "")


def _named(xs):
    """Whether the corpus must be named: the runs (or their metrics) hold more than one."""
    return len({corpus_of(x) for x in xs}) > 1


def groups(runs):
    """The studies among the runs: (model, training length in steps, corpus), each compared only within itself,
    since the learning-rate schedule spans the whole length and a corpus is its own data; the first corpus's
    studies first."""
    order = {n: i for i, n in enumerate(SIZES)}
    return sorted({(r["model"], r["config"]["steps"], corpus_of(r)) for r in runs},
                  key=lambda g: (g[2] != DEFAULT_CORPUS, g[2], order[g[0]], g[1]))


def metrics(runs):
    """Per run: final validation loss, last-10% training loss, and both relative to the BF16 run of the same
    model, length, corpus and seed (same initialisation and batches; docs/spec.md §12), in %."""
    bf = {(r["model"], r["config"]["steps"], corpus_of(r), r["seed"]): r for r in runs if r["recipe"] == "bf16"}
    out = []
    for r in runs:
        m = {"name": r["name"], "model": r["model"], "length": r["config"]["steps"], "corpus": corpus_of(r),
             "recipe": r["recipe"],
             "gemm_mode": r["gemm_mode"], "seed": r["seed"],
             "val": r["val_loss"][-1] if r["val_loss"] else float("nan"),
             "train": tail_mean(r), "tokens_per_s": r["tokens_per_s"], "steps": len(r["steps"]),
             "concurrent": r.get("concurrent_runs", 1), "diverged": r.get("diverged")}
        ref = bf.get((r["model"], m["length"], m["corpus"], r["seed"]))
        if ref is not None and r["recipe"] != "bf16" and len(ref["steps"]) == len(r["steps"]):
            m["val_rel"] = 100 * (m["val"] - ref["val_loss"][-1]) / ref["val_loss"][-1]
            m["train_rel"] = 100 * (m["train"] - tail_mean(ref)) / tail_mean(ref)
        out.append(m)
    return out


def _in(m, model, length, corpus):
    return m["model"] == model and m["length"] == length and m["corpus"] == corpus


def noise_band(ms, model, length, corpus=DEFAULT_CORPUS):
    """The BF16 seed-to-seed spread: (max − min) / mean of the BF16 runs' loss, in %, per measure."""
    b = [m for m in ms if _in(m, model, length, corpus) and m["recipe"] == "bf16"]
    if len(b) < 2:
        return None
    band = {}
    for key in ("val", "train"):
        xs = [m[key] for m in b]
        band[key] = 100 * (max(xs) - min(xs)) / (sum(xs) / len(xs))
    band["seeds"] = len(b)
    return band


def _fmt(v, spec):
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def tables(runs) -> str:
    ms = metrics(runs)
    order = {n: i for i, n in enumerate(CORE + ABLATIONS)}
    lines = []
    for model, length, corpus in groups(runs):
        rs = [m for m in ms if _in(m, model, length, corpus)]
        r0 = next(r for r in runs
                  if r["model"] == model and r["config"]["steps"] == length and corpus_of(r) == corpus)
        c = r0["config"]
        band = noise_band(ms, model, length, corpus)
        on = f", {corpus} corpus" if _named(ms) else ""
        lines += [f"### {model}{on}: {r0['block_params'] / 1e6:.1f}M parameters in the blocks "
                  f"({r0['params'] / 1e6:.1f}M in all), d {c['d']}, {c['layers']} layers, sequence {c['seq']}, "
                  f"batch {c['batch']}, {c['steps']} steps "
                  f"({c['steps'] * c['seq'] * c['batch'] / 1e6:.1f}M tokens)", "",
                  "Per recipe, the mean over its seeds of the BF16-relative loss error (each seed against the BF16 "
                  "run of the same seed), and the BF16 seed-to-seed spread for context:", "",
                  "| recipe | GEMMs | seeds | Δ val loss %, mean (per seed) | Δ train loss % (last 10%), mean "
                  "(per seed) | paper's Δ % (loss, last 1000 steps) |", "|---|---|---:|---|---|---|"]
        recs = sorted({(m["recipe"], m["gemm_mode"]) for m in rs if "val_rel" in m},
                      key=lambda k: (order.get(k[0], 99), k[1]))
        for rec, mode in recs:
            sel = sorted((m for m in rs if m["recipe"] == rec and m["gemm_mode"] == mode and "val_rel" in m),
                         key=lambda m: m["seed"])
            cells = []
            for key in ("val_rel", "train_rel"):
                mean, _ = _stats([m[key] for m in sel])
                cells.append(f"{mean:+.2f} ({', '.join(f'{m[key]:+.2f}' for m in sel)})")
            lines.append(f"| `{rec}` | {mode} | {len(sel)} | {cells[0]} | {cells[1]} | {PAPER.get(rec, '')} |")
        if band:
            lines.append(f"| BF16 seed-to-seed spread ({band['seeds']} seeds, (max − min) / mean) | bf16 | "
                         f"{band['seeds']} | {band['val']:.2f} | {band['train']:.2f} | |")
        lines += ["", "Every run:", "",
                  "| run | recipe | GEMMs | seed | val loss | Δ val % | train loss (last 10%) | Δ train % | "
                  "tokens/s | runs per GPU (at most) |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for m in sorted(rs, key=lambda m: (order.get(m["recipe"], 99), m["gemm_mode"], m["seed"])):
            note = f" — stopped: {m['diverged']}" if m["diverged"] else ""
            lines.append(f"| `{m['name']}`{note} | `{m['recipe']}` | {m['gemm_mode']} | {m['seed']} | "
                         f"{m['val']:.4f} | {_fmt(m.get('val_rel'), '+.2f')} | {m['train']:.4f} | "
                         f"{_fmt(m.get('train_rel'), '+.2f')} | {m['tokens_per_s']:,.0f} | {m['concurrent']} |")
        lines.append("")
        studies = paired(ms, model, length, corpus)
        for mode, results in studies:
            lines += paired_table(results, band, mode if len(studies) > 1 else None)
        lines += [verdict(ms, model, length, corpus), ""]
    return "\n".join(lines)


MEASURES = (("val", "final validation loss"), ("train", "training loss over the last 10%"))


def paired(ms, model, length, corpus=DEFAULT_CORPUS):
    """The paired comparisons of one study (fp4lab.paired): [(GEMM mode, [PairResult, ...])], one entry per GEMM
    mode of its FP4 runs, each against the BF16 runs of the study. Only runs that reached their last step take
    part (a stopped run has no final loss)."""
    order = {n: i for i, n in enumerate(CORE + ABLATIONS)}
    rs = sorted((m for m in ms if _in(m, model, length, corpus) and m["steps"] == length and not m["diverged"]),
                key=lambda m: (order.get(m["recipe"], 99), m["recipe"], m["seed"]))
    modes = sorted({m["gemm_mode"] for m in rs if m["recipe"] != "bf16"})
    losses = {}
    for mode in modes:
        for m in rs:
            if m["recipe"] == "bf16" or m["gemm_mode"] == mode:
                losses[(m["recipe"], m["seed"], mode)] = {"val": m["val"], "train": m["train"]}
    out = pm.compare_all(losses, measures=[k for k, _ in MEASURES])
    return [(mode, out.get((mode,), [])) for mode in modes]


def _pm2(x):
    return "–" if x is None else f"{x:+.2f}"


def paired_table(results, band, mode=None) -> list:
    """Markdown rows of the paired comparisons of one study and GEMM mode."""
    if not results:
        return []
    head = (f"{mode} GEMMs. " if mode else "") + (
            "Paired differences A − B in points of the BF16-relative loss error, 100 · (L_A − L_B) / L_bf16 with "
            "every L of the same seed (negative: A ends lower), over the seeds with runs of A, B and BF16; the 95% "
            "interval is mean ± t · SE with n − 1 degrees of freedom, and the verdict is read from it alone")
    head += (f" (the BF16 seed-to-seed spread, {band['val']:.2f} and {band['train']:.2f}, is context, not the "
             "yardstick):" if band else ":")
    lines = [head, "", "| A − B | measure | seeds | per seed | mean | SE | 95% interval | above / below 0 | verdict |",
             "|---|---|---|---|---:|---:|---|---|---|"]
    for p in results:
        s = p.stats
        seeds = ", ".join(str(x) for x in p.seeds) or "none"
        if p.unpaired():
            seeds += f" (not paired: {p.unpaired()})"
        interval = "–" if s.low is None else f"{s.low:+.2f} to {s.high:+.2f}"
        se = "–" if s.se is None else f"{s.se:.2f}"
        signs = f"{s.above} / {s.below}" + (f" ({s.zero} at 0)" if s.zero else "")
        lines.append(f"| `{p.a}` − `{p.b}` | {'val' if p.measure == 'val' else 'train (last 10%)'} | {seeds} | "
                     f"{', '.join(f'{d:+.2f}' for d in p.diffs) or '–'} | {_pm2(s.mean)} | {se} | {interval} | "
                     f"{signs} | {p.verdict(notes=False)} |")
    return lines + [""]


def paired_json(runs) -> dict:
    """Every study's paired comparisons as docs/results/training-paired.json holds them."""
    ms = metrics(runs)
    studies = []
    for model, length, corpus in groups(runs):
        band = noise_band(ms, model, length, corpus)
        for mode, results in paired(ms, model, length, corpus):
            studies.append({"model": model, "length": length, "corpus": corpus, "gemm_mode": mode,
                            "bf16_spread_pct": None if band is None else {k: band[k] for k in ("val", "train")},
                            "bf16_seeds": None if band is None else band["seeds"],
                            "pairs": [p.as_dict() for p in results]})
    out = {"definition": pm.DEFINITION, "measures": dict(MEASURES), "studies": studies}
    got = pooled(ms)
    if got is not None:
        parts, res = got
        out["pooled"] = {"model": "small", "a": "ufp4", "b": "e2m1-ref",
                         "studies": [{"corpus": c, "length": n, "seeds": list(sd)} for c, n, sd in parts],
                         "measures": {k: {"diffs": list(d), **t.as_dict()} for k, (d, t) in res.items()}}
    return out


_CLAIM = {"worse": "ufp4 trained worse than e2m1-ref", "better": "ufp4 trained better than e2m1-ref (ufp4 < "
          "e2m1-ref holds)", "undetected": "no difference detectable", "same": "no difference: identical runs",
          "one": "one seed, not decided", "none": "not paired"}


def verdict(ms, model, length, corpus=DEFAULT_CORPUS) -> str:
    """ufp4 against e2m1-ref in one study, from the paired statistics of fp4lab.paired: the 95% interval of the
    per-seed differences decides, on each measure; the BF16 seed-to-seed spread is quoted as context."""
    study = study_label(model, length, corpus, _named(ms))
    found = [(mode, [p for p in res if (p.a, p.b) == ("ufp4", "e2m1-ref")])
             for mode, res in paired(ms, model, length, corpus)]
    found = [(mode, ps) for mode, ps in found if ps and ps[0].stats.n]
    if not found:
        have = sorted({f"{m['recipe']} seed {m['seed']}" for m in ms if _in(m, model, length, corpus)
                       and m["recipe"] in ("ufp4", "e2m1-ref")})
        return (f"**{study}: ufp4 vs e2m1-ref** — not both run with a common seed (of the two, run: "
                f"{', '.join(have) or 'neither'}).")
    band = noise_band(ms, model, length, corpus)
    out = []
    for mode, ps in found:
        kinds = [p.stats.kind for p in ps]
        claim = _CLAIM[kinds[0]] if len(set(kinds)) == 1 else "; ".join(
            f"{what}: {_CLAIM[k]}" for (_, what), k in zip(MEASURES, kinds))
        n = ps[0].stats.n
        where = f"{study}" + (f", {mode} GEMMs" if len(found) > 1 else "")
        parts = []
        for p, (key, what) in zip(ps, MEASURES):
            s = p.stats
            per = ", ".join(f"{d:+.2f}" for d in p.diffs)
            if s.n == 1:
                parts.append(f"{what}: ufp4 − e2m1-ref = {s.mean:+.2f} points (seed {p.seeds[0]}; one seed gives "
                             "no interval)")
            else:
                parts.append(f"{what}: ufp4 − e2m1-ref = {s.mean:+.2f} ± {s.half:.2f} points (95% interval "
                             f"{s.low:+.2f} to {s.high:+.2f}, t with {n - 1} df; per seed {per}; {s.above} above "
                             f"zero, {s.below} below)" + p.unpaired_note())
        ctx = (f"BF16 seed-to-seed spread, for context: {band['val']:.2f} and {band['train']:.2f} over "
               f"{band['seeds']} seeds" if band else "no second BF16 seed to show the seed-to-seed spread")
        out.append(f"**{where}: ufp4 vs e2m1-ref over {n} seed{'s' if n != 1 else ''}: {claim}** — " +
                   "; ".join(parts) + f"; {ctx}.")
    return "\n- ".join(out)


def pooled(ms, model="small", a="ufp4", b="e2m1-ref"):
    """A − B pooled over corpora: for each corpus, the longest study of `model` in which A and B share a seed, its
    per-seed paired differences (each against the BF16 run of its own study and seed) taken as they are; then
    fp4lab.paired's statistics over all of them, as if one study. None where fewer than two corpora take part.
    Returns ([(corpus, length, seeds)], {measure: PairResult-like dict of diffs and stats})."""
    parts, diffs = [], {k: [] for k, _ in MEASURES}
    for corpus in sorted({m["corpus"] for m in ms}, key=lambda c: (c != DEFAULT_CORPUS, c)):
        lengths = sorted({m["length"] for m in ms if m["model"] == model and m["corpus"] == corpus}, reverse=True)
        for length in lengths:
            found = []
            for _, res in paired(ms, model, length, corpus):  # the first GEMM mode with the pair
                found = found or [p for p in res if (p.a, p.b) == (a, b) and p.stats.n]
            if found:
                parts.append((corpus, length, found[0].seeds))
                for p in found:
                    diffs[p.measure] += list(p.diffs)
                break
    if len(parts) < 2:
        return None
    return parts, {k: (tuple(v), pm.paired_stats(v)) for k, v in diffs.items()}


def pooled_verdict(ms, model="small", a="ufp4", b="e2m1-ref") -> str:
    """The status line of the pooled comparison (pooled()), or '' where there is none."""
    got = pooled(ms, model, a, b)
    if got is None:
        return ""
    parts, res = got
    n = res[MEASURES[0][0]][1].n
    where = "; ".join(f"{c} {length} steps, seeds {', '.join(str(x) for x in seeds)}" for c, length, seeds in parts)
    kinds = {res[k][1].kind for k, _ in MEASURES}
    claim = _CLAIM[kinds.pop()] if len(kinds) == 1 else "the measures disagree"
    out = []
    for key, what in MEASURES:
        d, s = res[key]
        out.append(f"{what}: {a} − {b} = {s.mean:+.2f} ± {s.half:.2f} points (95% interval {s.low:+.2f} to "
                   f"{s.high:+.2f}, t with {s.n - 1} df; {s.above} above zero, {s.below} below)")
    return (f"**{model}, pooled over corpora ({where}): {a} vs {b} over {n} paired seeds: {claim}** — " +
            "; ".join(out) + ". Each corpus's own interval is the one above; pooling treats the corpora's "
            "differences as draws of one effect.")


def status(runs) -> str:
    """The status block of docs/results/training.md: one verdict per study, then ufp4 vs e2m1-ref pooled over corpora."""
    ms = metrics(runs)
    lines = [f"- {verdict(ms, *g)}" for g in groups(runs)]
    pool = pooled_verdict(ms)
    return "\n".join(lines + ([f"- {pool}"] if pool else []))


def replace_block(text: str, marker: str, body: str, path: str = "") -> str:
    """`text` with the block between the markers of `marker` replaced by `body`; a DataError naming `path` where the
    markers are not there."""
    start, end = f"<!-- {marker} -->", f"<!-- end of {marker} -->"
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise DataError(f"{path + ': ' if path else ''}markers '{start}' / '{end}' not found")
    return text[: i + len(start)] + "\n" + body.rstrip() + "\n" + text[j:]


def _figure_path(path_prefix, model, length, corpus, named) -> str:
    return f"{path_prefix}_{model}_{length}" + (f"_{corpus}" if named and corpus != DEFAULT_CORPUS else "") + ".png"


def figure_paths(runs, path_prefix) -> list:
    """The files plot(runs, path_prefix) writes, one a study."""
    return [_figure_path(path_prefix, *g, _named(runs)) for g in groups(runs)]


def _save_figure(fig, path: str, inputs=()) -> None:
    """A matplotlib figure as a PNG under the output rules (temporary name, then renamed), closed."""
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_atomic(path, buf.getvalue(), inputs)


def plot(runs, path_prefix, inputs=()):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []
    colors = {n: f"C{i}" for i, n in enumerate(CORE + [a for a in ABLATIONS if a not in CORE])}
    # One line style per seed, so the seeds of one recipe can be told apart (five: solid, dotted, dashed, dash-dot,
    # dash-dot-dot).
    seed_style = ["-", ":", "--", "-.", (0, (6, 2, 1, 2, 1, 2))]
    named = _named(runs)
    for model, length, corpus in groups(runs):
        rs = [r for r in runs if r["model"] == model and r["config"]["steps"] == length and corpus_of(r) == corpus]
        bf = {r["seed"]: r for r in rs if r["recipe"] == "bf16"}
        abl = [r for r in rs if r["recipe"] in ABLATIONS and r["recipe"] != "ufp4"]
        panels = 3 if abl else 2 if len(bf) < len(rs) else 1  # BF16 runs alone: their validation curves
        fig, ax = plt.subplots(1, panels, figsize=(6.2 * panels, 4.8), squeeze=False)
        ax = ax[0]

        def rel_curve(a, r):
            ref = bf.get(r["seed"])
            if ref is None or r is ref or len(r["train_loss"]) != len(ref["train_loss"]):
                return
            w = max(1, len(r["train_loss"]) // 20)  # moving mean over 5% of the run
            d = [100 * (x - y) / y for x, y in zip(r["train_loss"], ref["train_loss"])]
            sm = [sum(d[i - w + 1: i + 1]) / w for i in range(w - 1, len(d))]
            a.plot(r["steps"][w - 1:], sm, linestyle=seed_style[r["seed"] % len(seed_style)],
                   color=colors.get(r["recipe"], "k"),
                   label=f"{r['recipe']} s{r['seed']}")

        for r in rs:
            if r["recipe"] in CORE:
                ax[0].plot(r["val_steps"], r["val_loss"], linestyle=seed_style[r["seed"] % len(seed_style)], marker=".",
                           color=colors[r["recipe"]], label=f"{r['recipe']} s{r['seed']}")
                if panels > 1:
                    rel_curve(ax[1], r)
        for r in abl:
            rel_curve(ax[2], r)
        if abl:
            for r in rs:
                if r["recipe"] == "ufp4" and r["seed"] == 0:
                    rel_curve(ax[2], r)
        study = study_label(model, length, corpus, named)
        ax[0].set(xlabel="step", ylabel="validation loss (nats/byte)", title=f"{study}: validation loss")
        if panels > 1:
            ax[1].set(xlabel="step", ylabel="% vs BF16 of the same seed", title=f"{study}: training loss vs BF16 "
                      "(moving mean)")
        if abl:
            ax[2].set(xlabel="step", ylabel="% vs BF16 of the same seed", title=f"{study}: ablations (seed 0)")
        n = max(len(r["steps"]) for r in rs)
        for a in ax[1:]:
            a.axhline(0, color="k", lw=0.5)
            a.set_xlim(n // 5, n)
        for a in ax:
            a.grid(alpha=0.3)
            a.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        out = _figure_path(path_prefix, model, length, corpus, named)
        _save_figure(fig, out, inputs)
        written.append(out)
    return written


_NUMBER = (int, float)


def _numbers(v, kind=_NUMBER) -> bool:
    return isinstance(v, list) and all(isinstance(x, kind) and not isinstance(x, bool) for x in v)


def check_run(r, where: str) -> None:
    """A DataError naming `where` unless `r` is a run as `fp4lab-train train` writes it, as far as the report reads
    it: the fields the tables, comparisons and figures use, of their types."""
    if not isinstance(r, dict) or not isinstance(r.get("name"), str) or not r["name"]:
        raise DataError(f"{where}: no run name (not a run JSON)")

    def bad(what):
        return DataError(f"{where}: run {r['name'][:80]!r}: {what} (not a run JSON of fp4lab-train train)")

    if r.get("model") not in SIZES:
        raise bad(f"model {str(r.get('model'))[:80]!r} is none of {', '.join(SIZES)}")
    for k in ("recipe", "gemm_mode"):
        if not isinstance(r.get(k), str):
            raise bad(f"no {k!r} name")
    for k, kind in (("seed", int), ("params", _NUMBER), ("block_params", _NUMBER), ("tokens_per_s", _NUMBER)):
        if not _numbers([r.get(k)], kind):
            raise bad(f"no {k!r} number")
    if not (_numbers(r.get("steps"), int) and _numbers(r.get("train_loss")) and r["train_loss"]
            and len(r["steps"]) == len(r["train_loss"])):
        raise bad("'steps' and 'train_loss' are not lists of numbers of one length")
    if not (_numbers(r.get("val_steps"), int) and _numbers(r.get("val_loss"))
            and len(r["val_steps"]) == len(r["val_loss"])):
        raise bad("'val_steps' and 'val_loss' are not lists of numbers of one length")
    c = r.get("config")
    if not isinstance(c, dict) or not all(_numbers([c.get(k)], int) and c[k] > 0
                                          for k in ("d", "layers", "seq", "batch", "steps")):
        raise bad("'config' lacks the positive whole d, layers, seq, batch and steps")
    for k, kind in (("corpus", str), ("diverged", str), ("concurrent_runs", int)):
        if r.get(k) is not None and not (isinstance(r[k], kind) and not isinstance(r[k], bool)):
            raise bad(f"{k!r} is not a {kind.__name__}")
    if r.get("corpus") == "":
        raise bad("an empty 'corpus'")
    if r.get("sr_draw") is not None and r["sr_draw"] not in SR_DRAWS:
        raise bad(f"'sr_draw' is none of {', '.join(SR_DRAWS)}")


def sr_draw_of(run) -> Optional[str]:
    """The SR draw a run trained under (docs/spec.md §4): runs recorded before the draw existed drew philox1;
    BF16 runs none."""
    return None if run["recipe"] == "bf16" else run.get("sr_draw", "philox1")


def _runs_of(path: str) -> list:
    """The runs of a results file (training.json), each checked."""
    runs = read_json(path, "runs")
    if not isinstance(runs, list):
        raise DataError(f"{path}: 'runs' is not a list (not the results file fp4lab-train report writes)")
    for i, r in enumerate(runs):
        check_run(r, f"{path}: run {i}")
    return runs


def cmd_report(args):
    """Reads every input and checks every output before it writes any: the results JSON, the paired comparisons,
    the document (its blocks replaced in place) and the figures."""
    if not args.json:
        raise UsageError("--json '': the results file needs a name")
    runs, seen = [], set()
    for p in args.runs:
        r = read_json(p)
        check_run(r, p)
        if r["name"] in seen:
            raise DataError(f"{p}: run name {r['name']!r} given twice")
        seen.add(r["name"])
        runs.append(r)
    if args.merge and os.path.exists(args.json):
        for r in _runs_of(args.json):
            if r["name"] not in seen:
                runs.append(r)
                seen.add(r["name"])
    # A study pairs runs of one SR draw: a report of runs under two would compare draws as if they were recipes,
    # and a merge would let runs of one draw replace the other's of the same name.
    draws = sorted({d for d in map(sr_draw_of, runs) if d is not None}, key=SR_DRAWS.index)
    if len(draws) > 1:
        raise DataError(f"the runs trained under {' and '.join(draws)} (SR draws, docs/spec.md §4): a report "
                        f"pairs runs of one draw; report each draw's runs into its own --json")
    text = read_text(args.doc) if args.doc else None  # before anything is written
    if not runs:  # never replace a results file with an empty one
        raise DataError(f"no runs to write to {args.json} (give run JSONs, or --merge to redo the report "
                        "of the runs already there)")
    order = {n: i for i, n in enumerate(SIZES)}
    runs.sort(key=lambda r: (order[r["model"]], r["name"]))
    if args.paired_json is None:
        args.paired_json = os.path.splitext(args.json)[0] + "-paired.json"
    figs = figure_paths(runs, args.figures) if args.figures else []
    # The results file and the document are rewritten in place (--merge reads the one); no output is a run file.
    check_outputs([p for p in (args.json, args.paired_json, args.doc) if p] + figs, args.runs)
    if args.doc:
        text = replace_block(text, "training tables: fp4lab-train report", tables(runs), args.doc)
        text = replace_block(text, "training status: fp4lab-train report", status(runs), args.doc)
    write_atomic(args.json, (json.dumps({"runs": runs}, separators=(",", ":")) + "\n").encode(), args.runs)
    if args.paired_json:
        write_atomic(args.paired_json, (json.dumps(paired_json(runs), indent=1) + "\n").encode(), args.runs)
    if args.doc:
        write_atomic(args.doc, text.encode(), args.runs)
    figs = plot(runs, args.figures, args.runs) if args.figures else []
    print(f"{len(runs)} runs -> {args.json}" + (f", {args.paired_json}" if args.paired_json else "") +
          (f", {args.doc}" if args.doc else "") +
          "".join(f", {p}" for p in figs))


PRESETS = ["nvfp4", "mxfp4", "e2m1-ref", "ufp4"]


def spearman(xs, ys):
    """Spearman's rho, with the rank and correlation code the simulator's validation uses (ties averaged)."""
    return pm.pearson(pm.ranks(xs), pm.ranks(ys))


# The trace statistics the proxy sections test, per recipe: the mean over the GEMM rows of `fp4lab analyze --recipe`
# (every GEMM and pass, or bwd_dw's alone) of the GEMM-output SQNR (dB) and of eta, the output's shrinkage factor.
PROXIES = (("sqnr", "mean GEMM-output SQNR (dB)", "sqnr_db", None),
           ("sqnr_dw", "bwd_dw GEMM-output SQNR (dB)", "sqnr_db", "bwd_dw"),
           ("eta", "mean GEMM-output eta", "eta", None))


# The recipes the paired proxy compares: the presets, then the paper's ablations (each against the recipe it changes).
PROXY_RECIPES = PRESETS + [a for a in ABLATIONS if a not in PRESETS]


def recipe_rows(analysis_path, recipes=None):
    """{recipe: (file, its GEMM rows)} of `fp4lab analyze --recipe` output, for `recipes` (default PROXY_RECIPES).
    analysis_path is one JSON or several joined by '+' (one trace's analyses, e.g. of the presets and of the
    ablations); every preset must be there, each ablation may be; a recipe's rows come from the first file that
    has it."""
    files = []
    for path in analysis_path.split("+"):
        gemms = read_json(path, "gemms")
        if not isinstance(gemms, list) or not all(isinstance(r, dict) for r in gemms):
            raise DataError(f"{path}: 'gemms' is not a list of GEMM rows (not fp4lab analyze --json output)")
        files.append((path, gemms))
    out = {}
    for rec in PROXY_RECIPES if recipes is None else recipes:
        for path, gemms in files:  # the first file with rows of this recipe
            rows = [r for r in gemms if r.get("recipe") == rec]
            if rows:
                break
        if not rows:
            if rec in PRESETS:
                raise DataError(f"{analysis_path}: no GEMM rows for recipe {rec} (run analyze with --recipe "
                                f"{','.join(PRESETS)})")
            continue
        out[rec] = (path, rows)
    return out


def proxy_stats(analysis_path):
    """{recipe: {proxy: value}} of `fp4lab analyze --recipe` output (recipe_rows), for the PROXIES."""
    out = {}
    for rec, (path, rows) in recipe_rows(analysis_path).items():
        out[rec] = {}
        for key, _, field, pass_ in PROXIES:
            xs = [r.get(field) for r in rows if pass_ is None or r.get("pass") == pass_]
            if not (_numbers(xs) and xs):
                raise DataError(f"{path}: recipe {rec}: no {field} of every {pass_ or 'GEMM'} row "
                                "(not fp4lab analyze --json output)")
            out[rec][key] = sum(xs) / len(xs)
    return out


def proxy_pairs(runs, traces=None):
    """The paired effects the proxy is held against: every comparison of two presets, or of an ablation and the
    recipe it changes, in final validation loss with at least two seeds (an interval), as (study label, GEMM mode,
    PairResult); with traces ([(label, proxy_stats)]), only those that some trace has both recipes of."""
    ms = metrics(runs)
    out = []
    for g in groups(runs):
        for mode, results in paired(ms, *g):
            for p in results:
                if (p.measure == "val" and p.a in PROXY_RECIPES and p.b in PROXY_RECIPES and p.stats.n >= 2
                        and (traces is None or any(p.a in st and p.b in st for _, st in traces))):
                    out.append((study_label(*g, _named(ms)), mode, p))
    return out


def proxy_paired_table(traces, pairs) -> str:
    """One row per paired effect: its interval, and per trace the proxies' differences A − B. A higher SQNR predicts
    a lower loss (a negative effect), an eta nearer 1 less shrinkage; the last column says whether the SQNR
    difference's sign agrees with the effect where the interval decides its sign."""
    lines = ["| model, length | A − B | seeds | Δ val loss, points (95% interval) | " +
             " | ".join(f"ΔSQNR / Δ`bwd_dw` SQNR dB / Δη, {label}" for label, _ in traces) +
             " | SQNR's sign against the effect |",
             "|---|---|---|---|" + "---|" * len(traces) + "---|"]
    for study, mode, p in pairs:
        s = p.stats
        cells = []
        agree = set()
        for _, st in traces:
            if p.a not in st or p.b not in st:  # an ablation this trace was not analysed under
                cells.append("–")
                continue
            d = {k: st[p.a][k] - st[p.b][k] for k, _, _, _ in PROXIES}
            cells.append(f"{d['sqnr']:+.2f} / {d['sqnr_dw']:+.2f} / {d['eta']:+.4f}")
            agree.add(d["sqnr"] > 0)
        if s.kind in ("undetected", "same"):
            sign = "not decided (the interval holds 0)"
        else:
            lower = s.mean < 0  # A ends lower
            sign = "agrees" if agree == {lower} else "disagrees" if agree == {not lower} else "mixed over traces"
        if len(agree) == 1:
            sign += f"; SQNR favours {p.a if agree == {True} else p.b} on every trace"
        lines.append(f"| {study} ({mode}) | `{p.a}` − `{p.b}` | {s.n} | {s.mean:+.2f} "
                     f"({s.low:+.2f} to {s.high:+.2f}) | " + " | ".join(cells) + f" | {sign} |")
    return "\n".join(lines)


def plot_proxy_pairs(traces, pairs, path, inputs=()):
    """Each paired effect (mean and 95% interval over seeds) beside the side the traces' SQNR difference predicts
    (shaded): an effect whose interval lies inside the shading confirms the proxy, one beyond zero refutes it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(pairs)), 4.6))
    # The y range of the intervals of three seeds or more; wider ones (two seeds) run off the plot.
    spans = [abs(v) for *_, p in pairs if p.stats.n >= 3 for v in (p.stats.low, p.stats.high)]
    lim = 1.3 * max(spans or [abs(v) for *_, p in pairs for v in (p.stats.low, p.stats.high)] or [1.0])
    for x, (study, mode, p) in enumerate(pairs):
        d = [st[p.a]["sqnr"] - st[p.b]["sqnr"] for _, st in traces if p.a in st and p.b in st]
        if d and (all(v > 0 for v in d) or all(v < 0 for v in d)):  # the side a higher SQNR predicts for A − B
            lo, hi = (-lim, 0) if d[0] > 0 else (0, lim)
            ax.fill_between([x - 0.4, x + 0.4], lo, hi, color="C2", alpha=0.15, lw=0,
                            label="predicted by the SQNR difference" if x == 0 else None)
            ax.annotate(f"ΔSQNR {min(d):+.2f} to {max(d):+.2f} dB", (x, (lo + hi) / 2), ha="center", fontsize=7)
        s = p.stats
        ax.errorbar([x], [s.mean], yerr=[[s.mean - max(s.low, -lim)], [min(s.high, lim) - s.mean]], fmt="o",
                    color="C0", capsize=4, label="paired effect, 95% interval" if x == 0 else None)
        if s.low < -lim or s.high > lim:
            ax.annotate(f"interval {s.low:+.1f} to {s.high:+.1f}", (x, s.mean), fontsize=7, xytext=(6, -10),
                        textcoords="offset points")
    ax.set_xticks(range(len(pairs)))
    ax.set_xticklabels([f"{p.a} − {p.b}\n{study}\n{p.stats.n} seeds" for study, _, p in pairs],
                       fontsize=8)
    ax.set_xlim(-0.6, len(pairs) - 0.4)
    ax.set_ylim(-lim, lim)
    ax.axhline(0, color="k", lw=0.5)
    ax.set(ylabel="paired Δ final validation loss A − B (points)",
           title="trace SQNR against the paired loss effects")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    _save_figure(fig, path, inputs)


def _paired_figure(path: str) -> str:
    """The paired proxy figure beside the proxy figure `path`: its name with _paired before the extension."""
    root, ext = os.path.splitext(path)
    return f"{root}_paired{ext}"


def analysis_specs(specs):
    """The (label, path) of each LABEL=ANALYSIS.json[+ANALYSIS.json] argument, or UsageError naming a bad one."""
    out = []
    for spec in specs:
        label, _, path = spec.partition("=")
        if not label or not path or "" in path.split("+"):
            raise UsageError(f"{spec}: not LABEL=ANALYSIS.json[+ANALYSIS.json]")
        out.append((label, path))
    return out


def cmd_proxy(args):
    """Does a recipe's mean GEMM-output SQNR on a trace predict its loss ranking? One row per trace and per
    study (model, length and corpus)."""
    specs = analysis_specs(args.analysis)
    figures = [args.figure, _paired_figure(args.figure)] if args.figure else []
    # The document is rewritten in place; no output is an analysis or the results file.
    check_outputs(([args.doc] if args.doc else []) + figures,
                  [args.training] + [p for _, path in specs for p in path.split("+")])
    runs = _runs_of(args.training)
    doc = read_text(args.doc) if args.doc else None
    ms = metrics(runs)
    traces, stats = [], []
    for label, path in specs:
        st = proxy_stats(path)
        stats.append((label, st))
        traces.append((label, {r: v["sqnr"] for r, v in st.items()}))
    pairs = proxy_pairs(runs, stats)
    # The studies with every preset at this seed: a ranking of fewer recipes says little.
    outcome = {}
    for g in groups(runs):
        o = {m["recipe"]: m["val_rel"] for m in ms if _in(m, *g) and m["recipe"] in PRESETS
             and "val_rel" in m and m["seed"] == args.seed}
        if len(o) == len(PRESETS):
            outcome[g] = o
    studies = list(outcome)
    if not studies:
        raise DataError(f"{args.training}: no study has runs of every one of {', '.join(PRESETS)} with seed "
                        f"{args.seed} (--seed), nothing to rank")
    lines = ["| trace | " + " | ".join(f"`{r}` SQNR dB" for r in PRESETS) + " | SQNR ranking (best first) |",
             "|---|" + "---:|" * len(PRESETS) + "---|"]
    for label, sq in traces:
        rank = " > ".join(sorted(PRESETS, key=lambda r: -sq[r]))
        lines.append(f"| {label} | " + " | ".join(f"{sq[r]:.2f}" for r in PRESETS) + f" | {rank} |")
    lines += ["", f"| model, length (seed {args.seed}) | " + " | ".join(f"`{r}` Δ val %" for r in PRESETS) +
              " | loss ranking (best first) | " + " | ".join(f"Spearman vs {label}" for label, _ in traces) + " |",
              "|---|" + "---:|" * len(PRESETS) + "---|" + "---:|" * len(traces)]
    for study in studies:
        rank = " > ".join(sorted(PRESETS, key=lambda r: outcome[study][r]))
        rhos = []
        for _, sq in traces:
            # A good proxy: higher SQNR, lower loss error, so rho(SQNR, −Δloss) = +1.
            rhos.append(spearman([sq[r] for r in PRESETS], [-outcome[study][r] for r in PRESETS]))
        lines.append(f"| {study_label(*study, _named(ms))} | " +
                     " | ".join(f"{outcome[study][r]:+.2f}" for r in PRESETS) +
                     f" | {rank} | " + " | ".join(f"{x:+.2f}" for x in rhos) + " |")
    text = "\n".join(lines)
    if args.doc:
        doc = replace_block(doc, "proxy tables: fp4lab-train proxy", text, args.doc)
        doc = replace_block(doc, "proxy paired: fp4lab-train proxy", proxy_paired_table(stats, pairs), args.doc)
        write_atomic(args.doc, doc.encode(), [args.training])
    else:
        print(text + "\n\n" + proxy_paired_table(stats, pairs))
    if args.figure:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(studies), figsize=(6 * len(studies), 4.6), squeeze=False)
        for ax, study in zip(axes[0], studies):
            band = noise_band(ms, *study)
            if band:
                ax.axhspan(-band["val"] / 2, band["val"] / 2, color="0.85", label="± half the BF16 seed spread")
            for k, (label, sq) in enumerate(traces):
                ax.plot([sq[r] for r in PRESETS], [outcome[study][r] for r in PRESETS], "o", color=f"C{k}",
                        label=label)
                for r in PRESETS:
                    ax.annotate(r, (sq[r], outcome[study][r]), fontsize=7, xytext=(3, 3),
                                textcoords="offset points")
            ax.axhline(0, color="k", lw=0.5)
            ax.set(xlabel="mean GEMM-output SQNR on the trace (dB)", ylabel="Δ final validation loss vs BF16 (%)",
                   title=f"{study_label(*study, _named(ms))}: proxy against outcome")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        _save_figure(fig, args.figure, [args.training])
        plot_proxy_pairs(traces=stats, pairs=pairs, path=figures[1], inputs=[args.training])
    print(f"proxy: {len(traces)} traces x {len(studies)} studies, {len(pairs)} paired effects" +
          (f" -> {args.doc}" if args.doc else "") +
          (f", {args.figure}" if args.figure else ""))
