#!/bin/bash
# Speculation against plain decoding in CPU time, for a machine that is not quiet
# (bench/figures/spec.md): per prompt and binary, `perf stat -e task-clock` of
# `kvllm run -t 1` with --spec off, --spec ngram (adaptive) and --spec ngram --spec-fixed,
# median of REPS, less the median of the same run with -n 1 (load and prefill). CPU time
# does not count the time the process was descheduled, so a loaded machine moves it far
# less than wall-clock tokens/s (cache sharing still can). Prints decode ms and the counts.
# Usage: bench/spec_cpu.sh KVLLM... (PROMPTS="list song knock" N=256 REPS=7 MODES="off ngram fixed"
#        EXTRA="" (e.g. "--ignore-eos"), MODEL=models/stories260K.gguf)
set -eu
PROMPTS=${PROMPTS:-list song knock}
N=${N:-256}
R=${REPS:-7}
MODES=${MODES:-off ngram fixed}
EXTRA=${EXTRA:-}
MODEL=${MODEL:-models/stories260K.gguf}
C=$((N + 512))
tc() { perf stat -x, -e task-clock "$@" 2>&1 >/dev/null | awk -F, '/task-clock/ {print $1}'; }
med() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
T=$(mktemp -d)
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg); -n $N -t 1, median of $R"
echo "prompt binary mode decode_ms generated drafted accepted"
for p in $PROMPTS; do
    printf '%s' "$(cat "bench/spec_prompts/$p.txt")" > "$T/$p.txt"
    for K in "$@"; do
        base=$(for i in $(seq "$R"); do
            tc "$K" run -m "$MODEL" -f "$T/$p.txt" -n 1 -c $C --temp 0 $EXTRA -t 1 --spec off
        done | med)
        for s in $MODES; do
            case $s in fixed) a="--spec ngram --spec-fixed" ;; *) a="--spec $s" ;; esac
            cnt=$("$K" run -m "$MODEL" -f "$T/$p.txt" -n "$N" -c $C --temp 0 $EXTRA -t 1 $a \
                --json 2>/dev/null | tail -1 | python3 -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print(s["generated_tokens"], s.get("spec_draft_tokens",0), s.get("spec_accepted_tokens",0))')
            t=$(for i in $(seq "$R"); do
                tc "$K" run -m "$MODEL" -f "$T/$p.txt" -n "$N" -c $C --temp 0 $EXTRA -t 1 $a
            done | med)
            echo "$p $K $s $(awk -v a="$t" -v b="$base" 'BEGIN {printf "%.2f", a - b}') $cnt"
        done
    done
done
rm -rf "$T"
