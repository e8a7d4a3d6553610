# Goldens from llama.cpp (tests/data/golden): one test per model directory. The
# ASan + UBSan build runs them with --sanitizer (check_golden.py: fewer CLI
# tokenize processes; test_tokenizer checks every case there).
file(GLOB KVLLM_GOLDEN_DIRS LIST_DIRECTORIES true ${KVLLM_DATA}/golden/*)
set(KVLLM_GOLDEN_FLAGS "")
if(KVLLM_SANITIZE)
  set(KVLLM_GOLDEN_FLAGS --sanitizer)
endif()
foreach(d ${KVLLM_GOLDEN_DIRS})
  if(IS_DIRECTORY ${d} AND EXISTS ${d}/meta.json)
    get_filename_component(name ${d} NAME)
    add_test(NAME golden_${name}
      COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/golden/check_golden.py ${KVLLM_BIN} ${KVLLM_DATA}/golden ${name}
              ${KVLLM_GOLDEN_FLAGS})
    set_tests_properties(golden_${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS golden)
  endif()
endforeach()

# stories260K: greedy from BOS must reproduce the independent fp64 reference exactly.
add_test(NAME stories260K_greedy256
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/golden/check_stories.py ${KVLLM_BIN}
          ${CMAKE_SOURCE_DIR}/models/stories260K.gguf ${KVLLM_DATA}/stories260K.greedy256.txt)
set_tests_properties(stories260K_greedy256 PROPERTIES LABELS golden)

# phi3's LongRoPE factors chosen by llama.cpp's rounded context per sequence.
add_test(NAME golden_phi3_longrope_ctx
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/golden/check_longrope_ctx.py ${KVLLM_BIN} ${KVLLM_DATA}/golden)
set_tests_properties(golden_phi3_longrope_ctx PROPERTIES LABELS golden)
