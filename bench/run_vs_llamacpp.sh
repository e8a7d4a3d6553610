#!/usr/bin/env bash
# kvllm vs llama.cpp, side by side in one run, on the same synthetic GGUF files
# (kvllm synth: random weights, real shapes), same thread count.
#
# Builds nothing: it expects kvllm built in build/ and a llama.cpp build in
# $LLAMA_CPP_DIR (llama-batched-bench, llama-bench; see bench/README.md for how
# that build was made). For each weight mix of $SHAPE it measures
#   prefill $NPP tokens and decode $NTG tokens after it (1 sequence),
#   aggregate decode of $BATCHES sequences with $BATCH_PROMPT-token prompts,
# then stories260K prefill/decode, and prints one table with the ratio
# kvllm / llama.cpp and each engine's share of the decode roofline: bytes of
# weights read per step x steps per second / memory read bandwidth, the
# bandwidth measured in the same run by `kvllm bench --membw`.
#
# llama.cpp side: llama-batched-bench, repeated $REPS times (it has no
# repetitions of its own); llama-bench for stories260K (F32, nothing to repack).
# Both engines repack weights at load by default (llama.cpp's CPU "extra"
# buffers, kvllm's panels); LLAMA_REPACK=0 passes -nr to llama.cpp (its AMX
# repack path crashes on Intel machines with AMX; the peer figures used -nr),
# KVLLM_REPACK=0 passes --no-repack to kvllm.
#
# BEFORE=path/to/another/kvllm (optional; e.g. a build of the commit before a
# change) runs that binary too, alternating with the others, and the table
# gains its t/s, the ratio after / before and its share of the roofline.
# BEFORE_BATCH=0 runs BEFORE on the single-sequence tests only.
# SKIP_STORIES=1 leaves out stories260K.
# STEP_PROBES=1 (the default) runs kvllm's single-sequence tests with
# --membw-steps: a bandwidth probe after each timed decoding step, outside its
# time, and the table is followed by kvllm's decode share of the bandwidth
# those probes read (the same seconds as the decode; the probes at the start
# and the end may catch another minute's). STEP_PROBES=0: without.
# SYNTH_FLAGS: extra flags for `kvllm synth` when a file is missing (bench/moe.sh
# passes --repeat-rows for the 30B shape). WARM=1 reads each file once before
# its runs, so that both engines load it from the page cache.
#
# Usage: bench/run_vs_llamacpp.sh            (env: see the defaults below)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
KVLLM=${KVLLM:-$ROOT/build/kvllm}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/tmp/llama.cpp/build}
LLAMA_CPP_COMMIT=${LLAMA_CPP_COMMIT:-unknown}
SYNTH_DIR=${SYNTH_DIR:-/tmp/kvllm-synth}
OUT=${OUT:-/tmp/kvllm-vs-llamacpp-$(date +%Y%m%d-%H%M%S)}
THREADS=${THREADS:-2}
REPS=${REPS:-3}
SHAPE=${SHAPE:-llama-3.2-1b}
TYPES=${TYPES:-"f16 q8_0 q4_0 q4_k_m"}
NPP=${NPP:-512}
NTG=${NTG:-64}
BATCHES=${BATCHES:-16}
BATCH_PROMPT=${BATCH_PROMPT:-128}
BATCH_REPS=${BATCH_REPS:-1}
STORIES=${STORIES:-$ROOT/models/stories260K.gguf}
LLAMA_REPACK=${LLAMA_REPACK:-1}
KVLLM_REPACK=${KVLLM_REPACK:-1}
LLAMA_NR=; [ "$LLAMA_REPACK" = 0 ] && LLAMA_NR=-nr
KVLLM_NR=; [ "$KVLLM_REPACK" = 0 ] && KVLLM_NR=--no-repack
KVLLM_SP=; [ "${STEP_PROBES:-1}" = 1 ] && KVLLM_SP=--membw-steps
BEFORE=${BEFORE:-}
[ -z "$BEFORE" ] || [ -x "$BEFORE" ] || { echo "missing $BEFORE" >&2; exit 2; }
[ "${SKIP_STORIES:-0}" = 1 ] && STORIES=/nonexistent

LBB=$LLAMA_CPP_DIR/bin/llama-batched-bench
LB=$LLAMA_CPP_DIR/bin/llama-bench
for bin in "$KVLLM" "$LBB" "$LB"; do
    [ -x "$bin" ] || { echo "missing $bin (build kvllm / set LLAMA_CPP_DIR)" >&2; exit 2; }
done
mkdir -p "$OUT" "$SYNTH_DIR"
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

# The machine's read bandwidth, with the same thread count.
log "memory bandwidth"
"$KVLLM" bench --membw -t "$THREADS" --json > "$OUT/membw.json"

synth_file() { # shape type -> path (written once, reused by later runs)
    local f=$SYNTH_DIR/$1-$2.gguf
    if [ ! -s "$f" ]; then
        log "synth $1 $2"
        "$KVLLM" synth --shape "$1" --type "$2" -o "$f" -t "$THREADS" ${SYNTH_FLAGS:-} >&2
    fi
    echo "$f"
}

