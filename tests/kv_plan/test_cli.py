#!/usr/bin/env python3
"""CLI tests for `kvllm kv-plan`: usage  test_cli.py KVLLM_BIN SOURCE_ROOT GROUP

GROUP is one of:
  figures  every row of docs/kv-figures.md, exact bytes, from the config.json fixtures
  verify   --verify: the planner's allocation equals the engine pools', measured, for every
           shipped architecture and KV type (split K/V types too), sliding windows included
  e2e      the planner's figures for T equal `kvllm run --json`'s measured KV after a real generation
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


GOLDEN = "tests/data/golden/models/"
# Every architecture that ships a GGUF: llama (stories260K, llama-gqa), qwen3,
# gemma3 (sliding window 16 in 2 of 4 layers) and deepseek2 (MLA, 48-value rows).
ENGINE_MODELS = ["models/stories260K.gguf", GOLDEN + "llama-gqa-bpe-q8_0.gguf", GOLDEN + "qwen3-f32.gguf",
                 GOLDEN + "gemma3-swa-f32.gguf", GOLDEN + "deepseek2-mla-f32.gguf"]
KV_TYPES = [["--kv-type", t] for t in ("f32", "f16", "bf16", "q8_0", "fp8")] + [
    ["--kv-type-k", "q8_0", "--kv-type-v", "fp8"], ["--kv-type-k", "fp8", "--kv-type-v", "bf16"],
    ["--kv-type", "f32", "--kv-type-v", "q8_0"]]


def q8_refused(mpath, kv):
    """deepseek2's MLA K row (32 latent + 16 rope = 48 values) is not whole q8_0 blocks."""
    return "deepseek2" in mpath and kv[kv.index("--kv-type-k" if "--kv-type-k" in kv else "--kv-type") + 1] == "q8_0"


def check_verify(label, args, source="engine"):
    j = plan(*args, "--verify")
    v = j.get("verify", {})
    expect(f"{label} source", v.get("pool_shape_from"), source)
    expect(f"{label} agree", v.get("agree"), True)
    expect(f"{label} allocated", v.get("measured_allocated_bytes"), j.get("allocated_bytes"))
    expect(f"{label} lower bound", v.get("measured_lower_bound_bytes"), j.get("lower_bound_bytes"))
    expect(f"{label} held at T", v.get("measured_end_bytes"),
           j.get("seq_held_bytes", -1) * j.get("concurrency", 0))
    groups = v.get("groups", [])
    expect(f"{label} groups", len(groups), (j.get("n_swa_layers", 0) > 0) + (j.get("n_layers") != j.get("n_swa_layers")))
    for g in groups:
        swa = g["window"] > 0
        expect(f"{label} window {g['window']} block bytes", g["measured_block_bytes"],
               j.get("swa_block_bytes" if swa else "block_bytes"))
        expect(f"{label} window {g['window']} peak blocks", g["measured_peak_blocks"],
               j.get("swa_blocks_per_seq" if swa else "blocks_per_seq", -1) * j.get("concurrency", 0))
        expect(f"{label} window {g['window']} blocks at T", g["measured_end_blocks"],
               j.get("swa_blocks_held" if swa else "blocks_per_seq", -1) * j.get("concurrency", 0))
    return j


