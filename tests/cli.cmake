# Command-line habits (tests/cli/test_cli.py): --help on every subcommand,
# `kvllm chat` / `run -cnv` over piped turns with the KV cache reused between
# them, `-f -` and `-s`.
add_test(NAME cli_habits COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_cli.py ${KVLLM_BIN} ${CMAKE_SOURCE_DIR})
set_tests_properties(cli_habits PROPERTIES TIMEOUT 300 LABELS cli)
# kvllm run-batch (vLLM's offline batch runner) against the server it runs on.
add_test(NAME cli_run_batch COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_run_batch.py ${KVLLM_BIN} ${CMAKE_SOURCE_DIR})
set_tests_properties(cli_run_batch PROPERTIES TIMEOUT 300 LABELS cli)

# kvllm chat-template --caps against llama-server's /props chat_template_caps on every vendored
# template (tests/data/llama_server/chat_template_caps.json); under ASan too (the tracked renders).
add_test(NAME cli_template_caps
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/check_template_caps.py ${KVLLM_BIN} ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_template_caps PROPERTIES TIMEOUT 300 LABELS "cli;asan_cli")
