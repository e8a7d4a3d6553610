# Refuses includes that bypass the layer rule of CMakeLists.txt: a project
# header is included by its name only ("kv.h"), found through the include
# roots of the modules the target links. A path ("../engine/engine.h",
# "engine/engine.h", <../kv/kv.h>) would reach a module the target does not
# link, so it is an error here, before anything compiles.
# usage: cmake -DROOT=<source dir> -P check_includes.cmake
file(GLOB_RECURSE files RELATIVE ${ROOT}
  ${ROOT}/src/*.c ${ROOT}/src/*.h ${ROOT}/tools/*.c ${ROOT}/tools/*.h
  ${ROOT}/tests/unit/*.c ${ROOT}/tests/unit/*.h ${ROOT}/tests/fuzz/*.c)
set(bad "")
foreach(f ${files})
  file(STRINGS ${ROOT}/${f} lines REGEX "^[ \t]*#[ \t]*include")
  foreach(l ${lines})
    if(l MATCHES "#[ \t]*include[ \t]*\"[^\"]*/" OR l MATCHES "#[ \t]*include[ \t]*<[^>]*\\.\\.")
      string(STRIP "${l}" l)
      string(APPEND bad "  ${f}: ${l}\n")
    endif()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "includes by path (write the header's name, e.g. #include \"kv.h\", and link "
    "the module's target; a module may link only the layers above it, base -> gguf -> kernels -> "
    "tokenizer -> kv -> model -> engine -> server):\n${bad}")
endif()
