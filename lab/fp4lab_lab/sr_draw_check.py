"""The paired check of an SR draw revision (docs/spec.md §4): does drawing one Philox block per four elements
(philox4) instead of one per element (philox1), or per sixteen elements with 8 bits each (philox16) instead of
philox4, change how a model trains?

    python3 -m fp4lab_lab.sr_draw_check RUN.json ... [--json OUT]

RUN.json are fp4lab-train runs of one recipe, mode, size, corpus and step count under two draws, each seed once
under each (`fp4lab-train train ... --sr-draw D`): every pair shares its initial weights and its batches, so the
per-seed difference NEW - BASE isolates the draw (NEW the later draw of fp4lab.SrDraw's order, BASE the earlier).
Prints, for the final validation loss and the mean training loss over the last 10% of steps, the differences per
seed, their mean with a 95% t-interval (fp4lab.paired) and the verdict, in nats and in percent of the BASE loss.
"""
import argparse
import json
import sys

from fp4lab import SrDraw
from fp4lab._files import DataError, console_main, read_json, write_atomic
from fp4lab.paired import paired_stats
from fp4lab.study.report import check_run, sr_draw_of


def _measures(run: dict) -> dict:
    train = run["train_loss"]
    tail = train[len(train) - max(1, len(train) // 10):]
    return {"val": run["val_loss"][-1], "train": sum(tail) / len(tail)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m fp4lab_lab.sr_draw_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="fp4lab-train run JSONs")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    runs = []
    for p in args.runs:
        r = read_json(p)
        check_run(r, p)  # a file that is no run JSON: one line naming it
        runs.append(r)
    # Everything but the seed and the draw must be the same, or a difference is not the draw's.
    settings = {(r["recipe"], r["gemm_mode"], r["model"], r.get("corpus"), len(r["steps"]),
                 json.dumps(r["config"], sort_keys=True), r.get("deterministic")) for r in runs}
    if len(settings) != 1:
        raise DataError(f"the runs differ in more than seed and SR draw ({len(settings)} settings among them)")
    by = {}
    for p, r in zip(args.runs, runs):
        k = (r["seed"], sr_draw_of(r))
        if k[1] is None:
            raise DataError(f"{p}: a BF16 run has no SR draw")
        if k in by:
            raise DataError(f"{p}: a second run of seed {k[0]} under {k[1]}")
        if r.get("diverged"):
            raise DataError(f"{p}: diverged ({r['diverged']})")
        by[k] = _measures(r)
    order = list(SrDraw.__members__)
    draws = sorted({d for _, d in by}, key=order.index)
    if len(draws) != 2:
        raise DataError(f"the runs are under {len(draws)} SR draw(s) ({', '.join(draws)}): a check pairs two")
    base, new = draws
    seeds = sorted(s for s, d in by if d == new and (s, base) in by)
    unpaired = sorted(f"seed {s} ({d})" for s, d in by if s not in seeds)
    if len(seeds) < 2:
        raise DataError("fewer than two seeds with a run under each draw"
                        + (f" (unpaired: {', '.join(unpaired)})" if unpaired else ""))
    recipe, mode, size, corpus, steps, _, _ = settings.pop()
    out = {"recipe": recipe, "mode": mode, "size": size, "corpus": corpus, "steps": steps, "seeds": seeds,
           "unpaired": unpaired, "new": new, "base": base}
    print(f"{recipe} ({mode}), {size} model, {corpus}, {steps} steps, seeds {', '.join(map(str, seeds))}: "
          f"{new} - {base}, paired by seed" + (f"; not paired: {', '.join(unpaired)}" if unpaired else ""))
    for m, what in (("val", "final validation loss"), ("train", "training loss over the last 10%")):
        d = [by[(s, new)][m] - by[(s, base)][m] for s in seeds]
        pct = [100 * x / by[(s, base)][m] for x, s in zip(d, seeds)]
        st, sp = paired_stats(d), paired_stats(pct)
        verdict = ("no difference detectable" if st.low <= 0 <= st.high
                   else f"{new} higher" if st.low > 0 else f"{new} lower")
        print(f"  {what}: {st.mean:+.5f} nats ({sp.mean:+.3f}%), 95% interval {st.low:+.5f} to {st.high:+.5f} "
              f"({sp.low:+.3f}% to {sp.high:+.3f}%), t with {st.n - 1} df; per seed "
              + ", ".join(f"{x:+.5f}" for x in d) + f": {verdict}")
        for s in seeds:
            print(f"    seed {s}: {base} {by[(s, base)][m]:.5f}, {new} {by[(s, new)][m]:.5f}")
        # For scale: how far runs of one draw spread from seed to seed (other weights, batches and SR words).
        spread = {d: paired_stats([by[(s, d)][m] for s in seeds]).sd for d in (base, new)}
        print(f"    seed-to-seed SD of the loss: {base} {spread[base]:.5f}, {new} {spread[new]:.5f}")
        out[m] = {"diffs": d, "percent": pct, **st.as_dict(), "verdict": verdict, "seed_sd": spread,
                  base: [by[(s, base)][m] for s in seeds], new: [by[(s, new)][m] for s in seeds]}
    if args.json:
        write_atomic(args.json, (json.dumps(out, indent=1) + "\n").encode(), args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(console_main("python3 -m fp4lab_lab.sr_draw_check", main))
