"""`fp4lab-train`: the command line of the training study. It ends as the `fp4lab` command line does
(fp4lab._files.console_main): a fault is one line `fp4lab-train CMD: error: ...` with exit code 1 (data) or 2
(usage), a run stopped with its state in --checkpoint exits EXIT_CONTINUE."""
import argparse
import sys

from .._files import ArgumentParser, UsageError, console_main
from . import __doc__ as DOC
from .corpus import CORPORA, DEFAULT_CORPUS, cmd_corpus, corpus_name
from .model import RECIPES, SIZES
from .proxy_study import RESAMPLES, SEED, cmd_proxy_study
from .report import PRESETS, cmd_proxy, cmd_report
from .train import EXIT_CONTINUE, cmd_train, run_name


COMMANDS = ("corpus", "train", "report", "proxy", "proxy-study", "recipes", "name")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    cmd = argv[0] if argv and argv[0] in COMMANDS else None
    return console_main("fp4lab-train" + (f" {cmd}" if cmd else ""), lambda: _run(argv))


def _run(argv) -> int:
    ap = ArgumentParser(prog="fp4lab-train", description=DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus", help="extract the token files from a documentation package ("
                       + ", ".join(CORPORA) + ")")
    g = c.add_mutually_exclusive_group()
    g.add_argument("--deb", help="a package file: " + "; ".join(f"{n}: {c.shown}_*.deb" for n, c in CORPORA.items()))
    g.add_argument("--root", default="/", help="the root of an installed system (default /)")
    c.add_argument("--corpus", choices=list(CORPORA),
                   help=f"which corpus (default {DEFAULT_CORPUS}); with --deb, the package's, checked")
    c.add_argument("out", help="output folder")
    t = sub.add_parser("train", help="one training run")
    t.add_argument("--data", required=True)
    t.add_argument("--size", choices=sorted(SIZES), default="small")
    t.add_argument("--recipe", choices=sorted(RECIPES), default="bf16")
    t.add_argument("--mode", choices=["exact", "fast"], default="exact")
    t.add_argument("--seed", type=int, default=0)
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
    r = sub.add_parser("report", help="merge runs into training.json, docs tables and figures")
    r.add_argument("runs", nargs="*")
    r.add_argument("--json", default="docs/results/training.json")
    r.add_argument("--merge", action="store_true", help="keep the runs already in --json that are not given")
    r.add_argument("--paired-json", help="the paired comparisons of every study (fp4lab.paired), as JSON (default: "
                   "beside --json, its name with -paired; empty: not written)")
    r.add_argument("--doc", default="docs/training.md")
    r.add_argument("--figures", default="docs/fig_training")
    x = sub.add_parser("proxy", help="mean GEMM-output SQNR per recipe on traces against the loss ranking")
    x.add_argument("analysis", nargs="+", metavar="LABEL=ANALYSIS.json[+ANALYSIS.json]", help="fp4lab analyze "
                   "--recipe " + ",".join(PRESETS) + " --json output of one trace, with the analyses of the same "
                   "trace under the ablations joined by '+' where their paired effects are to be held against it")
    x.add_argument("--training", default="docs/results/training.json")
    x.add_argument("--seed", type=int, default=0, help="the seed whose runs give the outcome (every preset has it)")
    x.add_argument("--doc", default="docs/training.md")
    x.add_argument("--figure", default="docs/fig_training_proxy.png")
    y = sub.add_parser("proxy-study", help="which trace metrics predict the paired loss effects: rank correlations "
                       "with bootstrap intervals, per metric and trace")
    y.add_argument("analysis", nargs="+", metavar="LABEL=ANALYSIS.json[+ANALYSIS.json]", help="as for proxy: one "
                   "trace's fp4lab analyze --recipe output, its ablations' joined by '+'")
    y.add_argument("--training", default="docs/results/training.json")
    y.add_argument("--resamples", type=int, default=RESAMPLES, help=f"bootstrap resamples (default {RESAMPLES})")
    y.add_argument("--bootstrap-seed", type=int, default=SEED, help=f"seed of the draws (default {SEED})")
    y.add_argument("--json", default="docs/results/proxy-study.json", help="every figure of the study ('': none)")
    y.add_argument("--doc", default="docs/training.md", help="the document whose proxy-study block is replaced "
                   "('': print the table)")
    sub.add_parser("recipes", help="list the recipes")
    n = sub.add_parser("name", help="the run name of each scripts/train_study.sh run spec")
    n.add_argument("specs", nargs="+", metavar="SIZE:RECIPE:MODE:SEED:STEPS[:EXTRA ARGS]")
    n.add_argument("--data", help="the runs' training data (a corpus other than the first adds its name)")
    args = ap.parse_args(argv)
    if args.cmd == "corpus":
        cmd_corpus(args)
    elif args.cmd == "train":
        return EXIT_CONTINUE if cmd_train(args) is None else 0
    elif args.cmd == "report":
        cmd_report(args)
    elif args.cmd == "proxy":
        cmd_proxy(args)
    elif args.cmd == "proxy-study":
        cmd_proxy_study(args)
    elif args.cmd == "name":
        for spec in args.specs:
            f = spec.split(":", 5)
            if len(f) < 5:
                raise UsageError(f"{spec}: not SIZE:RECIPE:MODE:SEED:STEPS[:EXTRA ARGS]")
            # The name becomes file names (scripts/train_study.sh): only values `train` takes, never a path.
            for what, value, ok in (("SIZE", f[0], f[0] in SIZES), ("RECIPE", f[1], f[1] in RECIPES),
                                    ("MODE", f[2], f[2] in ("exact", "fast")),
                                    ("SEED", f[3], f[3].isascii() and f[3].isdigit()),
                                    ("STEPS", f[4], f[4].isascii() and f[4].isdigit())):
                if not ok:
                    raise UsageError(f"{spec}: {what} {value!r} is not one `fp4lab-train train` takes")
            print(run_name(*f[:5], corpus=corpus_name(args.data) if args.data else DEFAULT_CORPUS))
    else:
        for n, what in RECIPES.items():
            print(f"{n:20s} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
