#!/bin/sh
# Speculation against plain decoding, off / on interleaved, many times (bench/figures/spec.md;
# nothing here asserts a time). Each repetition runs every prompt with --spec off and
# with --spec ngram (adaptive), in alternating order, so that drift of a shared machine
# falls on both alike; the figure is the median, quartiles and range of the per-pair
# ratios on / off of decode tokens/s (and the median tokens/s of each side).
#  stories260K: -n N (default 2000, --ignore-eos: one story after another) on the
#    prompts PROMPTS (default: the open-ended bench/spec_prompts/open*.txt).
#  1B synth Q4_K_M (random weights, so nothing is accepted: what the fallback costs at
#    real size): -n N1B (default 256), open.txt, REPS1B times.
#  CALLGRIND=1 also counts instructions (valgrind --tool=callgrind, -t 1, -n NCG
#    (default 500)) of stories260K off / on, twice each: a count that does not depend
#    on the machine's load (the adaptive decisions still do, through the step times they
#    measure; KVLLM_SPEC_COST fixes them when set).
#  MODES (default "ngram"): the modes set against off: ngram (adaptive), fixed (--spec-fixed).
#  EOS=1: stop at the end of the story (no --ignore-eos).
# Usage: bench/spec_open.sh [build/kvllm]  (REPS=11 THREADS=2 SKIP_1B=1 OUT=/tmp/kvllm-spec-open)
set -eu
K=${1:-build/kvllm}
T=${THREADS:-2}
REPS=${REPS:-11}
REPS1B=${REPS1B:-5}
N=${N:-2000}
N1B=${N1B:-256}
NCG=${NCG:-500}
STORIES=${STORIES:-models/stories260K.gguf}
B1=${B1:-/tmp/kvllm-synth/llama-3.2-1b-q4_k_m.gguf}
PROMPTS=${PROMPTS:-$(ls bench/spec_prompts/open*.txt)}
OUT=${OUT:-/tmp/kvllm-spec-open}
rm -rf "$OUT"; mkdir -p "$OUT"
echo "# $(date -u +%FT%TZ) $(uname -m) $(nproc) cpus, threads $T, load: $(cut -d' ' -f1-3 /proc/loadavg)"

MODES=${MODES:-ngram}
IGN=--ignore-eos; [ "${EOS:-0}" = 1 ] && IGN=
one() { # model prompt-file n mode -> "tok/s drafted accepted"
    case $4 in fixed) a="--spec ngram --spec-fixed" ;; *) a="--spec $4" ;; esac
    "$K" run -m "$1" -f "$2" -n "$3" -c $(($3 + 512)) --temp 0 $IGN --json -t "$T" \
        $a 2>/dev/null | tail -1 |
        python3 -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print(s["decode_tokens_per_s"], s.get("spec_draft_tokens",0), s.get("spec_accepted_tokens",0))'
}
pairs() { # label model prompt n reps (after one run not counted: page cache, clocks)
    one "$2" "$3" "$4" off > /dev/null
    for i in $(seq "$5"); do
        if [ $((i % 2)) = 1 ]; then order="off $MODES"; else order="$MODES off"; fi
        for mode in $order; do echo "$1 $i $mode $(one "$2" "$3" "$4" "$mode")"; done
    done >> "$OUT/runs.txt"
}
for p in $PROMPTS; do
    printf '%s' "$(cat "$p")" > "$OUT/$(basename "$p")"
    pairs "stories260K:$(basename "$p" .txt):n$N" "$STORIES" "$OUT/$(basename "$p")" "$N" "$REPS"
done
if [ "${SKIP_1B:-0}" = 0 ] && [ -f "$B1" ]; then
    printf '%s' "$(cat bench/spec_prompts/open.txt)" > "$OUT/open1b.txt"
    pairs "1B-q4_k_m:open:n$N1B" "$B1" "$OUT/open1b.txt" "$N1B" "$REPS1B"
fi
echo "# end $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT/runs.txt" <<'PY'
import sys, statistics as st
runs = {}
for l in open(sys.argv[1]):
    lab, i, mode, tps, d, a = l.split()
    runs.setdefault(lab, {}).setdefault(int(i), {})[mode] = (float(tps), int(d), int(a))
def q(v, f):
    v = sorted(v); x = f * (len(v) - 1); i = int(x)
    return v[i] if i + 1 >= len(v) else v[i] + (v[i + 1] - v[i]) * (x - i)
print("| run | mode | pairs | off tok/s (median) | on tok/s (median) | on/off median | quartiles | range | drafted | accepted |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for lab, reps in runs.items():
    modes = sorted({m for i in reps for m in reps[i]} - {"off"})
    for mo in modes:
        r = [reps[i][mo][0] / reps[i]["off"][0] for i in reps if "off" in reps[i] and mo in reps[i]]
        off = st.median(reps[i]["off"][0] for i in reps); on = st.median(reps[i][mo][0] for i in reps)
        d = st.median(reps[i][mo][1] for i in reps); a = st.median(reps[i][mo][2] for i in reps)
        print("| %s | %s | %d | %.0f | %.0f | x%.3f | x%.3f-%.3f | x%.3f-%.3f | %d | %d |" %
              (lab, mo, len(r), off, on, st.median(r), q(r, .25), q(r, .75), min(r), max(r), d, a))
PY

if [ "${CALLGRIND:-0}" = 1 ]; then
    echo "## instructions (callgrind, -t 1, -n $NCG, stories260K, first prompt)"
    p=$(ls "$OUT"/open*.txt | head -1)
    for mode in off ngram off ngram; do
        valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.out" "$K" run -m "$STORIES" -f "$p" \
            -n "$NCG" -c $((NCG + 64)) --temp 0 --ignore-eos --json -t 1 --spec "$mode" \
            > "$OUT/cg.json" 2> "$OUT/cg.log"
        ir=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$OUT/cg.log")
        echo "$mode $ir $(tail -1 "$OUT/cg.json" | python3 -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print("drafted", s.get("spec_draft_tokens",0), "accepted", s.get("spec_accepted_tokens",0))')"
    done
fi
