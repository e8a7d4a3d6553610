# Hostile input through the CLI: non-UTF-8 prompts (run, score, perplexity,
# tokenize) and a GGUF claiming context_length 2^32 - 1.
add_test(NAME cli_hostile_input
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/hostile/check_cli_input.py ${KVLLM_BIN} ${CMAKE_SOURCE_DIR}
          ${CMAKE_CURRENT_BINARY_DIR}/hostile)
set_tests_properties(cli_hostile_input PROPERTIES TIMEOUT 300 LABELS golden)
