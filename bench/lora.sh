#!/bin/sh
# What a LoRA adapter costs (README "LoRA adapters"; nothing here asserts a time): kvllm bench
# on MODEL without and with a random rank-RANK F16 adapter on every attention and FFN
# projection (tests/golden/make_golden.py's write_lora, alpha 2 x RANK), alternating, REPS
# rounds: prefill NPP tokens, decode after 512, and a BATCH-sequence aggregate. Prints one
# JSON line per run and the ratios of each round.
# Usage: MODEL=/path/llama-3.2-1b-q4_k_m.gguf bench/lora.sh [build/kvllm]
#   (RANK=16 REPS=2 NPP=512 BATCH=16 THREADS=2; ADAPTER=FILE: use that adapter instead)
set -eu
K=${1:-build/kvllm}
: "${MODEL:?set MODEL to a GGUF (kvllm synth --shape llama-3.2-1b --type q4_k_m -o ...)}"
RANK=${RANK:-16}
REPS=${REPS:-2}
NPP=${NPP:-512}
BATCH=${BATCH:-16}
T=${THREADS:-2}
HERE=$(cd "$(dirname "$0")/.." && pwd)
ADAPTER=${ADAPTER:-${MODEL%.gguf}-lora-r$RANK-f16.gguf}
if [ ! -f "$ADAPTER" ]; then
    python3 -c "import sys; sys.path.insert(0, '$HERE/tests/golden'); import make_golden as g; \
g.write_lora('$MODEL', '$ADAPTER', 'f16', rank=$RANK, alpha=2 * $RANK, seed=1)"
fi
echo "# $(date -u +%FT%TZ) kvllm $(git -C "$HERE" rev-parse --short HEAD) $K, model $MODEL, adapter $ADAPTER (rank $RANK)"
run() {
    "$K" bench -m "$MODEL" -p "$NPP" -n 65 --decode-prompt 512 -r 2 -t "$T" --batch "1,$BATCH" --json \
        --no-progress "$@" 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
b = {x['batch']: x['decode_tokens_per_s'] for x in d['batches']}
print(json.dumps({'prefill': round(d['prefill_tokens_per_s'], 1), 'decode': round(d['decode_tokens_per_s'], 2),
                  'batch$BATCH': round(b[$BATCH], 1)}))"
}
for r in $(seq "$REPS"); do
    base=$(run)
    lora=$(run --lora "$ADAPTER")
    echo "round $r base $base"
    echo "round $r lora $lora"
    python3 -c "
import json
b, l = json.loads('$base'), json.loads('$lora')
print('round $r lora / base: ' + ', '.join(f'{k} {l[k] / b[k]:.3f}' for k in b))"
done
