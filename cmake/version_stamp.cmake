# Writes fp4lab/version.hpp from version.hpp.in with `git describe` of the source tree as it is at build time (run by
# the fp4lab_version_stamp target on every build): configure_file rewrites the header only when its text changes, so
# only a new commit or a change of the tree's dirty state recompiles the few files that print it.
# -D SRC=<source dir> -D OUT=<header> -D VERSION=<project version> [-D GIT=<git executable>]
set(FP4LAB_GIT_COMMIT "unknown")
if(GIT)
  execute_process(COMMAND ${GIT} describe --always --dirty --abbrev=12 WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE _git OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
  if(_rc EQUAL 0 AND _git)
    set(FP4LAB_GIT_COMMIT "${_git}")
  endif()
endif()
set(PROJECT_VERSION "${VERSION}")
configure_file(${SRC}/cmake/version.hpp.in ${OUT} @ONLY)
