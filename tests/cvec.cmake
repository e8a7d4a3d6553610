# Control vectors: refusals of malformed files and flags, scale 0 / cancelling
# files / an empty layer range = the base model exactly, a file twice = scale 2
# (the llama.cpp goldens tests/data/golden/*-cvec* check the agreement).
add_test(NAME cvec_check
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/cvec_check.py ${KVLLM_BIN} ${KVLLM_DATA}/golden/models
          ${CMAKE_CURRENT_BINARY_DIR}/cvec_check)
set_tests_properties(cvec_check PROPERTIES LABELS golden)
