#!/usr/bin/env python3
"""LoRA adapters (--lora): refusals and the arithmetic, on the vendored golden adapter.

Usage: lora_check.py KVLLM_BIN GOLDEN_MODELS_DIR OUT_DIR

The llama.cpp goldens (tests/data/golden/*-lora_*) check agreement with llama.cpp; this checks
what they cannot:
- malformed or mismatched adapters are refused with a message naming the key or tensor
  (each case rewrites llama-gqa-bpe-f32-lora_f32.gguf), and an adapter's norm vectors are
  left out with a warning, as llama.cpp leaves them out;
- scale 0 gives the base model's numbers exactly;
- the adapter equals its merge: W + alpha / rank * B A written into a copy of the base model
  (here, in float64) gives the same log-probabilities as base + adapter, within float rounding
  (which this random model amplifies along the sequence: 1e-6 at the first positions, 1e-3
  by the tenth; the adapter itself moves them by units);
- two adapters add: the adapter loaded twice is the adapter at scale 2 (within the same
  rounding as the merge).
Standard library only.
"""
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_refusals as mr  # noqa: E402 (its GGUF reader and writer)

BASE, ADAPTER = "llama-gqa-bpe-f32.gguf", "llama-gqa-bpe-f32-lora_f32.gguf"
IDS = "1,2,3,500,900,77,1400,2000,31,64,128,4000,9,10"
failures = []


def run(kv, args):
    return subprocess.run([kv] + args, capture_output=True, text=True)


def score(kv, model, extra):
    p = run(kv, ["score", "-m", model, "--ids", IDS, "--top-logprobs", "8", "--json"] + extra)
    if p.returncode != 0:
        failures.append(f"score {extra}: exit {p.returncode}: {p.stderr.strip()[-300:]}")
        return None
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    return [{t["id"]: t["logprob"] for t in r["top_logprobs"]} for r in rows]


def max_diff(a, b):
    if a is None or b is None:
        return float("inf")
    d = 0.0
    for ra, rb in zip(a, b):
        for i, v in ra.items():
            if i not in rb:
                return float("inf")
            d = max(d, abs(v - rb[i]))
    return d


def edit_kv(key, t, raw):
    return lambda kvs, ts: mr.set_kv(kvs, key, t, raw)


def rename_exact(old, new):
    def f(kvs, ts):
        for t in ts:
            if t[0] == old:
                t[0] = new
    return f


def both(*fs):
    def f(kvs, ts):
        for g in fs:
            g(kvs, ts)
    return f


REFUSALS = [
    ("not_an_adapter", edit_kv("general.type", mr.T_STR, mr.gstr("model")),
     "not an adapter (key 'general.type' must be \"adapter\")"),
    ("not_lora", edit_kv("adapter.type", mr.T_STR, mr.gstr("control_vector")),
     "key 'adapter.type' must be \"lora\""),
    ("other_arch", edit_kv("general.architecture", mr.T_STR, mr.gstr("qwen3")),
     "adapter architecture 'qwen3' differs from the model's 'llama'"),
    ("alora", edit_kv("adapter.alora.invocation_tokens", mr.T_ARR, struct.pack("<IQI", mr.T_U32, 1, 5)),
     "key 'adapter.alora.invocation_tokens': activated LoRA (aLoRA) is not supported"),
    ("half_a_pair", rename_exact("blk.0.attn_q.weight.lora_b", "blk.0.attn_q.weight.lora_c"),
     "LoRA pair for 'blk.0.attn_q.weight' is missing 'blk.0.attn_q.weight.lora_b'"),
    ("not_in_base", both(rename_exact("blk.1.ffn_up.weight.lora_a", "blk.7.ffn_up.weight.lora_a"),
                         rename_exact("blk.1.ffn_up.weight.lora_b", "blk.7.ffn_up.weight.lora_b")),
     "LoRA tensor 'blk.7.ffn_up.weight' does not exist in the base model"),
    ("not_adaptable", both(rename_exact("blk.0.attn_q.weight.lora_a", "blk.0.attn_norm.weight.lora_a"),
                           rename_exact("blk.0.attn_q.weight.lora_b", "blk.0.attn_norm.weight.lora_b")),
     "LoRA on 'blk.0.attn_norm.weight' is not supported"),
    ("wrong_shape", both(rename_exact("blk.0.attn_q.weight.lora_a", "blk.0.ffn_down.weight.x"),
                         rename_exact("blk.0.ffn_down.weight.lora_a", "blk.0.attn_q.weight.lora_a"),
                         rename_exact("blk.0.ffn_down.weight.x", "blk.0.ffn_down.weight.lora_a")),
     "LoRA pair for 'blk.0.ffn_down.weight': shapes A [256, 8], B [8, 256] do not fit the base [512, 256]"),
]


