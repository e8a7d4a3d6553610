#!/usr/bin/env python3
"""phi3's LongRoPE factors are chosen by the context of a sequence as llama.cpp
chooses them: its n_ctx_seq, rounded up to a multiple of 256, against the
original context (64 in the phi3-f32 golden). So a kvllm run with -c 40, whose
context rounds to 256 > 64, must take the long factors like the golden (made at
-c 512) and agree with it on the steps that fit; short factors would miss by far.

Usage: check_longrope_ctx.py KVLLM_BIN GOLDEN_DIR
"""
import json
import os
import subprocess
import sys

CTX, TOL = 40, 1e-3


def main():
    kv, root = sys.argv[1], sys.argv[2]
    model = os.path.join(root, "models", "phi3-f32.gguf")
    case = json.load(open(os.path.join(root, "phi3-f32", "greedy.json")))["cases"][0]
    seq = (case["prompt_ids"] + case["ids"][:-1])[:CTX]
    p = subprocess.run([kv, "score", "-m", model, "--ids", ",".join(map(str, seq)), "--top-logprobs", "50",
                        "--kv-type", "f32", "--json", "-c", str(CTX)], capture_output=True, text=True)
    if p.returncode != 0:
        print(f"FAIL: kvllm score exit {p.returncode}\n{p.stderr}")
        return 1
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    worst, n = 0.0, 0
    for s, step in enumerate(case["steps"]):
        r = len(case["prompt_ids"]) - 1 + s
        if r >= len(seq):
            break
        ours = {t["id"]: t["logprob"] for t in rows[r]["top_logprobs"]}
        for t in step["top"]:
            worst = max(worst, abs(ours[t["id"]] - t["logprob"]) if t["id"] in ours else float("inf"))
            n += 1
    print(f"-c {CTX}: {n} golden logprobs (made at -c 512), max |diff| {worst:.3g} (tol {TOL:g})")
    if n == 0 or worst > TOL:
        print("FAIL")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
