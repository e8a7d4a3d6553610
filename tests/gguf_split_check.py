#!/usr/bin/env python3
"""A model split as llama.cpp's gguf-split splits it (tests/gguf_split.py,
whose files were byte-identical to llama-gguf-split 81ff7abe's on this golden
model) loads from its first file as the whole file does: `kvllm info` counts
the files and the same weights, and `kvllm score` gives bit-identical
teacher-forced logprobs. Loading another file of the set, a missing file, a
tensor in two files and a wrong split.tensors.count are refused with a message
naming the file and the key or tensor.

usage: gguf_split_check.py KVLLM REPO_ROOT WORK_DIR
"""
import json
import os
import subprocess
import sys


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def main():
    kv, root, work = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    for f in os.listdir(work):
        os.remove(os.path.join(work, f))
    split = os.path.join(root, "tests/gguf_split.py")
    whole = os.path.join(root, "tests/data/golden/models/qwen3-f32.gguf")
    prefix = os.path.join(work, "qwen3")

    def make(pre, *extra):
        p = run([sys.executable, split, whole, pre, "10", *extra])
        assert p.returncode == 0, p.stderr

    make(prefix)
    first = prefix + "-00001-of-00003.gguf"
    failures = []

    def check(cond, what):
        print(("ok    " if cond else "FAIL  ") + what)
        if not cond:
            failures.append(what)

    a = json.loads(run([kv, "info", "--json", "-m", whole]).stdout)
    p = run([kv, "info", "--json", "-m", first])
    b = json.loads(p.stdout) if p.returncode == 0 else {}
    check(b.get("n_files") == 3 and a.get("n_files") == 1, "info: 3 files, and 1")
    check(all(a.get(k) == b.get(k) for k in ("n_params", "weights_bytes", "n_layer")),
          "info: the same parameters and weight bytes")
    ids = "3707,11,1879,13,576,937,374,3460,30,220,16,17,18,11,1052,1033"
    score = [kv, "score", "--ids", ids, "--top-logprobs", "5", "--json", "-c", "128"]
    sa, sb = run(score + ["-m", whole]), run(score + ["-m", first])
    check(sa.returncode == 0 and sa.stdout == sb.stdout and len(sa.stdout) > 100,
          "score: the split model's logprobs are the whole file's, bit for bit")

    def refused(model, words, what):
        p = run([kv, "info", "-m", model])
        ok = p.returncode != 0 and all(w in p.stderr for w in words)
        check(ok, f"{what}: {p.stderr.strip()[:160]}")

    refused(prefix + "-00002-of-00003.gguf", ["split.no", "-00001-of-00003.gguf"], "not the first file")
    os.rename(prefix + "-00003-of-00003.gguf", prefix + "-x.gguf")
    refused(first, ["qwen3-00003-of-00003.gguf", "cannot open"], "a file missing")
    make(prefix + "d", "--break", "dup")
    refused(prefix + "d-00001-of-00003.gguf", ["qwen3d-00003-of-00003.gguf", "token_embd.weight"],
            "a tensor in two files")
    make(prefix + "c", "--break", "count")
    refused(prefix + "c-00001-of-00003.gguf", ["split.tensors.count", "31", "24"],
            "a wrong split.tensors.count")
    os.rename(first, os.path.join(work, "renamed.gguf"))
    refused(os.path.join(work, "renamed.gguf"), ["-00001-of-00003.gguf"], "a first file renamed")
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
