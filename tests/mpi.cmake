# Pipeline-parallel tests (label mpi; not in the sanitizer passes, which run
# unit|golden|server): they need Open MPI's mpirun, and run only where the
# build found MPI.
if(KVLLM_HAVE_MPI AND KVLLM_MPIEXEC)
  add_executable(test_pp ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_pp.c)
  target_link_libraries(test_pp PRIVATE kvllm_engine)
  add_dependencies(test_pp kvllm_check_includes)
  file(GLOB KVLLM_PP_MODELS ${KVLLM_DATA}/golden/models/*.gguf)
  list(FILTER KVLLM_PP_MODELS EXCLUDE REGEX "vocab-")
  list(APPEND KVLLM_PP_MODELS ${CMAKE_SOURCE_DIR}/models/stories260K.gguf)
  # Root in CI: Open MPI refuses it unless told; the shared-memory transport
  # alone (no network interfaces probed) for ranks on one machine, copying
  # through the shared segment (containers often forbid cross-process reads).
  set(KVLLM_MPI_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
      OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
      OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1)
  foreach(n 2 3)
    add_test(NAME pp_models_${n}
             COMMAND ${KVLLM_MPIEXEC} --oversubscribe -np ${n} $<TARGET_FILE:test_pp> ${KVLLM_PP_MODELS}
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(pp_models_${n} PROPERTIES LABELS mpi TIMEOUT 300
                         ENVIRONMENT "${KVLLM_MPI_ENV}")
  endforeach()
  add_test(NAME pp_cli
           COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_pp_cli.py ${KVLLM_MPIEXEC} $<TARGET_FILE:kvllm>
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(pp_cli PROPERTIES LABELS mpi TIMEOUT 300 ENVIRONMENT "${KVLLM_MPI_ENV}")
  add_test(NAME pp_netns
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_pp_netns.sh ${KVLLM_MPIEXEC} $<TARGET_FILE:kvllm>
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(pp_netns PROPERTIES LABELS mpi TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endif()
