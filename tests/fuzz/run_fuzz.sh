#!/bin/sh
# libFuzzer smoke run of the GGUF reader (the fuzz_gguf_smoke CTest).
# usage: run_fuzz.sh SRC_DIR WORK_DIR
#   KVLLM_FUZZ_SECONDS  run time (default 30)
# Exits 77 (CTest "skipped") when clang or its libFuzzer runtime is missing;
# any crash, sanitizer report, leak or timeout fails the run, and the input
# that caused it is left in WORK_DIR as crash-*/leak-*/timeout-*.
set -eu
src=$(cd "$1" && pwd)
work=$2
secs=${KVLLM_FUZZ_SECONDS:-30}
mkdir -p "$work"
work=$(cd "$work" && pwd)

. "$src/tests/fuzz/need_libfuzzer.sh"

echo "building fuzz_gguf"
clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Wall -Wextra -Wno-unused-parameter -I"$src/src/base" -I"$src/src/gguf" \
    "$src"/src/base/*.c "$src"/src/gguf/*.c "$src/tests/fuzz/fuzz_gguf.c" -lm -o "$work/fuzz_gguf"

# Seeds: the first 64 KiB of real files (headers, vocab arrays) plus the
# hand-made corrupt and valid files. Fresh every run; findings go to corpus/.
rm -rf "$work/seeds" "$work/corpus" "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*
mkdir -p "$work/seeds" "$work/corpus"
for f in "$src"/tests/data/golden/models/*.gguf "$src"/tests/data/tokenizer/*.gguf \
         "$src"/tests/data/*.gguf "$src"/models/*.gguf; do
    [ -f "$f" ] && head -c 65536 "$f" >"$work/seeds/$(basename "$f").64k"
done
if command -v python3 >/dev/null 2>&1; then
    python3 "$src/tools/make_bad_gguf.py" "$work/bad" >/dev/null
    cp "$work"/bad/*.gguf "$work/seeds/"
fi
echo "$(ls "$work/seeds" | wc -l) seed files; fuzzing for ${secs}s"

cd "$work"
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} ./fuzz_gguf \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=25 -max_len=65536 \
    -dict="$src/tests/fuzz/gguf.dict" -artifact_prefix="$work/" -print_final_stats=1 \
    "$work/corpus" "$work/seeds"
echo "fuzz_gguf: no crashes in ${secs}s"
