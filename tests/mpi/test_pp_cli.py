#!/usr/bin/env python3
"""kvllm run --pp N under mpirun: the same ids and logprobs as one process,
clear refusals, and a rank that dies or stops answering ends the job with an
error naming it, within the timeout.

Usage: test_pp_cli.py MPIRUN KVLLM_BIN
"""
import json
import subprocess
import sys
import time

MPIRUN, KV = sys.argv[1], sys.argv[2]
G = "tests/data/golden/models/"
failures = []


def mpirun(n, args, env=None, timeout=120):
    cmd = [MPIRUN, "--oversubscribe", "-np", str(n), KV] + args
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return p, time.time() - t0


def tokens(out):
    """The generated-token lines of `run --json` (the stats line holds timings)."""
    return [json.loads(l) for l in out.splitlines() if l.strip() and '"done"' not in l]


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


RUN = ["run", "-p", "Once upon a time", "-n", "16", "-t", "1", "--temp", "0", "--json",
       "--top-logprobs", "3", "--ignore-eos"]

import os
import re

# gemma3-swa: two KV groups (sliding and full), and ranks holding no layer of one of them
for model, n in [(G + "qwen3moe-f32.gguf", 2), ("models/stories260K.gguf", 3),
                 (G + "gemma3-swa-f32.gguf", 2)]:
    one = subprocess.run([KV] + RUN + ["-m", model], capture_output=True, text=True)
    p, _ = mpirun(n, RUN + ["-m", model, "--pp", str(n)], env=dict(os.environ, KVLLM_PP_STATS="1"))
    info = json.loads(subprocess.run([KV, "info", "-m", model, "--json"], capture_output=True,
                                     text=True).stdout)
    check(p.returncode == 0 and one.returncode == 0 and len(tokens(one.stdout)) == 16
          and tokens(p.stdout) == tokens(one.stdout),
          f"run --pp {n} {model}: ids and logprobs as one process\n{p.stderr[-800:]}")
    # the KV blocks of all ranks together are one process's (each rank its layers' share)
    kv = re.search(r"KV allocated +by rank:.*; all ranks (\d+) bytes", p.stderr)
    done = [json.loads(l) for l in one.stdout.splitlines() if '"done"' in l]
    check(kv is not None and done and int(kv.group(1)) == done[0]["stats"]["kv_allocated_bytes"],
          f"run --pp {n}: KV bytes of all ranks = one process's\n{p.stderr[-400:]}")
    # the last rank sends back only the wanted rows: one per generated token
    lg = re.search(rf"rank {n - 1}: \d+ steps, \d+ tokens, sent \d+ hidden \+ (\d+) logits", p.stderr)
    check(lg is not None and int(lg.group(1)) == 16 * info["n_vocab"] * 4,
          f"run --pp {n}: logits bytes = 16 rows x n_vocab x 4")
    # hidden states cross each boundary as n_embd float32s per token
    info = json.loads(subprocess.run([KV, "info", "-m", model, "--json"], capture_output=True,
                                     text=True).stdout)
    st = re.search(r"rank 0: \d+ steps, (\d+) tokens, sent (\d+) hidden", p.stderr)
    check(st is not None and int(st.group(2)) == int(st.group(1)) * info["n_embd"] * 4,
          f"rank 0 sent n_embd x 4 = {info['n_embd'] * 4} bytes per token to rank 1")

# the planner per rank (no MPI needed): Llama 3 70B, 80 layers over 4 ranks, 20 each;
# KV per rank = 2 x 20 layers x 8 KV heads x 128 x 2 bytes x 8192 x 8 tokens = 5 GiB
p = subprocess.run([KV, "kv-plan", "--config", "tests/kv_plan/llama-3-70b.json", "--context", "8192",
                    "--concurrency", "8", "--weights-bytes", "42.5GB", "--budget", "32GiB", "--pp",
                    "4"], capture_output=True, text=True)
rows = re.findall(r"^  (\d)\s+(\d+-\d+)\s+([\d.]+ \w+)\s+([\d.]+ \w+)", p.stdout, re.M)
check(p.returncode == 0 and [r[1] for r in rows] == ["0-19", "20-39", "40-59", "60-79"]
      and all(r[3] == "5 GiB" for r in rows) and "the job: fits" in p.stdout,
      "kv-plan --pp 4: 20 layers and 5 GiB of KV per rank\n" + p.stdout[-600:])

