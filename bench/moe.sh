#!/usr/bin/env bash
# Mixture-of-experts speed vs llama.cpp (bench/run_vs_llamacpp.sh on synth
# files, 2 threads): decode 64 after a 512-token prompt, prefill 512, and the
# aggregate decode of 16 sequences, on
#   deepseek-v2-lite Q4_K_M (MLA; 64 routed experts, 6 used, 2 shared), and
#   qwen3-30b-a3b at $QWEN_TYPE (default q4_k_m: 18.6 GB; kvllm peaks at 19.9
#   GB resident on it, the GGUF pages of repacked tensors dropped, so it runs
#   on a 23 GiB machine; QWEN_TYPE=q2_k, 11.3 GB, for smaller ones). Its file is
#   written with --repeat-rows 4096 (rows repeat within each tensor: same
#   layout and bytes per token; quantizing 30B weights to Q2_K takes hours on
#   two cores), and
#   gpt-oss-20b as llama-quantize's MXFP4_MOE writes it (experts MXFP4, the
#   rest Q8_0: 12.10 GB; also --repeat-rows 4096).
# The roofline column: bytes read per token (kvllm bench's
# weights_bytes_per_token: every tensor of the file, less the unselected
# experts' share of the routed-expert tensors, less all but one row of an
# untied token embedding) x tokens/s / the read bandwidth measured in the run;
# a second table gives kvllm's decode share of the bandwidth read between its
# own decoding steps (run_vs_llamacpp.sh's STEP_PROBES, on by default).
# Each file is read once before its runs (WARM=1), so both engines load from
# the page cache.
#
# Usage: bench/moe.sh [ds|qwen|oss]   (all by default; env as for run_vs_llamacpp.sh,
#        e.g. BEFORE=path/to/older/kvllm adds its single-sequence figures)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export REPS=${REPS:-1} BATCH_REPS=${BATCH_REPS:-1} SKIP_STORIES=1 WARM=${WARM:-1}
export BEFORE_BATCH=${BEFORE_BATCH:-0}
which=${1:-all}
if [ "$which" = all ] || [ "$which" = ds ]; then
    SHAPE=deepseek-v2-lite TYPES=q4_k_m "$ROOT/bench/run_vs_llamacpp.sh"
fi
if [ "$which" = all ] || [ "$which" = qwen ]; then
    SHAPE=qwen3-30b-a3b TYPES=${QWEN_TYPE:-q4_k_m} SYNTH_FLAGS="--repeat-rows 4096" \
        "$ROOT/bench/run_vs_llamacpp.sh"
fi
if [ "$which" = all ] || [ "$which" = oss ]; then
    SHAPE=gpt-oss-20b TYPES=mxfp4_moe SYNTH_FLAGS="--repeat-rows 4096" \
        "$ROOT/bench/run_vs_llamacpp.sh"
fi
