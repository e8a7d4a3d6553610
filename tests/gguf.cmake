# GGUF reader tests beyond tests/unit/test_gguf.c:
#   gguf_bad_files_lib   generated corrupt files through the library (exact reasons)
#   gguf_bad_files_cli   the same files through `kvllm info -m`: exit 1 + message naming the file
#   gguf_split           a model split in three files (llama.cpp's gguf-split layout)
#   (both run again under ASan + UBSan in the sanitizer stage of `make test`: build-asan, label unit)
#   fuzz_gguf_smoke      libFuzzer over gguf_open_memory for KVLLM_FUZZ_SECONDS (default 30; slow)
find_package(Python3 REQUIRED COMPONENTS Interpreter)

set(GGUF_GEN ${PROJECT_SOURCE_DIR}/tools/make_bad_gguf.py)
set(GGUF_DRIVER ${CMAKE_CURRENT_LIST_DIR}/gguf_badfiles.py)

add_test(NAME gguf_bad_files_lib
  COMMAND ${Python3_EXECUTABLE} ${GGUF_DRIVER} --gen ${GGUF_GEN}
          --out ${CMAKE_CURRENT_BINARY_DIR}/gguf_bad_lib --checker $<TARGET_FILE:test_gguf>)

add_test(NAME gguf_bad_files_cli
  COMMAND ${Python3_EXECUTABLE} ${GGUF_DRIVER} --gen ${GGUF_GEN}
          --out ${CMAKE_CURRENT_BINARY_DIR}/gguf_bad_cli --bin ${KVLLM_BIN}
          --good ${PROJECT_SOURCE_DIR}/models/stories260K.gguf)
set_tests_properties(gguf_bad_files_lib gguf_bad_files_cli PROPERTIES LABELS unit)

# A model split as llama.cpp's gguf-split does (tests/gguf_split.py): loads from its
# first file with the whole file's logprobs; a damaged set is refused by name.
add_test(NAME gguf_split
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/gguf_split_check.py ${KVLLM_BIN}
          ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/gguf_split)
set_tests_properties(gguf_split PROPERTIES LABELS unit)

# Needs clang with the libFuzzer runtime (libclang-rt-14-dev); exits 77 = skipped without it.
add_test(NAME fuzz_gguf_smoke
  COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/fuzz/run_fuzz.sh ${PROJECT_SOURCE_DIR}
          ${CMAKE_CURRENT_BINARY_DIR}/fuzz_gguf)
set_tests_properties(fuzz_gguf_smoke PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS "slow;fuzz")

# -DKVLLM_FUZZ=ON with clang also builds the fuzzer as a normal target for long
# local runs, e.g.  build/tests/fuzz_gguf -dict=tests/fuzz/gguf.dict CORPUS_DIR
# It compiles the reader's sources itself so that they get coverage instrumentation.
if(KVLLM_FUZZ)
  if(CMAKE_C_COMPILER_ID MATCHES "Clang")
    file(GLOB GGUF_FUZZ_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/base/*.c
      ${PROJECT_SOURCE_DIR}/src/gguf/*.c)
    add_executable(fuzz_gguf ${CMAKE_CURRENT_LIST_DIR}/fuzz/fuzz_gguf.c ${GGUF_FUZZ_SOURCES})
    target_include_directories(fuzz_gguf PRIVATE ${PROJECT_SOURCE_DIR}/src/base ${PROJECT_SOURCE_DIR}/src/gguf)
    target_compile_options(fuzz_gguf PRIVATE -g -O1 -fsanitize=fuzzer,address,undefined)
    target_link_options(fuzz_gguf PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(fuzz_gguf PRIVATE m)
  else()
    message(WARNING "KVLLM_FUZZ needs clang (CC=clang); fuzz_gguf not built")
  endif()
endif()
