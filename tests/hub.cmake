# -hf (Hugging Face downloads, src/hub) against a local stand-in for the
# Hugging Face API: the tag's file, a resumed transfer, the cache layout, the
# cache offline, a split model, a gated repository, refusals. Under ASan too
# (label asan_cli): the answers it parses are untrusted.
add_test(NAME hub_check
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/hub_check.py ${KVLLM_BIN} ${CMAKE_SOURCE_DIR}
          ${CMAKE_CURRENT_BINARY_DIR}/hub_check)
set_tests_properties(hub_check PROPERTIES TIMEOUT 300 LABELS "cli;asan_cli")
