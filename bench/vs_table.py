#!/usr/bin/env python3
"""The table of bench/run_vs_llamacpp.sh, from the raw results it leaves in OUT:
mean ± sd over the alternating repetitions, the ratio kvllm / llama.cpp, and each
engine's share of the decode roofline (weights read per step x steps/s / bandwidth);
with results of a second kvllm binary (BEFORE=, files before-*.jsonl) also its t/s,
after / before and its roofline share.
usage: vs_table.py OUT "f16 q8_0 ..." SHAPE LLAMA_CPP_COMMIT THREADS [SETTINGS]"""
import json
import os
import statistics
import sys

out, types, shape, commit, threads = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4], sys.argv[5]
settings = sys.argv[6] if len(sys.argv) > 6 else ""
bw = max(json.load(open(p))["membw_gb_per_s"] for p in (f"{out}/membw.json", f"{out}/membw-end.json")
         if os.path.exists(p))


def jl(path):
    return [json.loads(l) for l in open(path) if l.startswith("{")] if os.path.exists(path) else []


def ms(xs):
    return (statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0) if xs else (0.0, 0.0)


def pct(w, tps, b=1):
    """Weights read per second (one pass over them per step of b tokens) / bandwidth."""
    return f"{100 * w * tps / b / 1e9 / bw:.0f}%" if w and tps else ""


has_before = any(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out) if f.startswith("before-"))


def row(model, test, l, k, w=0, b=1, bf=(0.0, 0.0)):
    ratio = f"{k[0] / l[0]:.2f}" if l[0] else ""
    extra = ""
    if has_before:
        gain = f"{k[0] / bf[0]:.2f}" if bf[0] else ""
        extra = f" {bf[0]:.2f} ± {bf[1]:.2f} | {gain} | {pct(w, bf[0], b)} |"
    print(f"| {model} | {test} | {l[0]:.2f} ± {l[1]:.2f} | {k[0]:.2f} ± {k[1]:.2f} | {ratio} | "
          f"{pct(w, l[0], b)} | {pct(w, k[0], b)} |{extra}")


def kbatch(runs, b):
    return [e["decode_tokens_per_s"] for r in runs for e in r["batches"] if e["batch"] == b]


print(f"Read bandwidth {bw:.1f} GB/s ({threads} threads, `kvllm bench --membw`, the better of start and end); "
      f"llama.cpp {commit}; "
      f"{shape} shape, synthetic weights; {settings + '; ' if settings else ''}"
      f"mean ± sd over alternating repetitions\n")
print("| model | test | llama.cpp t/s | kvllm t/s | kvllm / llama.cpp | roofline llama.cpp | roofline kvllm |"
      + (" kvllm before t/s | after / before | roofline before |" if has_before else ""))
print("|---|---|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if has_before else ""))
for t in types:
    ls, ks = jl(f"{out}/llama-{t}-single.jsonl"), jl(f"{out}/kvllm-{t}-single.jsonl")
    bs, bb = jl(f"{out}/before-{t}-single.jsonl"), jl(f"{out}/before-{t}-batch.jsonl")
    if not ls or not ks:
        continue
    name = f"{shape} {ks[0]['type']} ({ks[0]['model_size_bytes'] / 1e9:.2f} GB)"
    w = ks[0]["weights_bytes_per_token"]
    row(name, f"prefill {ls[0]['pp']}", ms([x["speed_pp"] for x in ls]), ms([x["prefill_tokens_per_s"] for x in ks]),
        bf=ms([x["prefill_tokens_per_s"] for x in bs]))
    row(name, f"decode {ls[0]['tg']} after {ls[0]['pp']}", ms([x["speed_tg"] for x in ls]),
        ms([x["decode_tokens_per_s"] for x in ks]), w, bf=ms([x["decode_tokens_per_s"] for x in bs]))
    lb, kb = jl(f"{out}/llama-{t}-batch.jsonl"), jl(f"{out}/kvllm-{t}-batch.jsonl")
    for b in sorted({x["pl"] for x in lb}):
        row(name, f"decode x{b} sequences, aggregate (prompt {lb[0]['pp']})",
            ms([x["speed_tg"] for x in lb if x["pl"] == b]), ms(kbatch(kb, b)), w, b, ms(kbatch(bb, b)))

ls, ks = jl(f"{out}/llama-stories.jsonl"), jl(f"{out}/kvllm-stories.jsonl")
if ls and ks:
    row("stories260K F32", "prefill 128", ms([x["avg_ts"] for x in ls if x["n_prompt"] > 0]),
        ms([x["prefill_tokens_per_s"] for x in ks]))
    row("stories260K F32", "decode 64", ms([x["avg_ts"] for x in ls if x["n_gen"] > 0]),
        ms([x["decode_tokens_per_s"] for x in ks]), ks[0]["weights_bytes_per_token"])
steps = [(t, ks) for t in types for ks in [jl(f"{out}/kvllm-{t}-single.jsonl")]
         if ks and all("membw_between_steps_gb_per_s" in x for x in ks)]
if steps:
    print("\nkvllm's single-sequence decode against the bandwidth read by probes between its steps "
          "(`--membw-steps`; the same seconds as the decode), mean ± sd over the repetitions:\n")
    print("| model | kvllm decode t/s | bandwidth between steps GB/s | roofline kvllm, between steps |")
    print("|---|---:|---:|---:|")
    for t, ks in steps:
        d, bwx = ms([x["decode_tokens_per_s"] for x in ks]), ms([x["membw_between_steps_gb_per_s"] for x in ks])
        r = ms([x["roofline_between_steps_pct"] for x in ks])
        print(f"| {shape} {ks[0]['type']} | {d[0]:.2f} ± {d[1]:.2f} | {bwx[0]:.1f} ± {bwx[1]:.1f} | "
              f"{r[0]:.0f}% ± {r[1]:.0f} |")
print(f"\nraw results: {out}")
