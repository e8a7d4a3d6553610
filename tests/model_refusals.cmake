# Model files kvllm refuses with a message naming the key or tensor (mixture of
# experts, rope scaling), made by rewriting the golden models; and `kvllm info`
# on the mixture-of-experts goldens (experts, bytes read per token).
add_test(NAME model_refusals
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/model_refusals.py ${KVLLM_BIN} ${KVLLM_DATA}/golden/models
          ${CMAKE_CURRENT_BINARY_DIR}/model_refusals)
