# Refuses includes that bypass the layer rule of CMakeLists.txt: a project
# header is included by its name only ("kv.h"), found through the include
# roots of the modules the target links. A path ("../engine/engine.h",
# "engine/engine.h", <../kv/kv.h>) would reach a module the target does not
# link, so it is an error here, before anything compiles.
# A module's other headers are private: only its own files (and the white-box
# unit and fuzz tests) may include them; other modules, tools and the front
# ends see the public headers listed below.
# usage: cmake -DROOT=<source dir> -P check_includes.cmake
cmake_policy(SET CMP0057 NEW)
file(GLOB_RECURSE files RELATIVE ${ROOT}
  ${ROOT}/src/*.c ${ROOT}/src/*.h ${ROOT}/tools/*.c ${ROOT}/tools/*.h
  ${ROOT}/tests/unit/*.c ${ROOT}/tests/unit/*.h ${ROOT}/tests/fuzz/*.c)
# The public headers of each module; every other header in src/<module> is private.
set(public_base      base.h kvl_buf.h kvl_pool.h units.h)
set(public_gguf      gguf.h)
set(public_kernels   kernels.h kernels_grouped.h)
set(public_tokenizer tokenizer.h chat_template.h jinja.h)
set(public_kv        kv.h kv_plan.h kv_disk.h)
set(public_model     model.h arch.h hparams.h)
set(public_engine    engine.h grammar.h sampler.h stop_match.h pp.h)
set(public_server    server.h)
set(public_hub       hub.h)
set(public_cli       cli.h)
file(GLOB headers RELATIVE ${ROOT}/src ${ROOT}/src/*/*.h)
foreach(h ${headers})
  get_filename_component(mod ${h} DIRECTORY)
  get_filename_component(name ${h} NAME)
  if(NOT name IN_LIST public_${mod})
    set(private_${name} ${mod})
  endif()
endforeach()
set(bad "")
set(leaks "")
foreach(f ${files})
  file(STRINGS ${ROOT}/${f} lines REGEX "^[ \t]*#[ \t]*include")
  foreach(l ${lines})
    if(l MATCHES "#[ \t]*include[ \t]*\"[^\"]*/" OR l MATCHES "#[ \t]*include[ \t]*<[^>]*\\.\\.")
      string(STRIP "${l}" l)
      string(APPEND bad "  ${f}: ${l}\n")
    elseif(l MATCHES "#[ \t]*include[ \t]*\"([^\"]*)\"")
      set(name ${CMAKE_MATCH_1})
      if(DEFINED private_${name} AND NOT f MATCHES "^src/${private_${name}}/" AND NOT f MATCHES "^tests/(unit|fuzz)/"
         AND NOT (private_${name} STREQUAL "cli" AND f MATCHES "^src/cli/"))
        string(STRIP "${l}" l)
        string(APPEND leaks "  ${f}: ${l} (private to src/${private_${name}})\n")
      endif()
    endif()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "includes by path (write the header's name, e.g. #include \"kv.h\", and link "
    "the module's target; a module may link only the layers above it, base -> gguf -> kernels -> "
    "tokenizer -> kv -> model -> engine -> server):\n${bad}")
endif()
if(leaks)
  message(FATAL_ERROR "private headers included from outside their module (use the module's public "
    "header, or make the header public in cmake/check_includes.cmake):\n${leaks}")
endif()
