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
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
TAIL=3 step configure cmake -S . -B build-gpu "${gen[@]}" -DFP4LAB_CLI=OFF -DFP4LAB_TESTS=OFF -DFP4LAB_SIM=OFF \
  -DFP4LAB_RTL=OFF -DFP4LAB_BENCH=OFF -DFP4LAB_CUDA_ARCHS="$ARCHS" -DPython_EXECUTABLE="$(command -v python3)" \
  ${PREFIX:+-DCMAKE_PREFIX_PATH=$PREFIX} || exit 1
TAIL=3 step build cmake --build build-gpu --target _core -j"$(nproc)" || exit 1
export PYTHONPATH=$PWD/build-gpu/python
TAIL=15 step pytest-torch python3 -m pytest -v -p no:cacheprovider tests/python/test_fp4lab_torch.py
TAIL=30 step bench-train-step python3 scripts/bench_train_step.py --recipes bf16,ufp4,nvfp4,mxfp4,e2m1-ref \
  --json "$LOGS/bench-train-step.json" ${BENCH_ARGS:-}
echo "failed steps: $fail"
exit $fail
