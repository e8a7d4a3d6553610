#!/usr/bin/env python3
"""kvllm synth + kvllm bench, end to end on tiny shapes. Checks that the files
load and generate, that synth is deterministic, that the bench's JSON has the
documented fields with positive values, and that the sweep files are written.
Never asserts a time: the machine is shared and noisy."""
import json
import re
import os
import subprocess
import sys

kv, out = sys.argv[1:3]
os.makedirs(out, exist_ok=True)
failures = []


def run(args, want_rc=0, env=None):
    p = subprocess.run([kv] + args, capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, **env) if env else None)
    if p.returncode != want_rc:
        failures.append(f"{' '.join(args)}: exit {p.returncode}, wanted {want_rc}\n{p.stderr[-2000:]}")
    return p


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def synth(shape, typ, seed="1", threads="2"):
    path = os.path.join(out, f"{shape}-{typ}-{seed}-t{threads}.gguf")
    run(["synth", "--shape", shape, "--type", typ, "-o", path, "--seed", seed, "-t", threads])
    return path


# Every weight mix of the llama shape, and the qwen2 one (biases, NeoX rope).
for shape in ("tiny", "tiny-qwen2"):
    for typ in ("f16", "q8_0", "q4_0", "q4_k_m"):
        path = synth(shape, typ)
        info = run(["info", "-m", path]).stdout
        arch = "qwen2" if "qwen2" in shape else "llama"
        check(f"architecture  {arch}" in info and "vocab         1024 (gpt2" in info,
              f"info {shape} {typ}: architecture and vocabulary")
        gen = run(["run", "-m", path, "-p", "the cat", "-n", "4", "--temp", "0", "--ignore-eos", "--json"])
        ids = [l for l in gen.stdout.splitlines() if '"id"' in l]
        check(len(ids) == 4, f"run {shape} {typ}: 4 tokens generated")

# The 32-element types: every matrix but the tied output (Q6_K).
for typ in ("q4_1", "q5_0", "q5_1", "iq4_nl"):
    path = synth("tiny", typ)
    info = run(["info", "-m", path]).stdout
    check(f" {typ.upper()} x14" in info and " Q6_K x1" in info, f"{typ} mix: matrices {typ.upper()}, token_embd Q6_K")
    gen = run(["run", "-m", path, "-p", "the cat", "-n", "4", "--temp", "0", "--ignore-eos", "--json"])
    check(len([l for l in gen.stdout.splitlines() if '"id"' in l]) == 4, f"run tiny {typ}: 4 tokens generated")

# Q4_K_M keeps more bits where llama-quantize does.
info = run(["info", "-m", os.path.join(out, "tiny-q4_k_m-1-t2.gguf")]).stdout
check("Q4_K x12 Q6_K x3" in info, "q4_k_m mix: token_embd + layer-1 attn_v/ffn_down in Q6_K")

# The K-quant, IQ4_XS and IQ2_XXS mixes as llama-quantize picks them for this shape (2 layers,
# GQA 2; IQ2_XXS with an importance matrix: attn_v Q2_K, the tied output Q5_K; its codes random).
for typ, mix in (("q2_k", "Q2_K x8 Q3_K x6 Q6_K x1"), ("q3_k_m", "Q3_K x8 Q4_K x4 Q5_K x2 Q6_K x1"),
                 ("q4_k_s", "Q4_K x12 Q5_K x2 Q6_K x1"), ("q5_k_s", "Q5_K x14 Q6_K x1"),
                 ("q5_k_m", "Q5_K x12 Q6_K x3"), ("iq4_xs", "Q6_K x1 IQ4_XS x14"),
                 ("iq2_xxs", "Q2_K x2 Q5_K x1 IQ2_XXS x12")):
    path = synth("tiny", typ)
    check(mix in run(["info", "-m", path]).stdout, f"{typ} mix: {mix}")
    gen = run(["run", "-m", path, "-p", "the cat", "-n", "4", "--temp", "0", "--ignore-eos", "--json"])
    check(len([l for l in gen.stdout.splitlines() if '"id"' in l]) == 4, f"run tiny {typ}: 4 tokens generated")

