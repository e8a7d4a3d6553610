#!/usr/bin/env python3
"""The KV disk tier and priorities through `kvllm serve`: a prefix saved with
POST /v1/kv/save is read back from disk by a server restarted (after SIGKILL)
over the same directory, with the same greedy output as the first computation;
the disk metrics count it; `priority` is validated and refused under fcfs; the
saved prefix is unpinned once (POST /v1/kv/unpin), and a save past
--kv-disk-pin-max is a 413.
usage: test_kv_disk.py KVLLM_BIN SOURCE_DIR"""
import json, os, re, shutil, signal, subprocess, sys, tempfile, urllib.error, urllib.request

BIN, SRC = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SRC, "models/stories260K.gguf")
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, file=sys.stderr)


def start(args):
    p = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", "0", "-c", "256", "--kv-blocks", "24",
                          "-t", "1"] + args, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            return p, int(m.group(1))
    raise SystemExit("server did not start")


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
        return r.read().decode()


d = tempfile.mkdtemp(prefix="kvllm_kvdisk_")
prompt = "Once upon a time there was a little girl named Lily. She loved to play outside in the park " * 2
gen = {"prompt": prompt, "max_tokens": 12, "temperature": 0}
try:
    p, port = start(["--kv-disk", d, "--kv-disk-size", "64MiB"])
    st, ref = post(port, "/v1/completions", gen)
    check(st == 200, f"completion: {st} {ref}")
    st, saved = post(port, "/v1/kv/save", {"prompt": prompt})
    check(st == 200 and saved.get("blocks", 0) >= 2, f"kv/save: {st} {saved}")
    st, chat = post(port, "/v1/kv/save", {"messages": [{"role": "user", "content": "hello there"}]})
    check(st == 200 and "blocks" in chat, f"kv/save with messages: {st} {chat}")
    st, e = post(port, "/v1/kv/save", {"prompt": prompt, "bogus": 1})
    check(st == 400, f"kv/save with an unknown field: {st}")
    st, e = post(port, "/v1/completions", dict(gen, priority=1))
    check(st == 400 and "priority" in json.dumps(e), f"priority under fcfs: {st} {e}")
    st, e = post(port, "/v1/completions", dict(gen, priority=0))
    check(st == 200, f"priority 0 under fcfs: {st}")
    p.send_signal(signal.SIGKILL)
    p.wait()

    p, port = start(["--kv-disk", d, "--scheduling-policy", "priority"])
    st, again = post(port, "/v1/completions", dict(gen, priority=-3))
    check(st == 200, f"after restart: {st} {again}")
    disk = again.get("usage", {}).get("prompt_tokens_details", {}).get("disk_cached_tokens", 0)
    check(disk >= 16 * (saved.get("blocks", 1)), f"after restart: {disk} tokens from disk, want {saved}")
    check(again["choices"][0]["text"] == ref["choices"][0]["text"], "after restart: the text differs")
    m = get(port, "/metrics")
    hits = re.search(r"^kvllm:kv_disk_hits_total\{[^}]*\} (\S+)", m, re.M)
    check(hits and float(hits.group(1)) >= 2, "metrics: kv_disk_hits_total")
    check(re.search(r"^kvllm:kv_disk_blocks\{", m, re.M) is not None, "metrics: kv_disk_blocks")
    st, e = post(port, "/v1/completions", dict(gen, priority="high"))
    check(st == 400, f"priority 'high': {st}")
    # the saved prefix is pinned until unpinned, once
    st, un = post(port, "/v1/kv/unpin", {"prompt": prompt})
    check(st == 200 and un.get("blocks") == saved.get("blocks"), f"kv/unpin: {st} {un} (saved {saved})")
    st, e = post(port, "/v1/kv/unpin", {"prompt": prompt})
    check(st == 404, f"kv/unpin twice: {st} {e}")
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)

    # a save past the pin cap is refused, nothing pinned
    shutil.rmtree(d, ignore_errors=True)
    p, port = start(["--kv-disk", d, "--kv-disk-size", "64MiB", "--kv-disk-pin-max", "1KiB"])
    st, e = post(port, "/v1/kv/save", {"prompt": prompt})
    check(st == 413 and e.get("error", {}).get("code") == "kv_pin_limit", f"save past the pin cap: {st} {e}")
    m = get(port, "/metrics")
    pinned = re.search(r"^kvllm:kv_disk_pinned_blocks\{[^}]*\} (\S+)", m, re.M)
    check(pinned and float(pinned.group(1)) == 0, "metrics: kv_disk_pinned_blocks after a refused save")
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
finally:
    shutil.rmtree(d, ignore_errors=True)
print("test_kv_disk.py:", "FAIL" if failures else "ok", f"(saved {saved}, {disk} prompt tokens from disk after restart)")
sys.exit(1 if failures else 0)
