#!/usr/bin/env python3
"""Where a decode step's time goes, from a perf profile of `kvllm bench`.

Record (the whole run; only the decode at its end is counted):
    perf record -F 999 -g -o perf.data -- build/kvllm bench -m MODEL -p 0 -n 65 \
        --decode-prompt 512 -r 1 -t 2 --membw --json --no-progress > bench.json
Then:
    bench/decode_parts.py perf.data bench.json

The last 60 decode steps before the exit (less 0.4 s of teardown) are split by
symbol into: the repacked matmul kernels (weights), attention, the pool's
waiting (spin, yield, scheduler), serial code on the calling thread, and the
rest. Shares are of both threads' samples; ms per token = share x the
measured ms per token (both threads run the whole step, so this is the wall
time the part stands for). The split is by symbol, so a kernel's time is not told
apart by the matrix it ran on: for the wall time and bytes of each phase of the step (q/k/v,
attention, output projection, router, experts, head) build with -DKVLLM_PHASE_TIMERS=ON
instead (bench/README.md)."""
import json
import re
import subprocess
import sys

NAMES = ["weights: repacked matmul kernels", "attention (q.k, softmax, p.v, merge, KV)",
         "pool: waiting, spinning, scheduler", "serial: norms, rope, routing, quantize x, sums",
         "other (kernel mode, libc)"]


def group(sym, kernel_mode):
    if kernel_mode:
        if re.search(r"schedule|finish_task_switch|sched_yield|futex", sym):
            return 2
        return 4
    if re.search(r"kernel$|vec_dot|each_task|repacked_task|mm_chunk|gemm", sym):
        return 0
    if re.search(r"^(scores|pv|softmax|merge|load_run|query_row|attend|kavx\d*_(from|to)_float_f16)",
                 sym):
        return 1
    if re.search(r"worker_main|run_tasks|kvl_pool|sched_yield|spin|clock_gettime", sym):
        return 2
    if re.search(r"^(rms_rows|op_|.*prepare|silu|moe_|route|decode_experts|add_residual|model_|"
                 r"soft_max|argmax|sincos|layer_forward|attn_|norm_rows|kern_|from_float)", sym):
        return 3
    return 4


def main():
    data, js = sys.argv[1], sys.argv[2]
    d = json.load(open(js))
    tps = d["decode_tokens_per_s"]
    ms_tok = 1000.0 / tps
    # the window ends 0.4 s before the last sample of a kernel: `--membw`
    # probes the bandwidth again after the runs
    samples = subprocess.run(["perf", "script", "-i", data, "-G", "-F", "time,ip,sym"],
                             capture_output=True, text=True).stdout.splitlines()
    end = None
    for line in samples:
        f = line.split()
        if len(f) >= 3 and f[0].endswith(":") and group(f[2], False) == 0:
            end = float(f[0].rstrip(":"))
    t1 = end - 0.4
    t0 = t1 - 60.0 / tps
    out = subprocess.run(["perf", "report", "-i", data, "--time", f"{t0:.3f},{t1:.3f}",
                          "--no-children", "--sort", "sym", "-g", "none"], capture_output=True,
                         text=True).stdout
    tot = [0.0] * len(NAMES)
    top = [[] for _ in NAMES]
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+\[(.)\]\s+(\S+)", line)
        if not m:
            continue
        p, sym = float(m.group(1)), m.group(3)
        g = group(sym, m.group(2) == "k")
        tot[g] += p
        top[g].append((p, sym))
    print(f"decode {tps:.2f} t/s = {ms_tok:.2f} ms/token; read bandwidth "
          f"{d.get('membw_gb_per_s', 0):.1f} GB/s; roofline {d.get('roofline_pct', 0):.0f}%"
          + (f" (weights), {d['roofline_read_pct']:.0f}% with the KV cache's "
             f"{d['kv_read_bytes_per_token'] / 1e6:.1f} MB a token" if 'roofline_read_pct' in d else ""))
    print("| part | share | ms/token | largest symbols (%) |")
    print("|---|---:|---:|---|")
    for g, name in enumerate(NAMES):
        syms = ", ".join(f"{s} {p:.1f}" for p, s in sorted(top[g], reverse=True)[:6])
        print(f"| {name} | {tot[g]:.1f}% | {tot[g] * ms_tok / 100:.2f} | {syms} |")


if __name__ == "__main__":
    main()
