# Command-line habits (tests/cli/test_cli.py): --help on every subcommand,
# `kvllm chat` / `run -cnv` over piped turns with the KV cache reused between
# them, `-f -` and `-s`.
add_test(NAME cli_habits COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_cli.py ${KVLLM_BIN} ${CMAKE_SOURCE_DIR})
set_tests_properties(cli_habits PROPERTIES TIMEOUT 300 LABELS cli)
# kvllm run-batch (vLLM's offline batch runner) against the server it runs on.
add_test(NAME cli_run_batch COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_run_batch.py ${KVLLM_BIN} ${CMAKE_SOURCE_DIR})
set_tests_properties(cli_run_batch PROPERTIES TIMEOUT 300 LABELS cli)
