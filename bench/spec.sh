#!/bin/sh
# Speculative decoding figures (README "Speculative decoding"; nothing here asserts a time).
#  (a) verify cost, measured: one forward over n = 1, 2, 4, 8 tokens of one sequence
#      (kvllm bench's prefill of n tokens: submit to first token) on the llama-3.2-1b
#      shape (kvllm synth, random weights) at Q4_K_M and Q8_0, THREADS threads;
#      the ratio t(n) / t(1) is what verifying k = n - 1 drafts costs against one token.
#  (b) stories260K (the only trained model here), greedy, measured: decode tokens/s
#      without speculation, with --spec ngram (adaptive: as many drafts as pay) and with
#      --spec-fixed (always --spec-k), and acceptance, on the prompts of bench/spec_prompts/
#      (grounded: list, song, knock, which stories260K copies, and retell, quote, repeat,
#      which it does not; open-ended: open, open2, open3); beside llama.cpp on the same
#      prompts (llama-simple: plain decoding; llama-lookup: its prompt lookup, k = 4).
#      Prompts are given without their final newline (llama.cpp strips it).
#  (c) draft model = stories260K itself (every draft accepted: what the machinery costs),
#      kvllm --model-draft against llama-speculative -md, list prompt, k = 4.
#  (d) calculated, and labelled so: the speed-up on the 1B shape. The drafting decisions
#      are the ones kvllm makes with the 1B verify costs of (a) (KVLLM_SPEC_COST fixes its
#      cost table), the acceptance is stories260K's under those decisions, and the time
#      is the sum of (a)'s verify costs over the steps.
#  (e) 1B end to end, measured: decode tokens/s off and --spec ngram on the 1B synth,
#      open prompt. Its weights are random: it copies nothing, so this measures what the
#      fallback (adaptive drafting that finds nothing pays) costs at real size.
# Usage: bench/spec.sh [build/kvllm]
#   (SYNTH_DIR=/tmp/kvllm-synth THREADS=2 REPS=5 LLAMA_BIN=/tmp/llama.cpp/build/bin;
#    SKIP_VERIFY=1: only (b, c); SKIP_1B=1: no (e); SKIP_LLAMA=1: no llama.cpp runs)
set -eu
K=${1:-build/kvllm}
SYN=${SYNTH_DIR:-/tmp/kvllm-synth}
T=${THREADS:-2}
REPS=${REPS:-5}
LB=${LLAMA_BIN:-/tmp/llama.cpp/build/bin}
STORIES=${STORIES:-models/stories260K.gguf}
OUT=${OUT:-/tmp/kvllm-spec-bench}
rm -rf "$OUT"; mkdir -p "$SYN" "$OUT"
echo "# $(date -u +%FT%TZ) $(uname -m) $(nproc) cpus, threads $T, load: $(cut -d' ' -f1-3 /proc/loadavg)"
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

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

for p in bench/spec_prompts/*.txt; do printf '%s' "$(cat "$p")" > "$OUT/$(basename "$p")"; done

run_one() { # prompt-file model extra-args... -> "tokens/s drafted accepted generated verifications"
    f=$1 m=$2; shift 2
    "$K" run -m "$m" -f "$f" -n 256 -c 512 --temp 0 -s 1 --json -t "$T" "$@" 2>/dev/null | tail -1 |
        python3 -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print(s["decode_tokens_per_s"], s.get("spec_draft_tokens",0), s.get("spec_accepted_tokens",0), s["generated_tokens"], s.get("spec_drafts",0))'
}
llama_speed() { # log -> decode tokens/s of a llama.cpp example's "decoded N tokens in S s, speed: X t/s"
    sed -n 's/.*decoded *[0-9]* tokens in .* speed: *\([0-9.]*\) t\/s.*/\1/p' "$1" | tail -1
}

echo "## (b) stories260K, greedy, measured: decode tokens/s (median of $REPS); acceptance = accepted / drafted"
for p in "$OUT"/*.txt; do
    name=$(basename "$p" .txt)
    case $name in verify|stories|calc) continue ;; esac
    for mode in off ngram fixed; do
        case $mode in off) a="--spec off" ;; ngram) a="--spec ngram" ;; fixed) a="--spec ngram --spec-fixed" ;; esac
        for i in $(seq "$REPS"); do run_one "$p" "$STORIES" $a; done > "$OUT/$name.$mode.runs"
        v=$(cut -d' ' -f1 "$OUT/$name.$mode.runs" | median)
        set -- $(head -1 "$OUT/$name.$mode.runs")
        echo "$name $mode $v $2 $3 $4 $5" >> "$OUT/stories.txt"
    done
    if [ -x "$LB/llama-simple" ] && [ "${SKIP_LLAMA:-0}" = 0 ]; then
        for i in $(seq "$REPS"); do
            "$LB/llama-simple" -m "$STORIES" -n 256 "$(cat "$p")" > "$OUT/ls.log" 2>&1 || true
            llama_speed "$OUT/ls.log"
        done | median > "$OUT/$name.llama_plain"
        for i in $(seq "$REPS"); do
            "$LB/llama-lookup" -m "$STORIES" -f "$p" -n 256 -c 512 --temp 0 -t "$T" --spec-draft-n-max 4 > "$OUT/ll.log" 2>&1 || true
            llama_speed "$OUT/ll.log"
        done | median > "$OUT/$name.llama_lookup"
        dr=$(sed -n 's/.*n_drafted *= *\([0-9]*\).*/\1/p' "$OUT/ll.log" | tail -1)
        ac=$(sed -n 's/.*n_accept *= *\([0-9]*\).*/\1/p' "$OUT/ll.log" | tail -1)
        lp=$(cat "$OUT/$name.llama_plain") lk=$(cat "$OUT/$name.llama_lookup")
        echo "$name llama_plain ${lp:-nan} 0 0 256 0" >> "$OUT/stories.txt"
        echo "$name llama_lookup ${lk:-nan} ${dr:-0} ${ac:-0} 256 0" >> "$OUT/stories.txt"
    fi
