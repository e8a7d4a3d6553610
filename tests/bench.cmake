# `kvllm synth` and `kvllm bench`, functional only (no timing is asserted):
#   bench_synth_bench  synth tiny shapes (llama and qwen2, every weight
#                      mix), load them with info/run, run the bench with tiny
#                      sizes, --json, --batch, --context-sweep and --membw.
find_package(Python3 REQUIRED COMPONENTS Interpreter)

add_test(NAME bench_synth_bench
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/bench/check_bench.py
          ${KVLLM_BIN} ${CMAKE_CURRENT_BINARY_DIR}/bench_synth)
set_tests_properties(bench_synth_bench PROPERTIES TIMEOUT 300)

# `kvllm bench` the way llama-bench runs (-o md|csv|json|jsonl|sql, -pg, -d,
# value lists and ranges) against llama-bench's own output
# (tests/data/llama_bench): fields, order, JSON types, columns, test order.
add_test(NAME bench_llama_way
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/bench/check_bench_llama.py
          ${KVLLM_BIN} ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/bench_llama)
set_tests_properties(bench_llama_way PROPERTIES TIMEOUT 300 LABELS "cli;asan_cli")
