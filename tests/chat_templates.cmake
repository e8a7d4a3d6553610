# Jinja chat templates: `kvllm chat-template` over the vendored oracle
# (tests/data/chat-templates, copied from the shared set: 39 real templates x
# 19 conversations and their variants, as transformers' apply_chat_template
# renders them), byte for byte, refusals included. The interpreter's pieces
# are tests/unit/test_jinja.c.
add_test(NAME chat_templates
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/chat_templates.py ${KVLLM_BIN} ${KVLLM_DATA}/chat-templates -v)
set_tests_properties(chat_templates PROPERTIES TIMEOUT 600)
# The same over 20 more of llama.cpp's templates (tests/data/chat-templates-more,
# rendered by tests/chat_template_oracle.py under the same rules).
add_test(NAME chat_templates_more
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/chat_templates.py ${KVLLM_BIN} ${KVLLM_DATA}/chat-templates-more -v)
set_tests_properties(chat_templates_more PROPERTIES TIMEOUT 600)
# -m: the template from a GGUF's tokenizer.chat_template, BOS/EOS from its vocabulary.
add_test(NAME chat_template_gguf
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/chat_template_gguf.py ${KVLLM_BIN}
          ${KVLLM_DATA}/tokenizer/ggml-vocab-llama3.gguf "<|begin_of_text|>" "<|end_of_text|>"
          ${CMAKE_CURRENT_BINARY_DIR}/chat_template_gguf)

# -DKVLLM_FUZZ=ON with clang builds a libFuzzer target over the interpreter for
# local runs, e.g.  build/tests/fuzz_jinja -max_len=8192 CORPUS tests/data/chat-templates
if(KVLLM_FUZZ AND CMAKE_C_COMPILER_ID MATCHES "Clang")
  file(GLOB JINJA_FUZZ_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/tokenizer/jinja_*.c)
  add_executable(fuzz_jinja ${CMAKE_CURRENT_LIST_DIR}/fuzz/fuzz_jinja.c ${JINJA_FUZZ_SOURCES})
  target_include_directories(fuzz_jinja PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(fuzz_jinja PRIVATE -g -O1 -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_jinja PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_jinja PRIVATE PkgConfig::CJSON m)
endif()