# the same as JSON, and --verify next to --pp (it checks the one-process plan the ranks split)
p = subprocess.run([KV, "kv-plan", "--config", "tests/kv_plan/llama-3-70b.json", "--context", "8192",
                    "--concurrency", "8", "--weights-bytes", "42.5GB", "--budget", "32GiB", "--pp",
                    "4", "--json"], capture_output=True, text=True)
try:
    pj = json.loads(p.stdout)["pipeline"]
    ok = (pj["ranks"] == 4 and pj["fits"] is True
          and [(x["layer_first"], x["layer_last"]) for x in pj["per_rank"]]
          == [(0, 19), (20, 39), (40, 59), (60, 79)]
          and all(x["kv_bytes"] == 5 << 30 for x in pj["per_rank"]))
except (ValueError, KeyError, TypeError):
    ok = False
check(p.returncode == 0 and ok, "kv-plan --pp 4 --json: the same ranks\n" + p.stdout[-600:])
p = subprocess.run([KV, "kv-plan", "-m", "models/stories260K.gguf", "--context", "128",
                    "--concurrency", "2", "--pp", "2", "--verify"], capture_output=True, text=True,
                   timeout=120)
check(p.returncode == 0 and "pipeline       --pp 2" in p.stdout and "verify" in p.stdout.lower(),
      "kv-plan --pp 2 --verify: verified, and the ranks' table\n" + p.stdout[-600:] + p.stderr[-300:])

# --pp-layers, and micro-batches of one token each
p, _ = mpirun(2, RUN + ["-m", "models/stories260K.gguf", "--pp", "2", "--pp-layers", "0-0,1-4",
                        "--pp-micro", "8"])
one = subprocess.run([KV] + RUN + ["-m", "models/stories260K.gguf"], capture_output=True, text=True)
check(p.returncode == 0 and tokens(p.stdout) == tokens(one.stdout) and "layers 0-0, 1-4" in p.stderr,
      "--pp-layers 0-0,1-4 --pp-micro 8: same output")

# refusals
p, _ = mpirun(3, ["run", "-m", G + "qwen3-f32.gguf", "-p", "x", "-n", "2", "--pp", "3"])
check(p.returncode != 0 and "only 2 layers" in p.stderr, "--pp 3 on a 2-layer model is refused")
p = subprocess.run([KV, "run", "-m", G + "qwen3-f32.gguf", "-p", "x", "-n", "2", "--pp", "2"],
                   capture_output=True, text=True, timeout=60)
check(p.returncode != 0 and "mpirun -np 2" in p.stderr, "--pp 2 without mpirun is refused")
p, _ = mpirun(2, ["run", "-m", G + "qwen3-f32.gguf", "-p", "x", "-n", "2", "--pp", "2",
                  "--pp-layers", "0-0,2-3"])
check(p.returncode != 0 and "--pp-layers" in p.stderr, "a bad --pp-layers is refused")
p, _ = mpirun(2, ["run", "-m", G + "qwen3-f32.gguf", "-p", "x", "-n", "2", "--pp", "2",
                  "--spec", "ngram"])
check(p.returncode != 0 and "speculative" in p.stderr, "--spec with --pp is refused")

# faults: rank 1 stops answering / exits at step 3
for mode in ["hang", "exit"]:
    env = dict(os.environ, KVLLM_PP_FAULT=f"1:3:{mode}")
    try:
        p, dt = mpirun(2, ["run", "-m", G + "qwen3-f32.gguf", "-p", "hello", "-n", "32", "-t", "1",
                           "--pp", "2", "--pp-timeout", "3"], env=env, timeout=90)
        named = ("pipeline: rank 1 sent nothing" in p.stderr if mode == "hang"
                 else "],1]" in p.stderr or "pipeline: rank 1" in p.stderr)
        check(p.returncode != 0 and named and dt < 60,
              f"rank 1 {mode}s at step 3: the job ends non-zero in {dt:.1f} s naming rank 1\n"
              + p.stderr[-600:])
    except subprocess.TimeoutExpired:
        check(False, f"rank 1 {mode}s at step 3: the job hung")

