"""`fp4lab-train`: the command line of the training study. It ends as the `fp4lab` command line does
(fp4lab._files.console_main): a fault is one line `fp4lab-train CMD: error: ...` with exit code 1 (data) or 2
(usage), a run stopped with its state in --checkpoint exits EXIT_CONTINUE.

The outputs of report and proxy are the ones given: no default writes into a repository's docs/. build_parser and
run are also the lab's study command (python3 -m fp4lab_lab.study, outside the installed package), which adds the
corpus extraction from Debian packages, the proxy study, the run names of scripts/train_study.sh and this
repository's default paths."""
import argparse
import sys

from .._files import ArgumentParser, console_main
from . import __doc__ as DOC
from .model import DEFAULT_SR_DRAW, RECIPES, SIZES, SR_DRAWS
from .proxy_study import RESAMPLES, SEED, cmd_proxy_study
from .report import PRESETS, cmd_proxy, cmd_report
from .train import EXIT_CONTINUE, cmd_train


COMMANDS = ("train", "report", "proxy", "proxy-study", "recipes")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    cmd = argv[0] if argv and argv[0] in COMMANDS else None
    return console_main("fp4lab-train" + (f" {cmd}" if cmd else ""), lambda: run(build_parser()[0].parse_args(argv)))


def _path(p, cmd: str, option: str, defaults, what: str, **kw) -> None:
    """An input or output path option: its default from `defaults` (the lab's repository paths) where it has one;
    else `required` where the command cannot do without it, or '' (not written)."""
    d = (defaults or {}).get((cmd, option))
    required = kw.pop("required", False) and d is None
    p.add_argument(option, default=d if d is not None else ("" if not required else None), required=required,
                   help=what + (f" (default {d})" if d else ""), **kw)


