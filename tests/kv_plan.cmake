# kvllm kv-plan: CLI tests (tests/kv_plan/test_cli.py) over the hand-written
# config.json fixtures in tests/kv_plan/ and the bundled GGUFs. The library side
# is tests/unit/test_kv_plan.c.
foreach(group figures verify e2e budget errors)
  add_test(NAME kv_plan_${group}
    COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/kv_plan/test_cli.py ${KVLLM_BIN} ${CMAKE_SOURCE_DIR} ${group})
  set_tests_properties(kv_plan_${group} PROPERTIES TIMEOUT 300)
endforeach()
