"""Train a SwiGLU decoder from scratch under BF16 and under fp4lab's FP4 recipes, and report the paper's metric.

The question (UFP4, arXiv 2606.20381): does the uniform E1M2 grid with RHT on all three training GEMMs (`ufp4`)
train closer to BF16 than the E2M1 reference recipe (`e2m1-ref`), and what do RHT scope and SR on dY contribute?
Every run of one model size starts from the same initialisation and sees the same batches in the same order; only
the arithmetic of the blocks' linear layers changes (fp4lab.torch.convert; the embedding and the output head stay
BF16). docs/training.md reports the results; docs/spec.md §12 defines the metric.

  corpus  Extracts the English reStructuredText page sources of Sphinx-built documentation from a Debian package,
          installed or as a .deb file, into byte token files (vocabulary = 256 bytes) with a held-out validation
          split (every file whose path's CRC-32 is 0 mod 20). Two corpora: `linux-doc`, the Linux kernel
          documentation (linux-doc-<version>, about 25 MB of English prose, GPL-2.0), the study's first; and
          `python-doc`, the Python documentation (python3.<minor>-doc, about 11 MB, PSF licence), its second:
            apt-get download linux-doc-6.12      # or apt-get install linux-doc-6.12
            fp4lab-train corpus --deb linux-doc-6.12_*.deb data/linux-doc
            apt-get download python3.11-doc
            fp4lab-train corpus --deb python3.11-doc_*.deb data/python-doc
  train   One run; writes its JSON (the fields of docs/results/training.json's runs) when it completes:
            fp4lab-train train --data data/linux-doc --size small --recipe ufp4 --out runs/x.json
  report  Merges run files into docs/results/training.json, writes the paired comparisons of the recipes
          (fp4lab.paired: per-seed differences, 95% t-intervals, verdicts) to docs/results/training-paired.json,
          the tables of docs/training.md between their markers and the loss-curve figures:
            fp4lab-train report runs/*.json
  recipes Lists the recipes the study knows (the presets and the ablations) with what each changes.
  proxy   Mean GEMM-output SQNR per recipe on traces (`fp4lab analyze --recipe`) against the loss ranking.
  proxy-study  Which trace metrics (GEMM SQNR per pass, shrinkage η, output and weight-update bias) predict the
          paired loss effects: rank correlations with bootstrap intervals, the table of docs/training.md and
          docs/results/proxy-study.json.

Modules: model (decoder, sizes, recipes), corpus, train (one run), report (tables, paired comparisons, verdicts,
figures, proxy), proxy_study (trace metrics against the paired effects), cli (`fp4lab-train`), tiny_lm (the
decoder that made the bundled trace workloads/tiny-lm).
Run the commands from the repository root: report, proxy and proxy-study read and write docs/ there by default.
"""
from .corpus import CORPORA, DEFAULT_CORPUS, cmd_corpus, corpus_name, write_atomic  # noqa: F401
from .model import RECIPES, SIZES, build_model, make_recipe  # noqa: F401
from .report import (ABLATIONS, CORE, PRESETS, groups, metrics, noise_band, paired, paired_json,  # noqa: F401
                     replace_block, status, tables, verdict)
from .train import EXIT_CONTINUE, cmd_train, run_name  # noqa: F401
