# Tokenizer tests beyond tests/unit/test_tokenizer.c (which runs all vectors,
# goldens and behaviour checks):
#   tokenizer_valgrind  the same suite, without the timing check, under valgrind
#                       memcheck (leaks are errors). It uses its own build of
#                       base + gguf + tokenizer with PCRE2's JIT off, because
#                       valgrind cannot follow JIT-generated code. Slow (~1 min);
#                       only added where valgrind is installed.
find_program(VALGRIND_EXE valgrind)
if(VALGRIND_EXE)
  file(GLOB TOK_NOJIT_SOURCES CONFIGURE_DEPENDS
    ${PROJECT_SOURCE_DIR}/src/base/*.c ${PROJECT_SOURCE_DIR}/src/gguf/*.c
    ${PROJECT_SOURCE_DIR}/src/tokenizer/*.c)
  add_executable(test_tokenizer_nojit ${CMAKE_CURRENT_LIST_DIR}/unit/test_tokenizer.c
    ${TOK_NOJIT_SOURCES})
  target_compile_definitions(test_tokenizer_nojit PRIVATE KVLLM_TOK_NO_JIT)
  add_dependencies(test_tokenizer_nojit kvllm_check_includes)
  target_include_directories(test_tokenizer_nojit PRIVATE ${PROJECT_SOURCE_DIR}/src/base
    ${PROJECT_SOURCE_DIR}/src/gguf ${PROJECT_SOURCE_DIR}/src/tokenizer ${CMAKE_CURRENT_LIST_DIR}/unit)
  target_link_libraries(test_tokenizer_nojit PRIVATE PkgConfig::PCRE2 PkgConfig::CJSON
    PkgConfig::XXHASH m Threads::Threads)
  add_test(NAME tokenizer_valgrind
    COMMAND ${VALGRIND_EXE} --quiet --leak-check=full --errors-for-leak-kinds=all
            --error-exitcode=99 $<TARGET_FILE:test_tokenizer_nojit> --quick
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(tokenizer_valgrind PROPERTIES TIMEOUT 900 LABELS "slow")
endif()
