#!/usr/bin/env bash
# The Python package's GPU checks on a CUDA machine: builds the module fp4lab._core for that machine's python3
# (in build-gpu/, CUDA kernels for sm_90a by default), then runs the torch tests (CUDA against the CPU golden
# model, bit for bit) and the training-step benchmark beside BF16. Logs and JSON go to $LOGS (default gpu-out).
# PREFIX may name a folder holding headers the machine lacks (Eigen, nlohmann-json) with their CMake configs.
# Exit status: the number of failed steps.
set -u
LOGS=${LOGS:-gpu-out}
ARCHS=${ARCHS:-90a}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
fail=0
. "$(dirname "$0")/gpu_step.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'
build_core || exit 1
export PYTHONPATH=$PWD/build-gpu/python
TAIL=15 step pytest-torch python3 -m pytest -v -p no:cacheprovider tests/python/torch_layer/test_torch.py
TAIL=30 step bench-train-step python3 scripts/bench_train_step.py --recipes bf16,ufp4,nvfp4,mxfp4,e2m1-ref \
  --json "$LOGS/bench-train-step.json" ${BENCH_ARGS:-}
echo "failed steps: $fail"
exit $fail