# Mixture-of-experts shapes (qwen3moe; deepseek2 with MLA, a dense lead layer,
# a shared expert and YaRN): they load, report their experts and generate.
# deepseek2's Q4_K_M as llama-quantize picks it: ffn_down's layer count is the
# number of ffn_down tensors (1 dense + 2 x (exps, shexp) = 5), so layer 2's
# two ffn_down tensors and the output get Q6_K; attn_k_b rows of 64 fall
# back to Q5_0; the router and norms stay F32.
for shape, want in (("tiny-qwen3moe", "experts       8, 2 used per token"),
                    ("tiny-deepseek2", "experts       8, 2 used per token, softmax gating, expert ff 256, shared ff 256, on 2 of 3 layers"),
                    ("tiny-deepseek2-qlora", "experts       8, 2 used per token, softmax gating")):
    for typ in ("f16", "q4_k_m"):
        path = synth(shape, typ)
        info = run(["info", "-m", path]).stdout
        check(want in info, f"info {shape} {typ}: experts reported")
        gen = run(["run", "-m", path, "-p", "the cat", "-n", "4", "--temp", "0", "--ignore-eos", "--json"])
        check(len([l for l in gen.stdout.splitlines() if '"id"' in l]) == 4, f"run {shape} {typ}: 4 tokens generated")
info = run(["info", "-m", os.path.join(out, "tiny-deepseek2-q4_k_m-1-t2.gguf")]).stdout
check("F32 x12 Q5_0 x3 Q4_K x26 Q6_K x3" in info and "rope scaling  yarn, factor 4" in info,
      "deepseek2 q4_k_m mix and YaRN keys")
lst = run(["synth", "--list"]).stdout
check("qwen3-30b-a3b" in lst and "8/128+0 x768" in lst and "6/64+2 x1408" in lst, "synth --list: MoE shapes")
# gpt-oss as llama-quantize's MXFP4_MOE writes it: the 3-D experts MXFP4, every
# other matrix Q8_0 (the output too), router, biases, sinks and norms F32.
check("gpt-oss-20b" in lst and "4/32+0 x2880" in lst, "synth --list: gpt-oss-20b")
path = synth("tiny-gpt-oss", "mxfp4_moe")
info = run(["info", "-m", path]).stdout
check("tensor types  F32 x25 Q8_0 x10 MXFP4 x6" in info and "sliding window 128 tokens on 1 of 2 layers" in info
      and "rope scaling  yarn, factor 32, original context 4096" in info, "gpt-oss mxfp4_moe mix and keys")
gen = run(["run", "-m", path, "-p", "the cat", "-n", "4", "--temp", "0", "--ignore-eos", "--json"])
check(len([l for l in gen.stdout.splitlines() if '"id"' in l]) == 4, "run tiny-gpt-oss: 4 tokens generated")

# Deterministic for a seed (whatever the thread count), different for another.
a, b, c = synth("tiny", "q4_0", "7"), synth("tiny", "q4_0", "7", "1"), synth("tiny", "q4_0", "8")
a = open(a, "rb").read()
check(a == open(b, "rb").read(), "synth: same seed, same bytes with 1 and 2 threads")
check(a != open(c, "rb").read(), "synth: another seed, other bytes")

# --repeat-rows: same layout and size; rows past N repeat (no effect when N covers every tensor).
rr = {}
for n in ("8", "100000"):
    rr[n] = os.path.join(out, f"tiny-q4_0-7-rr{n}.gguf")
    run(["synth", "--shape", "tiny", "--type", "q4_0", "-o", rr[n], "--seed", "7", "--repeat-rows", n])
check(open(rr["100000"], "rb").read() == a, "synth --repeat-rows past every tensor's rows: the same bytes")
r8 = open(rr["8"], "rb").read()
check(len(r8) == len(a) and r8 != a, "synth --repeat-rows 8: same size, other bytes")
run(["synth", "--shape", "tiny", "--type", "q4_0", "-o", os.path.join(out, "x.gguf"), "--repeat-rows", "0"],
    want_rc=2)
run(["synth", "--shape", "no-such-shape", "--type", "f16", "-o", os.path.join(out, "x.gguf")], want_rc=2)
run(["synth", "--shape", "tiny", "--type", "q3_k", "-o", os.path.join(out, "x.gguf")], want_rc=2)
check(not os.path.exists(os.path.join(out, "x.gguf")), "synth: bad arguments write nothing")

# The bench itself, tiny sizes, JSON.
model = os.path.join(out, "tiny-q4_k_m-1-t2.gguf")
prefix = os.path.join(out, "sweep")
for f in (prefix + ".csv", prefix + ".svg"):
    if os.path.exists(f):
        os.remove(f)
p = run(["bench", "-m", model, "-p", "32", "-n", "8", "-r", "2", "-t", "2", "--batch", "4,2",
         "--context-sweep", "16,48", "--sweep-tokens", "4", "--out", prefix, "--membw", "--membw-mb", "32",
         "--json", "--no-progress"])
