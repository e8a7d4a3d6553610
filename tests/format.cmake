# The C sources follow .clang-format (tests/check_format.sh).
add_test(NAME format_check COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/check_format.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(format_check PROPERTIES LABELS lint SKIP_RETURN_CODE 77) # not again in the sanitizer runs

# The phase timers (src/model/model_phases.h) are a build option no test build
# turns on: their call sites are compiled here with it, warnings as errors.
add_test(NAME phase_timers_compile
         COMMAND ${CMAKE_C_COMPILER} -std=gnu11 -fsyntax-only -Wall -Wextra -Wno-unused-parameter
                 -Werror -DKVLLM_PHASE_TIMERS -I${CMAKE_SOURCE_DIR}/src/base
                 -I${CMAKE_SOURCE_DIR}/src/gguf -I${CMAKE_SOURCE_DIR}/src/kernels
                 -I${CMAKE_SOURCE_DIR}/src/kv -I${CMAKE_SOURCE_DIR}/src/model
                 ${CMAKE_SOURCE_DIR}/src/model/model_forward.c
                 ${CMAKE_SOURCE_DIR}/src/model/model_moe.c
                 ${CMAKE_SOURCE_DIR}/src/model/model_phases.c)
set_tests_properties(phase_timers_compile PROPERTIES LABELS lint)
