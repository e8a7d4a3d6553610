#!/bin/sh
# TTFT of a 2,000-token shared prompt + a short question, three ways, in one
# run on one server: recompute (a prompt nothing caches), RAM hit (the prompt
# is in the prefix cache), disk hit (the prompt was pushed out of a pool that
# holds about one such prompt by other traffic, then read back from --kv-disk),
# plus a disk hit after a restart. Random weights of a real shape are fine for
# timing (kvllm synth). TTFT here = the latency of a max_tokens=1 completion.
#   usage: bench/disk_tier.sh [KVLLM] [SHAPE] [TYPE] [N]   (defaults: build/kvllm llama-3.2-1b q4_k_m 3)
set -eu
BIN=${1:-build/kvllm}
SHAPE=${2:-llama-3.2-1b}
TYPE=${3:-q4_k_m}
N=${4:-3}
WORK=$(mktemp -d /tmp/kvllm_disk_bench.XXXXXX)
MODEL=${MODEL:-$WORK/model.gguf}
trap 'kill $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
[ -e "$MODEL" ] || "$BIN" synth --shape "$SHAPE" --type "$TYPE" -o "$MODEL" >/dev/null
start() {
    "$BIN" serve -m "$MODEL" --port 0 -c 4096 --kv-blocks 160 --kv-disk "$WORK/tier" "$@" 2>"$WORK/log" &
    PID=$!
    while ! grep -q "listening on" "$WORK/log"; do sleep 0.2; kill -0 $PID || { cat "$WORK/log"; exit 1; }; done
    PORT=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$WORK/log")
}
measure() { # $1: label; rest: python mode
    python3 - "$PORT" "$N" "$@" <<'PY'
import json, sys, time, urllib.request
port, n, label, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
def prompt(seed, q):  # 2,000 shared ids (by seed) + an 8-token question (by q)
    x, ids = 12345 + seed * 7919, []
    for _ in range(2000):
        x = (x * 1103515245 + 12345) % 2**31
        ids.append(50 + x % 900)  # inside every vocabulary of the synth shapes
    return ids + [500 + q * 8 + k for k in range(8)]
def ttft(ids):
    body = json.dumps({"prompt": ids, "max_tokens": 1, "temperature": 0}).encode()
    t = time.time()
    r = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                                      {"Content-Type": "application/json"}), timeout=600)
    u = json.loads(r.read())["usage"]
    return time.time() - t, u["prompt_tokens_details"]
out = []
for i in range(n):
    if mode == "recompute":
        out.append(ttft(prompt(100 + i + int(time.time()) % 1000 * 10, i)))
    elif mode == "ram":
        ttft(prompt(1, 0)) if i == 0 else None
        out.append(ttft(prompt(1, i + 1)))
    elif mode == "disk":
        ttft(prompt(2, 0))
        ttft(prompt(900 + i, 0)); ttft(prompt(950 + i, 0))  # other traffic evicts prompt 2
        time.sleep(2)  # the writer finishes
        out.append(ttft(prompt(2, i + 1)))
    elif mode == "restart":
        out.append(ttft(prompt(2, 50 + i)))
ts = sorted(t for t, _ in out)
print(f"{label:10s} median {ts[len(ts)//2]*1000:8.1f} ms  (n={n}; cached/disk tokens of the first: {out[0][1]})")
PY
}
start
measure recompute recompute
measure ram ram
measure disk disk
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^kvllm:kv_disk_(hits|reads|writes|dropped)_total'
kill -TERM $PID; wait $PID || true
start
measure restart restart
