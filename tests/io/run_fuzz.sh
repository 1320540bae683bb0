#!/usr/bin/env bash
# Builds a fuzz target with clang++ (libFuzzer + ASan + UBSan) straight from the sources and runs it for SECONDS
# on a seed corpus the target writes itself. Fails on any crash, leak, timeout or escaped exception. Exit 77
# (ctest: skipped) when no clang++ with libFuzzer is available. Targets:
#   safetensors  the safetensors reader and trace v1 validation (tests/io/fuzz_safetensors.cpp)
#   readers      the simulator's configuration and shape-list readers, the config-file reader (`key = value` and
#                JSON) and the sweep-file reader (tests/sim/fuzz_readers.cpp; toml++ from the system)
#   tests/io/run_fuzz.sh <repo root> <work dir> [seconds=60] [target=safetensors]
# FP4LAB_FUZZ_COVERAGE=1 additionally replays the final corpus through a source-coverage build and prints
# llvm-cov's report for safetensors.cpp.
set -euo pipefail
root=$(cd "$1" && pwd)
work=$2
secs=${3:-60}
target=${4:-safetensors}
mkdir -p "$work"
work=$(cd "$work" && pwd)

cxx=${CLANGXX:-}
for c in clang++-14 clang++; do
  [[ -z $cxx ]] && command -v "$c" >/dev/null && cxx=$(command -v "$c")
done
[[ -z $cxx ]] && { echo "skip: no clang++"; exit 77; }
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$work/probe.cpp"
if ! "$cxx" -fsanitize=fuzzer,address "$work/probe.cpp" -o "$work/probe" 2>/dev/null; then
  echo "skip: $cxx cannot link libFuzzer (Debian: libclang-rt-14-dev)"
  exit 77
fi

srcs=("$root/models/io/src/safetensors.cpp" "$root/models/io/src/files.cpp")
incs=(-I"$root/models/io/include" -I"$root/models/include")
libs=()
case $target in
  safetensors) srcs+=("$root/tests/io/fuzz_safetensors.cpp") ;;
  readers)
    srcs+=("$root/sim/src/config.cpp" "$root/sim/src/workload.cpp" "$root/models/src/recipe.cpp"
           "$root/cli/sim_config.cpp" "$root/cli/sweep_reader.cpp" "$root/models/src/text.cpp"
           "$root/tests/sim/fuzz_readers.cpp")
    # toml++ as Debian builds it, a shared library: its parser is not instrumented, but the build stays short.
    incs+=(-I"$root/sim/include" -I"$root/cli" -DTOML_HEADER_ONLY=0 -DTOML_SHARED_LIB=1)
    libs+=(-lboost_program_options -ltomlplusplus) ;;
  *) echo "unknown fuzz target '$target'"; exit 2 ;;
esac
bin="$work/fuzz_$target"
t0=$(date +%s)
"$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "${incs[@]}" "${srcs[@]}" "${libs[@]}" -o "$bin"
echo "build: $(( $(date +%s) - t0 )) s"

rm -rf "$work/seeds" "$work/corpus" && mkdir -p "$work/corpus"
FP4LAB_ROOT="$root" FP4LAB_FUZZ_SEEDS="$work/seeds" "$bin"
if [[ $target == readers ]]; then
  cat >"$work/st.dict" <<'DICT'
"gemm,tokens,in,out,count"
"clock_ghz = "
"tcu.count = "
"mac.units = "
"config = "
"%value%"
"[[grid]]"
"[defaults]"
"name = "
"{recipe}"
"\\u0000"
"1e308"
"nan"
"-1"
"9223372036854775807"
DICT
else
cat >"$work/st.dict" <<'DICT'
"\"dtype\""
"\"shape\""
"\"data_offsets\""
"\"__metadata__\""
"\"fp4lab.trace.version\""
"\"F32\""
"\"BF16\""
"\"F16\""
"\"U8\""
"\"I64\""
"\"F8_E4M3\""
".fwd_x"
".fwd_w"
".bwd_dy"
"\"1\""
"1e999"
"-0"
"18446744073709551615"
"\\u0000"
DICT
fi

# ASAN_OPTIONS: leaks are findings; allocator_may_return_null=0 so a huge allocation is reported too.
set +e
TMPDIR="$work" ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 \
  "$bin" -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -dict="$work/st.dict" -print_final_stats=1 -artifact_prefix="$work/" "$work/corpus" "$work/seeds" \
  >"$work/fuzz.log" 2>&1
status=$?
set -e
# The log without the per-input progress lines.
grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)' "$work/fuzz.log" | tail -n 80
[[ $status -ne 0 ]] && { echo "FAIL: fuzzer exited with $status (see $work/fuzz.log and $work/crash-*)"; exit 1; }
runs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$work/fuzz.log" || echo 0)
cov=$(grep -oP '^#[0-9]+\s+DONE\s+cov: \K[0-9]+' "$work/fuzz.log" || echo 0)
echo "fuzz: $runs executions in $secs s, $cov coverage points, corpus $(ls "$work/corpus" | wc -l) files"
[[ $runs -gt 0 ]] || { echo "FAIL: the fuzzer executed nothing"; exit 1; }

if [[ ${FP4LAB_FUZZ_COVERAGE:-0} == 1 ]]; then
  prof=$(dirname "$cxx")/llvm-profdata-14; [[ -x $prof ]] || prof=llvm-profdata
  llcov=$(dirname "$cxx")/llvm-cov-14; [[ -x $llcov ]] || llcov=llvm-cov
  "$cxx" -std=c++20 -O0 -fsanitize=fuzzer -fprofile-instr-generate -fcoverage-mapping "${incs[@]}" "${srcs[@]}" "${libs[@]}" \
    -o "$work/fuzz_cov"
  LLVM_PROFILE_FILE="$work/cov.profraw" "$work/fuzz_cov" -runs=0 "$work/corpus" "$work/seeds" >/dev/null 2>&1
  "$prof" merge -sparse "$work/cov.profraw" -o "$work/cov.profdata"
  "$llcov" report "$work/fuzz_cov" -instr-profile="$work/cov.profdata" "$root/models/io/src/safetensors.cpp"
fi
