#!/usr/bin/env python3
"""Multi-turn chat against a pool that holds only some conversations: prompt
tokens recomputed (prompt - cached) with and without the --kv-disk tier.
C conversations x T turns, round-robin; each turn's prompt is the previous
prompt + the reply + a new user message of U token ids. The pool holds about
H conversations at their final length. Counts, not timing: any model works.
usage: disk_tier_multiturn.py KVLLM MODEL [C T H U]   (defaults 50 20 10 24)"""
import json, re, shutil, subprocess, sys, tempfile, urllib.request

BIN, MODEL = sys.argv[1], sys.argv[2]
C, T, H, U = (int(x) for x in (sys.argv[3:7] if len(sys.argv) >= 7 else (50, 20, 10, 24)))
GEN, BS = 8, 16


def run(disk):
    final = T * (U + GEN)
    blocks = H * (final // BS + 2)
    args = [BIN, "serve", "-m", MODEL, "--port", "0", "-c", str(final + 64), "--kv-blocks", str(blocks)]
    d = tempfile.mkdtemp(prefix="kvllm_mt_")
    if disk:
        args += ["--kv-disk", d]
    p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    port = None
    for line in p.stderr:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    convs = [[] for _ in range(C)]
    total = recomputed = 0
    for t in range(T):
        for c in range(C):
            convs[c] += [50 + (c * 131 + t * 17 + k * 7) % 900 for k in range(U)]
            body = json.dumps({"prompt": convs[c], "max_tokens": GEN, "temperature": 0,
                               "ignore_eos": True, "return_tokens_as_token_ids": False}).encode()
            r = json.loads(urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})).read())
            u = r["usage"]
            total += u["prompt_tokens"]
            recomputed += u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"]
            convs[c] += [50 + (c * 7 + t * 3 + k) % 900 for k in range(GEN)]  # the "reply" as ids
    m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    tier = " ".join(f"{k}={v}" for k, v in re.findall(r"^kvllm:kv_disk_(\w+?)(?:_total)?\{[^}]*\} (\S+)", m, re.M))
    p.terminate()
    p.wait()
    shutil.rmtree(d, ignore_errors=True)
    return total, recomputed, tier


for disk in (False, True):
    total, rec, tier = run(disk)
    print(f"{'with' if disk else 'without'} the disk tier: {rec} of {total} prompt tokens recomputed "
          f"({100.0 * rec / total:.1f}%)" + (f"; tier: {tier}" if disk else ""))
