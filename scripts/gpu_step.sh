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

# build_core: configures build-gpu/ for this machine's python3 (CUDA kernels for sm_$ARCHS, default 90a; PREFIX may
# name a folder with headers the machine lacks and nanobind) and builds the module fp4lab._core there, as steps
# `configure` and `build`. Then PYTHONPATH=$PWD/build-gpu/python imports it.
build_core() {
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  PYTHONPATH=${PREFIX:-}${PYTHONPATH:+:$PYTHONPATH} TAIL=3 step configure cmake -S . -B build-gpu "${gen[@]}" \
    -DFP4LAB_CLI=OFF -DFP4LAB_TESTS=OFF -DFP4LAB_SIM=OFF -DFP4LAB_RTL=OFF -DFP4LAB_BENCH=OFF \
    -DFP4LAB_CUDA_ARCHS="${ARCHS:-90a}" -DPython_EXECUTABLE="$(command -v python3)" \
    ${PREFIX:+-DCMAKE_PREFIX_PATH=$PREFIX} || return 1
  TAIL=3 step build cmake --build build-gpu --target _core -j"$(nproc)"
}
