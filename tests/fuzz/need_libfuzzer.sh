# Sourced by run_fuzz.sh and smoke.sh with $work set: exits 77 (CTest
# "skipped") when clang or its libFuzzer runtime is missing.
if ! command -v clang >/dev/null 2>&1; then
    echo "SKIP: clang not found (install clang libclang-rt-14-dev, e.g. make deps)"
    exit 77
fi
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }\n' >"$work/probe.c"
if ! clang -fsanitize=fuzzer "$work/probe.c" -o "$work/probe" >"$work/probe.log" 2>&1; then
    echo "SKIP: clang cannot link libFuzzer (install libclang-rt-14-dev):"
    cat "$work/probe.log"
    exit 77
fi
