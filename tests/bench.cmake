# `kvllm synth` and `kvllm bench`, functional only (no timing is asserted):
#   bench_synth_bench  synth tiny shapes (llama and qwen2, the f16, q8_0, q4_0
#                      and q4_k_m mixes; llama also q4_1, q5_0, q5_1 and
#                      iq4_nl), load them with info/run, run the bench with tiny
#                      sizes, --json, --batch, --context-sweep and --membw.
find_package(Python3 REQUIRED COMPONENTS Interpreter)

add_test(NAME bench_synth_bench
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/bench/check_bench.py
          ${KVLLM_BIN} ${CMAKE_CURRENT_BINARY_DIR}/bench_synth)
set_tests_properties(bench_synth_bench PROPERTIES TIMEOUT 300)