j = json.loads(p.stdout or "{}")
for key in ("prefill_tokens_per_s", "decode_tokens_per_s", "prefill_tokens_per_s_sd", "decode_tokens_per_s_sd",
            "model_size_bytes", "weights_bytes_per_token", "weights_gb_per_s", "membw_gb_per_s", "roofline_pct"):
    check(isinstance(j.get(key), (int, float)) and j[key] >= 0, f"bench json: {key}")
check(j.get("prefill_tokens_per_s", 0) > 0 and j.get("decode_tokens_per_s", 0) > 0, "bench json: rates > 0")
check(j.get("type") == "Q4_K_M" and j.get("threads") == 2 and j.get("reps") == 2, "bench json: type, threads, reps")
check([x.get("batch") for x in j.get("batches", [])] == [1, 4, 2], "bench json: batch 1 first, then 4 and 2")
check(all(x.get("decode_tokens_per_s", 0) > 0 for x in j.get("batches", [])), "bench json: batch rates > 0")
# The KV cache's reads, calculated: per token of the decode test, the f16 K and V
# of every layer at each timed step's context (prompt + k, k = 1 .. n - 1).
kv_tok = json.loads(run(["info", "-m", model, "--json"]).stdout or "{}").get("kv_bytes_per_token", {}).get("f16", 0)
want = kv_tok * (j.get("decode_prompt", 0) + j.get("n_decode", 0) / 2)
check(kv_tok > 0 and j.get("kv_read_bytes_per_token") == want,
      f"bench json: kv_read_bytes_per_token {j.get('kv_read_bytes_per_token')} = {kv_tok} x mean context ({want})")
for x in [j] + j.get("batches", []):
    w = j.get("weights_bytes_per_token", 0) / x.get("batch", 1)
    check(abs(x.get("read_bytes_per_token", 0) - (w + want)) < 1e-6 * (w + want) and
          x.get("roofline_read_pct", 0) > x.get("roofline_pct", 1e9) - 1e-9,
          f"bench json batch {x.get('batch', 1)}: read bytes = weights / batch + KV, its roofline share >= the weights'")
sweep = j.get("context_sweep", [])
check([x.get("context") for x in sweep] == [16, 48] and all(x["kv_cache_ms_per_token"] > 0 for x in sweep),
      "bench json: context sweep with the cache")
check(all(x["no_kv_cache_skipped"] or x["no_kv_cache_ms_per_token"] > 0 for x in sweep),
      "bench json: context sweep without the cache")
csv = open(prefix + ".csv").read().splitlines() if os.path.exists(prefix + ".csv") else []
check(len(csv) == 3 and csv[0].startswith("context,"), "sweep csv: header and two rows")
svg = open(prefix + ".svg").read() if os.path.exists(prefix + ".svg") else ""
check(svg.startswith("<svg") and svg.rstrip().endswith("</svg>") and "<polyline" in svg, "sweep svg written")

# A mixture-of-experts model's weights per token, measured from the routing:
# one sequence reads exactly one token's selection (the calculated figure); four
# share the experts they pick alike, so a token reads between a quarter of that
# and all of it; a dense model has no such fields.
moe = os.path.join(out, "tiny-qwen3moe-q4_k_m-1-t2.gguf")
ex = json.loads(run(["info", "-m", moe, "--json"]).stdout or "{}").get("experts", {})
one = ex.get("expert_weights_bytes", 0) * ex.get("used", 0) / max(ex.get("count", 1), 1)
p = run(["bench", "-m", moe, "-p", "0", "-n", "6", "-r", "1", "-t", "2", "--batch", "1,4", "--json",
         "--no-progress"])
jm = json.loads(p.stdout or "{}")
bt = {x.get("batch"): x for x in jm.get("batches", [])}
r1, r4 = bt.get(1, {}), bt.get(4, {})
check(one > 0 and r1.get("moe_routed_bytes_per_token_measured") == one and
      r1.get("weights_bytes_per_token_measured") == jm.get("weights_bytes_per_token"),
      f"bench moe batch 1: routed bytes measured {r1.get('moe_routed_bytes_per_token_measured')} = one token's {one}")
check(one / 4 <= r4.get("moe_routed_bytes_per_token_measured", 0) <= one and
      r4.get("weights_gb_per_s_measured", 0) > 0,
      f"bench moe batch 4: {r4.get('moe_routed_bytes_per_token_measured')} routed bytes a token, within [{one / 4}, {one}]")
