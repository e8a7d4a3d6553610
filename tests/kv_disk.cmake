# The disk tier's unit test spawns writer processes and kills them; one OpenMP
# thread each keeps the runs from spinning against each other on a busy machine.
set_tests_properties(test_kv_disk PROPERTIES ENVIRONMENT OMP_NUM_THREADS=1)
set_tests_properties(test_sched PROPERTIES ENVIRONMENT OMP_NUM_THREADS=1)