# llama-batched-bench, its jsonl result lines only. It logs them to stderr with
# the rest of its log, through an asynchronous logger that now and then loses
# the last lines at exit: a run that printed none is repeated (3 tries). The
# context is rounded up to a multiple of 256 with room to spare: it rejects
# smaller ones.
lbb() { # model npp ntg npl ctx
    for _ in 1 2 3; do
        "$LBB" -m "$1" -c $((($5 + 511) / 256 * 256)) -b 2048 -ub 512 -npp "$2" -ntg "$3" -npl "$4" \
            -t "$THREADS" $LLAMA_NR --output-format jsonl > "$OUT/llama.log.tmp" 2>&1 || true
        if grep -q '^{' "$OUT/llama.log.tmp"; then
            grep '^{' "$OUT/llama.log.tmp"
            return 0
        fi
    done
    cat "$OUT/llama.log.tmp" >&2
    return 1
}

# Repetitions alternate between the engines, so both see the same background load.
for t in $TYPES; do
    f=$(synth_file "$SHAPE" "$t")
    [ "${WARM:-0}" = 1 ] && { log "$t: reading $f into the page cache"; cat "$f" > /dev/null; }
    log "$t: single sequence (prefill $NPP, decode $NTG) x $REPS"
    : > "$OUT/llama-$t-single.jsonl"
    : > "$OUT/kvllm-$t-single.jsonl"
    : > "$OUT/before-$t-single.jsonl"
    for _ in $(seq "$REPS"); do
        lbb "$f" "$NPP" "$NTG" 1 $((NPP + NTG + 16)) >> "$OUT/llama-$t-single.jsonl"
        # -n NTG+1: the first token comes from the prefill, then NTG decoding steps as above.
        "$KVLLM" bench -m "$f" -p "$NPP" -n $((NTG + 1)) --decode-prompt "$NPP" -r 1 -t "$THREADS" \
            $KVLLM_NR $KVLLM_SP --json --no-progress >> "$OUT/kvllm-$t-single.jsonl"
        [ -z "$BEFORE" ] || "$BEFORE" bench -m "$f" -p "$NPP" -n $((NTG + 1)) --decode-prompt "$NPP" -r 1 \
            -t "$THREADS" $KVLLM_NR --json --no-progress >> "$OUT/before-$t-single.jsonl"
    done
    log "$t: batched decode ($BATCHES sequences, prompt $BATCH_PROMPT) x $BATCH_REPS"
    : > "$OUT/llama-$t-batch.jsonl"
    : > "$OUT/kvllm-$t-batch.jsonl"
    : > "$OUT/before-$t-batch.jsonl"
    maxb=$(echo "$BATCHES" | tr ',' '\n' | sort -n | tail -1)
    for _ in $(seq "$BATCH_REPS"); do
        lbb "$f" "$BATCH_PROMPT" "$NTG" "$BATCHES" $((maxb * (BATCH_PROMPT + NTG) + 16)) \
            >> "$OUT/llama-$t-batch.jsonl"
        "$KVLLM" bench -m "$f" -p 0 -n $((NTG + 1)) --decode-prompt "$BATCH_PROMPT" --batch "$BATCHES" \
            -r 1 -t "$THREADS" $KVLLM_NR --json --no-progress >> "$OUT/kvllm-$t-batch.jsonl"
        [ -z "$BEFORE" ] || [ "${BEFORE_BATCH:-1}" = 0 ] || "$BEFORE" bench -m "$f" -p 0 -n $((NTG + 1)) --decode-prompt "$BATCH_PROMPT" \
            --batch "$BATCHES" -r 1 -t "$THREADS" $KVLLM_NR --json --no-progress >> "$OUT/before-$t-batch.jsonl"
    done
done

if [ -s "$STORIES" ]; then
    log "stories260K (llama-bench -p 128 -n 64) x $REPS"
    : > "$OUT/llama-stories.jsonl"
    : > "$OUT/kvllm-stories.jsonl"
    for _ in $(seq "$REPS"); do # llama-bench prints its results on stdout
        "$LB" -m "$STORIES" -t "$THREADS" -p 128 -n 64 -r 1 -o jsonl 2> "$OUT/llama.log.tmp" \
            | grep '^{' >> "$OUT/llama-stories.jsonl"
        "$KVLLM" bench -m "$STORIES" -p 128 -n 65 --decode-prompt 1 -r 1 -t "$THREADS" --json --no-progress \
            >> "$OUT/kvllm-stories.jsonl"
    done
fi
rm -f "$OUT/llama.log.tmp"
# Bandwidth again at the end: on a shared host it swings (31-53 GB/s seen at 2
# threads); the table uses the better of the two.
log "memory bandwidth (again)"
"$KVLLM" bench --membw -t "$THREADS" --json > "$OUT/membw-end.json"

python3 "$ROOT/bench/vs_table.py" "$OUT" "$TYPES" "$SHAPE" "$LLAMA_CPP_COMMIT" "$THREADS" \
    "llama.cpp repack $([ "$LLAMA_REPACK" = 0 ] && echo off || echo on), kvllm repack $([ "$KVLLM_REPACK" = 0 ] && echo off || echo on)" \
    | tee "$OUT/table.md"