check("moe_routed_bytes_per_token_measured" not in json.dumps(j), "bench json: no routed-expert fields for a dense model")

# --membw-steps: a probe after every timed decoding step; each test's decode
# GB/s over what those probes read is its roofline share against them.
p = run(["bench", "-m", model, "-p", "0", "-n", "6", "-r", "1", "-t", "2", "--batch", "2", "--membw-steps",
         "--membw-mb", "16", "--membw-step-mb", "8", "--json", "--no-progress"])
j = json.loads(p.stdout or "{}")
for x in [j] + j.get("batches", []):
    bw, pct = x.get("membw_between_steps_gb_per_s", 0), x.get("roofline_between_steps_pct", 0)
    check(bw > 0 and abs(pct - 100 * x.get("weights_gb_per_s", 0) / bw) < 1e-6 * pct and
          x.get("roofline_read_between_steps_pct", 0) > pct,
          f"bench --membw-steps batch {x.get('batch', 1)}: bandwidth between steps and the shares against it")
check(j.get("membw_gb_per_s", 0) > 0, "bench --membw-steps implies --membw")
p = run(["bench", "-m", model, "-p", "0", "-n", "4", "-r", "1", "--membw-steps", "--membw-mb", "16",
         "--membw-step-mb", "8", "--no-progress"])
check("read between its steps" in p.stdout, "bench --membw-steps: text report")
# the text table's shares: the weights', then with the KV cache's reads added (larger)
m = re.search(r"^\| tg4 .*\|\s+(\d+)% \|\s+(\d+)% \|$", p.stdout, re.M)
check(m is not None and int(m.group(2)) >= int(m.group(1)) > 0,
      f"bench text: roofline and 'with KV' columns ({m.group(0) if m else p.stdout[-400:]})")
m = re.search(r"roofline (\d+)%, with KV (\d+)%", p.stdout)
check(m is not None and int(m.group(2)) >= int(m.group(1)), "bench text: between steps, with KV")
run(["bench", "-m", model, "--membw-steps", "--membw-step-mb", "3"], want_rc=2)

# A zero budget skips the recompute sweep and says so.
p = run(["bench", "-m", model, "-p", "0", "-n", "0", "-r", "1", "--context-sweep", "16", "--sweep-tokens", "3",
         "--no-cache-budget", "0", "--out", prefix, "--json"])
j = json.loads(p.stdout or "{}")
check(j.get("context_sweep", [{}])[0].get("no_kv_cache_skipped") is True, "sweep: over budget -> skipped")

# The machine the figures come from: the CPU's name as the kernel reports it
# (/proc/cpuinfo's "model name", where there is one) and the decode kernels'
# prefetch hint, non-temporal on AMD with AVX-512, into L2 on other AVX-512
# CPUs, none below AVX-512.
cpuinfo = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
model_name = next((l.split(":", 1)[1].strip() for l in cpuinfo.splitlines() if l.startswith("model name")), None)
vendor = next((l.split(":", 1)[1].strip() for l in cpuinfo.splitlines() if l.startswith("vendor_id")), "")
if model_name is not None:
    check(" ".join(str(j.get("cpu")).split()) == " ".join(model_name.split()), f"bench json: cpu {j.get('cpu')!r} = {model_name!r}")
want = ("nta" if vendor == "AuthenticAMD" else "t1") if j.get("isa") == "avx512" else "none"
check(j.get("decode_prefetch") == want, f"bench json: decode_prefetch {j.get('decode_prefetch')!r} ({want})")
p = run(["bench", "-m", model, "-p", "8", "-n", "2", "-r", "1", "--json", "--no-progress"],
        env={"KVLLM_KERNELS": "avx2"})
j2 = json.loads(p.stdout or "{}")
check(j2.get("isa") in ("avx2", "scalar") and j2.get("decode_prefetch") == "none",
      "bench json: decode_prefetch none below AVX-512")

# Text table, and the bandwidth-only mode.
p = run(["bench", "-m", model, "-p", "16", "-n", "4", "-r", "1"])
check("| pp16" in p.stdout and "| tg4 " in p.stdout, "bench text table")
check("  CPU: " in p.stdout and "(decode prefetch: " in p.stdout, "bench text: the CPU line")
p = run(["bench", "--membw", "--membw-mb", "32", "--json"])
check(json.loads(p.stdout or "{}").get("membw_gb_per_s", 0) > 0, "bench --membw alone")
run(["bench", "-m", model, "--batch", "0"], want_rc=2)

print(f"{len(failures)} failed" if failures else "all passed")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
