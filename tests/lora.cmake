# LoRA adapters: refusals of malformed or mismatched adapter files, scale 0 =
# the base model, base + adapter = the merged weights, two adapters add up
# (the llama.cpp goldens tests/data/golden/*-lora_* check the agreement).
add_test(NAME lora_check
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/lora_check.py ${KVLLM_BIN} ${KVLLM_DATA}/golden/models
          ${CMAKE_CURRENT_BINARY_DIR}/lora_check)
set_tests_properties(lora_check PROPERTIES LABELS golden)
