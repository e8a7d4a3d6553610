# Jinja chat templates: `kvllm chat-template` over the vendored oracle
# (tests/data/chat-templates, copied from the shared set: 39 real templates x
# 19 conversations and their variants, as transformers' apply_chat_template
# renders them), byte for byte, refusals included. The interpreter's pieces
# are tests/unit/test_jinja.c.
add_test(NAME chat_templates
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/chat_templates.py ${KVLLM_BIN} ${KVLLM_DATA}/chat-templates -v)
set_tests_properties(chat_templates PROPERTIES TIMEOUT 600)
# -m: the template from a GGUF's tokenizer.chat_template, BOS/EOS from its vocabulary.
add_test(NAME chat_template_gguf
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/chat_template_gguf.py ${KVLLM_BIN}
          ${KVLLM_DATA}/tokenizer/ggml-vocab-llama3.gguf "<|begin_of_text|>" "<|end_of_text|>"
          ${CMAKE_CURRENT_BINARY_DIR}/chat_template_gguf)
