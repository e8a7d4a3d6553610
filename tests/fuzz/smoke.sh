#!/bin/sh
# libFuzzer smoke runs (the fuzz_smoke CTest): the request parser, the
# tokenizer, the Jinja interpreter and the grammar compilers, each for a few seconds from its corpus
# in tests/fuzz/corpus/<target> (Jinja: the vendored chat templates).
# usage: smoke.sh SRC_DIR WORK_DIR [TARGET...]
#   KVLLM_FUZZ_SMOKE_SECONDS  run time per target (default 4)
# Exits 77 (CTest "skipped") when clang or its libFuzzer runtime is missing;
# any crash, sanitizer report, leak or timeout fails, and the input that
# caused it is left in WORK_DIR as crash-*/leak-*/timeout-*. Each run prints
# libFuzzer's final stats (stat::number_of_executed_units, exec/s).
set -eu
src=$(cd "$1" && pwd)
work=$2
shift 2
targets=${*:-request tokenizer jinja grammar}
secs=${KVLLM_FUZZ_SMOKE_SECONDS:-4}
mkdir -p "$work"
work=$(cd "$work" && pwd)

. "$src/tests/fuzz/need_libfuzzer.sh"

# The library sources each target reaches, compiled once with the fuzzer's
# coverage and ASan + UBSan (no recovery).
cflags="-std=gnu11 -g -O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
        -Wall -Wextra -Wno-unused-parameter -DKVLLM_SRC=\"$src\""
for d in base gguf tokenizer server engine model kv kernels; do cflags="$cflags -I$src/src/$d"; done
cflags="$cflags -I$src/tests/unit" # grammar_ref.h
cflags="$cflags $(pkg-config --cflags libpcre2-8 libcjson libxxhash libmicrohttpd)"
libs="$(pkg-config --libs libpcre2-8 libcjson libxxhash libmicrohttpd) -lm -lpthread"
mkdir -p "$work/obj"
objs=""
for f in "$src"/src/base/*.c "$src"/src/gguf/*.c "$src"/src/tokenizer/*.c "$src"/src/engine/sampler.c \
         "$src"/src/engine/grammar*.c "$src"/src/engine/json_*.c \
         "$src"/src/server/srv_openai.c "$src"/src/server/srv_chat_jinja.c "$src"/src/server/srv_guard.c \
         "$src"/src/server/srv_job.c "$src"/src/server/srv_util.c "$src"/src/server/srv_json.c \
         "$src"/src/server/srv_structured.c "$src"/src/server/srv_tools.c \
         "$src"/src/server/srv_tool_calls.c "$src"/src/server/srv_tool_stream.c \
         "$src"/src/server/srv_tool_gemma.c "$src"/src/server/srv_response.c \
         "$src"/src/server/srv_responses.c "$src"/src/server/srv_responses_out.c \
         "$src"/src/server/srv_chunks.c "$src"/src/server/srv_anthropic.c \
         "$src"/src/server/srv_anthropic_out.c "$src"/src/server/srv_rstore.c \
         "$src"/src/server/srv_lora.c "$src"/src/server/srv_llama.c \
         "$src"/src/server/srv_llama_out.c "$src"/src/server/srv_infill.c \
         "$src"/src/server/srv_rerank.c "$src"/src/server/srv_streams.c; do
    o="$work/obj/$(basename "$(dirname "$f")")_$(basename "$f" .c).o"
    # shellcheck disable=SC2086
    clang $cflags -c "$f" -o "$o"
    objs="$objs $o"
done

# An archive, so each target pulls in only what it uses (the tokenizer and
# Jinja targets never reach sampler.c and the kernels it calls).
rm -f "$work/libdeps.a"
# shellcheck disable=SC2086
ar rcs "$work/libdeps.a" $objs

fail=0
for t in $targets; do
    echo "== fuzz_$t: building"
    # shellcheck disable=SC2086
    clang $cflags -fsanitize=fuzzer "$src/tests/fuzz/fuzz_$t.c" "$work/libdeps.a" $libs -o "$work/fuzz_$t"
    rm -rf "$work/corpus-$t" "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*
    mkdir -p "$work/corpus-$t"
    t_secs=$secs
    case $t in
        jinja) seeds="$src/tests/data/chat-templates"; opts="-max_len=8192" ;;
        # loading its four vocabularies (Llama 3's 128K tokens) under ASan takes seconds
        tokenizer) seeds="$src/tests/fuzz/corpus/$t"; opts="-max_len=4096"; t_secs=$((secs * 3)) ;;
        *) seeds="$src/tests/fuzz/corpus/$t"; opts="-max_len=4096" ;;
    esac
    echo "== fuzz_$t: ${t_secs}s from $seeds"
    cd "$work"
    if ! ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "./fuzz_$t" -max_total_time="$t_secs" -rss_limit_mb=2048 \
            -timeout=20 $opts -artifact_prefix="$work/" -print_final_stats=1 "$work/corpus-$t" "$seeds" \
            >"$work/fuzz_$t.log" 2>&1; then
        tail -n 40 "$work/fuzz_$t.log"
        echo "fuzz_$t: FAILED (see $work/fuzz_$t.log and $work/crash-*)"
        fail=1
    fi
    grep -E 'stat::number_of_executed_units|stat::average_exec_per_sec|DONE' "$work/fuzz_$t.log" || true
done
exit $fail
