# Options for the layers that need a dependency (CUDA, SystemC, Verilator, nanobind, MPI): each is AUTO, ON or OFF.
# AUTO (the default) builds the layer where its dependency is found and says in one status line what it left out;
# ON asks for it, and a missing dependency is a configure error naming what is missing; OFF leaves it out.

# fp4lab_option(NAME DOC): the cache entry NAME (default AUTO) and NAME_MODE, its value as AUTO, ON or OFF.
function(fp4lab_option name doc)
  set(${name} AUTO CACHE STRING "${doc}: AUTO (where found), ON (required) or OFF")
  set_property(CACHE ${name} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "${${name}}" v)
  if(v MATCHES "^(ON|YES|TRUE|Y|1)$")
    set(v ON)
  elseif(v MATCHES "^(OFF|NO|FALSE|N|0)$")
    set(v OFF)
  elseif(NOT v STREQUAL "AUTO")
    message(FATAL_ERROR "fp4lab: ${name}=${${name}}: give AUTO, ON or OFF")
  endif()
  set(${name}_MODE ${v} PARENT_SCOPE)
endfunction()

# fp4lab_missing(NAME WHAT): NAME's dependency is missing (WHAT says which, and how to get it). An error when
# NAME=ON; with AUTO one status line.
function(fp4lab_missing name what)
  if(${name}_MODE STREQUAL "ON")
    message(FATAL_ERROR "fp4lab: ${name}=ON but ${what}. (-D${name}=AUTO builds without it where it is missing)")
  endif()
  message(STATUS "fp4lab: ${name}=AUTO, off: ${what}")
endfunction()
