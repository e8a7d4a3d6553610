#!/usr/bin/env python3
"""Greedy decode of stories260K from BOS must equal the independent fp64 reference
(256 ids), with the default f16 KV cache and with f32, with and without the cache."""
import json
import subprocess
import sys

kv, model, ref = sys.argv[1:4]
lines = [l for l in open(ref, encoding="utf-8").read().splitlines() if l and not l.startswith("#")]
want = [int(x) for x in lines[0].split()]
failed = False
for extra in ([], ["--kv-type", "f32"], ["--block-size", "7"], ["--no-kv-cache", "-n", "64"], ["--no-kv-cache", "-n", "48", "-b", "16"]):
    n = str(len(want))
    cmd = [kv, "run", "-m", model, "-n", n, "--temp", "0", "--ignore-eos", "--json"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print("FAIL:", " ".join(cmd), p.stderr)
        sys.exit(1)
    got = [json.loads(l)["id"] for l in p.stdout.splitlines() if '"id"' in l and '"done"' not in l]
    # the last -n wins: the no-cache runs ask for a prefix of the reference, and
    # must produce all of it (an empty or short output fails)
    n_asked = int(cmd[len(cmd) - 1 - cmd[::-1].index("-n") + 1])
    exp = want[:n_asked]
    same = sum(1 for a, b in zip(got, exp) if a == b)
    ok = got == exp
    failed |= not ok
    print(f"{'ok  ' if ok else 'FAIL'} {' '.join(extra) or 'default (f16 KV)'}: {same}/{len(exp)} ids equal")
sys.exit(1 if failed else 0)
