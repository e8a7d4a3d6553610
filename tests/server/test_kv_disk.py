#!/usr/bin/env python3
"""The KV disk tier and priorities through `kvllm serve`: a prefix saved with
POST /v1/kv/save is read back from disk by a server restarted (after SIGKILL)
over the same directory, with the same greedy output as the first computation;
the disk metrics count it; `priority` is validated and refused under fcfs; the
saved prefix is unpinned once (POST /v1/kv/unpin), and a save past
--kv-disk-pin-max is a 413; a client that leaves while its prefix is read from
disk has the read given up and every block back.
usage: test_kv_disk.py KVLLM_BIN SOURCE_DIR"""
import json, os, re, shutil, signal, socket, subprocess, sys, tempfile, time, urllib.error, urllib.request

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

    # A client that leaves while its prefix is being read from disk: the read is
    # given up and every reserved block comes back. FIFOs put in place of the
    # block files after the server indexed them hold the reader: its open() and
    # read() wait until this side opens and closes the other end (no timing).
    shutil.rmtree(d, ignore_errors=True)
    p, port = start(["--kv-disk", d])
    st, _ = post(port, "/v1/completions", gen)
    p.send_signal(signal.SIGTERM)  # a clean stop writes what RAM caches
    p.wait(timeout=60)
    p, port = start(["--kv-disk", d])
    fifos = [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".kvb")]
    for f in fifos:
        os.unlink(f)
        os.mkfifo(f)
    body = json.dumps(gen).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    held = []
    for _ in range(3000):  # until the reader has one open (then it sits in read())
        for f in fifos:
            try:
                held.append(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        if held:
            break
        time.sleep(0.01)
    check(len(held) == 1, f"{len(held)} block files held open by the reader (want 1 of {len(fifos)})")
    sock.close()

    def metric(name):
        m = re.search(r"^kvllm:%s\{[^}]*\} (\S+)" % name, get(port, "/metrics"), re.M)
        return float(m.group(1)) if m else -1

    for _ in range(3000):
        if metric("kv_disk_loads_abandoned_total") >= 1:
            break
        time.sleep(0.01)
    check(metric("kv_disk_loads_abandoned_total") == 1, "the read of a client that left was not given up")
    check(metric("kv_blocks_free") < 24, "the reader's blocks came back while it still read into them")
    for fd in held:
        os.close(fd)  # an empty read: the block fails its checks
    for _ in range(3000):
        if metric("kv_blocks_free") == 24:
            break
        time.sleep(0.01)
    check(metric("kv_blocks_free") == 24, f"{metric('kv_blocks_free')} of 24 KV blocks free after the read ended")
    st, again = post(port, "/v1/completions", gen)
    check(st == 200 and again["choices"][0]["text"] == ref["choices"][0]["text"],
          f"after a given-up read: {st} {again}")
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
finally:
    shutil.rmtree(d, ignore_errors=True)
print("test_kv_disk.py:", "FAIL" if failures else "ok", f"(saved {saved}, {disk} prompt tokens from disk after restart)")
sys.exit(1 if failures else 0)
