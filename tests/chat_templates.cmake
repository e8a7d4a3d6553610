# Jinja chat templates: `kvllm chat-template` over the vendored oracle
# (tests/data/chat-templates, copied from the shared set: 39 real templates x
# 19 conversations and their variants, as transformers' apply_chat_template
# renders them), byte for byte, refusals included. The interpreter's pieces
# are tests/unit/test_jinja.c.
add_test(NAME chat_templates
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/chat_templates.py ${KVLLM_BIN} ${KVLLM_DATA}/chat-templates -v)
set_tests_properties(chat_templates PROPERTIES TIMEOUT 600)
