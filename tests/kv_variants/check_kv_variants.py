#!/usr/bin/env python3
"""KV variants: sliding-window memory stays flat, quantized KV shrinks the
allocation by the stated ratio and stays within a stated quality bound.

Usage: check_kv_variants.py KVLLM_BIN REPO_ROOT
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

kv, root = sys.argv[1], sys.argv[2]
gemma = f"{root}/tests/data/golden/models/gemma3-swa-f32.gguf"
stories = f"{root}/models/stories260K.gguf"
story_text = f"{root}/tests/data/tiny_story.txt"
failures = []


def run_stats(args):
    p = subprocess.run([kv, "run", "--json", "--temp", "0", "--ignore-eos"] + args,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"FAIL: {args}: {p.stderr}")
    return json.loads(p.stdout.strip().split("\n")[-1])["stats"]


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


# 1. Sliding window (gemma3, W = 16 on layers 0 and 2): a generation of 10x the
#    window keeps the sliding group's blocks flat while the full group grows.
W, BS = 16, 16
short = run_stats(["-m", gemma, "-p", "hello world", "-n", "40"])
long = run_stats(["-m", gemma, "-p", "hello world", "-n", str(10 * W)])
swa_s = [g for g in short["kv_groups"] if g["window"] == W][0]
swa_l = [g for g in long["kv_groups"] if g["window"] == W][0]
full_s = [g for g in short["kv_groups"] if g["window"] == 0][0]
full_l = [g for g in long["kv_groups"] if g["window"] == 0][0]
cap = -(-(W - 1) // BS) + 1
check(swa_l["blocks"] == swa_s["blocks"] <= cap,
      f"sliding group blocks flat: {swa_s['blocks']} after 40 tokens, {swa_l['blocks']} after {10 * W} (cap {cap})")
check(full_l["blocks"] > full_s["blocks"],
      f"full-attention group grows: {full_s['blocks']} -> {full_l['blocks']} blocks")

# 1b. Mistral-style sliding window on llama (attention.sliding_window on every layer):
#     the golden llama model with the key added. Positions inside the window see the
#     same context as without it, so their log-probabilities must be identical; later
#     ones must differ; the KV stays at the window however long the generation.
here = os.path.dirname(os.path.abspath(__file__))
llama = f"{root}/tests/data/golden/models/llama-gqa-bpe-f32.gguf"
swa_dir = tempfile.mkdtemp(prefix="kvllm-swa-")
atexit.register(shutil.rmtree, swa_dir, True)
swa_model = os.path.join(swa_dir, "llama-swa8.gguf")
subprocess.run([sys.executable, f"{here}/gguf_add_key.py", llama, swa_model, "llama.attention.sliding_window", "8"], check=True)
ids = ",".join(str(10 + 7 * i) for i in range(24))
def score(model):
    p = subprocess.run([kv, "score", "-m", model, "--ids", ids, "--top-logprobs", "5", "--json", "--kv-type", "f32"],
                       capture_output=True, text=True, check=True)
    return [json.loads(l) for l in p.stdout.split("\n") if l.strip()]
a, b = score(llama), score(swa_model)
inside = max(abs(x["next_logprob"] - y["next_logprob"]) for x, y in zip(a[:8], b[:8]))
outside = max(abs(x["next_logprob"] - y["next_logprob"]) for x, y in zip(a[8:23], b[8:23]))
check(inside < 1e-6 and outside > 1e-3,
      f"llama + sliding_window 8: positions < 8 equal (max diff {inside:.2g}), later differ (max {outside:.3g})")
g1 = run_stats(["-m", swa_model, "--prompt-ids", "1,2,3", "-n", "16"])["kv_groups"][0]
g2 = run_stats(["-m", swa_model, "--prompt-ids", "1,2,3", "-n", "80"])["kv_groups"][0]
check(g1["window"] == 8 and g1["blocks"] == g2["blocks"], f"llama sliding window KV flat: {g1['blocks']} -> {g2['blocks']} blocks")

# 2. Quantized KV on stories260K: allocation against f16 (same block count).
alloc = {t: run_stats(["-m", stories, "-n", "100", "--kv-type", t]) for t in ["f16", "bf16", "q8_0", "fp8"]}
base = alloc["f16"]["kv_allocated_bytes"]
for t, ratio in [("bf16", 1.0), ("q8_0", 34 / 64), ("fp8", 0.5)]:
    got = alloc[t]["kv_allocated_bytes"] / base
    check(abs(got - ratio) < 1e-9, f"{t} KV allocated {alloc[t]['kv_allocated_bytes']} B = {got:.4f} x f16 (want {ratio:.4f})")
split = run_stats(["-m", stories, "-n", "100", "--kv-type-k", "q8_0", "--kv-type-v", "f16"])
check(abs(split["kv_allocated_bytes"] / base - (34 / 64 + 1) / 2) < 1e-9,
      f"K q8_0 + V f16 allocated {split['kv_allocated_bytes']} B")

# 3. Quality against f16 KV (perplexity, KL divergence, top-1 agreement).
#    Bounds: bf16 +0.5% PPL, q8_0 +3%, fp8 +6%; mean KL < 0.01 / 0.01 / 0.05 nats; top-1 >= 90%.
ppl = {}
for t, dppl, dkl in [("f16", 0.0001, 1e-6), ("bf16", 0.005, 0.01), ("q8_0", 0.03, 0.01), ("fp8", 0.06, 0.05)]:
    p = subprocess.run([kv, "perplexity", "-m", stories, "-f", story_text, "-c", "128", "--kv-type", t,
                        "--kl-base", "f16", "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"FAIL perplexity {t}: {p.stderr}")
    r = json.loads(p.stdout.strip().split("\n")[-1])
    ppl[t] = r["final_ppl"]
    rel = r["final_ppl"] / ppl["f16"] - 1
    check(rel <= dppl and r["mean_kl"] < dkl and r["top1_agreement"] >= 0.9,
          f"{t}: PPL {r['final_ppl']:.4f} ({rel:+.2%} vs f16), KL {r['mean_kl']:.3g}, top-1 {r['top1_agreement']:.2%}")

# 4. The same for q8_0 on heads of 32 (llama-gqa-bpe): each head's slice is
#    whole q8_0 blocks, so the cache is head-major and attention converts only
#    its head (kv_block_layout); stories260K's heads of 8 take the whole-row path above.
p = subprocess.run([kv, "perplexity", "-m", llama, "-f", story_text, "-c", "128", "--kv-type", "q8_0",
                    "--kl-base", "f16", "--json"], capture_output=True, text=True)
if p.returncode != 0:
    raise SystemExit(f"FAIL perplexity q8_0 (heads of 32): {p.stderr}")
r = json.loads(p.stdout.strip().split("\n")[-1])
check(r["mean_kl"] < 0.01 and r["top1_agreement"] >= 0.9,
      f"q8_0, heads of 32: KL {r['mean_kl']:.3g} vs f16, top-1 {r['top1_agreement']:.2%}")

print("PASS" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
