# Sourced by the GPU run scripts (kernels/tools/h200_run.sh, scripts/gpu_python_check.sh):
#   step NAME CMD...  runs CMD with its output in $LOGS/NAME.log (also appended to $COMBINED when set), prints the
#                     last $TAIL lines (default 6) and the exit status, counts a failure in $fail, returns CMD's status.
fail=${fail:-0}
step() {
  local name=$1
  shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  [ -n "${COMBINED:-}" ] && { echo "=== $name: $*"; cat "$LOGS/$name.log"; echo "=== $name: exit $rc"; } >>"$COMBINED"
  tail -n "${TAIL:-6}" "$LOGS/$name.log"
  echo "=== $name: exit $rc, $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || fail=$((fail + 1))
  return $rc
}