# rank 0 stops answering at step 3: rank 1, waiting for the next step, ends the job
env = dict(os.environ, KVLLM_PP_FAULT="0:3:hang")
try:
    p, dt = mpirun(2, ["run", "-m", G + "qwen3-f32.gguf", "-p", "hello", "-n", "32", "-t", "1",
                       "--pp", "2", "--pp-timeout", "3"], env=env, timeout=90)
    check(p.returncode != 0 and "rank 1: rank 0 sent nothing" in p.stderr and dt < 60,
          f"rank 0 hangs at step 3: rank 1 ends the job non-zero in {dt:.1f} s naming rank 0\n"
          + p.stderr[-600:])
except subprocess.TimeoutExpired:
    check(False, "rank 0 hangs at step 3: the job hung")

# serve --pp 2: the same completion as one process; then a rank that goes silent fails the
# request in flight with an error and ends the job
import socket
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def complete(port, deadline):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}).encode()
    while True:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")
        except (ConnectionError, urllib.error.URLError):
            if time.time() > deadline:
                return None, None
            time.sleep(0.2)


def serve(cmd, env=None):
    port = free_port()
    proc = subprocess.Popen(cmd + ["--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    return proc, port


SERVE = ["serve", "-m", G + "qwen3-f32.gguf", "-t", "1"]
one, port = serve([KV] + SERVE)
st1, r1 = complete(port, time.time() + 30)
one.terminate()
one.communicate(timeout=30)
# idle for longer than --pp-timeout: rank 0's pings keep the workers waiting
pp, port = serve([MPIRUN, "--oversubscribe", "-np", "2", KV] + SERVE + ["--pp", "2",
                 "--pp-timeout", "2"])
st0, _ = complete(port, time.time() + 60)
time.sleep(3)
st2, r2 = complete(port, time.time() + 60)
# embeddings and reranking need the last rank's hidden states: a 501 saying so, not a 503
pooled = []
for path, body in (("/v1/embeddings", {"input": "Once"}), ("/rerank", {"query": "a", "documents": ["b"]})):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=30)
        pooled.append((path, 200, ""))
    except urllib.error.HTTPError as e:
        pooled.append((path, e.code, json.loads(e.read() or b"{}").get("error", {}).get("message", "")))
pp.terminate()
try:
    _, err = pp.communicate(timeout=60)
except subprocess.TimeoutExpired:
    pp.kill()
    err = "hung on SIGTERM"
check(st1 == 200 and st0 == 200 and st2 == 200
      and r1["choices"][0]["text"] == r2["choices"][0]["text"],
      f"serve --pp 2: the same completion as one process, also after idling past the timeout "
      f"({st1}, {st0}, {st2})\n{err[-500:]}")

check(all(code == 501 and "--pp" in msg for _, code, msg in pooled),
      f"serve --pp 2: embeddings and /rerank refused with 501 naming --pp ({pooled})")

env = dict(os.environ, KVLLM_PP_FAULT="1:2:hang")
pp, port = serve([MPIRUN, "--oversubscribe", "-np", "2", KV] + SERVE + ["--pp", "2",
                 "--pp-timeout", "3"], env=env)
st, r = complete(port, time.time() + 60)
try:
    _, err = pp.communicate(timeout=60)
    rc = pp.returncode
except subprocess.TimeoutExpired:
    pp.kill()
    err, rc = "hung", None
check(st is not None and st >= 500 and rc not in (0, None) and "rank 1 sent nothing" in err,
      f"serve --pp 2, rank 1 silent: the request fails ({st}), the job ends ({rc})\n{err[-500:]}")


# /metrics under --pp: the job's KV bytes (the ranks' sum) are one process's for the same blocks,
# and each rank reports its layers' share (stories260K's 5 layers are alike: 1/5 and 4/5 here)


def get_metrics(port, deadline):
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
                text = r.read().decode()
            out = {}
            for m in re.finditer(r'^kvllm:(\w+)\{[^}]*?(?:rank="(\d+)")?\} (\S+)$', text, re.M):
                out[(m.group(1), None if m.group(2) is None else int(m.group(2)))] = float(m.group(3))
            return out, text
        except (ConnectionError, urllib.error.URLError):
            if time.time() > deadline:
                return {}, ""
            time.sleep(0.2)


def settled_metrics(port):
    """/metrics once the engine thread has published the finished request's step (its blocks
    back in the pool: none used, some cached), or after 10 s."""
    deadline = time.time() + 10
    while True:
        m, _ = get_metrics(port, deadline)
        if (m.get(("kv_blocks_used", None)) == 0 and m.get(("kv_blocks_cached", None), 0) > 0) \
                or time.time() > deadline:
            return m
        time.sleep(0.1)


def stop(proc):
    proc.terminate()
    try:
        return proc.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return "hung on SIGTERM"


S260 = ["serve", "-m", "models/stories260K.gguf", "-t", "1"]
PP2 = [MPIRUN, "--oversubscribe", "-np", "2", KV]
UNEVEN = ["--pp", "2", "--pp-layers", "0-0,1-4"]
one, port = serve([KV] + S260 + ["--kv-blocks", "64"])
m1, _ = get_metrics(port, time.time() + 30)
complete(port, time.time() + 30)
m1b = settled_metrics(port)
stop(one)
pp, port = serve(PP2 + S260 + ["--kv-blocks", "64"] + UNEVEN)
m2, text2 = get_metrics(port, time.time() + 60)
complete(port, time.time() + 60)
m2b = settled_metrics(port)
err = stop(pp)
J, B = m1.get(("kv_cache_bytes", None), -1), m1.get(("kv_block_bytes", None), -1)
print("/metrics KV bytes, one process:", {k: v for k, v in m1.items() if "bytes" in k[0] and "disk" not in k[0]})
print("/metrics KV bytes, --pp 2 --pp-layers 0-0,1-4:",
      {k: v for k, v in m2.items() if "bytes" in k[0] and "disk" not in k[0]})
check(J > 0 and m1.get(("kv_cache_rank_bytes", 0)) == J and m1.get(("kv_block_rank_bytes", 0)) == B,
      f"one process: rank 0's KV bytes are the job's ({J})")
check(m2.get(("kv_cache_bytes", None)) == J and m2.get(("kv_block_bytes", None)) == B,
      f"serve --pp 2: the job's KV bytes are one process's ({m2.get(('kv_cache_bytes', None))} vs {J})"
      f"\n{err[-500:]}")
check(m2.get(("kv_cache_rank_bytes", 0)) == J / 5 and m2.get(("kv_cache_rank_bytes", 1)) == 4 * J / 5
      and m2.get(("kv_block_rank_bytes", 0)) == B / 5 and m2.get(("kv_block_rank_bytes", 1)) == 4 * B / 5,
      "serve --pp 2: each rank's KV bytes are its layers' share (1/5, 4/5)")
check(m2b.get(("kv_cache_cached_bytes", None)) == m1b.get(("kv_cache_cached_bytes", None))
      and m2b.get(("kv_cache_used_bytes", None)) == m1b.get(("kv_cache_used_bytes", None))
      and m2b.get(("kv_cache_cached_bytes", None), 0) > 0,
      f"after one request: cached and used KV bytes as one process's "
      f"({m2b.get(('kv_cache_cached_bytes', None))}, {m1b.get(('kv_cache_cached_bytes', None))})")

# serve --pp sizes the pool by every rank's own budget: with --kv-memory 40 blocks' bytes (one
# process's blocks), rank 0 (1 layer) holds 200 blocks, rank 1 (4 layers) 50: the pool is 50
pp, port = serve(PP2 + S260 + ["--kv-memory", str(int(40 * B))] + UNEVEN)
m3, _ = get_metrics(port, time.time() + 60)
err = stop(pp)
check(m3.get(("kv_blocks_free", None)) == 50 and m3.get(("kv_cache_bytes", None)) == 50 * B
      and "rank 0 (layers 0-0)" in err and "-> 200 blocks fit" in err and "-> 50 blocks fit" in err
      and "KV pool 50 blocks on every rank: the least, rank 1's" in err,
      f"serve --pp 2 --kv-memory: the pool is the least any rank holds (rank 1's 50, not rank 0's "
      f"200): {m3.get(('kv_blocks_free', None))}\n{err[-900:]}")
# from memory (each host's available memory, shared by its ranks): one log line per rank, same blocks
pp, port = serve(PP2 + S260 + UNEVEN + ["--max-seqs", "4"])
m4, _ = get_metrics(port, time.time() + 60)
err = stop(pp)
check(m4.get(("kv_blocks_free", None), 0) > 0 and "x available memory" in err and "rank 1 (layers 1-4)" in err,
      f"serve --pp 2 from memory: every rank's budget reported\n{err[-900:]}")

print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)
