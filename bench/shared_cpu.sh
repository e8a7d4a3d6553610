#!/usr/bin/env bash
# Decode speed when the CPU is shared: single-sequence decode tokens/s of two
# kvllm builds (BEFORE, AFTER) and, when present, llama.cpp's llama-bench, each
# on an otherwise idle machine ("quiet") and next to one CPU-bound process
# ("busy": a shell loop pinned to nothing, started before and killed after
# each measurement), all in one run so the figures share the machine's state.
# Measurements alternate between engines so slow drift hits all alike.
#
# Builds nothing. Needs the synthetic model (kvllm synth --shape llama-3.2-1b
# --type q4_k_m -o "$MODEL"; made here when missing, with AFTER).
#
# Usage: bench/shared_cpu.sh      (env: see the defaults below)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
AFTER=${AFTER:-$ROOT/build/kvllm}
BEFORE=${BEFORE:-}                 # another kvllm binary to compare with (optional)
LLAMA_BENCH=${LLAMA_BENCH:-/tmp/llama.cpp/build/bin/llama-bench}
MODEL=${MODEL:-/tmp/kvllm-synth/llama-3.2-1b-q4_k_m.gguf}
THREADS=${THREADS:-2}
NTG=${NTG:-32}                     # tokens decoded per repetition
REPS=${REPS:-2}
COMPETITORS=${COMPETITORS:-1}      # CPU-bound loops in the busy runs

[ -f "$MODEL" ] || { mkdir -p "$(dirname "$MODEL")"; "$AFTER" synth --shape llama-3.2-1b --type q4_k_m -o "$MODEL"; }

loops=()
stop_loops() { for p in "${loops[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; loops=(); }
trap stop_loops EXIT
start_loops() { for ((i = 0; i < COMPETITORS; i++)); do sh -c 'while :; do :; done' & loops+=($!); done; sleep 1; }

kvllm_tps() { # binary -> decode tokens/s
    "$1" bench -m "$MODEL" -t "$THREADS" -p 0 -n "$NTG" -r "$REPS" --json --no-progress 2>/dev/null |
        python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["decode_tokens_per_s"])'
}
llama_tps() {
    "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -p 0 -n "$NTG" -r "$REPS" -o json 2>/dev/null |
        python3 -c 'import json,sys; print("%.2f" % [r for r in json.load(sys.stdin) if r["n_gen"] > 0][0]["avg_ts"])'
}

engines=()
[ -n "$BEFORE" ] && engines+=("before:$BEFORE")
engines+=("after:$AFTER")
[ -x "$LLAMA_BENCH" ] && engines+=("llama.cpp:$LLAMA_BENCH")

declare -A quiet busy
echo "date $(date -u +%FT%TZ), load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs, $THREADS threads"
echo "model $MODEL, tg$NTG x $REPS reps, $COMPETITORS competing loop(s) when busy"
for cond in quiet busy; do
    for e in "${engines[@]}"; do
        name=${e%%:*} bin=${e#*:}
        [ "$cond" = busy ] && start_loops
        if [ "$name" = llama.cpp ]; then v=$(llama_tps || echo nan); else v=$(kvllm_tps "$bin" || echo nan); fi
        stop_loops
        if [ "$cond" = quiet ]; then quiet[$name]=$v; else busy[$name]=$v; fi
        echo "  $cond $name: $v t/s"
    done
done
printf '\n| engine | quiet t/s | busy t/s ($COMPETITORS competing loop) | busy / quiet |\n|---|---:|---:|---:|\n'
for e in "${engines[@]}"; do
    name=${e%%:*}
    python3 -c "import sys; q, b = float(sys.argv[2]), float(sys.argv[3]); print('| %s | %.2f | %.2f | %.0f%% |' % (sys.argv[1], q, b, 100 * b / q if q else 0))" \
        "$name" "${quiet[$name]}" "${busy[$name]}"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
