# libFuzzer smoke runs in every `ctest`: the request parser (JSON body -> job),
# the tokenizer (encode/decode round trips, SPM and BPE) and the Jinja
# interpreter, a few seconds each from the corpora in tests/fuzz/corpus and
# the vendored chat templates (tests/fuzz/smoke.sh; skipped without clang's
# libFuzzer). The GGUF reader's longer run is fuzz_gguf_smoke (tests/gguf.cmake).
add_test(NAME fuzz_smoke
  COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/fuzz/smoke.sh ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/fuzz_smoke)
set_tests_properties(fuzz_smoke PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS fuzz)
