#!/usr/bin/env bash
# Rewrites tests/sim/expected/*.json from the current model. Review `git diff tests/sim/expected` before
# committing: every change there is a change in what the model reports.
# Usage: tests/sim/regen_expected.sh [BUILD_DIR]   (default: build)
set -euo pipefail
build=${1:-build}
bin="$build/tests/sim/fp4lab_sim_tests"
[ -x "$bin" ] || { echo "regen_expected: $bin not found; build the fp4lab_sim_tests target first" >&2; exit 2; }
FP4LAB_REGEN_EXPECTED=1 "$bin" --gtest_filter='Expected.*'
git diff --stat -- "$(dirname "$0")/expected" || true
