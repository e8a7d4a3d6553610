#!/usr/bin/env python3
"""Control vectors (--control-vector): refusals and the arithmetic, on the golden model
llama-gqa-bpe-f32 (256 wide, 2 layers).

Usage: cvec_check.py KVLLM_BIN GOLDEN_MODELS_DIR OUT_DIR

The llama.cpp goldens (tests/data/golden/*-cvec*) check agreement with llama.cpp; this checks
what they cannot:
- malformed files and flags are refused with a message naming the tensor or the flag;
- scale 0, a file cancelled by itself at scale -1, and a layer range past the model's layers
  give the base model's numbers exactly; a file twice is the file at scale 2 exactly (the
  vectors are summed before they are added);
- a direction beyond the model's layers is left out with a warning, as llama.cpp leaves it out.
Standard library only.
"""
import json
import math
import os
import random
import struct
import subprocess
import sys

BASE = "llama-gqa-bpe-f32.gguf"
E, L = 256, 2
IDS = "1,2,3,500,900,77,1400,2000,31,64,128,4000,9,10"
failures = []


def write_cvec(path, tensors, dtype=0):
    """A GGUF v3 control vector file: tensors [(name, [values])], F32 (dtype 0) or F16 (1)."""
    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b
    kvs = [("general.architecture", 8, s("controlvector")), ("controlvector.model_hint", 8, s("llama")),
           ("controlvector.layer_count", 5, struct.pack("<i", L))]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        head += s(k) + struct.pack("<I", t) + v
    blobs, off = [], 0
    for name, vals in tensors:
        blob = struct.pack(f"<{len(vals)}" + ("f" if dtype == 0 else "e"), *vals)
        head += s(name) + struct.pack("<I", 1) + struct.pack("<Q", len(vals)) + struct.pack("<IQ", dtype, off)
        blobs.append(blob)
        off += (len(blob) + 31) // 32 * 32
    head += b"\0" * (-len(head) % 32)
    with open(path, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b + b"\0" * (-len(b) % 32))


def run(kv, args):
    return subprocess.run([kv] + args, capture_output=True, text=True, timeout=120)


def score(kv, model, extra):
    p = run(kv, ["score", "-m", model, "--ids", IDS, "--top-logprobs", "8", "--json"] + extra)
    if p.returncode != 0:
        failures.append(f"score {extra}: exit {p.returncode}: {p.stderr.strip()[-300:]}")
        return None
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    return [{t["id"]: t["logprob"] for t in r["top_logprobs"]} for r in rows]


def same(what, a, b):
    ok = a is not None and a == b
    print(f"{what}: {'identical' if ok else 'DIFFERENT'}")
    if not ok:
        failures.append(f"{what}: not identical")


def main():
    kv, golden, out = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(out, exist_ok=True)
    base = os.path.join(golden, BASE)
    rng = random.Random(7)
    vec = [rng.uniform(-0.5, 0.5) for _ in range(E)]
    good = os.path.join(out, "good.gguf")
    write_cvec(good, [("direction.1", vec)])

    def path(name):
        return os.path.join(out, name + ".gguf")

    refusals = [
        ("other_name", [("blk.1.direction", vec)], 0, "tensor 'blk.1.direction' is not named direction.N"),
        ("no_number", [("direction.x", vec)], 0, "tensor 'direction.x' is not named direction.N"),
        ("layer_zero", [("direction.0", vec)], 0, "'direction.0': layer 0 has no control vector"),
        ("f16", [("direction.1", vec)], 1, "'direction.1' is F16, not F32"),
        ("narrow", [("direction.1", vec[:128])], 0, "the model's vectors are 256 wide"),
        ("nan", [("direction.1", vec[:3] + [math.nan] + vec[4:])], 0, "'direction.1' value 3 is not finite"),
        ("empty", [], 0, "no direction tensors"),
    ]
    for name, tensors, dtype, want in refusals:
        write_cvec(path(name), tensors, dtype)
        p = run(kv, ["run", "-m", base, "--control-vector", path(name), "-p", "Hello", "-n", "2"])
        if p.returncode != 1 or want not in p.stderr or path(name) not in p.stderr:
            failures.append(f"{name}: exit {p.returncode}, want 1 and '{want}'; got: {p.stderr.strip()[-300:]}")
        else:
            print(f"refused {name}: {want}")
    flags = [
        (["--control-vector", path("absent")], "absent.gguf"),
        (["--control-vector-scaled", good], "expected FILE:SCALE"),
        (["--control-vector-scaled", good + ":big"], "scale 'big' is not a number"),
        (["--control-vector", good, "--control-vector-layer-range", "1"], "expects START END"),
        (["--control-vector", good, "--control-vector-layer-range", "1", "x"], "--control-vector-layer-range"),
    ]
    for extra, want in flags:
        p = run(kv, ["run", "-m", base, "-p", "Hello", "-n", "2"] + extra)
        if p.returncode == 0 or want not in p.stderr:
            failures.append(f"{extra}: exit {p.returncode}, want an error with '{want}'; got: {p.stderr.strip()[-300:]}")
        else:
            print(f"refused {' '.join(extra[-2:])}: {want}")

    b = score(kv, base, [])
    with_cv = score(kv, base, ["--control-vector", good])
    top = lambda rows: [max(r, key=r.get) for r in rows or []]
    changed = sum(x != y for x, y in zip(top(b), top(with_cv)))
    print(f"the control vector changes the top token at {changed} of {len(top(b))} positions")
    if changed < 3:
        failures.append(f"the control vector changes little: top token at {changed} positions")
    same("scale 0 vs none", b, score(kv, base, ["--control-vector-scaled", good + ":0"]))
    same("the file at 1 and at -1 vs none", b,
         score(kv, base, ["--control-vector-scaled", f"{good}:1,{good}:-1"]))
    same("layers 3-9 of a 2-layer model vs none", b,
         score(kv, base, ["--control-vector", good, "--control-vector-layer-range", "3", "9"]))
    same("the file twice vs scale 2", score(kv, base, ["--control-vector", f"{good},{good}"]),
         score(kv, base, ["--control-vector-scaled", good + ":2"]))
    same("layers 1-1 vs the default range", with_cv,
         score(kv, base, ["--control-vector", good, "--control-vector-layer-range", "1", "1"]))
    # two directions of one layer in a file add up (direction.01 is layer 1 too, as llama.cpp reads
    # it); one beyond the layers is left out with a warning
    half = [v / 2 for v in vec]
    write_cvec(path("halves"), [("direction.1", half), ("direction.01", half), ("direction.5", vec)])
    p = run(kv, ["run", "-m", base, "--control-vector", path("halves"), "-p", "Hello", "-n", "2"])
    if "beyond the model's 2 layers" not in p.stderr:
        failures.append(f"direction.5: no warning ({p.stderr.strip()[-200:]})")
    same("two halves of one layer (+ direction.5) vs the whole", with_cv,
         score(kv, base, ["--control-vector", path("halves")]))
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