def merge(golden, out_path):
    """The base model with every adapted matrix replaced by W + alpha / rank * B A (float64 sums)."""
    _, akvs, ats, adata = mr.load(os.path.join(golden, ADAPTER))
    alpha = next(struct.unpack("<f", v)[0] for k, t, v in akvs if k == "adapter.lora.alpha")
    version, kvs, ts, data = mr.load(os.path.join(golden, BASE))
    data = bytearray(data)

    def floats(blob, off, n):
        return struct.unpack_from(f"<{n}f", blob, off)

    pairs = {}
    for name, dims, dt, off in ats:
        assert dt == 0, name  # F32 adapter
        pairs.setdefault(name.rsplit(".", 1)[0], {})[name.rsplit(".", 1)[1]] = (dims, off)
    for name, dims, dt, off in ts:
        if name not in pairs:
            continue
        (adims, aoff), (bdims, boff) = pairs[name]["lora_a"], pairs[name]["lora_b"]
        n_in, n_out, rank = dims[0], dims[1], adims[1]
        A = floats(adata, aoff, n_in * rank)      # rank rows of n_in
        B = floats(adata, boff, rank * n_out)     # n_out rows of rank
        W = list(floats(data, off, n_in * n_out))  # n_out rows of n_in
        s = alpha / rank
        for o in range(n_out):
            brow = B[o * rank:(o + 1) * rank]
            for i in range(n_in):
                W[o * n_in + i] += s * sum(brow[r] * A[r * n_in + i] for r in range(rank))
        struct.pack_into(f"<{len(W)}f", data, off, *W)
        del pairs[name]
    if pairs:
        failures.append(f"merge: adapter tensors not in the base: {sorted(pairs)}")
    mr.save(out_path, version, kvs, ts, bytes(data))


def main():
    kv, golden, out = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(out, exist_ok=True)
    base, adapter = os.path.join(golden, BASE), os.path.join(golden, ADAPTER)
    version, kvs, ts, data = mr.load(adapter)
    for name, edit, want in REFUSALS:
        k2, t2 = [list(x) for x in kvs], [list(x) for x in ts]
        edit(k2, t2)
        path = os.path.join(out, name + ".gguf")
        mr.save(path, version, k2, t2, data)
        p = run(kv, ["run", "-m", base, "--lora", path, "-p", "Hello", "-n", "2"])
        if p.returncode != 1 or want not in p.stderr:
            failures.append(f"{name}: exit {p.returncode}, want 1 and '{want}'; got: {p.stderr.strip()[-300:]}")
        else:
            print(f"refused {name}: {want}")
    # a norm vector beside the pairs: left out with a warning, the numbers unchanged
    k2, t2 = [list(x) for x in kvs], [list(x) for x in ts]
    first = t2[0]
    t2.append(["blk.0.attn_norm.weight", [first[1][0]], 0, first[3]])
    with_norm = os.path.join(out, "with_norm.gguf")
    mr.save(with_norm, version, k2, t2, data)
    plain = score(kv, base, ["--lora", adapter])
    normed = score(kv, base, ["--lora", with_norm])
    p = run(kv, ["run", "-m", base, "--lora", with_norm, "-p", "Hello", "-n", "2"])
    if "tensor 'blk.0.attn_norm.weight' left out" not in p.stderr or plain != normed:
        failures.append(f"norm vector: warning or numbers wrong ({p.stderr.strip()[-200:]})")
    # kvllm info reports the adapter as the file has it (14 pairs of rank 8, alpha 16)
    p = run(kv, ["info", "-m", base, "--lora-scaled", adapter + ":0.25", "--json"])
    info = json.loads(p.stdout)["lora"][0] if p.returncode == 0 else {}
    if [info.get(k) for k in ("n_tensors", "rank", "alpha", "scale")] != [14, 8, 16, 0.25]:
        failures.append(f"kvllm info --lora: {info or p.stderr.strip()[-200:]}")
    # scale 0: the base model's numbers, exactly
    b = score(kv, base, [])
    z = score(kv, base, ["--lora-scaled", adapter + ":0"])
    print(f"scale 0 vs no adapter: {'identical' if b == z else 'DIFFERENT'}")
    if b != z:
        failures.append("scale 0 differs from the base model")
    top = lambda rows: [max(r, key=r.get) for r in rows or []]
    changed = sum(x != y for x, y in zip(top(b), top(plain)))
    print(f"the adapter changes the top token at {changed} of {len(top(b))} positions")
    if changed < 3:
        failures.append(f"the adapter changes little: top token at {changed} positions")
    # the merge
    merged = os.path.join(out, "merged.gguf")
    merge(golden, merged)
    m = score(kv, merged, [])
    d = max_diff(plain, m)
    print(f"base + adapter vs merged weights: max |logprob diff| {d:.3g} (tol 2e-3)")
    if d > 2e-3:
        failures.append(f"base + adapter vs merged: {d:.4g} > 2e-3")
    # two adapters add up
    twice = score(kv, base, ["--lora", f"{adapter},{adapter}"])
    doubled = score(kv, base, ["--lora-scaled", adapter + ":2"])
    d2 = max_diff(twice, doubled)
    print(f"adapter twice vs scale 2: max |logprob diff| {d2:.3g} (tol 2e-3)")
    if d2 > 2e-3:
        failures.append(f"adapter twice vs scale 2: {d2:.4g} > 2e-3")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
