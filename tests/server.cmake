# Server end-to-end tests (tests/server): `kvllm serve` driven through the
# official OpenAI npm client. server_npm_install installs the pinned client
# once (a fixture); the tests SKIP (77) when it could not be installed.
set(KVLLM_SERVER_TESTS ${CMAKE_CURRENT_SOURCE_DIR}/server)

add_test(NAME server_npm_install COMMAND sh ${KVLLM_SERVER_TESTS}/install.sh)
set_tests_properties(server_npm_install PROPERTIES FIXTURES_SETUP server_npm TIMEOUT 180 LABELS server)

foreach(t api batch chat_template structured endpoints tools responses anthropic llama_api pooling vllm_params slots lora sdks connections faults tenants hostile_input web tls streams predict)
  add_test(NAME server_${t}
    COMMAND sh ${KVLLM_SERVER_TESTS}/run.sh ${KVLLM_SERVER_TESTS}/test_${t}.mjs ${KVLLM_BIN} ${CMAKE_SOURCE_DIR})
  set_tests_properties(server_${t} PROPERTIES FIXTURES_REQUIRED server_npm SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS server)
endforeach()
# Under ASan + UBSan too (make sanitize): the request paths of the OpenAI and
# llama-server APIs, whose parsers and answers are the server's largest new code.
set_property(TEST server_api server_llama_api server_pooling server_vllm_params server_slots server_streams server_predict server_lora APPEND PROPERTY LABELS asan_server)
