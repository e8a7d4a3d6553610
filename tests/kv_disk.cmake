# The disk tier's unit test spawns writer processes and kills them; one OpenMP
# thread each keeps the runs from spinning against each other on a busy machine.
set_tests_properties(test_kv_disk PROPERTIES ENVIRONMENT OMP_NUM_THREADS=1)
set_tests_properties(test_sched PROPERTIES ENVIRONMENT OMP_NUM_THREADS=1)
# The disk tier and priorities through `kvllm serve` (save, SIGKILL, restart, hit).
add_test(NAME server_kv_disk COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/server/test_kv_disk.py ${KVLLM_BIN}
         ${CMAKE_SOURCE_DIR})
set_tests_properties(server_kv_disk PROPERTIES TIMEOUT 120 LABELS server)
# Background reads, cancellation while reading, pins. Labelled threads as well,
# so the sanitizer pass runs it under TSan (the reader thread and the engine's).
set_tests_properties(test_kv_disk_load PROPERTIES ENVIRONMENT OMP_NUM_THREADS=1 TIMEOUT 120)
set_property(TEST test_kv_disk_load APPEND PROPERTY LABELS threads)