def build_parser(prog: str = "fp4lab-train", defaults=None, description: str = DOC):
    """(parser, its subparsers action). defaults: {(command, option): path} for the path options."""
    ap = ArgumentParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="one training run")
    t.add_argument("--data", required=True)
    t.add_argument("--size", choices=sorted(SIZES), default="small")
    t.add_argument("--recipe", choices=sorted(RECIPES), default="bf16")
    t.add_argument("--mode", choices=["exact", "fast"], default="exact")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--sr-draw", choices=SR_DRAWS, default=DEFAULT_SR_DRAW,
                   help=f"how stochastic rounding draws its words (docs/spec.md §4; default {DEFAULT_SR_DRAW}, the "
                        "presets'): philox1 reproduces runs made before philox4; philox16 draws 8 bits an element")
    t.add_argument("--steps", type=int, default=2000)
    t.add_argument("--seq", type=int)
    t.add_argument("--batch", type=int)
    t.add_argument("--lr", type=float)
    t.add_argument("--eval-every", type=int, default=250)
    t.add_argument("--eval-windows", type=int, default=256, help="validation sequences per intermediate evaluation")
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--device", default=None)
    t.add_argument("--name")
    t.add_argument("--out")
    t.add_argument("--force", action="store_true")
    t.add_argument("--deterministic", action="store_true", help="PyTorch's deterministic algorithms: on a GPU, "
                   "two runs of one command then agree bit for bit (on the CPU they always do); an operation without "
                   "one stops the run")
    t.add_argument("--graph", action="store_true", help="on a GPU, replay each step's forward and backward from "
                   "a CUDA graph captured once (again after each evaluation) instead of launching its kernels from "
                   "Python: the same bits as without, less host time a step")
    t.add_argument("--concurrent", type=int, default=1, help="runs sharing the GPU (recorded, for tokens/s)")
    t.add_argument("--checkpoint", help="resume from this file if it exists; where --time-limit saves the state")
    t.add_argument("--time-limit", type=float, help="stop after this many seconds at a step boundary, save the state "
                   f"to --checkpoint and exit {EXIT_CONTINUE}")
    t.add_argument("--stop-at", type=int, metavar="N", help="stop after step N as --time-limit does (state in "
                   f"--checkpoint, exit {EXIT_CONTINUE}): a run in parts of a set number of steps")
    t.add_argument("--capture-steps", help="write trace v1 folders at these steps (updates applied before the pass)")
    t.add_argument("--capture-dir", default="traces")
    t.add_argument("--capture-pattern", help="modules to capture (default qkv, proj, fc1, fc2 of the first and the "
                   "last block)")
    t.add_argument("--capture-tokens", type=int, default=256, help="token rows kept per GEMM")
    t.add_argument("--capture-token-stride", type=int, default=1, help="keep every n-th token row")
    t.add_argument("--capture-max-out", type=int, help="keep at most this many output features, evenly spaced")
    r = sub.add_parser("report", help="merge runs into a results JSON, the paired comparisons, a document's tables "
                       "and figures")
    r.add_argument("runs", nargs="*")
    _path(r, "report", "--json", defaults, "the results file the runs are merged into", required=True)
    r.add_argument("--merge", action="store_true", help="keep the runs already in --json that are not given")
    r.add_argument("--paired-json", help="the paired comparisons of every study (fp4lab.paired), as JSON (default: "
                   "beside --json, its name with -paired; empty: not written)")
    _path(r, "report", "--doc", defaults, "the document whose report blocks are replaced ('': none)")
    _path(r, "report", "--figures", defaults, "the loss-curve figures' path prefix ('': none)")
    x = sub.add_parser("proxy", help="mean GEMM-output SQNR per recipe on traces against the loss ranking")
    x.add_argument("analysis", nargs="+", metavar="LABEL=ANALYSIS.json[+ANALYSIS.json]", help="fp4lab analyze "
                   "--recipe " + ",".join(PRESETS) + " --json output of one trace, with the analyses of the same "
                   "trace under the ablations joined by '+' where their paired effects are to be held against it")
    _path(x, "proxy", "--training", defaults, "the results file of `report`", required=True)
    x.add_argument("--seed", type=int, default=0, help="the seed whose runs give the outcome (every preset has it)")
    _path(x, "proxy", "--doc", defaults, "the document whose proxy blocks are replaced ('': print the tables)")
    _path(x, "proxy", "--figure", defaults, "the figure ('': none)")
    y = sub.add_parser("proxy-study", help="which trace metrics predict the paired loss effects: rank correlations "
                       "with bootstrap intervals, per metric and trace (the JSON fp4lab decide --evidence takes)")
    y.add_argument("analysis", nargs="+", metavar="LABEL=ANALYSIS.json[+ANALYSIS.json]", help="as for proxy: one "
                   "trace's fp4lab analyze --recipe output, its ablations' joined by '+'")
    _path(y, "proxy-study", "--training", defaults, "the results file of `report`", required=True)
    y.add_argument("--resamples", type=int, default=RESAMPLES, help=f"bootstrap resamples (default {RESAMPLES})")
    y.add_argument("--bootstrap-seed", type=int, default=SEED, help=f"seed of the draws (default {SEED})")
    _path(y, "proxy-study", "--json", defaults, "every figure of the study", required=True)
    _path(y, "proxy-study", "--doc", defaults, "the document whose proxy-study block is replaced ('': print the table)")
    sub.add_parser("recipes", help="list the recipes")
    return ap, sub


def run(args) -> int:
    """Runs the command `args` (of build_parser's parser) names; its exit status."""
    if args.cmd == "train":
        return EXIT_CONTINUE if cmd_train(args) is None else 0
    elif args.cmd == "report":
        cmd_report(args)
    elif args.cmd == "proxy":
        cmd_proxy(args)
    elif args.cmd == "proxy-study":
        cmd_proxy_study(args)
    else:
        for n, what in RECIPES.items():
            print(f"{n:20s} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
