#!/bin/sh
# Soak: `kvllm serve` under steady load at about half its capacity for a while,
# its resident memory sampled throughout. Load: `kvllm loadgen` streaming
# requests (concurrency = half of --max-seqs), plus non-streaming requests and
# clients that hang up mid-request (curl -m). Prints the RSS after the warm-up,
# at the end, the growth, and the requests served.
#
#   bench/soak.sh [SECONDS] [MODEL]          (default 300 s, models/stories260K.gguf)
#
# The first tenth of the run (at least 10 s) is warm-up: allocator arenas and
# the prefix cache fill there, so growth is measured from its end.
set -e
cd "$(dirname "$0")/.."
BIN=${KVLLM:-build/kvllm}
SECS=${1:-300}
MODEL=${2:-models/stories260K.gguf}
SEQS=8
. bench/serve_lib.sh
# A pool of exactly max-seqs full contexts: every block is touched during the
# warm-up, so first touches of the pool do not show as growth later.
start_server -m "$MODEL" -c 512 --max-seqs $SEQS --kv-blocks $((SEQS * 512 / 16))
rss() { sed -n 's/VmRSS:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/$PID/status"; }
END=$(($(date +%s) + SECS))
WARM=$((SECS / 10)); [ $WARM -lt 10 ] && WARM=10

# non-streaming requests and hang-ups, in the background
(
  i=0
  while [ "$(date +%s)" -lt $END ]; do
    curl -s -o /dev/null "$URL/v1/completions" -d "{\"prompt\":\"Once upon a time $i\",\"max_tokens\":32,\"n\":2}" || true
    curl -s -o /dev/null -m 0.05 "$URL/v1/completions" -d "{\"prompt\":\"The dog $i\",\"max_tokens\":400,\"ignore_eos\":true}" || true
    i=$((i + 1))
  done
) &
SIDE=$!

total=0; rss0=""; t0=$(date +%s)
SAMPLES=$(mktemp)
while [ "$(date +%s)" -lt $END ]; do
  n=$("$BIN" loadgen --url "$URL" --concurrency $((SEQS / 2)) --requests 64 --prompt-tokens 64 \
      --shared-prefix 16 --max-tokens 64 --temperature 0.8 --json |
      python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["completed"] if d["failed"] == 0 else -1)')
  [ "$n" -ge 0 ] || { echo "loadgen: failed requests"; exit 1; }
  total=$((total + n))
  if [ -z "$rss0" ] && [ $(($(date +%s) - t0)) -ge $WARM ]; then rss0=$(rss); fi
  echo "$(($(date +%s) - t0)) $(rss)" >> "$SAMPLES"
done
wait $SIDE
rss1=$(rss)
[ -n "$rss0" ] || rss0=$rss1
python3 - "$SAMPLES" <<PY
import sys
r0, r1 = $rss0, $rss1
print(f'soak {$SECS} s ({$WARM} s warm-up): {$total} streamed requests + the non-streaming/hang-up loop; '
      f'RSS {r0} -> {r1} KiB ({100.0 * (r1 - r0) / r0:+.2f}%)')
# RSS at the end of each tenth of the run: growth that levels off is the
# allocator settling; growth that keeps its pace is a leak.
s = [tuple(map(int, l.split())) for l in open(sys.argv[1])]
marks = []
for k in range(1, 11):
    t = $SECS * k / 10
    before = [r for (ts, r) in s if ts <= t]
    if before: marks.append((int(t), before[-1]))
print('RSS KiB at each tenth: ' + ', '.join(f'{t} s {r}' for t, r in marks))
if len(marks) >= 2:
    h = marks[len(marks) // 2 - 1]
    print(f'second half: {h[1]} -> {r1} KiB ({100.0 * (r1 - h[1]) / h[1]:+.2f}%)')
PY
rm -f "$SAMPLES"
curl -s "$URL/metrics" | grep -E '^kvllm:(kv_blocks_used|client_disconnects_total|request_success_total)'
