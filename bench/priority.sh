#!/bin/sh
# Priority scheduling under a saturating load: TTFT of high-priority requests
# while low-priority ones keep every seat and the queue full, with
# --scheduling-policy priority against fcfs, in one run on one model.
#   - low load: LOW_C client threads of long low-priority completions
#     ("priority": 10 under the priority policy; fcfs refuses a priority, so it
#     sends none there), started SETTLE seconds before the measurement;
#   - high: N short completions one after another (no priority field: 0, the
#     most urgent here), through `kvllm loadgen --json`; their TTFT p50/p95/p99.
# A low-priority request keeps its seat under fcfs; under priority a waiting
# high request is admitted first and, with every seat taken, preempts the
# newest low one (its work is recomputed later).
#   usage: bench/priority.sh [KVLLM] [MODEL] [N]   (defaults: build/kvllm models/stories260K.gguf 40)
#   env: SEATS (--max-seqs, 4), LOW_C (16), LOW_TOKENS (256), SETTLE (2), SERVE_FLAGS ("-t 1")
set -eu
cd "$(dirname "$0")/.."
BIN=${1:-build/kvllm}
MODEL=${2:-models/stories260K.gguf}
N=${3:-40}
SEATS=${SEATS:-4}
LOW_C=${LOW_C:-16}
LOW_TOKENS=${LOW_TOKENS:-256}
SETTLE=${SETTLE:-2}
. bench/serve_lib.sh
echo "model $MODEL; $SEATS seats; low load: $LOW_C clients x $LOW_TOKENS tokens; high: $N requests x 8 tokens, one at a time"
for policy in fcfs priority; do
  # shellcheck disable=SC2086
  start_server -m "$MODEL" --max-seqs "$SEATS" --max-queue 256 --scheduling-policy "$policy" ${SERVE_FLAGS:--t 1}
  prio=""
  [ "$policy" = priority ] && prio="--priority 10"
  # shellcheck disable=SC2086
  "$BIN" loadgen --url "$URL" --concurrency "$LOW_C" --requests 1000000 --prompt-tokens 64 \
    --max-tokens "$LOW_TOKENS" --seed 7 $prio >/dev/null 2>&1 &
  LOW=$!
  sleep "$SETTLE"
  "$BIN" loadgen --url "$URL" --concurrency 1 --requests "$N" --prompt-tokens 32 --max-tokens 8 \
    --seed 3 --json |
  python3 -c 'import json,sys; d=json.load(sys.stdin); p=sys.argv[1]; print("%-9s high-priority TTFT p50 %8.1f ms  p95 %8.1f ms  p99 %8.1f ms  (%d of %d ok)" % (p, d["median_ttft_ms"], d["p95_ttft_ms"], d["p99_ttft_ms"], d["completed"], d["completed"] + d["failed"]))' "$policy"
  curl -s "$URL/metrics" | sed -n 's/^kvllm:num_preemptions_total{[^}]*} /          preemptions: /p'
  kill "$LOW" 2>/dev/null || true
  wait "$LOW" 2>/dev/null || true
  kill "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
done