done
python3 - "$OUT/stories.txt" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
base = {}
for r in rows:
    if r[1] in ("off", "llama_plain"): base[(r[0], r[1])] = float(r[2])
print("| prompt | engine, mode | decode tok/s | vs its plain | drafted | accepted | acceptance |")
print("|---|---|---:|---:|---:|---:|---:|")
for name, mode, tps, d, a, g, v in rows:
    plain = base.get((name, "llama_plain" if mode.startswith("llama") else "off"), 0)
    eng = "llama.cpp " + mode[6:] if mode.startswith("llama") else "kvllm " + mode
    acc = "%.0f%%" % (100.0 * int(a) / int(d)) if int(d) else "-"
    print("| %s | %s | %.0f | x%.2f | %s | %s | %s |" % (name, eng, float(tps), float(tps) / plain if plain else 0, d, a, acc))
PY

echo "## (c) draft model = stories260K itself, list prompt, k = 4 (measured, median of $REPS)"
for i in $(seq "$REPS"); do run_one "$OUT/list.txt" "$STORIES" --model-draft "$STORIES" --spec-fixed; done > "$OUT/draft.runs"
set -- $(head -1 "$OUT/draft.runs")
echo "kvllm --model-draft: $(cut -d' ' -f1 "$OUT/draft.runs" | median) tok/s, drafted $2 accepted $3"
if [ -x "$LB/llama-speculative" ] && [ "${SKIP_LLAMA:-0}" = 0 ]; then
    for i in $(seq "$REPS"); do
        "$LB/llama-speculative" -m "$STORIES" -md "$STORIES" -f "$OUT/list.txt" -n 256 -c 512 --temp 0 -t "$T" --spec-draft-n-max 4 > "$OUT/sp.log" 2>&1 || true
        llama_speed "$OUT/sp.log"
    done | median > "$OUT/llama_spec"
    echo "llama-speculative -md: $(cat "$OUT/llama_spec") tok/s, drafted $(sed -n 's/.*n_drafted *= *\([0-9]*\).*/\1/p' "$OUT/sp.log" | tail -1) accepted $(sed -n 's/.*n_accept *= *\([0-9]*\).*/\1/p' "$OUT/sp.log" | tail -1)"
fi

if [ -f "$OUT/verify.txt" ]; then
echo "## (d) calculated: 1B speed-up = 1B verify costs of (a) summed over the steps kvllm takes on stories260K when it decides with those costs"
for type in q4_k_m q8_0; do
    cost=$(awk -v t=$type '$1 == t {printf "%s%s:%s", s, $2, $3; s=","}' "$OUT/verify.txt")
    for p in "$OUT"/*.txt; do
        name=$(basename "$p" .txt)
        case $name in verify|stories|calc) continue ;; esac
        echo "$type $name $(KVLLM_SPEC_COST=$cost run_one "$p" "$STORIES" --spec ngram)" >> "$OUT/calc.txt"
    done
done
python3 - "$OUT" <<'PY'
import sys
out = sys.argv[1]
cost = {}
for l in open(out + "/verify.txt"):
    t, n, ms = l.split(); cost.setdefault(t, {})[int(n)] = float(ms)
def c(t, n):
    tab = cost[t]; ks = sorted(tab)
    if n in tab: return tab[n]
    for a, b in zip(ks, ks[1:]):
        if a < n < b: return tab[a] + (tab[b] - tab[a]) * (n - a) / (b - a)
    return tab[ks[-1]] * n / ks[-1]
for l in open(out + "/calc.txt"):
    t, name, tps, d, a, g, v = l.split()
    d, a, g, v = int(d), int(a), int(g), int(v)
    steps = g - a                      # each step emits 1 + its accepted drafts
    k = d / v if v else 0              # mean drafts of a step with drafts
    time = (steps - v) * c(t, 1) + v * c(t, 1 + k)
    print("%s %-6s drafted %4d accepted %4d (%3.0f%%) in %3d of %3d steps: %.2f tokens/step -> x%.2f (calculated)" %
          (t, name, d, a, 100.0 * a / d if d else 0, v, steps, g / steps, g * c(t, 1) / time))
PY
fi

if [ "${SKIP_1B:-0}" = 0 ]; then
echo "## (e) 1B synth Q4_K_M end to end, open prompt, 64 tokens: decode tok/s (median of 3; random weights: nothing is accepted)"
f="$SYN/llama-3.2-1b-q4_k_m.gguf"
for mode in off ngram; do
    v=$(for i in 1 2 3; do "$K" run -m "$f" -f "$OUT/open.txt" -n 64 -c 256 --temp 0 --json -t "$T" --spec $mode 2>/dev/null | tail -1 |
        python3 -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print(s["decode_tokens_per_s"], s.get("spec_draft_tokens",0))'; done | sort -g | awk '{a[NR]=$0} END {print a[2]}')
    echo "1B q4_k_m $mode: $v (tok/s, drafted)"
done
fi
