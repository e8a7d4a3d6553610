#!/usr/bin/env python3
"""CLI tests for `kvllm kv-plan`: usage  test_cli.py KVLLM_BIN SOURCE_ROOT GROUP

GROUP is one of:
  figures  every row of docs/kv-figures.md, exact bytes, from the config.json fixtures
  verify   --verify: the planner's allocation equals the engine pool's, measured
  budget   --budget / max_concurrency
  errors   bad inputs exit nonzero with a clear message
"""
import json
import os
import subprocess
import sys

BIN, ROOT, GROUP = sys.argv[1], sys.argv[2], sys.argv[3]
FIX = os.path.join(ROOT, "tests", "kv_plan")
failures = []


def run(*args):
    p = subprocess.run([BIN, "kv-plan", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def plan(*args):
    rc, out, err = run(*args, "--json")
    if rc != 0:
        failures.append(f"kv-plan {' '.join(args)}: exit {rc}: {err.strip()}")
        return {}
    return json.loads(out)


def expect(what, got, want):
    if got != want:
        failures.append(f"{what}: got {got!r}, want {want!r}")


def cfg(name):
    return os.path.join(FIX, name)


def row(label, args, **want):
    j = plan(*args)
    for k, v in want.items():
        expect(f"{label} {k}", j.get(k), v)
    return j


def text_has(label, args, *needles):
    rc, out, err = run(*args)
    expect(f"{label} exit", rc, 0)
    for n in needles:
        if n not in out:
            failures.append(f"{label}: output lacks {n!r}\n{out}")


def figures():
    q = ["--config", cfg("qwen3-32b.json"), "--context", "32768"]
    row("Qwen3-32B", q, bytes_per_token=262144, lower_bound_bytes=8589934592)
    row("Qwen3-32B x20", q + ["--concurrency", "20"], lower_bound_bytes=171798691840,
        allocated_bytes=171798691840)
    row("Qwen3-32B MHA", q + ["--kv-heads", "64"], bytes_per_token=2097152, lower_bound_bytes=68719476736)
    row("Qwen3-32B MHA x20", q + ["--kv-heads", "64", "--concurrency", "20"],
        lower_bound_bytes=1374389534720)
    row("Qwen3-32B fp8 x20", q + ["--kv-type", "fp8", "--concurrency", "20"], bytes_per_token=131072,
        lower_bound_bytes=85899345920)
    text_has("Qwen3-32B text", q + ["--concurrency", "20"], "262,144 B (256 KiB, 262.14 KB)",
             "171,798,691,840 B (160 GiB, 171.8 GB)", "(calculated)", "1.25 TiB -> 160 GiB",
             "160 GiB -> 80 GiB")
    l8 = ["--config", cfg("llama-3-8b.json"), "--context", "8192"]
    row("Llama-3-8B", l8, bytes_per_token=131072, lower_bound_bytes=1073741824)
    j = row("Llama-3-8B x32", l8 + ["--concurrency", "32", "--weights-bytes", "16GB"],
            lower_bound_bytes=34359738368, weights_bytes=16000000000)
    expect("Llama-3-8B x32 total", j.get("total_bytes"),
           16000000000 + 34359738368 + 32 * (512 * 4 + 64))
    text_has("Llama-3-8B text", l8, "1,073,741,824 B (1 GiB, 1.07 GB)")
    text_has("Llama-3-8B x32 text", l8 + ["--concurrency", "32"], "34,359,738,368 B (32 GiB, 34.36 GB)")
    l2 = ["--config", cfg("llama-2-7b.json")]
    row("Llama-2-7B 4K", l2 + ["--context", "4096"], bytes_per_token=524288, lower_bound_bytes=2147483648)
    row("Llama-2-7B 8K", l2 + ["--context", "8192"], lower_bound_bytes=4294967296)
    j = row("DeepSeek-V3", ["--config", cfg("deepseek-v3.json"), "--context", "1"], bytes_per_token=70272,
            kv_type="bf16", kv_lora_rank=512, rope_dim=64)
    mla = [s for s in j.get("savings", []) if s["what"] == "MLA"]
    expect("DeepSeek-V3 MLA baseline", mla and mla[0]["baseline_bytes_per_token"], 61 * 128 * 320 * 2)
    row("DeepSeek-V3 by hand", ["--layers", "61", "--kv-lora-rank", "512", "--rope-dim", "64",
                                "--kv-type", "bf16", "--context", "1"], bytes_per_token=70272)
    row("48-layer GQA", ["--layers", "48", "--kv-heads", "8", "--head-dim", "128", "--context", "1"],
        bytes_per_token=196608)
    row("Llama-3-70B", ["--config", cfg("llama-3-70b.json"), "--context", "1"], bytes_per_token=327680)
    text_has("Llama-3-70B text", ["--config", cfg("llama-3-70b.json"), "--context", "1"],
             "327,680 B (320 KiB, 327.68 KB)")
    # Mistral-7B's 4096-token window: KV stops growing at W tokens.
    m = ["--config", cfg("mistral-7b-v0.1.json"), "--context", "32768"]
    j = row("Mistral-7B SWA", m, bytes_per_token=131072, lower_bound_bytes=4096 * 131072,
            sliding_window=4096, n_swa_layers=32)
    swa = [s for s in j.get("savings", []) if s["what"] == "SWA"]
    expect("Mistral-7B SWA baseline", swa and swa[0]["baseline_lower_bound_bytes"], 32768 * 131072)
    # A GGUF's metadata: gemma3's pattern (every 2nd layer full), deepseek2's MLA.
    row("gemma3 gguf", ["-m", "tests/data/golden/models/gemma3-swa-f32.gguf", "--context", "100"],
        n_swa_layers=2, sliding_window=16, lower_bound_bytes=2 * 256 * 100 + 2 * 256 * 16)
    row("deepseek2 gguf", ["-m", "tests/data/golden/models/deepseek2-mla-f32.gguf", "--context", "1",
                           "--kv-type", "f32"], bytes_per_token=2 * 48 * 4)


def verify():
    models = ["models/stories260K.gguf", "tests/data/golden/models/llama-gqa-bpe-q8_0.gguf"]
    cases = [["--context", "256", "--concurrency", "4"],
             ["--context", "1000", "--concurrency", "3", "--kv-type", "f32"],
             ["--context", "77", "--concurrency", "5", "--block-size", "7", "--kv-type", "bf16"]]
    for mpath in models:
        for c in cases:
            args = ["-m", mpath, *c, "--verify"]
            j = plan(*args)
            v = j.get("verify", {})
            expect(f"verify {args} source", v.get("pool_shape_from"), "engine")
            expect(f"verify {args} agree", v.get("agree"), True)
            expect(f"verify {args} allocated", v.get("measured_allocated_bytes"), j.get("allocated_bytes"))
            expect(f"verify {args} lower bound", v.get("measured_lower_bound_bytes"),
                   j.get("lower_bound_bytes"))
        text_has(f"verify text {mpath}", ["-m", mpath, "--context", "100", "--verify"], "AGREE", "measured")
    rc, out, err = run("-m", models[0], "--context", "100", "--kv-type", "q8_0", "--verify")
    expect("verify q8_0 exit", rc != 0, True)
    expect("verify q8_0 message", "pool stores" in err, True)


def budget():
    l8 = ["--config", cfg("llama-3-8b.json"), "--context", "8192", "--budget", "80GiB"]
    # (80 GiB - 16 GB) / (1 GiB of KV + 512 x 4 + 64 B of metadata) = 65.09
    j = row("budget 16GB", l8 + ["--weights-bytes", "16GB"], max_concurrency=65, fits=True,
            budget_bytes=80 << 30)
    j = row("budget B=65", l8 + ["--weights-bytes", "16GB", "--concurrency", "65"], fits=True)
    expect("B=65 within", j.get("total_bytes", 1 << 62) <= 80 << 30, True)
    j = row("budget B=66", l8 + ["--weights-bytes", "16GB", "--concurrency", "66"], fits=False)
    expect("B=66 over", j.get("total_bytes", 0) > 80 << 30, True)
    row("budget params", l8 + ["--params", "8.03B"], weights_bytes=16060000000, max_concurrency=65)
    row("budget too small", l8[:-1] + ["10GB", "--weights-bytes", "16GB"], max_concurrency=0, fits=False)
    j = plan("--config", cfg("llama-3-8b.json"), "--context", "8192")
    expect("no budget: no max_concurrency", "max_concurrency" in j, False)
    text_has("budget text", l8 + ["--weights-bytes", "16GB"], "max concurrency 65")


def errors():
    def bad(label, args, needle):
        rc, out, err = run(*args)
        if rc == 0:
            failures.append(f"{label}: exit 0, want nonzero")
        if needle not in err:
            failures.append(f"{label}: stderr lacks {needle!r}: {err.strip()}")

    c = ["--config", cfg("llama-3-8b.json")]
    bad("missing --context", c, "--context")
    bad("negative context", c + ["--context", "-5"], "--context")
    bad("zero context", c + ["--context", "0"], "at least 1")
    bad("negative concurrency", c + ["--context", "10", "--concurrency", "-1"], "--concurrency")
    bad("negative layers", ["--layers", "-3", "--kv-heads", "8", "--head-dim", "128", "--context", "1"],
        "--layers")
    bad("missing head dim", ["--layers", "3", "--kv-heads", "8", "--context", "1"], "head dim")
    bad("unreadable config", ["--config", cfg("does-not-exist.json"), "--context", "1"], "cannot open")
    bad("bad JSON", ["--config", cfg("bad-syntax.json"), "--context", "1"], "not a JSON object")
    bad("bad field", ["--config", cfg("bad-type.json"), "--context", "1"], "num_attention_heads")
    bad("unknown kv type", c + ["--context", "1", "--kv-type", "q4_0"], "--kv-type")
    bad("bad budget", c + ["--context", "1", "--budget", "lots"], "--budget")
    bad("fractional bytes", c + ["--context", "1", "--budget", "0.1KiB"], "--budget")
    bad("no model", ["--context", "1"], "no model")
    bad("both sources", c + ["-m", "models/stories260K.gguf", "--context", "1"], "not both")
    bad("unreadable gguf", ["-m", cfg("does-not-exist.gguf"), "--context", "1"], "does-not-exist")
    bad("not a gguf", ["-m", cfg("llama-3-8b.json"), "--context", "1"], "llama-3-8b.json")
    bad("missing value", c + ["--context"], "--context")
    bad("overflow", c + ["--context", "1000000000000", "--concurrency", "2000000000"], "64-bit")


GROUPS = {"figures": figures, "verify": verify, "budget": budget, "errors": errors}
GROUPS[GROUP]()
for f in failures:
    print("FAIL:", f)
print(f"kv-plan {GROUP}: {'ok' if not failures else str(len(failures)) + ' failure(s)'}")
sys.exit(1 if failures else 0)