def verify():
    cases = [["--context", "256", "--concurrency", "4"],
             ["--context", "1000", "--concurrency", "3"],
             ["--context", "77", "--concurrency", "5", "--block-size", "7"]]
    for mpath in ENGINE_MODELS:
        for kv in KV_TYPES:
            for c in cases:
                args = ["-m", mpath, *c, *kv]
                if q8_refused(mpath, kv):
                    rc, out, err = run(*args, "--verify")
                    expect(f"{args} refused exit", rc, 2)
                    expect(f"{args} refused message", "multiple of 32" in err, True)
                    continue
                check_verify(f"verify {args}", args)
        text_has(f"verify text {mpath}", ["-m", mpath, "--context", "100", "--verify"], "AGREE", "measured")
    # gemma3's sliding group (W = 16) around the window and block edges, T = 10 W included.
    g3 = ["-m", GOLDEN + "gemma3-swa-f32.gguf"]
    for t in (1, 15, 16, 17, 31, 32, 33, 159, 160, 161, 1000):
        for bs in ("16", "7", "32", "5", "15", "1"):
            j = check_verify(f"gemma3 T={t} bs={bs}", g3 + ["--context", str(t), "--block-size", bs,
                                                         "--concurrency", "2", "--kv-type", "q8_0"])
    j = check_verify("gemma3 T=160", g3 + ["--context", "160"])
    expect("gemma3 T=160 peak sliding blocks", j.get("swa_blocks_per_seq"), 2)
    expect("gemma3 T=160 sliding blocks held", j.get("swa_blocks_held"), 1)
    # Shapes the engine cannot load: the planner's groups, the real pools.
    check_verify("layer_types config", ["--config", cfg("synthetic-layer-types.json"), "--context", "2000",
                                        "--concurrency", "2", "--kv-type", "fp8"], source="planner")
    check_verify("by hand, all sliding", ["--layers", "3", "--kv-heads", "2", "--head-dim", "64",
                                          "--sliding-window", "100", "--context", "777", "--kv-type-k", "q8_0",
                                          "--kv-type-v", "f16"], source="planner")
    check_verify("by hand, MLA", ["--layers", "2", "--kv-lora-rank", "512", "--rope-dim", "64",
                                  "--context", "300", "--kv-type", "q8_0"], source="planner")
    rc, out, err = run("-m", ENGINE_MODELS[0], "--context", "1000000", "--concurrency", "100000", "--verify")
    expect("verify too big exit", rc != 0, True)
    expect("verify too big message", "smaller context" in err, True)


