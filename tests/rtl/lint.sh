#!/usr/bin/env bash
# Every RTL file through both tools the project supports (docs/spec.md §11): Verilator 5.006 with the
# shared flags (verilator.f: -Wall) in --lint-only mode, and Yosys 0.23's SystemVerilog reader followed
# by elaboration, `proc` and `check -assert`, with any warning of either tool treated as an error. Each
# module is linted in every build its parameters offer (format sets x pipeline depths 0/1/3); Yosys
# elaborates every format set (pipeline depths are covered by fp4lab_pipe itself).
# Usage: lint.sh <rtl dir> [jobs]   (the file list is <rtl dir>/files.f, package first)
set -uo pipefail
rtl=${1:?usage: lint.sh <rtl dir> [jobs]}
jobs=${2:-2}
cd "$rtl" || exit 2
mapfile -t files < <(grep -v -E '^\s*(//|$)' files.f)
[ ${#files[@]} -gt 0 ] || { echo "lint.sh: no files listed in $rtl/files.f"; exit 1; }

# One check: lint_one <description> <command...>; prints FAIL and the log on any error or warning.
lint_one() {
  local log
  log=$("${@:2}" 2>&1)
  local rc=$?
  if [ $rc -ne 0 ] || grep -q -E '^(%Warning|%Error)|Warning:|ERROR' <<<"$log"; then
    echo "FAIL: $1"
    sed 's/^/    /' <<<"$log" | head -40
    return 1
  fi
  echo "ok: $1"
}
export -f lint_one

checks=()  # NUL-separated command lines for xargs
add() { checks+=("$(printf '%q ' "$@")"); }
missing=0
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "FAIL: $f listed in files.f but missing"; missing=1; continue; }
  top=$(basename "$f" .sv)
  if grep -q -E "^\s*package\s+$top\s*;" "$f"; then
    add lint_one "verilator $f (package)" verilator --lint-only -f verilator.f "$f"
    add lint_one "yosys $f (package)" yosys -q -p "read_verilog -sv $f"
    continue
  fi
  grep -q -E "^\s*module\s+$top\b" "$f" || { echo "FAIL: $f does not hold module $top"; missing=1; continue; }
  fmts=("")
  grep -q -E 'parameter fp4lab_pkg::fmt_mask_t\s+FORMATS' "$f" && fmts=("4'b0001" "4'b0010" "4'b0100" "4'b1111")
  # Single-scale builds of the quantiser (all formats, DEPTH 1), one per scale kind.
  if grep -q -E 'parameter fp4lab_pkg::scale_mask_t\s+SCALES' "$f"; then
    for sm in 0001 0010 0100 1000; do
      dp=()
      grep -q -E 'parameter int unsigned\s+DEPTH' "$f" && dp=(-GDEPTH=1)
      add lint_one "verilator $top SCALES=4'b$sm" \
        verilator --lint-only -f verilator.f --top-module "$top" "-GSCALES=4'b$sm" "${dp[@]}" "${files[@]}"
      add lint_one "yosys $top SCALES=4'b$sm" \
        yosys -q -p "read_verilog -sv ${files[*]}; hierarchy -check -top $top -chparam SCALES $((2#$sm)); proc; check -assert"
    done
  fi
  depths=("")
  grep -q -E 'parameter int unsigned\s+DEPTH' "$f" && depths=(0 1 3)
  for m in "${fmts[@]}"; do
    for d in "${depths[@]}"; do
      vargs=()
      [ -n "$m" ] && vargs+=("-GFORMATS=$m")
      [ -n "$d" ] && vargs+=("-GDEPTH=$d")
      add lint_one "verilator $top${m:+ FORMATS=$m}${d:+ DEPTH=$d}" \
        verilator --lint-only -f verilator.f --top-module "$top" "${vargs[@]}" "${files[@]}"
      if [ -z "$d" ] || [ "$d" = 1 ] || [ "$top" = fp4lab_pipe ]; then
        yargs=""
        [ -n "$m" ] && yargs+=" -chparam FORMATS $((2#${m#4\'b}))"
        [ -n "$d" ] && yargs+=" -chparam DEPTH $d"
        add lint_one "yosys $top${m:+ FORMATS=$m}${d:+ DEPTH=$d}" \
          yosys -q -p "read_verilog -sv ${files[*]}; hierarchy -check -top $top$yargs; proc; check -assert"
      fi
    done
  done
done

out=$(printf '%s\0' "${checks[@]}" | xargs -0 -P "$jobs" -I{} bash -c '{}')
rc=$?
grep -v '^ok: ' <<<"$out"
runs=$(grep -c -E '^(ok|FAIL): ' <<<"$out")
echo "lint.sh: $runs checks over ${#files[@]} files, $([ $rc = 0 ] && [ $missing = 0 ] && echo clean || echo FAILED)"
[ "$runs" -eq ${#checks[@]} ] && [ "$runs" -gt 0 ] && [ $rc = 0 ] && [ $missing = 0 ]
