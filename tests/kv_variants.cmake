# KV variants: sliding-window memory, quantized KV size and quality.
add_test(NAME kv_variants
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/kv_variants/check_kv_variants.py ${KVLLM_BIN} ${CMAKE_SOURCE_DIR})
set_tests_properties(kv_variants PROPERTIES TIMEOUT 300)
