# Writes OUT, a C++ source that holds the text of every DIR/*.cfg (the bundled TCU configurations, sim/configs/),
# so that an installed fp4lab finds `--config NAME` without the source tree (cli/bundled_configs.hpp).
# Run at build time: cmake -DDIR=... -DOUT=... -P embed_configs.cmake
file(GLOB cfgs RELATIVE "${DIR}" "${DIR}/*.cfg")
set(names "")
foreach(f IN LISTS cfgs)
  get_filename_component(name "${f}" NAME_WLE)
  list(APPEND names "${name}")
endforeach()
list(SORT names)  # by name: "h200" before "h200-class-dual"
set(body "")
foreach(name IN LISTS names)
  set(f "${DIR}/${name}.cfg")
  file(READ "${f}" text)
  if(text MATCHES "\\)fp4lab_cfg\"")
    message(FATAL_ERROR "${f} holds the raw-string delimiter )fp4lab_cfg\"")
  endif()
  string(APPEND body "    {\"${name}\", R\"fp4lab_cfg(${text})fp4lab_cfg\"},\n")
endforeach()
set(src "// Generated from sim/configs/*.cfg by cmake/embed_configs.cmake; do not edit.\n#include \"bundled_configs.hpp\"\n\nnamespace fp4lab::cli {\n\nconst std::vector<BundledConfig>& bundled_configs() {\n  static const std::vector<BundledConfig> configs = {\n${body}  };\n  return configs;\n}\n\n}  // namespace fp4lab::cli\n")
# Rewritten only when it changes, so that a build without config edits recompiles nothing.
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
  if(old STREQUAL src)
    return()
  endif()
endif()
file(WRITE "${OUT}" "${src}")
