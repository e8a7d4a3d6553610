#!/bin/sh
# Speculative decoding figures (README "Speculative decoding"; nothing here asserts a time).
#  (a) verify cost, measured: one forward over n = 1, 2, 4, 8 tokens of one sequence
#      (kvllm bench's prefill of n tokens: submit to first token) on the llama-3.2-1b
#      shape (kvllm synth, random weights) at Q4_K_M and Q8_0, THREADS threads;
#      the ratio t(n) / t(1) is what verifying k = n - 1 drafts costs against one token.
#  (b) acceptance and decode tokens/s with and without --spec ngram on stories260K
#      (the only trained model here), greedy, on the grounded prompts of bench/spec_prompts/
#      (retell / quote / list) and (c) open-ended: open.txt, greedy and sampled.
#  (d) calculated, and labelled so: the speed-up on the 1B shape from (a) and the
#      acceptance of (b): tokens per verification / (t(k+1) / t(1)).
# Usage: bench/spec.sh [build/kvllm]   (SYNTH_DIR=/tmp/kvllm-synth THREADS=2 REPS=5; SKIP_VERIFY=1: only (b, c))
set -eu
K=${1:-build/kvllm}
SYN=${SYNTH_DIR:-/tmp/kvllm-synth}
T=${THREADS:-2}
REPS=${REPS:-5}
OUT=${OUT:-/tmp/kvllm-spec-bench}
rm -rf "$OUT"; mkdir -p "$SYN" "$OUT"
echo "# $(date -u +%FT%TZ) $(uname -m) $(nproc) cpus, threads $T, load: $(cut -d' ' -f1-3 /proc/loadavg)"

if [ "${SKIP_VERIFY:-0}" = 0 ]; then
echo "## (a) verify cost, measured: ms per forward of n tokens (kvllm bench -p n -n 0 -r $REPS -t $T)"
for type in q4_k_m q8_0; do
    f="$SYN/llama-3.2-1b-$type.gguf"
    [ -f "$f" ] || "$K" synth --shape llama-3.2-1b --type "$type" -o "$f" -t "$T" >/dev/null
    line="$type:"
    for n in 1 2 4 8; do
        tps=$("$K" bench -m "$f" -p "$n" -n 0 -r "$REPS" -t "$T" --json --no-progress 2>/dev/null |
              python3 -c 'import json,sys; print(json.load(sys.stdin)["prefill_tokens_per_s"])')
        ms=$(python3 -c "print('%.2f' % (1000.0 * $n / $tps))")
        echo "$type $n $ms" >> "$OUT/verify.txt"
        line="$line  n=$n ${ms}ms"
    done
    echo "$line"
done
fi

run_one() { # prompt-file spec temp -> "tokens/s drafted accepted"
    "$K" run -f "$1" -n 256 -c 512 --temp "$3" -s 1 --spec "$2" --json -t "$T" 2>/dev/null | tail -1 |
        python3 -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print(s["decode_tokens_per_s"], s.get("spec_draft_tokens",0), s.get("spec_accepted_tokens",0), s["generated_tokens"])'
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "## (b, c) stories260K, measured: decode tokens/s (median of $REPS), acceptance = accepted / drafted"
for p in bench/spec_prompts/*.txt; do
    for temp in 0 0.8; do
        name=$(basename "$p" .txt)
        [ "$temp" = 0.8 ] && [ "$name" != open ] && continue
        off=$(for i in $(seq "$REPS"); do run_one "$p" off "$temp"; done | cut -d' ' -f1 | median)
        on=$(for i in $(seq "$REPS"); do run_one "$p" ngram "$temp"; done | tee "$OUT/$name.$temp.txt" | cut -d' ' -f1 | median)
        set -- $(head -1 "$OUT/$name.$temp.txt")
        echo "$name temp $temp: off $off tok/s, ngram $on tok/s (x$(python3 -c "print('%.2f' % ($on / $off))")), drafted $2 accepted $3 of $4 generated" |
            tee -a "$OUT/stories.txt"
    done
done

[ -f "$OUT/verify.txt" ] || exit 0
echo "## (d) calculated: 1B speed-up at the measured acceptance (k = 4 drafts, verify cost from (a))"
python3 - "$OUT" <<'PY'
import sys, re
out = sys.argv[1]
cost = {}
for l in open(out + "/verify.txt"):
    t, n, ms = l.split(); cost.setdefault(t, {})[int(n)] = float(ms)
for l in open(out + "/stories.txt"):
    m = re.search(r"^(\S+) temp (\S+):.*drafted (\d+) accepted (\d+) of (\d+)", l)
    if not m: continue
    name, temp, d, a, g = m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5))
    # verifications ~ generated - accepted tokens; each emits 1 + its accepted drafts
    steps = max(g - a, 1)
    per_step = g / steps
    for t, c in cost.items():
        k = min(4, max(1, round(d / steps)))  # mean drafts per step, as a verify size
        ratio = c[min([n for n in c if n >= k + 1] or [8])] / c[1]
        print("%s temp %s %s: %.2f tokens per forward, verify cost x%.2f -> speed-up x%.2f (calculated)" %
              (name, temp, t, per_step, ratio, per_step / ratio))
PY
