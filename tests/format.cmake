# The C sources follow .clang-format (tests/check_format.sh).
add_test(NAME format_check COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/check_format.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(format_check PROPERTIES LABELS lint SKIP_RETURN_CODE 77) # not again in the sanitizer runs
