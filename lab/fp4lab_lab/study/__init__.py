"""The training study as this repository runs it: `python3 -m fp4lab_lab.study` is fp4lab-train (the installed
package's fp4lab.study.cli) with what only makes sense here:

  corpus  Extracts the English reStructuredText page sources of Sphinx-built documentation from a Debian package,
          installed or as a .deb file, into byte token files (vocabulary = 256 bytes) with a held-out validation
          split (every file whose path's CRC-32 is 0 mod 20). Two corpora: `linux-doc`, the Linux kernel
          documentation (linux-doc-<version>, about 25 MB of English prose, GPL-2.0), the study's first; and
          `python-doc`, the Python documentation (python3.<minor>-doc, about 11 MB, PSF licence), its second:
            apt-get download linux-doc-6.12      # or apt-get install linux-doc-6.12
            python3 -m fp4lab_lab.study corpus --deb linux-doc-6.12_*.deb data/linux-doc
            apt-get download python3.11-doc
            python3 -m fp4lab_lab.study corpus --deb python3.11-doc_*.deb data/python-doc
  name    The run name of each scripts/train_study.sh run spec.
  defaults  report, proxy and proxy-study read and write this repository's docs/ when not told otherwise
          (REPO_DEFAULTS): docs/results/training.json, docs/results/training.md, docs/fig_training*,
          docs/results/proxy-study.json. Run them from the repository root:
            python3 -m fp4lab_lab.study report --merge out/runs/*.json

train, recipes and proxy-study (whose docs/results/proxy-study.json the package's
python/fp4lab/data/training_evidence.json, read by `fp4lab decide`, summarises) are fp4lab-train's. tiny_lm (python3 -m fp4lab_lab.study.tiny_lm) is the trainer of the
bundled trace workloads/tiny-lm, with its corpus read out of an R package.
"""
import sys

from fp4lab._files import UsageError, console_main
from fp4lab.study import cli
from fp4lab.study.corpus import CORPORA, DEFAULT_CORPUS, corpus_name
from fp4lab.study.model import DEFAULT_SR_DRAW, RECIPES, SIZES, SR_DRAWS
from fp4lab.study.train import run_name

from .corpus import cmd_corpus

PROG = "python3 -m fp4lab_lab.study"
# The repository's paths (relative to its root) that report, proxy and proxy-study use when not given.
REPO_DEFAULTS = {
    ("report", "--json"): "docs/results/training.json",
    ("report", "--doc"): "docs/results/training.md",
    ("report", "--figures"): "docs/fig_training",
    ("proxy", "--training"): "docs/results/training.json",
    ("proxy", "--doc"): "docs/results/training.md",
    ("proxy", "--figure"): "docs/fig_training_proxy.png",
    ("proxy-study", "--training"): "docs/results/training.json",
    ("proxy-study", "--json"): "docs/results/proxy-study.json",
    ("proxy-study", "--doc"): "docs/results/training.md",
}
COMMANDS = ("corpus", "name") + cli.COMMANDS


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    cmd = argv[0] if argv and argv[0] in COMMANDS else None
    return console_main(PROG + (f" {cmd}" if cmd else ""), lambda: _run(argv))


def _run(argv) -> int:
    ap, sub = cli.build_parser(PROG, REPO_DEFAULTS, __doc__)
    c = sub.add_parser("corpus", help="extract the token files from a documentation package ("
                       + ", ".join(CORPORA) + ")")
    g = c.add_mutually_exclusive_group()
    g.add_argument("--deb", help="a package file: " + "; ".join(f"{n}: {c.shown}_*.deb" for n, c in CORPORA.items()))
    g.add_argument("--root", default="/", help="the root of an installed system (default /)")
    c.add_argument("--corpus", choices=list(CORPORA),
                   help=f"which corpus (default {DEFAULT_CORPUS}); with --deb, the package's, checked")
    c.add_argument("out", help="output folder")
    n = sub.add_parser("name", help="the run name of each scripts/train_study.sh run spec")
    n.add_argument("specs", nargs="+", metavar="SIZE:RECIPE:MODE:SEED:STEPS[:EXTRA ARGS]")
    n.add_argument("--data", help="the runs' training data (a corpus other than the first adds its name)")
    args = ap.parse_args(argv)
    if args.cmd == "corpus":
        cmd_corpus(args)
    elif args.cmd == "name":
        for spec in args.specs:
            print(_name(spec, args.data))
    else:
        return cli.run(args)
    return 0


def _name(spec: str, data) -> str:
    """The run name of one scripts/train_study.sh run spec SIZE:RECIPE:MODE:SEED:STEPS[:EXTRA ARGS]."""
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
    # The run's SR draw, where its EXTRA ARGS give one (train then names the run by it; TRAIN_ARGS, for every run
    # of a batch, are not seen here: give the draw per run).
    extra = f[5].split() if len(f) > 5 else []
    draw = extra[extra.index("--sr-draw") + 1] if "--sr-draw" in extra[:-1] else DEFAULT_SR_DRAW
    if draw not in SR_DRAWS:
        raise UsageError(f"{spec}: --sr-draw {draw!r} is none of {', '.join(SR_DRAWS)}")
    return run_name(*f[:5], corpus=corpus_name(data) if data else DEFAULT_CORPUS, sr_draw=draw)