def engine_run(mpath, n_prompt, n_gen, kv):
    """`kvllm run --json`: the final stats line."""
    ids = ",".join(str(2 + i % 50) for i in range(n_prompt))
    p = subprocess.run([BIN, "run", "-m", mpath, "--prompt-ids", ids, "-n", str(n_gen), "--ignore-eos",
                        "--temp", "0", "--json", *kv], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        failures.append(f"run {mpath} {kv}: exit {p.returncode}: {p.stderr.strip()}")
        return {}
    return json.loads(p.stdout.strip().splitlines()[-1]).get("stats", {})


def e2e():
    """The planner's per-sequence figures for T = kv_tokens against what the
    engine measured at the end of a real generation (prompt + n tokens: the
    last generated token's KV is not computed, so T = prompt + n - 1)."""
    stories = "models/stories260K.gguf"
    g3, ds2 = GOLDEN + "gemma3-swa-f32.gguf", GOLDEN + "deepseek2-mla-f32.gguf"
    runs = [(stories, 20, 30, ["--kv-type", "f16"]), (stories, 20, 30, ["--kv-type", "q8_0"]),
            (stories, 20, 30, ["--kv-type", "fp8"]), (stories, 7, 9, ["--kv-type", "f32"]),
            (stories, 33, 3, ["--kv-type-k", "q8_0", "--kv-type-v", "fp8"]),
            (GOLDEN + "llama-gqa-bpe-q8_0.gguf", 12, 20, ["--kv-type", "bf16"]),
            (GOLDEN + "qwen3-f32.gguf", 12, 20, ["--kv-type", "q8_0"]),
            (g3, 10, 151, ["--kv-type", "f32"]),   # T = 160 = 10 W: the window is block-aligned
            (g3, 10, 152, ["--kv-type", "f32"]),   # T = 161: the window straddles two blocks
            (g3, 10, 151, ["--kv-type", "q8_0"]), (g3, 10, 145, ["--kv-type", "fp8"]),
            (g3, 5, 6, ["--kv-type", "f16"]),      # T = 10 < W
            (g3, 40, 2, ["--kv-type", "bf16"]),    # prompt past the window, then one decode step
            (g3, 10, 40, ["--kv-type", "f16", "--block-size", "7"]),
            (ds2, 10, 40, ["--kv-type", "f32"]), (ds2, 10, 40, ["--kv-type", "f16"]),
            (ds2, 10, 40, ["--kv-type", "fp8"]), (ds2, 20, 5, ["--kv-type", "bf16"])]
    for mpath, n_prompt, n_gen, kv in runs:
        label = f"e2e {os.path.basename(mpath)} {n_prompt}+{n_gen} {' '.join(kv)}"
        s = engine_run(mpath, n_prompt, n_gen, kv)
        if not s:
            continue
        T = s["kv_tokens"]
        expect(f"{label} kv_tokens", T, n_prompt + n_gen - 1)
        bs = ["--block-size", kv[kv.index("--block-size") + 1]] if "--block-size" in kv else []
        types = [a for a in kv if a not in bs]
        j = check_verify(label + " verify", ["-m", mpath, "--context", str(T), *types, *bs])
        expect(f"{label} held bytes", j.get("seq_held_bytes"), s["kv_allocated_bytes"])
        expect(f"{label} lower bound", j.get("seq_lower_bound_bytes"), s["kv_lower_bound_bytes"])
        expect(f"{label} kv_type", j.get("kv_type"), s["kv_type"])
        for g in s.get("kv_groups", []):
            swa = g["window"] > 0
            blocks = j.get("swa_blocks_held" if swa else "blocks_per_seq")
            expect(f"{label} window {g['window']} blocks", g["blocks"], blocks)
            expect(f"{label} window {g['window']} bytes", g["allocated_bytes"],
                   blocks * j.get("swa_block_bytes" if swa else "block_bytes", 0))
        if j.get("n_swa_layers", 0) == 0:  # no window: the allocation itself is what the engine holds
            expect(f"{label} allocated", j.get("seq_allocated_bytes"), s["kv_allocated_bytes"])
        else:  # sliding: the allocation is the decode peak; what is held at T is at most one block less
            extra = j.get("seq_allocated_bytes", 0) - s["kv_allocated_bytes"]
            expect(f"{label} peak - held", extra in (0, j.get("swa_block_bytes")), True)
            if T == 160:  # T = 10 W, W and T block-aligned: [T - W, T) is exactly one block
                expect(f"{label} T = 10 W: held one block below the peak", extra, j.get("swa_block_bytes"))
            if T in (10, 161):
                expect(f"{label} allocated", j.get("seq_allocated_bytes"), s["kv_allocated_bytes"])


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
    # --budget available: what this process may take now (MemAvailable, or a memory cgroup's room)
    meminfo = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemAvailable:"))
    j = plan("--config", cfg("llama-3-8b.json"), "--context", "8192", "--budget", "available",
             "--weights-bytes", "16GB")
    expect("budget available: a figure of this machine",
           0 < j.get("budget_bytes", 0) <= meminfo * 1.25, True)
    expect("budget available: its source", j.get("budget_source") in
           ("MemAvailable now", "the memory cgroup's room now"), True)
    expect("budget available: max_concurrency from it",
           j.get("max_concurrency") == max(0, (j.get("budget_bytes", 0) - 16 * 10**9) // ((1 << 30) + 512 * 4 + 64)), True)


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
    bad("unknown kv type", c + ["--context", "1", "--kv-type", "q4_1"], "--kv-type")
    bad("unknown V kv type", c + ["--context", "1", "--kv-type-v", "int4"], "--kv-type-v")
    bad("q8_0 row not whole blocks", ["-m", "tests/data/golden/models/deepseek2-mla-f32.gguf", "--context", "1",
                                      "--kv-type", "q8_0"], "multiple of 32")
    bad("q8_0 V row not whole blocks", ["--layers", "2", "--kv-heads", "1", "--head-dim", "48", "--context", "1",
                                        "--kv-type-v", "q8_0"], "V row of 48 values")
    bad("bad budget", c + ["--context", "1", "--budget", "lots"], "--budget")
    bad("fractional bytes", c + ["--context", "1", "--budget", "0.1KiB"], "--budget")
    bad("no model", ["--context", "1"], "no model")
    bad("both sources", c + ["-m", "models/stories260K.gguf", "--context", "1"], "not both")
    bad("unreadable gguf", ["-m", cfg("does-not-exist.gguf"), "--context", "1"], "does-not-exist")
    bad("not a gguf", ["-m", cfg("llama-3-8b.json"), "--context", "1"], "llama-3-8b.json")
    bad("missing value", c + ["--context"], "--context")
    bad("overflow", c + ["--context", "1000000000000", "--concurrency", "2000000000"], "64-bit")


GROUPS = {"figures": figures, "verify": verify, "e2e": e2e, "budget": budget, "errors": errors}
GROUPS[GROUP]()
for f in failures:
    print("FAIL:", f)
print(f"kv-plan {GROUP}: {'ok' if not failures else str(len(failures)) + ' failure(s)'}")
sys.exit(1 if failures else 0)
