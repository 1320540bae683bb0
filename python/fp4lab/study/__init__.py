"""Train a SwiGLU decoder from scratch under BF16 and under fp4lab's FP4 recipes, and report the paper's metric.

The question (UFP4, arXiv 2606.20381): does the uniform E1M2 grid with RHT on all three training GEMMs (`ufp4`)
train closer to BF16 than the E2M1 reference recipe (`e2m1-ref`), and what do RHT scope and SR on dY contribute?
Every run of one model size starts from the same initialisation and sees the same batches in the same order; only
the arithmetic of the blocks' linear layers changes (fp4lab.torch.convert; the embedding and the output head stay
BF16). docs/results/training.md reports the results; docs/spec.md §12 defines the metric.

  train   One run on a training-data folder (--data): train.bin and val.bin, byte tokens (vocabulary = 256 bytes),
          any text you give; writes its JSON when it completes:
            fp4lab-train train --data data/mytext --size small --recipe ufp4 --out runs/x.json
  report  Merges run files into a results JSON (--json), writes the paired comparisons of the recipes
          (fp4lab.paired: per-seed differences, 95% t-intervals, verdicts) beside it, and, where asked, a
          document's tables between their markers (--doc) and the loss-curve figures (--figures):
            fp4lab-train report runs/*.json --json out/training.json
  recipes Lists the recipes the study knows (the presets and the ablations) with what each changes.
  proxy   Mean GEMM-output SQNR per recipe on traces (`fp4lab analyze --recipe`) against the loss ranking.

Modules: model (decoder, sizes, recipes), corpus (the training-data folder), train (one run), report (tables,
paired comparisons, verdicts, figures, proxy), cli (`fp4lab-train`). The study's own corpora (Debian
documentation packages), its proxy study, the trainer of the bundled trace workloads/tiny-lm and this
repository's default paths into docs/ are the lab's (python3 -m fp4lab_lab.study, outside the installed package).
"""
from .corpus import CORPORA, DEFAULT_CORPUS, corpus_name, write_atomic  # noqa: F401
from .model import RECIPES, SIZES, build_model, make_recipe  # noqa: F401
from .report import (ABLATIONS, CORE, PRESETS, groups, metrics, noise_band, paired, paired_json,  # noqa: F401
                     replace_block, status, tables, verdict)
from .train import EXIT_CONTINUE, cmd_train, run_name  # noqa: F401
