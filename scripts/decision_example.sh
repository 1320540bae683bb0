#!/usr/bin/env bash
# Regenerates the example decision report, docs/results/decision/ (decision.json, report.md, fig_pareto.png,
# fig_layers.png): Llama-2 7B at 4,096 tokens per step on the five native H200-class design points, the accuracy side
# from both bundled traces. Needs the build's fp4lab (with the simulator) and the in-tree package:
#   cmake --build build -j2 --target fp4lab _core && scripts/decision_example.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHONPATH=$BUILD/python FP4LAB_BIN=$BUILD/bin/fp4lab python3 -m fp4lab decide \
  --model workloads/models/llama2-7b.json --tokens 4096 \
  --trace workloads/tiny-lm/step_005000 --trace workloads/doc-lm/step_001999 \
  --out docs/results/decision
