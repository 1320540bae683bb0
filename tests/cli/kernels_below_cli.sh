#!/bin/sh
# kernels/ is a library below the command line (cli/ links it, never the reverse): no kernels/ file includes a
# cli/ header, and kernels/CMakeLists.txt links no cli/ library. Usage: kernels_below_cli.sh SOURCE_DIR
cd "$1" || exit 2
bad=0
for h in cli/*.hpp; do
  if grep -rnF -e "#include \"${h#cli/}\"" -e "#include \"$h\"" kernels; then bad=1; fi
done
if grep -nE 'fp4lab_cli_options|fp4lab_dist' kernels/CMakeLists.txt; then bad=1; fi
[ "$bad" = 0 ] && echo "kernels/ uses nothing of cli/"
exit $bad
