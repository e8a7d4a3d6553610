#!/bin/sh
# Pipeline parallelism (--pp) on one machine: what the split costs and saves.
#   1. peak RSS of each rank against one process (weights + KV + scratch);
#   2. decode (batch 1) and 16-stream throughput: 2 ranks x 1 thread against
#      1 process x 2 threads (the same cores), with two step groups in flight
#      (the default with --pp 2) and with one (--pp-groups 1: each step waits
#      for its logits); then 2 ranks x 2 threads unbound (each rank may use
#      both cores while the other waits), with the thread pool's idle spin
#      as is and cut to 20 us;
#   3. hidden-state bytes sent per token between the ranks, measured, against
#      n_embd x 4 bytes (one boundary);
#   4. the planner for a 70B model on 4 hosts of 32 GiB.
# Take a quiet window first (timings). Usage: bench/pp.sh [MODEL] (default: the
# synthetic Llama 3.2 1B Q4_K_M); KV=path/to/kvllm.
set -e
MODEL=${1:-/tmp/kvllm-synth/llama-3.2-1b-q4_k_m.gguf}
KV=${KV:-build/kvllm}
BENCH_ARGS=${BENCH_ARGS:-"-p 128 -n 32 -r 3 --batch 1,16 -c 1024 --no-progress"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "== model: $MODEL"
"$KV" info -m "$MODEL" 2>/dev/null | grep -E "^(arch|layers|embedding|params|file)" || true
E=$("$KV" info -m "$MODEL" --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["n_embd"])')

echo "== 1 process x 2 threads"
/usr/bin/time -f "one process: peak RSS %M KiB" "$KV" bench -m "$MODEL" $BENCH_ARGS -t 2 2>&1 |
    grep -E "^\||peak RSS"

echo "== 2 ranks x 1 thread (--pp 2: two step groups in flight)"
# each rank under time(1), labelled with its rank
cat > "$TMP/timed" <<SH
#!/bin/sh
exec /usr/bin/time -o "$TMP/rss.\$OMPI_COMM_WORLD_RANK" -f "rank \$OMPI_COMM_WORLD_RANK: peak RSS %M KiB" "\$@"
SH
chmod +x "$TMP/timed"
mpirun --oversubscribe -np 2 -x KVLLM_PP_STATS=1 \
    "$TMP/timed" "$KV" bench -m "$MODEL" $BENCH_ARGS -t 1 --pp 2 > "$TMP/pp.txt" 2>&1
grep -E "^\||pipeline of|rank [0-9]:" "$TMP/pp.txt"
cat "$TMP/rss.0" "$TMP/rss.1"

echo "== 2 ranks x 1 thread, one step at a time (--pp 2 --pp-groups 1)"
mpirun --oversubscribe -np 2 "$KV" bench -m "$MODEL" $BENCH_ARGS -t 1 --pp 2 --pp-groups 1 2>&1 |
    grep -E "^\|"

# mpirun binds each rank to one core by default: threads of a rank beyond
# the first would share it; unbound, a rank's threads use both cores while
# the other rank waits (its MPI waits sleep 20 us between polls; its idle
# pool threads spin up to 1 ms, yielding, before they sleep)
echo "== 2 ranks x 2 threads, unbound (mpirun --bind-to none, --pp 2 -t 2)"
mpirun --oversubscribe --bind-to none -np 2 "$KV" bench -m "$MODEL" $BENCH_ARGS -t 2 --pp 2 2>&1 |
    grep -E "^\|"
echo "== the same, idle pool threads sleep after 20 us (KVLLM_POOL_SPIN_US=20)"
mpirun --oversubscribe --bind-to none -np 2 -x KVLLM_POOL_SPIN_US=20 "$KV" bench -m "$MODEL" \
    $BENCH_ARGS -t 2 --pp 2 2>&1 | grep -E "^\|"

echo "== bytes per token between the ranks"
python3 - "$TMP/pp.txt" "$E" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
E = int(sys.argv[2])
m = re.search(r"rank 0: (\d+) steps, (\d+) tokens, sent (\d+) hidden", text)
steps, tokens, sent = map(int, m.groups())
print(f"rank 0 -> rank 1: {sent} bytes for {tokens} tokens = {sent / tokens:.1f} bytes/token;"
      f" calculated n_embd x 4 = {E} x 4 = {4 * E} bytes/token")
PY

echo "== planner: Llama 3 70B (Q4_K_M, 42.5 GB of weights) on 4 hosts of 32 GiB, 8 x 8192 tokens"
"$KV" kv-plan --config tests/kv_plan/llama-3-70b.json --context 8192 --concurrency 8 \
    --weights-bytes 42.5GB --budget 32GiB --pp 4 | sed -n '/^pipeline/,$p'
echo "   and in one host of 32 GiB:"
"$KV" kv-plan --config tests/kv_plan/llama-3-70b.json --context 8192 --concurrency 8 \
    --weights-bytes 42.5GB --budget 32GiB | grep -iE "fits|budget|max" | head -4
