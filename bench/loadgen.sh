#!/bin/sh
# Aggregate serving throughput at several concurrencies: starts `kvllm serve`
# on a free port, runs `kvllm loadgen` at each concurrency, prints one line per
# run (output tokens/s, TTFT/TPOT/ITL p50 and p99), stops the server.
#
#   bench/loadgen.sh [MODEL] [CONCURRENCIES] [PROMPT_TOKENS] [MAX_TOKENS]
#   bench/loadgen.sh tests/data/golden/models/llama-gqa-bpe-q8_0.gguf "1 4 16" 128 128
#
# Extra server flags can be passed in SERVE_FLAGS (e.g. SERVE_FLAGS="-t 2");
# TEMPERATURE sets the requests' sampling temperature (default 0, greedy).
set -e
cd "$(dirname "$0")/.."
BIN=${KVLLM:-build/kvllm}
MODEL=${1:-tests/data/golden/models/llama-gqa-bpe-q8_0.gguf}
CONC=${2:-"1 4 16"}
PROMPT=${3:-128}
MAXTOK=${4:-128}
. bench/serve_lib.sh
# shellcheck disable=SC2086
start_server -m "$MODEL" $SERVE_FLAGS
echo "model $MODEL, prompt $PROMPT words, $MAXTOK output tokens, $(nproc) CPUs"
for c in $CONC; do
  n=$((c * 8)); [ $n -lt 16 ] && n=16
  "$BIN" loadgen --url "$URL" --concurrency "$c" --requests "$n" \
    --prompt-tokens "$PROMPT" --max-tokens "$MAXTOK" --temperature "${TEMPERATURE:-0}" --json |
  python3 -c 'import json,sys; d=json.load(sys.stdin); print("C=%-3d requests=%-4d failed=%d  output %7.1f tok/s  %5.1f req/s  TTFT p50 %7.1f p99 %7.1f ms  TPOT p50 %6.2f p99 %6.2f ms  ITL p50 %6.2f p99 %6.2f ms" % (d["concurrency"], d["completed"], d["failed"], d["output_throughput"], d["request_throughput"], d["median_ttft_ms"], d["p99_ttft_ms"], d["median_tpot_ms"], d["p99_tpot_ms"], d["median_itl_ms"], d["p99_itl_ms"]))'
done
