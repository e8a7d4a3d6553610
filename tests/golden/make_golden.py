#!/usr/bin/env python3
"""Makes a golden (tests/data/golden/NAME) for an architecture that the vendored set lacks:
writes a tiny random-weight F32 GGUF of that architecture, then records what an EXISTING
llama.cpp build computes on it, in the layout tests/golden/check_golden.py reads
(tokenize.json, greedy.json, perplexity.json, meta.json; README "How to compare").

Usage: make_golden.py LLAMA_CPP_BIN_DIR GOLDEN_DIR NAME [NAME ...]
NAME: a spec (see SPECS), or BASE-TYPE (qwen3moe-q4_k_m): llama-quantize of the golden model
BASE-f32 already in GOLDEN_DIR/models to that file type, or BASE-kv_TYPE (qwen3-f32-kv_q8_0):
the golden model BASE with a TYPE KV cache (f16, bf16, q8_0; flash attention on), or
BASE-lora_TYPE[_xSCALE] (llama-gqa-bpe-f32-lora_f32, llama-moe-f32-lora_f16_x0.5): the golden model
BASE with a random LoRA adapter of TYPE (f32, f16) written beside it (make_lora), at that scale, or
BASE-cvec[N][_xSCALE][_lSTART-END] (llama-gqa-bpe-f32-cvec, gemma3-swa-f32-cvec2_x0.5_l2-3): BASE with N
random control vector files written beside it (write_cvec), at SCALE, on those layers, or
BASE-gate_N (deepseek2-moe-f32-gate_4): a copy of BASE whose ARCH.expert_gating_func is N (llama.cpp's
numbers: 1 softmax, 2 sigmoid, 3 softmax of the chosen logits, 4 sqrt-softplus), run by llama.cpp; the
copy is not kept: meta.json names BASE's file and the key as --override-kv gives it
(check_golden.py runs kvllm so).

The tokenizer (all tokenizer.* keys) is copied from an existing golden model, so the
tokenization cases are those of that model. Pure Python (no numpy); it never builds
llama.cpp: LLAMA_CPP_BIN_DIR must hold llama-server, llama-perplexity and llama-quantize (and
llama-imatrix for the IQ1 / IQ2 / IQ3 types).
"""
import hashlib
import json
import math
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

# ------------------------------------------------------------------ GGUF --
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
SCALAR = {T_U8: "B", T_I8: "b", T_U16: "H", T_I16: "h", T_U32: "I", T_I32: "i", T_F32: "f",
          T_BOOL: "?", T_U64: "Q", T_I64: "q", T_F64: "d"}


def read_kv(path, with_tensors=False, dims_out=None):
    """general/tokenizer metadata of a GGUF as [(key, type, value)] (value: python, arrays as (elem_type, list));
    with_tensors: also {tensor name: type name}; dims_out (a dict): filled with {tensor name: dims}."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(t):
        if t == T_STR:
            return string()
        if t == T_ARR:
            et, n = take("I"), take("Q")
            return (et, [value(et) for _ in range(n)])
        return take(SCALAR[t])

    assert data[:4] == b"GGUF", path
    pos = 4
    take("I")
    n_tensors = take("Q")
    n_kv = take("Q")
    out = []
    for _ in range(n_kv):
        k = string()
        t = take("I")
        out.append((k, t, value(t)))
    if not with_tensors:
        return out
    types = {}
    for _ in range(n_tensors):
        name = string()
        n_dims = take("I")
        dims = [take("Q") for _ in range(n_dims)]
        if dims_out is not None:
            dims_out[name] = dims
        types[name] = GGML_TYPE_NAMES.get(take("I"), "?")
        take("Q")
    return out, types


GGML_F32, GGML_MXFP4 = 0, 39
GGML_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K",
                   11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
                   19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 29: "IQ1_M", 30: "BF16",
                   39: "MXFP4"}


GGML_F16 = 1


def tensor_bytes(vals):
    """F32 values as bytes; bytes (MXFP4 blocks, already in ggml's layout) as they are;
    ("F16", values) as F16."""
    if isinstance(vals, (bytes, bytearray)):
        return GGML_MXFP4, bytes(vals)
    if isinstance(vals, tuple) and vals[0] == "F16":
        return GGML_F16, struct.pack(f"<{len(vals[1])}e", *vals[1])
    return GGML_F32, struct.pack(f"<{len(vals)}f", *vals)


def write_gguf(path, kvs, tensors):
    """kvs: [(key, type, value)]; tensors: [(name, dims (ggml order), values)], values a list of
    floats (F32) or the bytes of MXFP4 blocks (17 bytes per 32 values)."""
    def s(x):
        b = x.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def val(t, v):
        if t == T_STR:
            return s(v)
        if t == T_ARR:
            et, items = v
            return struct.pack("<IQ", et, len(items)) + b"".join(val(et, i) for i in items)
        return struct.pack("<" + SCALAR[t], v)

    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for k, t, v in kvs:
        out += s(k) + struct.pack("<I", t) + val(t, v)
    offset = 0
    for name, dims, vals in tensors:
        dtype, b = tensor_bytes(vals)
        want = {GGML_F32: 4 * math.prod(dims), GGML_F16: 2 * math.prod(dims)}.get(dtype, math.prod(dims) // 32 * 17)
        assert len(b) == want, name
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", dtype, offset)
        offset += (len(b) + 31) // 32 * 32
    out += b"\0" * (-len(out) % 32)
    for _, _, vals in tensors:
        b = tensor_bytes(vals)[1]
        out += b + b"\0" * (-len(b) % 32)
    with open(path, "wb") as f:
        f.write(out)


# ----------------------------------------------------------------- models --
# Each spec: arch, the donor of the tokenizer, scalar hparams (key suffixes after "ARCH."),
# and the tensors as (name, dims, kind) with kind "w" (random), "norm" (around 1) or "bias".
def qkv_with_bias(b, E, H, HKV, HD):
    """Layer b's q, k and v projections, each with its bias (qwen2moe, glm4moe, gpt-oss)."""
    return [(b + "attn_q.weight", [E, H * HD], "w"), (b + "attn_q.bias", [H * HD], "bias"),
            (b + "attn_k.weight", [E, HKV * HD], "w"), (b + "attn_k.bias", [HKV * HD], "bias"),
            (b + "attn_v.weight", [E, HKV * HD], "w"), (b + "attn_v.bias", [HKV * HD], "bias")]


def qwen2moe_spec():
    E, L, H, HKV, HD, V = 64, 2, 4, 2, 16, 4096
    NE, NU, FE, FS = 8, 2, 96, 128
    ts = [("token_embd.weight", [E, V], "w"), ("output_norm.weight", [E], "norm"), ("output.weight", [E, V], "w")]
    for i in range(L):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", [E], "norm"),
               *qkv_with_bias(b, E, H, HKV, HD),
               (b + "attn_output.weight", [H * HD, E], "w"),
               (b + "ffn_norm.weight", [E], "norm"),
               (b + "ffn_gate_inp.weight", [E, NE], "w"),
               (b + "ffn_gate_exps.weight", [E, FE, NE], "w"),
               (b + "ffn_up_exps.weight", [E, FE, NE], "w"),
               (b + "ffn_down_exps.weight", [FE, E, NE], "w"),
               (b + "ffn_gate_inp_shexp.weight", [E], "w"),
               (b + "ffn_gate_shexp.weight", [E, FS], "w"),
               (b + "ffn_up_shexp.weight", [E, FS], "w"),
               (b + "ffn_down_shexp.weight", [FS, E], "w")]
    hp = [("context_length", T_U32, 512), ("embedding_length", T_U32, E), ("block_count", T_U32, L),
          ("feed_forward_length", T_U32, 256), ("attention.head_count", T_U32, H),
          ("attention.head_count_kv", T_U32, HKV), ("rope.freq_base", T_F32, 1e6),
          ("attention.layer_norm_rms_epsilon", T_F32, 1e-6), ("expert_count", T_U32, NE),
          ("expert_used_count", T_U32, NU), ("expert_feed_forward_length", T_U32, FE),
          ("expert_shared_feed_forward_length", T_U32, FS)]
    return {"arch": "qwen2moe", "donor": "qwen3-f32", "hparams": hp, "tensors": ts,
            "summary": f"qwen2moe (Qwen1.5-MoE / Qwen2-57B-A14B): E{E} L{L}, GQA {H}/{HKV} x {HD}, q/k/v bias, "
                       f"NeoX rope 1e6; {NE} experts x ff {FE}, top-{NU} softmax (not renormalised), "
                       f"shared expert ff {FS} gated by sigmoid(ffn_gate_inp_shexp . x); untied output"}


def llama_like_tensors(E, L, H, HKV, HD, FF, V, tied=True):
    ts = [("token_embd.weight", [E, V], "w"), ("output_norm.weight", [E], "norm")]
    if not tied:
        ts.append(("output.weight", [E, V], "w"))
    for i in range(L):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", [E], "norm"), (b + "attn_q.weight", [E, H * HD], "w"),
               (b + "attn_k.weight", [E, HKV * HD], "w"), (b + "attn_v.weight", [E, HKV * HD], "w"),
               (b + "attn_output.weight", [H * HD, E], "w"), (b + "ffn_norm.weight", [E], "norm"),
               (b + "ffn_gate.weight", [E, FF], "w"), (b + "ffn_up.weight", [E, FF], "w"),
               (b + "ffn_down.weight", [FF, E], "w")]
    return ts


def mistral3_spec():
    E, L, H, HKV, HD, FF, V = 64, 2, 4, 2, 32, 128, 4096
    hp = [("context_length", T_U32, 512), ("embedding_length", T_U32, E), ("block_count", T_U32, L),
          ("feed_forward_length", T_U32, FF), ("attention.head_count", T_U32, H),
          ("attention.head_count_kv", T_U32, HKV), ("attention.key_length", T_U32, HD),
          ("attention.value_length", T_U32, HD), ("rope.dimension_count", T_U32, HD),
          ("rope.freq_base", T_F32, 1e6), ("attention.layer_norm_rms_epsilon", T_F32, 1e-5),
          ("rope.scaling.type", T_STR, "yarn"), ("rope.scaling.factor", T_F32, 4.0),
          ("rope.scaling.original_context_length", T_U32, 32), ("rope.scaling.yarn_beta_fast", T_F32, 32.0),
          ("rope.scaling.yarn_beta_slow", T_F32, 1.0), ("rope.scaling.yarn_log_multiplier", T_F32, 0.1),
          ("attention.temperature_scale", T_F32, 0.1)]
    return {"arch": "mistral3", "donor": "qwen3-f32", "hparams": hp,
            "tensors": llama_like_tensors(E, L, H, HKV, HD, FF, V),
            "summary": f"mistral3 (Ministral 3, Mistral Small 3.x, current converter): E{E} L{L}, GQA {H}/{HKV} x "
                       f"{HD} (q width {H * HD} != E), rope normal 1e6 with YaRN (factor 4, original context 32, "
                       f"beta 32/1, yarn_log_multiplier 0.1), attention.temperature_scale 0.1 (q scaled by "
                       f"1 + 0.1 ln(floor(pos/32) + 1)), tied output"}


def smollm3_spec():
    E, L, H, HKV, HD, FF, V = 64, 4, 4, 2, 16, 128, 4096
    hp = [("context_length", T_U32, 512), ("embedding_length", T_U32, E), ("block_count", T_U32, L),
          ("feed_forward_length", T_U32, FF), ("attention.head_count", T_U32, H),
          ("attention.head_count_kv", T_U32, HKV), ("rope.freq_base", T_F32, 5e6),
          ("attention.layer_norm_rms_epsilon", T_F32, 1e-6)]
    return {"arch": "smollm3", "donor": "qwen3-f32", "hparams": hp,
            "tensors": llama_like_tensors(E, L, H, HKV, HD, FF, V),
            "summary": f"smollm3 (SmolLM3-3B): E{E} L{L}, GQA {H}/{HKV} x {HD}, rope normal 5e6 on layers "
                       f"0-2, none on layer 3 (llama.cpp: every 4th layer, fixed), tied output"}


def base_hparams(E, L, H, HKV, FF, eps_key, eps):
    return [("context_length", T_U32, 512), ("embedding_length", T_U32, E), ("block_count", T_U32, L),
            ("feed_forward_length", T_U32, FF), ("attention.head_count", T_U32, H),
            ("attention.head_count_kv", T_U32, HKV), (eps_key, T_F32, eps)]


def granite_spec():
    E, L, H, HKV, HD, FF, V = 32, 2, 2, 1, 16, 64, 4096
    hp = base_hparams(E, L, H, HKV, FF, "attention.layer_norm_rms_epsilon", 1e-6) + [
        ("rope.freq_base", T_F32, 1e7), ("embedding_scale", T_F32, 12.0), ("residual_scale", T_F32, 0.22),
        ("attention.scale", T_F32, 0.09), ("logit_scale", T_F32, 8.0)]
    return {"arch": "granite", "donor": "qwen3-f32", "hparams": hp,
            "tensors": llama_like_tensors(E, L, H, HKV, HD, FF, V),
            "summary": f"granite (Granite 3.x dense): E{E} L{L}, GQA {H}/{HKV} x {HD}, rope normal 1e7, "
                       f"embedding_scale 12, residual_scale 0.22, attention.scale 0.09 (q.k scale), "
                       f"logit_scale 8 (logits divided), tied output"}


def phi3_spec():
    E, L, H, HKV, HD, FF, V, ROT = 32, 2, 2, 1, 16, 64, 4096, 12
    ts = [("token_embd.weight", [E, V], "w"), ("rope_factors_long.weight", [ROT // 2], "factor_long"),
          ("rope_factors_short.weight", [ROT // 2], "factor_short"), ("output_norm.weight", [E], "norm")]
    for i in range(L):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", [E], "norm"), (b + "attn_qkv.weight", [E, (H + 2 * HKV) * HD], "w"),
               (b + "attn_output.weight", [H * HD, E], "w"), (b + "ffn_norm.weight", [E], "norm"),
               (b + "ffn_up.weight", [E, 2 * FF], "w"), (b + "ffn_down.weight", [FF, E], "w")]
    hp = base_hparams(E, L, H, HKV, FF, "attention.layer_norm_rms_epsilon", 1e-5)
    hp[0] = ("context_length", T_U32, 4096)
    hp += [("rope.scaling.original_context_length", T_U32, 64), ("rope.dimension_count", T_U32, ROT),
           ("rope.freq_base", T_F32, 1e4), ("attention.sliding_window", T_U32, 2047),
           ("rope.scaling.attn_factor", T_F32, math.sqrt(1 + math.log(4096 / 64) / math.log(64)))]
    # general.name must not contain "phi3": llama.cpp's vocabulary then looks up Phi-3's own
    # special tokens, which the donor vocabulary lacks
    return {"arch": "phi3", "donor": "qwen3-f32", "hparams": hp, "tensors": ts, "general_name": "tiny-longrope-f32",
            "summary": f"phi3 (Phi-3.5 / Phi-4-mini layout): E{E} L{L}, GQA {H}/{HKV} x {HD}, fused attn_qkv, "
                       f"fused gate+up in ffn_up [{E}, {2 * FF}], NeoX rope 1e4 on {ROT} of {HD} dims, LongRoPE "
                       f"factors (original context 64, so every run of more than 64 tokens of context uses the "
                       f"long ones), rope.scaling.attn_factor sqrt(2), sliding_window 2047 (ignored by llama.cpp), "
                       f"tied output (Phi-4-mini)"}


def olmo2_spec():
    E, L, H, HKV, HD, FF, V = 32, 4, 2, 1, 16, 64, 4096
    ts = [("token_embd.weight", [E, V], "w"), ("output_norm.weight", [E], "norm"), ("output.weight", [E, V], "w")]
    for i in range(L):
        b = f"blk.{i}."
        ts += [(b + "attn_q.weight", [E, H * HD], "w"), (b + "attn_k.weight", [E, HKV * HD], "w"),
               (b + "attn_v.weight", [E, HKV * HD], "w"), (b + "attn_output.weight", [H * HD, E], "w"),
               (b + "attn_q_norm.weight", [H * HD], "norm"), (b + "attn_k_norm.weight", [HKV * HD], "norm"),
               (b + "post_attention_norm.weight", [E], "norm"), (b + "ffn_gate.weight", [E, FF], "w"),
               (b + "ffn_up.weight", [E, FF], "w"), (b + "ffn_down.weight", [FF, E], "w"),
               (b + "post_ffw_norm.weight", [E], "norm")]
    hp = base_hparams(E, L, H, HKV, FF, "attention.layer_norm_rms_epsilon", 1e-6) + [
        ("rope.freq_base", T_F32, 5e5), ("attention.sliding_window", T_U32, 32),
        ("attention.sliding_window_pattern", T_ARR, (T_BOOL, [(i + 1) % 4 != 0 for i in range(L)])),
        ("rope.scaling.type", T_STR, "yarn"), ("rope.scaling.factor", T_F32, 4.0),
        ("rope.scaling.original_context_length", T_U32, 32), ("rope.scaling.attn_factor", T_F32, 1.2)]
    return {"arch": "olmo2", "donor": "qwen3-f32", "hparams": hp, "tensors": ts,
            "summary": f"olmo2 as OLMo 3 is converted: E{E} L{L}, GQA {H}/{HKV} x {HD}, no pre-norms, "
                       f"post-attention and post-FFN RMSNorm, q/k RMSNorm over all heads, NeoX rope 5e5, "
                       f"sliding window 32 on layers 0-2 (pattern array), layer 3 full; YaRN (factor 4, original context 32, "
                       f"rope.scaling.attn_factor 1.2) on the full layer only, the sliding ones rotate plainly "
                       f"(OLMo 3 7B's layout); untied output"}


def command_r_spec():
    E, L, H, HKV, HD, FF, V = 32, 2, 2, 1, 16, 64, 4096
    ts = [t for t in llama_like_tensors(E, L, H, HKV, HD, FF, V) if "ffn_norm" not in t[0]]
    hp = base_hparams(E, L, H, HKV, FF, "attention.layer_norm_epsilon", 1e-5) + [
        ("rope.freq_base", T_F32, 1e4), ("logit_scale", T_F32, 0.0625), ("rope.scaling.type", T_STR, "none")]
    return {"arch": "command-r", "donor": "qwen3-f32", "hparams": hp, "tensors": ts,
            "summary": f"command-r (Command-R 35B / Aya 23 layout): E{E} L{L}, GQA {H}/{HKV} x {HD}, LayerNorm "
                       f"(no bias) eps 1e-5, attention and FFN in parallel on one normed input, rope normal 1e4, "
                       f"logit_scale 0.0625, tied output"}


def cohere2_spec():
    E, L, H, HKV, HD, FF, V = 32, 4, 2, 1, 16, 64, 4096
    ts = [t for t in llama_like_tensors(E, L, H, HKV, HD, FF, V) if "ffn_norm" not in t[0]]
    hp = base_hparams(E, L, H, HKV, FF, "attention.layer_norm_epsilon", 1e-5) + [
        ("rope.freq_base", T_F32, 5e4), ("logit_scale", T_F32, 0.25), ("attention.sliding_window", T_U32, 32),
        ("rope.dimension_count", T_U32, HD), ("rope.scaling.type", T_STR, "none")]
    return {"arch": "cohere2", "donor": "qwen3-f32", "hparams": hp, "tensors": ts,
            "summary": f"cohere2 (Command R7B / Command A layout): E{E} L{L}, GQA {H}/{HKV} x {HD}, LayerNorm "
                       f"(no bias), parallel attention + FFN, sliding window 32 with rope normal 5e4 on layers "
                       f"0-2, full attention without rope on layer 3, logit_scale 0.25, tied output"}


def glm4moe_spec():
    E, L, NEXTN, H, HKV, HD, FF, V = 32, 2, 1, 2, 1, 32, 64, 4096
    NE, NU, FE, NS = 8, 2, 32, 1
    ts = [("token_embd.weight", [E, V], "w"), ("output_norm.weight", [E], "norm")]
    for i in range(L + NEXTN):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", [E], "norm"),
               *qkv_with_bias(b, E, H, HKV, HD),
               (b + "attn_output.weight", [H * HD, E], "w"), (b + "post_attention_norm.weight", [E], "norm")]
        if i == 0:
            ts += [(b + "ffn_gate.weight", [E, FF], "w"), (b + "ffn_up.weight", [E, FF], "w"),
                   (b + "ffn_down.weight", [FF, E], "w")]
        else:
            ts += [(b + "ffn_gate_inp.weight", [E, NE], "w"), (b + "exp_probs_b.bias", [NE], "probs_bias"),
                   (b + "ffn_gate_exps.weight", [E, FE, NE], "w"), (b + "ffn_up_exps.weight", [E, FE, NE], "w"),
                   (b + "ffn_down_exps.weight", [FE, E, NE], "w"),
                   (b + "ffn_gate_shexp.weight", [E, FE * NS], "w"), (b + "ffn_up_shexp.weight", [E, FE * NS], "w"),
                   (b + "ffn_down_shexp.weight", [FE * NS, E], "w")]
        if i >= L:  # the MTP layer: loaded by llama.cpp, never run
            ts += [(b + "nextn.eh_proj.weight", [2 * E, E], "w"), (b + "nextn.enorm.weight", [E], "norm"),
                   (b + "nextn.hnorm.weight", [E], "norm"), (b + "nextn.shared_head_norm.weight", [E], "norm")]
    hp = base_hparams(E, L + NEXTN, H, HKV, FF, "attention.layer_norm_rms_epsilon", 1e-5) + [
        ("attention.key_length", T_U32, HD), ("attention.value_length", T_U32, HD),
        ("rope.dimension_count", T_U32, HD // 2), ("rope.freq_base", T_F32, 1e6),
        ("expert_count", T_U32, NE), ("expert_used_count", T_U32, NU), ("expert_feed_forward_length", T_U32, FE),
        ("expert_shared_count", T_U32, NS), ("leading_dense_block_count", T_U32, 1),
        ("expert_gating_func", T_U32, 2), ("expert_weights_scale", T_F32, 2.5),
        ("expert_weights_norm", T_BOOL, True), ("nextn_predict_layers", T_U32, NEXTN)]
    return {"arch": "glm4moe", "donor": "qwen3-f32", "hparams": hp, "tensors": ts,
            "summary": f"glm4moe (GLM-4.5 / 4.6 / Air): E{E} L{L} + {NEXTN} MTP layer (block_count {L + NEXTN}, "
                       f"nextn_predict_layers {NEXTN}: loaded, not run), GQA {H}/{HKV} x {HD} (q width {H * HD} != E), "
                       f"q/k/v bias, NeoX rope 1e6 on {HD // 2} of {HD} dims, FFN pre-norm named post_attention_norm; "
                       f"layer 0 dense, then {NE} experts x ff {FE}, top-{NU} sigmoid with exp_probs_b, weights "
                       f"renormalised and scaled 2.5, {NS} shared expert; tied output (GLM's is untied: the loader takes both)"}


def granitemoe_spec():
    E, L, H, HKV, HD, FF, V, NE, NU, FS = 32, 2, 2, 1, 16, 32, 4096, 8, 2, 48
    ts = [("token_embd.weight", [E, V], "w"), ("output_norm.weight", [E], "norm")]
    for i in range(L):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", [E], "norm"), (b + "attn_q.weight", [E, H * HD], "w"),
               (b + "attn_k.weight", [E, HKV * HD], "w"), (b + "attn_v.weight", [E, HKV * HD], "w"),
               (b + "attn_output.weight", [H * HD, E], "w"), (b + "ffn_norm.weight", [E], "norm"),
               (b + "ffn_gate_inp.weight", [E, NE], "w"), (b + "ffn_gate_exps.weight", [E, FF, NE], "w"),
               (b + "ffn_up_exps.weight", [E, FF, NE], "w"), (b + "ffn_down_exps.weight", [FF, E, NE], "w"),
               (b + "ffn_gate_shexp.weight", [E, FS], "w"), (b + "ffn_up_shexp.weight", [E, FS], "w"),
               (b + "ffn_down_shexp.weight", [FS, E], "w")]
    hp = base_hparams(E, L, H, HKV, FF, "attention.layer_norm_rms_epsilon", 1e-6) + [
        ("rope.freq_base", T_F32, 1e4), ("embedding_scale", T_F32, 12.0), ("residual_scale", T_F32, 0.22),
        ("attention.scale", T_F32, 0.0625), ("logit_scale", T_F32, 6.0), ("expert_count", T_U32, NE),
        ("expert_used_count", T_U32, NU), ("expert_shared_feed_forward_length", T_U32, FS)]
    return {"arch": "granitemoe", "donor": "qwen3-f32", "hparams": hp, "tensors": ts,
            "summary": f"granitemoe (Granite 3.x MoE, with granitemoeshared's shared expert): E{E} L{L}, GQA "
                       f"{H}/{HKV} x {HD}, the granite scales (embedding 12, residual 0.22, attention 0.0625, "
                       f"logit 6); {NE} experts x ff {FF} (feed_forward_length), top-{NU} softmax renormalised, "
                       f"shared expert ff {FS} added unweighted; tied output"}


def command_r_plus_spec():
    E, L, H, HKV, HD, FF, V = 32, 64, 2, 1, 16, 32, 4096
    ts = [("token_embd.weight", [E, V], "w"), ("output_norm.weight", [E], "norm")]
    for i in range(L):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", [E], "norm"), (b + "attn_q_norm.weight", [HD, H], "norm"),
               (b + "attn_k_norm.weight", [HD, HKV], "norm"), (b + "attn_q.weight", [E, H * HD], "w"),
               (b + "attn_k.weight", [E, HKV * HD], "w"), (b + "attn_v.weight", [E, HKV * HD], "w"),
               (b + "attn_output.weight", [H * HD, E], "w"), (b + "ffn_gate.weight", [E, FF], "w"),
               (b + "ffn_up.weight", [E, FF], "w"), (b + "ffn_down.weight", [FF, E], "w")]
    hp = base_hparams(E, L, H, HKV, FF, "attention.layer_norm_epsilon", 1e-5) + [
        ("rope.freq_base", T_F32, 7.5e7), ("logit_scale", T_F32, 0.8333), ("rope.scaling.type", T_STR, "none")]
    return {"arch": "command-r", "donor": "qwen3-f32", "hparams": hp, "tensors": ts,
            "summary": f"command-r with {L} layers = Command R+ (llama.cpp gives command-r files of 64 layers or "
                       f"more per-head q/k LayerNorm): E{E} L{L}, GQA {H}/{HKV} x {HD}, attn_q_norm [{HD}, {H}] and "
                       f"attn_k_norm [{HD}, {HKV}] (one weight row per head), LayerNorm, parallel blocks, rope "
                       f"normal 7.5e7, logit_scale 0.8333, tied output"}


def gpt_oss_spec():
    E, L, H, HKV, HD, V = 64, 2, 4, 2, 16, 4096
    NE, NU, FE = 8, 2, 64
    ts = [("token_embd.weight", [E, V], "w"), ("output_norm.weight", [E], "norm"), ("output.weight", [E, V], "w")]
    for i in range(L):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", [E], "norm"),
               *qkv_with_bias(b, E, H, HKV, HD),
               (b + "attn_output.weight", [H * HD, E], "w"), (b + "attn_output.bias", [E], "bias"),
               (b + "attn_sinks.weight", [H], "sink"),
               (b + "post_attention_norm.weight", [E], "norm"),
               (b + "ffn_gate_inp.weight", [E, NE], "w"), (b + "ffn_gate_inp.bias", [NE], "bias"),
               (b + "ffn_gate_exps.weight", [E, FE, NE], "mxfp4"), (b + "ffn_gate_exps.bias", [FE, NE], "bias"),
               (b + "ffn_up_exps.weight", [E, FE, NE], "mxfp4"), (b + "ffn_up_exps.bias", [FE, NE], "bias"),
               (b + "ffn_down_exps.weight", [FE, E, NE], "mxfp4"), (b + "ffn_down_exps.bias", [E, NE], "bias")]
    hp = base_hparams(E, L, H, HKV, 256, "attention.layer_norm_rms_epsilon", 1e-5) + [
        ("attention.key_length", T_U32, HD), ("attention.value_length", T_U32, HD),
        ("rope.dimension_count", T_U32, HD), ("rope.freq_base", T_F32, 150000.0),
        ("attention.sliding_window", T_U32, 32), ("expert_count", T_U32, NE), ("expert_used_count", T_U32, NU),
        ("expert_feed_forward_length", T_U32, FE), ("rope.scaling.type", T_STR, "yarn"),
        ("rope.scaling.factor", T_F32, 4.0), ("rope.scaling.original_context_length", T_U32, 32)]
    return {"arch": "gpt-oss", "donor": "qwen3-f32", "hparams": hp, "tensors": ts, "file_type": 38,
            "summary": f"gpt-oss (OpenAI gpt-oss 20B / 120B layout): E{E} L{L}, GQA {H}/{HKV} x {HD}, q/k/v/o "
                       f"biases, attention sinks (one logit per head in the softmax's denominator), sliding "
                       f"window 32 on layer 0, full attention on layer 1 (the default pattern 2), NeoX rope "
                       f"1.5e5 with YaRN (factor 4, original context 32) on every layer, the FFN pre-norm "
                       f"named post_attention_norm; {NE} experts x ff {FE} in MXFP4 (random E8M0 scales and "
                       f"E2M1 codes in ggml's block layout, as the converter copies them) with F32 biases, "
                       f"router with bias, top-{NU} on the raw logits weighted by the softmax of the {NU}, "
                       f"clamped SwiGLU (alpha 1.702, limit 7); untied output"}


def olmoe_spec():
    E, L, H, HD, FF, V = 64, 2, 4, 16, 64, 4096
    NE, NU = 8, 2
    ts = [("token_embd.weight", [E, V], "w"), ("output_norm.weight", [E], "norm"), ("output.weight", [E, V], "w")]
    for i in range(L):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", [E], "norm"), (b + "attn_q.weight", [E, H * HD], "w"),
               (b + "attn_k.weight", [E, H * HD], "w"), (b + "attn_v.weight", [E, H * HD], "w"),
               (b + "attn_output.weight", [H * HD, E], "w"),
               (b + "attn_q_norm.weight", [H * HD], "norm"), (b + "attn_k_norm.weight", [H * HD], "norm"),
               (b + "ffn_norm.weight", [E], "norm"), (b + "ffn_gate_inp.weight", [E, NE], "w"),
               (b + "ffn_gate_exps.weight", [E, FF, NE], "w"), (b + "ffn_up_exps.weight", [E, FF, NE], "w"),
               (b + "ffn_down_exps.weight", [FF, E, NE], "w")]
    hp = base_hparams(E, L, H, H, FF, "attention.layer_norm_rms_epsilon", 1e-5) + [
        ("rope.freq_base", T_F32, 1e4), ("expert_count", T_U32, NE), ("expert_used_count", T_U32, NU)]
    return {"arch": "olmoe", "donor": "qwen3-f32", "hparams": hp, "tensors": ts,
            "summary": f"olmoe (OLMoE-1B-7B layout): E{E} L{L}, {H} heads x {HD} (kv heads = heads), q/k "
                       f"RMSNorm over all heads ([{H * HD}]), NeoX rope 1e4; {NE} experts x ff {FF} "
                       f"(feed_forward_length) on every layer, top-{NU} softmax, weights not renormalised; "
                       f"untied output"}


def mxfp4_blocks(rng, n):
    """n values of random MXFP4 blocks: scales 2^-6.5 .. 2^-4.5 (values of rms about 0.02-0.1) and
    uniform codes, element j in the low nibble of byte j, element j + 16 in the high one."""
    out = bytearray()
    for _ in range(n // 32):
        out.append(rng.choice([121, 122, 123]))
        out += bytes(rng.randrange(256) for _ in range(16))
    return out


def llama4_spec():
    E, L, H, HKV, HD, FF, V = 32, 4, 2, 1, 16, 64, 4096
    NE, NU, FE, STEP = 8, 1, 48, 2
    ts = [("token_embd.weight", [E, V], "w"), ("rope_freqs.weight", [HD // 2], "factor_long"),
          ("output_norm.weight", [E], "norm"), ("output.weight", [E, V], "w")]
    for i in range(L):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", [E], "norm"), (b + "attn_q.weight", [E, H * HD], "w"),
               (b + "attn_k.weight", [E, HKV * HD], "w"), (b + "attn_v.weight", [E, HKV * HD], "w"),
               (b + "attn_output.weight", [H * HD, E], "w"), (b + "ffn_norm.weight", [E], "norm")]
        if (i + 1) % STEP == 0:
            ts += [(b + "ffn_gate_inp.weight", [E, NE], "w"), (b + "ffn_gate_exps.weight", [E, FE, NE], "w"),
                   (b + "ffn_up_exps.weight", [E, FE, NE], "w"), (b + "ffn_down_exps.weight", [FE, E, NE], "w"),
                   (b + "ffn_gate_shexp.weight", [E, FE], "w"), (b + "ffn_up_shexp.weight", [E, FE], "w"),
                   (b + "ffn_down_shexp.weight", [FE, E], "w")]
        else:
            ts += [(b + "ffn_gate.weight", [E, FF], "w"), (b + "ffn_up.weight", [E, FF], "w"),
                   (b + "ffn_down.weight", [FF, E], "w")]
    hp = base_hparams(E, L, H, HKV, FF, "attention.layer_norm_rms_epsilon", 1e-5) + [
        ("rope.freq_base", T_F32, 5e5), ("rope.dimension_count", T_U32, HD), ("expert_count", T_U32, NE),
        ("expert_used_count", T_U32, NU), ("expert_feed_forward_length", T_U32, FE),
        ("interleave_moe_layer_step", T_U32, STEP)]
    hp[0] = ("context_length", T_U32, 16384)
    # llama.cpp fixes the attention chunk and the temperature step at 8192 positions (no file
    # key sets them), so the perplexity runs at a context past 8192 to reach both
    return {"arch": "llama4", "donor": "qwen3-f32", "hparams": hp, "tensors": ts,
            "ppl": {"n_ctx": 8320, "text_file": "ppl_text_long.txt"}, "server_ctx": 8448,
            "long_prompt": (8250, 16),
            "summary": f"llama4 (Llama 4 Scout / Maverick layout): E{E} L{L}, GQA {H}/{HKV} x {HD}, rope normal 5e5 "
                       f"with rope_freqs factors on layers 0-2, which attend within chunks of 8192 positions "
                       f"(llama.cpp's fixed size) and L2-normalise q and k per head after rope; layer 3 full "
                       f"attention without rope, q scaled by 1 + 0.1 ln(floor((pos + 1) / 8192) + 1); layers 1 and "
                       f"3 MoE (interleave_moe_layer_step {STEP}): {NE} experts x ff {FE}, top-{NU} by router logit, "
                       f"sigmoid weight multiplying the expert's input, shared expert ff {FE}; layers 0 and 2 "
                       f"dense ff {FF}; untied output; perplexity at context 8320 (2 chunks) over ppl_text_long.txt "
                       f"(ppl_text.txt 15 times), and a 4th greedy prompt of its first 8250 tokens generating 16 (server "
                       f"context 8448), so positions 8192+ cross a chunk and a temperature step"}


def deepseek2_q_kv_a(b, E, H, R, NOPE, ROPE):
    """Layer b's norm, direct q projection (q_lora_rank 0) and latent down-projection of a
    DeepSeek-V2 layout (deepseek2_lite_spec, deepseek2_kvb_spec)."""
    return [(b + "attn_norm.weight", [E], "norm"), (b + "attn_q.weight", [E, H * (NOPE + ROPE)], "w"),
            (b + "attn_kv_a_mqa.weight", [E, R + ROPE], "w"), (b + "attn_kv_a_norm.weight", [R], "norm")]


def deepseek2_attn_hparams(R, ROPE, key_length, value_length):
    """The rope and attention keys of those layouts, q projected directly."""
    return [("rope.freq_base", T_F32, 1e4), ("rope.dimension_count", T_U32, ROPE),
            ("attention.q_lora_rank", T_U32, 0), ("attention.kv_lora_rank", T_U32, R),
            ("attention.key_length", T_U32, key_length), ("attention.value_length", T_U32, value_length)]


def deepseek2_lite_spec():
    """DeepSeek-V2-Lite's layout, which the shared deepseek2 goldens (V3-style) do not cover:
    q projected directly (q_lora_rank 0: attn_q, no attn_q_a / attn_q_b), softmax routing
    without expert_gating_func (the default V2 files rely on), weights neither renormalised nor
    scaled, 2 shared experts, YaRN with V2-Lite's yarn_log_multiplier."""
    E, L, H, V = 256, 2, 8, 4096
    R, NOPE, ROPE, VH = 32, 32, 16, 32  # kv_lora, q/k without rope, rope, v per head
    FF, NE, NU, FE, NS = 512, 8, 3, 128, 2
    ts = [("token_embd.weight", [E, V], "w"), ("output_norm.weight", [E], "norm")]
    for i in range(L):
        b = f"blk.{i}."
        ts += [*deepseek2_q_kv_a(b, E, H, R, NOPE, ROPE),
               (b + "attn_k_b.weight", [NOPE, R, H], "w"), (b + "attn_v_b.weight", [R, VH, H], "w"),
               (b + "attn_output.weight", [H * VH, E], "w"), (b + "ffn_norm.weight", [E], "norm")]
        if i == 0:
            ts += [(b + "ffn_gate.weight", [E, FF], "w"), (b + "ffn_up.weight", [E, FF], "w"),
                   (b + "ffn_down.weight", [FF, E], "w")]
        else:
            ts += [(b + "ffn_gate_inp.weight", [E, NE], "w"),
                   (b + "ffn_gate_exps.weight", [E, FE, NE], "w"), (b + "ffn_up_exps.weight", [E, FE, NE], "w"),
                   (b + "ffn_down_exps.weight", [FE, E, NE], "w"),
                   (b + "ffn_gate_shexp.weight", [E, FE * NS], "w"), (b + "ffn_up_shexp.weight", [E, FE * NS], "w"),
                   (b + "ffn_down_shexp.weight", [FE * NS, E], "w")]
    hp = base_hparams(E, L, H, 1, FF, "attention.layer_norm_rms_epsilon", 1e-6) + \
        deepseek2_attn_hparams(R, ROPE, R + ROPE, R) + [
        ("attention.key_length_mla", T_U32, NOPE + ROPE), ("attention.value_length_mla", T_U32, VH),
        ("leading_dense_block_count", T_U32, 1), ("expert_count", T_U32, NE), ("expert_used_count", T_U32, NU),
        ("expert_feed_forward_length", T_U32, FE), ("expert_shared_count", T_U32, NS),
        ("expert_weights_scale", T_F32, 1.0), ("rope.scaling.type", T_STR, "yarn"),
        ("rope.scaling.factor", T_F32, 4.0), ("rope.scaling.original_context_length", T_U32, 128),
        ("rope.scaling.yarn_log_multiplier", T_F32, 0.0707)]
    return {"arch": "deepseek2", "donor": "qwen3-f32", "hparams": hp, "tensors": ts,
            "summary": f"deepseek2 as DeepSeek-V2-Lite lays it out: E{E} L{L}, MLA {H} heads, q projected "
                       f"directly (q_lora_rank 0: attn_q), kv_lora {R}, nope {NOPE} + rope {ROPE}, v {VH}, "
                       f"absorbed attn_k_b / attn_v_b; YaRN factor 4, original context 128, yarn_log_multiplier "
                       f"0.0707; layer 0 dense ff {FF}, layer 1 {NE} experts x ff {FE}, top-{NU} softmax (no "
                       f"expert_gating_func key: the V2 default), weights neither renormalised nor scaled "
                       f"(scale 1), {NS} shared experts (ff {FE * NS}); tied output (V2-Lite's is untied: "
                       f"the loader takes both)"}


def deepseek2_kvb_spec():
    """deepseek2 as older DeepSeek-V2 GGUFs store it: the joint up-projection attn_kv_b and no
    key_length_mla / value_length_mla, so llama.cpp (and kvllm) run it as plain attention with
    H K/V heads of nope + rope and v; heads of 64 so that a quantized cache is rotated."""
    E, L, H, V, FF = 128, 2, 4, 4096, 256
    R, NOPE, ROPE, VH = 32, 48, 16, 64
    ts = [("token_embd.weight", [E, V], "w"), ("output_norm.weight", [E], "norm")]
    for i in range(L):
        b = f"blk.{i}."
        ts += [*deepseek2_q_kv_a(b, E, H, R, NOPE, ROPE),
               (b + "attn_kv_b.weight", [R, H * (NOPE + VH)], "w"),
               (b + "attn_output.weight", [H * VH, E], "w"), (b + "ffn_norm.weight", [E], "norm"),
               (b + "ffn_gate.weight", [E, FF], "w"), (b + "ffn_up.weight", [E, FF], "w"),
               (b + "ffn_down.weight", [FF, E], "w")]
    hp = base_hparams(E, L, H, H, FF, "attention.layer_norm_rms_epsilon", 1e-6) + \
        deepseek2_attn_hparams(R, ROPE, NOPE + ROPE, VH) + [
        ("leading_dense_block_count", T_U32, L), ("expert_feed_forward_length", T_U32, FF),
        ("expert_shared_count", T_U32, 0)]
    return {"arch": "deepseek2", "donor": "qwen3-f32", "hparams": hp, "tensors": ts,
            "summary": f"deepseek2 in the older uncompressed layout: E{E} L{L}, {H} heads, q projected directly, "
                       f"kv_lora {R} + rope {ROPE} through attn_kv_a_mqa, then attn_kv_b [{R} -> {H} x "
                       f"({NOPE} nope + {VH} v)]; no key_length_mla / value_length_mla, so plain attention over "
                       f"K heads of {NOPE + ROPE} and V heads of {VH} (both multiples of 64: a quantized cache "
                       f"is Hadamard-rotated); dense FFN; tied output"}


def gemma4_spec(moe=False, shared_kv=0, per_layer=0):
    """Gemma 4 as llama.cpp's gemma4 graph runs it (31B dense, or 26B-A4B with moe): sliding
    layers of their own head width and KV head count, full layers with wider heads, a
    proportional rope (rope_freqs leaves 3/4 of the pairs unrotated) and some without attn_v
    (V is K), V RMS-normed, q.k unscaled, a per-layer output scale, final soft-capping."""
    E, H, V, FF = 64, 4, 4096, 128
    SWA = [True, False, True, False] + [True, False] * (shared_kv // 2)
    L = len(SWA)
    HKV = {True: 2, False: 1}
    HD = {True: 16, False: 32}
    NE, NU, FE = 8, 2, 48
    ts = [("token_embd.weight", [E, V], "w"), ("rope_freqs.weight", [HD[False] // 2], "prop_rope"),
          ("output_norm.weight", [E], "norm")]
    # E2B's layout: per-layer inputs, and a twice as wide FFN on the layers sharing KV
    FFS = [FF * (2 if per_layer and i >= L - shared_kv else 1) for i in range(L)]
    if per_layer:
        ts += [("per_layer_token_embd.weight", [per_layer * L, V], "w"),
               ("per_layer_model_proj.weight", [E, per_layer * L], "w"),
               ("per_layer_proj_norm.weight", [per_layer], "norm")]
    for i, swa in enumerate(SWA):
        b, hd, hkv, ff = f"blk.{i}.", HD[swa], HKV[swa], FFS[i]
        ts += [(b + "attn_norm.weight", [E], "norm"), (b + "attn_q.weight", [E, H * hd], "w"),
               (b + "attn_k.weight", [E, hkv * hd], "w")]
        if swa or i >= 3:  # layer 1 has no attn_v: V is K
            ts.append((b + "attn_v.weight", [E, hkv * hd], "w"))
        ts += [(b + "attn_output.weight", [H * hd, E], "w"), (b + "attn_q_norm.weight", [hd], "norm"),
               (b + "attn_k_norm.weight", [hd], "norm"), (b + "post_attention_norm.weight", [E], "norm"),
               (b + "ffn_norm.weight", [E], "norm"), (b + "ffn_gate.weight", [E, ff], "w"),
               (b + "ffn_up.weight", [E, ff], "w"), (b + "ffn_down.weight", [ff, E], "w"),
               (b + "post_ffw_norm.weight", [E], "norm"), (b + "layer_output_scale.weight", [1], "scale")]
        if per_layer:
            ts += [(b + "inp_gate.weight", [E, per_layer], "w"), (b + "proj.weight", [per_layer, E], "w"),
                   (b + "post_norm.weight", [E], "norm")]
        if moe:
            ts += [(b + "ffn_gate_inp.weight", [E, NE], "w"), (b + "ffn_gate_inp.scale", [E], "norm"),
                   (b + "pre_ffw_norm_2.weight", [E], "norm"), (b + "post_ffw_norm_1.weight", [E], "norm"),
                   (b + "post_ffw_norm_2.weight", [E], "norm"),
                   (b + "ffn_gate_exps.weight", [E, FE, NE], "w"), (b + "ffn_up_exps.weight", [E, FE, NE], "w"),
                   (b + "ffn_down_exps.weight", [FE, E, NE], "w"), (b + "ffn_down_exps.scale", [NE], "scale")]
    hp = base_hparams(E, L, H, 1, FF, "attention.layer_norm_rms_epsilon", 1e-6)
    hp[5] = ("attention.head_count_kv", T_ARR, (T_U32, [HKV[w] for w in SWA]))
    hp += [("attention.key_length", T_U32, HD[False]), ("attention.value_length", T_U32, HD[False]),
           ("attention.key_length_swa", T_U32, HD[True]), ("attention.value_length_swa", T_U32, HD[True]),
           ("rope.dimension_count", T_U32, HD[False]), ("rope.dimension_count_swa", T_U32, HD[True]),
           ("rope.freq_base", T_F32, 1e6), ("rope.freq_base_swa", T_F32, 1e4),
           ("attention.sliding_window", T_U32, 16),
           ("attention.sliding_window_pattern", T_ARR, (T_BOOL, SWA)),
           ("attention.shared_kv_layers", T_U32, shared_kv),
           ("embedding_length_per_layer_input", T_U32, per_layer),
           ("final_logit_softcapping", T_F32, 30.0)]
    if per_layer:
        hp[3] = ("feed_forward_length", T_ARR, (T_U32, FFS))
    if moe:
        hp += [("expert_count", T_U32, NE), ("expert_used_count", T_U32, NU),
               ("expert_feed_forward_length", T_U32, FE)]
    return {"arch": "gemma4", "donor": "qwen3-f32", "hparams": hp, "tensors": ts,
            "summary": f"gemma4 (Gemma 4 {'26B-A4B' if moe else '31B'} layout): E{E} L{L}, layers 0 and 2 "
                       f"sliding (window 16, {HKV[True]} KV heads x {HD[True]}, rope 1e4 over all {HD[True]} "
                       f"dims), layers 1 and 3 full ({HKV[False]} KV head x {HD[False]}, rope 1e6 with "
                       f"rope_freqs leaving 12 of 16 pairs unrotated), layer 1 without attn_v (V = K); "
                       f"q/k RMSNorm, V weightless RMSNorm, q.k unscaled, GELU FFN ff {FF}, post-norms, "
                       f"layer_output_scale, final soft-capping 30, tied output"
                       + (f"; every layer also MoE: {NE} experts x ff {FE}, top-{NU} softmax renormalised, "
                          f"router on the RMS-normed residual / sqrt(E) x ffn_gate_inp.scale, "
                          f"per-expert ffn_down_exps.scale, the dense FFN as shared expert, "
                          f"post_ffw_norm_1 / _2 on the two, pre_ffw_norm_2 on the experts' input"
                          if moe else "")
                       + (f"; layers 4 (sliding) and 5 (full) keep no KV: attention.shared_kv_layers "
                          f"{shared_kv} makes them read the caches of layers 2 and 3 (their k and v "
                          f"projections are in the file and unused)" if shared_kv else "")
                       + (f"; per-layer inputs of {per_layer} values (per_layer_token_embd, per_layer_model_proj, "
                          f"per_layer_proj_norm; each layer's inp_gate, GELU, proj, post_norm) and "
                          f"feed_forward_length per layer {FFS} (E2B's wider FFN on the shared-KV layers)"
                          if per_layer else "")}


def gemma3n_spec():
    """Gemma 3n (E2B / E4B) as llama.cpp's gemma3n graph runs it: 4 AltUp streams of the
    residual (altup_proj / altup_unembd_proj, a tanh router predicting and correcting them),
    LAuReL, Gaussian top-k activation sparsity on the first 10 layers, per-layer inputs of 256
    values, V RMS-normed, q.k unscaled, soft-capping 30 whatever the file says; llama.cpp fixes
    the AltUp and LAuReL sizes (4 streams, rank 64, 256) and the first 20 layers' own KV."""
    E, L, H, HKV, HD, FF, V, A, R, NP = 64, 2, 4, 2, 16, 128, 4096, 4, 64, 256
    ts = [("token_embd.weight", [E, V], "w"), ("output_norm.weight", [E], "norm"),
          ("altup_proj.weight", [E, E, A - 1], "w"), ("altup_unembd_proj.weight", [E, E, A - 1], "w"),
          ("per_layer_token_embd.weight", [NP * L, V], "w"),
          ("per_layer_model_proj.weight", [E, NP * L], "w"), ("per_layer_proj_norm.weight", [NP], "norm")]
    for i in range(L):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", [E], "norm"), (b + "attn_q.weight", [E, H * HD], "w"),
               (b + "attn_k.weight", [E, HKV * HD], "w"), (b + "attn_v.weight", [E, HKV * HD], "w"),
               (b + "attn_output.weight", [H * HD, E], "w"), (b + "attn_q_norm.weight", [HD], "norm"),
               (b + "attn_k_norm.weight", [HD], "norm"), (b + "post_attention_norm.weight", [E], "norm"),
               (b + "ffn_norm.weight", [E], "norm"), (b + "ffn_gate.weight", [E, FF], "w"),
               (b + "ffn_up.weight", [E, FF], "w"), (b + "ffn_down.weight", [FF, E], "w"),
               (b + "post_ffw_norm.weight", [E], "norm"),
               (b + "inp_gate.weight", [E, NP], "w"), (b + "proj.weight", [NP, E], "w"),
               (b + "post_norm.weight", [E], "norm"),
               (b + "altup_correct_coef.weight", [A, A], "w"), (b + "altup_correct_scale.weight", [E], "norm"),
               (b + "altup_predict_coef.weight", [A, A * A], "w"), (b + "altup_router.weight", [E, A], "w"),
               (b + "altup_router_norm.weight", [E], "norm"), (b + "laurel_l.weight", [E, R], "w"),
               (b + "laurel_r.weight", [R, E], "w"), (b + "laurel_post_norm.weight", [E], "norm")]
    hp = base_hparams(E, L, H, HKV, FF, "attention.layer_norm_rms_epsilon", 1e-6) + [
        ("attention.key_length", T_U32, HD), ("attention.value_length", T_U32, HD),
        ("rope.freq_base", T_F32, 1e6), ("rope.freq_base_swa", T_F32, 1e4),
        ("attention.sliding_window", T_U32, 16), ("attention.sliding_window_pattern", T_U32, 2),
        ("embedding_length_per_layer_input", T_U32, NP)]
    return {"arch": "gemma3n", "donor": "qwen3-f32", "hparams": hp, "tensors": ts,
            "summary": f"gemma3n (Gemma 3n E2B / E4B layout): E{E} L{L}, layer 0 sliding (window 16, rope 1e4), "
                       f"layer 1 full (rope 1e6), GQA {H}/{HKV} x {HD}, q/k RMSNorm, V weightless RMSNorm, q.k "
                       f"unscaled; {A} AltUp streams, LAuReL rank {R}, per-layer inputs of {NP}, Gaussian top-k "
                       f"sparsity (both layers are among the first 10), GELU FFN ff {FF}, soft-capping 30, "
                       f"tied output"}


SPECS = {"gemma3n-f32": gemma3n_spec, "gemma4-f32": gemma4_spec, "gemma4-moe-f32": lambda: gemma4_spec(moe=True),
         "gemma4-kvshare-f32": lambda: gemma4_spec(shared_kv=2),
         "gemma4-e2b-f32": lambda: gemma4_spec(shared_kv=2, per_layer=16), 
         "gemma4-suppress-f32": lambda: dict(
             gemma4_spec(), extra_kvs=[("tokenizer.ggml.suppress_tokens", T_ARR, (T_I32, [3513, 4092, 1415, 883, 108, 1585, 1782, 3571]))],
             summary="gemma4-f32's layout and weights with tokenizer.ggml.suppress_tokens [3513, 4092, 1415, 883, 108, 1585, 1782, 3571] "
                     "(tokens gemma4-f32 greedily picks that the perplexity text lacks): their logits are -inf (llama.cpp's gemma4 graph)"), "qwen2moe-f32": qwen2moe_spec, "mistral3-f32": mistral3_spec, "smollm3-f32": smollm3_spec,
         "granite-f32": granite_spec, "phi3-f32": phi3_spec, "olmo2-swa-f32": olmo2_spec,
         "command-r-f32": command_r_spec, "cohere2-swa-f32": cohere2_spec, "glm4moe-f32": glm4moe_spec,
         "granitemoe-f32": granitemoe_spec, "command-r-plus-f32": command_r_plus_spec,
         "gpt-oss-mxfp4": gpt_oss_spec, "olmoe-f32": olmoe_spec,
         "llama4-f32": llama4_spec, "deepseek2-lite-f32": deepseek2_lite_spec,
         "deepseek2-kvb-f32": deepseek2_kvb_spec}


def make_model(name, golden_dir, seed):
    spec = SPECS[name]()
    arch = spec["arch"]
    donor = os.path.join(golden_dir, "models", spec["donor"] + ".gguf")
    kvs = [("general.architecture", T_STR, arch), ("general.name", T_STR, spec.get("general_name", name)),
           ("general.file_type", T_U32, spec.get("file_type", 0)), ("general.alignment", T_U32, 32)]
    kvs += [(f"{arch}.{k}", t, v) for k, t, v in spec["hparams"]]
    kvs += [kv for kv in read_kv(donor) if kv[0].startswith("tokenizer.")]
    kvs += spec.get("extra_kvs", [])
    rng = random.Random(seed)
    tensors = []
    for tname, dims, kind in spec["tensors"]:
        n = math.prod(dims)
        if kind == "norm":
            vals = [1.0 + 0.1 * rng.uniform(-1, 1) for _ in range(n)]
        elif kind == "factor_long":  # LongRoPE: long-context factors, 1 to 8
            vals = [rng.uniform(1.0, 8.0) for _ in range(n)]
        elif kind == "factor_short":
            vals = [rng.uniform(1.0, 1.5) for _ in range(n)]
        elif kind == "prop_rope":  # gemma4's proportional rope: a quarter of the pairs rotate
            vals = [1.0 if j < n // 4 else 1e30 for j in range(n)]
        elif kind == "scale":  # per-layer or per-expert output scales
            vals = [rng.uniform(0.5, 1.5) for _ in range(n)]
        elif kind == "probs_bias":  # selection bias: as large as the sigmoid scores it shifts
            vals = [rng.uniform(-0.5, 0.5) for _ in range(n)]
        elif kind == "mxfp4":
            tensors.append((tname, dims, mxfp4_blocks(rng, n)))
            continue
        elif kind == "sink":  # attention sinks: logits of the size of the scores
            vals = [rng.uniform(-2.0, 2.0) for _ in range(n)]
        elif kind == "bias":
            vals = [0.1 * rng.uniform(-1, 1) for _ in range(n)]
        else:  # uniform with the variance of N(0, 1/fan_in) so activations stay O(1)
            a = math.sqrt(3.0 / dims[0])
            vals = [rng.uniform(-a, a) for _ in range(n)]
        tensors.append((tname, dims, vals))
    path = os.path.join(golden_dir, "models", name + ".gguf")
    write_gguf(path, kvs, tensors)
    return spec, path, donor


# -------------------------------------------------------------- llama.cpp --
EPSILON_CHAT_PARSER = json.dumps({"parsers": [{"type": "epsilon"}], "rules": {}, "root": 0})
REQUEST = {"n_predict": 48, "temperature": 0.0, "samplers": ["temperature"], "repeat_penalty": 1.0,
           "n_probs": 10, "post_sampling_probs": False, "cache_prompt": False, "return_tokens": True,
           "seed": 0, "chat_parser": EPSILON_CHAT_PARSER}
SERVER_FLAGS = ["-c", "512", "-np", "1", "--no-webui", "-cram", "0", "-fa", "off", "-ctk", "f32", "-ctv", "f32",
                "-nr"]


class Server:
    """llama-server on the model; tokenization goes through its /tokenize (add_special false: the
    donor vocabularies add no BOS), completions through /completion."""

    def __init__(self, bindir, model, threads, commands, port=None, flags=SERVER_FLAGS):
        if port is None:  # a free one: another llama-server on a fixed port would answer instead
            with socket.socket() as sk:
                sk.bind(("127.0.0.1", 0))
                port = sk.getsockname()[1]
        self.url, self.commands = f"http://127.0.0.1:{port}", commands
        cmd = [os.path.join(bindir, "llama-server"), "-m", model, "--host", "127.0.0.1", "--port", str(port),
               "-t", str(threads), "-tb", str(threads)] + flags
        commands.append(" ".join(cmd))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            if self.proc.poll() is not None:
                raise SystemExit(f"llama-server exited ({self.proc.returncode}): {' '.join(cmd)}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return
            except Exception:
                time.sleep(0.2)
        raise SystemExit("llama-server did not start")

    def post(self, path, req):
        self.commands.append(f"POST {self.url}{path} " + json.dumps(req))
        r = urllib.request.Request(self.url + path, json.dumps(req).encode(), {"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(r, timeout=600).read())

    def tokenize(self, text, parse_special=True, add_special=False):
        return self.post("/tokenize", {"content": text, "add_special": add_special,
                                       "parse_special": parse_special})["tokens"]

    def greedy(self, prompts):
        """prompts: (text, ids, number of tokens to generate)."""
        cases = []
        for text, ids, n_predict in prompts:
            res = self.post("/completion", dict(REQUEST, prompt=ids, n_predict=n_predict))
            steps = []
            for p in res["completion_probabilities"]:
                top = [{"id": t["id"], "logprob": t["logprob"], "prob": math.exp(t["logprob"])}
                       for t in p["top_logprobs"]]
                steps.append({"id": p["id"], "logprob": p["logprob"], "top": top,
                              "top1_top2_logit_gap": top[0]["logprob"] - top[1]["logprob"]})
            cases.append({"prompt": text, "prompt_ids": ids, "ids": res["tokens"], "text": res["content"],
                          "steps": steps})
        return cases

    def teacher_forced(self, cases, banned):
        """Replaces each step's top-10 by a one-token request on prompt_ids + ids[:s]: in free
        running, llama-server reports a step whose token is an incomplete UTF-8 sequence late,
        against the wrong position. Tokens that are incomplete UTF-8 by themselves are banned
        (logit_bias) so that the one generated token is complete; the reported probabilities
        are the raw logits' and do not see the ban."""
        for c in cases:
            for s, step in enumerate(c["steps"]):
                req = dict(REQUEST, prompt=c["prompt_ids"] + c["ids"][:s], n_predict=1,
                           logit_bias=[[t, False] for t in banned])
                res = self.post("/completion", req)
                self.commands[-1] = (f"POST {self.url}/completion (teacher-forced step {s}, {len(banned)} "
                                     f"incomplete-UTF-8 tokens banned) prompt=prompt_ids+ids[:{s}]")
                p = res["completion_probabilities"][0]
                step["top"] = [{"id": t["id"], "logprob": t["logprob"], "prob": math.exp(t["logprob"])}
                               for t in p["top_logprobs"]]
                step["top1_top2_logit_gap"] = step["top"][0]["logprob"] - step["top"][1]["logprob"]
                step["logprob"] = next((t["logprob"] for t in step["top"] if t["id"] == step["id"]), None)
                step["source"] = "teacher_forced"

    def close(self):
        self.proc.terminate()
        self.proc.wait()


def incomplete_utf8_tokens(model):
    """Ids of the tokens whose bytes are not valid UTF-8 on their own: byte-level BPE tokens
    that decode to such bytes, or SentencePiece byte tokens <0x80>..<0xFF> (its normal pieces
    are text)."""
    kv = {k: v for k, t, v in read_kv(model)}
    if kv.get("tokenizer.ggml.model") == "llama":  # SentencePiece: byte fallback, type 6
        types = kv.get("tokenizer.ggml.token_type", (0, []))[1]
        return [i for i, piece in enumerate(kv["tokenizer.ggml.tokens"][1])
                if types and types[i] == 6 and len(piece) == 6 and int(piece[3:5], 16) >= 0x80]
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    byte_of, n = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            byte_of[chr(256 + n)] = b
            n += 1
    types = kv.get("tokenizer.ggml.token_type", (0, []))[1]
    out = []
    for i, piece in enumerate(kv["tokenizer.ggml.tokens"][1]):
        if types and types[i] != 1:  # only normal tokens
            continue
        try:
            bytes(byte_of[ch] for ch in piece).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            out.append(i)
    return out


def cache_flags(kv_type):
    """llama.cpp's attention and cache flags: f32 without flash attention (the goldens' default);
    another cache type with flash attention, which quantized V needs."""
    return ["-fa", "off" if kv_type == "f32" else "on", "-ctk", kv_type, "-ctv", kv_type, "-nr"]


def perplexity(bindir, model, text_path, threads, commands, n_ctx=128, kv_type="f32", extra=()):
    cmd = [os.path.join(bindir, "llama-perplexity"), "-m", model, "-f", text_path, "-c", str(n_ctx), "-b", str(n_ctx),
           "-t", str(threads), "-tb", str(threads), "--ppl-output-type", "1"] + cache_flags(kv_type) + list(extra)
    commands.append(" ".join(cmd))
    for _ in range(10):  # its asynchronous logger sometimes loses the last lines at exit: run again
        p = subprocess.run(cmd, capture_output=True, text=True, check=True)
        if "Final estimate: PPL" in p.stdout + p.stderr:
            break
    running = []
    for line in p.stdout.splitlines():
        f = line.split()
        if len(f) == 4 and f[0].isdigit():
            running.append({"start_token": int(f[0]), "running_ppl": float(f[1]),
                            "running_mean_nll": float(f[2]), "running_stderr_nll": float(f[3])})
    final = [l for l in p.stderr.splitlines() + p.stdout.splitlines() if "Final estimate: PPL" in l]
    final_ppl = float(final[-1].split("=")[1].split("+/-")[0])
    means = [r["running_mean_nll"] for r in running]
    per_chunk = [means[0]] + [means[k] * (k + 1) - means[k - 1] * k for k in range(1, len(means))]
    return final_ppl, running, per_chunk


def type_name(tensor):
    return "MXFP4" if tensor[2] == "mxfp4" else "F32"


def quantize_model(bindir, golden_dir, name, commands):
    """NAME = BASE-TYPE, not a spec: llama-quantize of the existing golden model BASE-f32 to
    TYPE (q4_k_m, iq4_xs, ...), with the type mix llama-quantize chooses for that file type
    (its fallbacks where rows are not a multiple of 256 included). The spec is the base's."""
    base, qtype = name.rsplit("-", 1)
    src = os.path.join(golden_dir, "models", base + "-f32.gguf")
    if not os.path.exists(src):
        raise SystemExit(f"{name}: neither a spec ({', '.join(SPECS)}) nor BASE-TYPE with {src}")
    path = os.path.join(golden_dir, "models", name + ".gguf")
    cmd = [os.path.join(bindir, "llama-quantize"), src, path, qtype.upper(), "1"]
    if qtype.startswith(("iq1", "iq2", "iq3")):
        # the lattice types want an importance matrix (llama-quantize refuses IQ1 / IQ2 without
        # one): llama-imatrix of the base model over the perplexity text, kept beside the model
        imatrix = os.path.join(golden_dir, "models", base + "-f32.imatrix.gguf")
        if not os.path.exists(imatrix):
            icmd = [os.path.join(bindir, "llama-imatrix"), "-m", src, "-f",
                    os.path.join(golden_dir, "ppl_text.txt"), "-c", "128", "-o", imatrix]
            commands.append(" ".join(icmd))
            subprocess.run(icmd, capture_output=True, check=True)
        cmd[1:1] = ["--imatrix", imatrix]
    commands.append(" ".join(cmd))
    subprocess.run(cmd, capture_output=True, check=True)
    kvs, types = read_kv(path, with_tensors=True)
    arch = next(v for k, t, v in kvs if k == "general.architecture")
    spec = dict(SPECS[base + "-f32"]()) if base + "-f32" in SPECS else {"arch": arch}
    spec.update(donor=base + "-f32", tensor_types=types,
                summary=f"llama-quantize {qtype.upper()} of {base}-f32 (the same weights; the file type's "
                        f"own mix of tensor types, see tensor_types)")
    return spec, path


LORA_TARGETS = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
                "ffn_up.weight", "ffn_down.weight", "ffn_gate_inp.weight", "ffn_gate_shexp.weight",
                "ffn_up_shexp.weight", "ffn_down_shexp.weight", "ffn_gate_inp_shexp.weight")
LORA_RANK, LORA_ALPHA = 8, 16.0
CVEC_RADIUS = 0.5


def write_lora(model_path, out_path, dtype, rank=LORA_RANK, alpha=LORA_ALPHA, seed=0, name="lora"):
    """A random LoRA adapter in llama.cpp's GGUF adapter layout (convert_lora_to_gguf.py's) for the
    model at model_path: a pair NAME.lora_a {n_in, rank}, NAME.lora_b {rank, n_out} for every attention
    and dense FFN projection and router of each layer, and, when the model has its own output head,
    for the head and the token embedding (lora_a {rank, n_vocab}, rows by token: llama.cpp applies
    a token_embd pair to the head too when the two are tied, which its shapes cannot do).
    A has the variance of N(0, 1/n_in), B of N(0, 1/(16 rank)), so with alpha / rank = 2 the
    adapters' products are about as large as the base's: an engine that skips one fails.
    Returns {tensor name: type name}."""
    kvs, dims = read_kv(model_path), {}
    read_kv(model_path, True, dims)
    arch = next(v for k, t, v in kvs if k == "general.architecture")
    rng = random.Random(seed)
    targets = [n for n in dims if n.startswith("blk.") and n.split(".", 2)[2] in LORA_TARGETS]
    if "output.weight" in dims:  # llama.cpp's deepseek2 graph multiplies by its head without adapters
        targets += ([] if arch == "deepseek2" else ["output.weight"]) + ["token_embd.weight"]
    tensors, types = [], {}
    for t in targets:
        n_in, n_out = dims[t][0], (dims[t] + [1])[1]  # a 1-D weight (ffn_gate_inp_shexp) has one output
        a_dims, a_fan = ([rank, n_out], rank) if t == "token_embd.weight" else ([n_in, rank], n_in)
        b_dims = [rank, n_in if t == "token_embd.weight" else n_out]
        ra, rb = math.sqrt(3.0 / a_fan), math.sqrt(3.0 / (16 * rank))
        for suffix, d, r in ((".lora_a", a_dims, ra), (".lora_b", b_dims, rb)):
            vals = [rng.uniform(-r, r) for _ in range(math.prod(d))]
            tensors.append((t + suffix, d, ("F16", vals) if dtype == "f16" else vals))
            types[t + suffix] = dtype.upper()
    write_gguf(out_path, [("general.architecture", T_STR, arch), ("general.type", T_STR, "adapter"),
                          ("general.name", T_STR, name), ("adapter.type", T_STR, "lora"),
                          ("adapter.lora.alpha", T_F32, float(alpha))], tensors)
    return types


def make_lora(golden_dir, base, dtype, name):
    """write_lora for the golden model BASE, beside it as NAME.gguf: (its path, its tensor types)."""
    path = os.path.join(golden_dir, "models", name + ".gguf")
    types = write_lora(os.path.join(golden_dir, "models", base + ".gguf"), path, dtype,
                       seed=sum(name.encode()), name=name)
    return path, types


def write_cvec(model_path, out_path, seed, radius=CVEC_RADIUS):
    """A random control vector for the model at model_path in the layout llama.cpp's
    cvector-generator writes (general.architecture "controlvector", model_hint, layer_count, F32
    direction.N of n_embd values): directions 1 .. n_layer, the last one beyond the model's layers
    (llama.cpp ignores it), values uniform in [-radius, radius]. Returns the tensor names."""
    kvs = read_kv(model_path)
    arch = next(v for k, t, v in kvs if k == "general.architecture")
    E = next(v for k, t, v in kvs if k == arch + ".embedding_length")
    L = next(v for k, t, v in kvs if k == arch + ".block_count")
    rng = random.Random(seed)
    tensors = [(f"direction.{n}", [E], [rng.uniform(-radius, radius) for _ in range(E)])
               for n in range(1, L + 1)]
    write_gguf(out_path, [("general.architecture", T_STR, "controlvector"),
                          ("controlvector.model_hint", T_STR, arch),
                          ("controlvector.layer_count", T_I32, L)], tensors)
    return [t[0] for t in tensors]


def parse_cvec(name):
    """BASE-cvec[N][_xSCALE][_lSTART-END]: (BASE, files, scale or None, (start, end) or None)."""
    base, rest = name.split("-cvec")
    files, scale, rng = 1, None, None
    parts = rest.split("_")
    if parts[0]:
        files = int(parts[0])
    for p in parts[1:]:
        if p.startswith("x"):
            scale = float(p[1:])
        elif p.startswith("l"):
            a, b = p[1:].split("-")
            rng = (int(a), int(b))
        else:
            raise SystemExit(f"{name}: unknown control vector part '{p}'")
    return base, files, scale, rng


def set_gating(base_path, out_path, value):
    """A copy of base_path with ARCH.expert_gating_func (a u32 the file has) set to value, in place."""
    blob = bytearray(open(base_path, "rb").read())
    arch = next(v for k, t, v in read_kv(base_path) if k == "general.architecture")
    key = f"{arch}.expert_gating_func".encode()
    at = blob.find(struct.pack("<Q", len(key)) + key)
    if at < 0 or struct.unpack_from("<I", blob, at + 8 + len(key))[0] != T_U32:
        raise SystemExit(f"{base_path}: no u32 {key.decode()} to change")
    struct.pack_into("<I", blob, at + 8 + len(key) + 4, value)
    open(out_path, "wb").write(blob)


def make(bindir, golden_dir, name):
    commands = []
    kv_type = "f32"
    lora = None
    if "-gate_" in name:  # BASE-gate_N: BASE with expert_gating_func N
        base, value = name.split("-gate_")
        model = os.path.join(golden_dir, "models", name + ".gguf")
        set_gating(os.path.join(golden_dir, "models", base + ".gguf"), model, int(value))
        base_meta = json.load(open(os.path.join(golden_dir, base, "meta.json")))
        spec = dict(SPECS[base]()) if base in SPECS else {}
        spec.update(arch=base_meta["arch"], donor=base, tensor_types=base_meta["tensor_types"],
                    file=base + ".gguf", override_kv=[f"{base_meta['arch']}.expert_gating_func=int:{value}"],
                    summary=f"{base} with expert_gating_func {value} (llama.cpp's numbers: 1 softmax, 2 "
                            f"sigmoid, 3 softmax of the chosen logits, 4 sqrt-softplus); the same weights "
                            f"(llama.cpp ran a copy of the file with that key changed)")
    elif "-cvec" in name:  # BASE-cvec[N][_xSCALE][_lA-B]: the golden model BASE with N control vectors
        base, n_files, scale, rng = parse_cvec(name)
        paths = []
        for i in range(n_files):
            paths.append(os.path.join(golden_dir, "models", f"{name}-{i}.gguf" if n_files > 1 else name + ".gguf"))
            write_cvec(os.path.join(golden_dir, "models", base + ".gguf"), paths[-1], seed=sum(name.encode()) + i)
        # llama.cpp's flags: every file at SCALE (--control-vector-scaled), else at 1
        flags = (["--control-vector-scaled", ",".join(f"{p}:{scale}" for p in paths)] if scale is not None
                 else ["--control-vector", ",".join(paths)])
        if rng:
            flags += ["--control-vector-layer-range", str(rng[0]), str(rng[1])]
        spec = dict(SPECS[base]()) if base in SPECS else {}
        model = os.path.join(golden_dir, "models", base + ".gguf")
        base_meta = json.load(open(os.path.join(golden_dir, base, "meta.json")))
        # the adapter fields carry the flags through the code below (greedy, perplexity)
        lora = {"flags": flags}
        cvec = {"files": [os.path.basename(p) for p in paths], "scale": scale, "layer_range": rng}
        spec.update(arch=base_meta["arch"], donor=base, tensor_types=base_meta["tensor_types"],
                    file=base + ".gguf",
                    summary=f"{base} with {n_files} random control vector file(s) (directions 1..n_layer, "
                            f"uniform in +-{CVEC_RADIUS:g})" + (f" at scale {scale:g}" if scale is not None else "")
                            + (f", layers {rng[0]}-{rng[1]}" if rng else ""))
    elif "-lora_" in name:  # BASE-lora_TYPE[_xSCALE]: the golden model BASE with a random TYPE adapter
        base, rest = name.split("-lora_")
        dtype, _, scale = rest.partition("_x")
        scale = float(scale) if scale else 1.0
        lpath, ltypes = make_lora(golden_dir, base, dtype, name)
        spec = dict(SPECS[base]()) if base in SPECS else {}
        model = os.path.join(golden_dir, "models", base + ".gguf")
        base_meta = json.load(open(os.path.join(golden_dir, base, "meta.json")))
        lora = {"file": os.path.basename(lpath), "scale": scale, "rank": LORA_RANK, "alpha": LORA_ALPHA,
                "tensor_types": ltypes,
                "flags": ["--lora-scaled", f"{lpath}:{scale}"] if scale != 1.0 else ["--lora", lpath]}
        spec.update(arch=base_meta["arch"], donor=base,
                    tensor_types=base_meta["tensor_types"], file=base + ".gguf",
                    summary=f"{base} with a random LoRA adapter ({dtype.upper()}, rank {LORA_RANK}, alpha "
                            f"{LORA_ALPHA:g}, scale {scale:g}) on its attention and FFN projections"
                            + (", router" if any("ffn_gate_inp" in t for t in ltypes) else "")
                            + (", output head and token embedding" if "output.weight.lora_a" in ltypes else ""))
    elif "-kv_" in name:  # BASE-kv_TYPE: the golden model BASE with a TYPE cache (f16, bf16, q8_0)
        base, kv_type = name.split("-kv_")
        spec = dict(SPECS[base]()) if base in SPECS else {}
        model = os.path.join(golden_dir, "models", base + ".gguf")
        base_meta = json.load(open(os.path.join(golden_dir, base, "meta.json")))
        spec.update(arch=base_meta["arch"], donor=base, tensor_types=base_meta["tensor_types"],
                    file=base + ".gguf",
                    summary=f"{base} with a {kv_type} KV cache (llama.cpp: flash attention, -ctk / -ctv "
                            f"{kv_type}); the same model file")
    elif name in SPECS:
        spec, model, _ = make_model(name, golden_dir, seed=sum(name.encode()))
        spec["tensor_types"] = {t[0]: type_name(t) for t in spec["tensors"]}
    else:
        spec, model = quantize_model(bindir, golden_dir, name, commands)
    out = os.path.join(golden_dir, name)
    os.makedirs(out, exist_ok=True)
    donor_cases = json.load(open(os.path.join(golden_dir, spec["donor"], "tokenize.json")))
    texts = ["The quick brown fox jumps over the lazy dog.",
             "def fibonacci(n):\n    if n < 2:\n        return n\n",
             "Once upon a time, in a small village by the sea, there lived"]
    ppl = spec.get("ppl", {"n_ctx": 128, "text_file": "ppl_text.txt"})
    text_path = os.path.join(golden_dir, ppl["text_file"])
    # a spec may run the server with more context and add a long prompt cut from the
    # perplexity text: (number of its tokens, tokens to generate)
    flags = ["-c", str(spec.get("server_ctx", 512))] + SERVER_FLAGS[2:-7] + cache_flags(kv_type)
    if lora:
        flags += lora["flags"]
    srv = Server(bindir, model, 1, commands, flags=flags)
    try:
        # a vocabulary that adds BOS (SentencePiece's) has it in every id list, as the shared
        # goldens do (tokenize.json's bos_added)
        bos = any(c.get("bos_added") for c in donor_cases["cases"])
        cases = [dict(c, ids=srv.tokenize(c["text"], c["parse_special"], c.get("bos_added", False)))
                 for c in donor_cases["cases"]]
        prompts = [(t, srv.tokenize(t, add_special=bos), REQUEST["n_predict"]) for t in texts]
        text_ids = srv.tokenize(open(text_path, encoding="utf-8").read(), add_special=bos)
        if "long_prompt" in spec:
            n, n_predict = spec["long_prompt"]
            prompts.append((f"the first {n} tokens of {ppl['text_file']}", text_ids[:n], n_predict))
        g1 = srv.greedy(prompts)
        srv.teacher_forced(g1, incomplete_utf8_tokens(model))
    finally:
        srv.close()
    tok = dict(donor_cases, cases=cases)
    if any(c["ids"] != d["ids"] for c, d in zip(cases, donor_cases["cases"])):
        raise SystemExit(f"{name}: tokenization differs from the donor {spec['donor']}")
    srv = Server(bindir, model, 2, commands, flags=flags)
    try:
        g2 = srv.greedy(prompts)
    finally:
        srv.close()
    same = all(a["ids"] == b["ids"] for a, b in zip(g1, g2))
    extra = lora["flags"] if lora else ()
    ppl1, running, per_chunk = perplexity(bindir, model, text_path, 1, commands, ppl["n_ctx"], kv_type, extra)
    ppl2, _, _ = perplexity(bindir, model, text_path, 2, commands, ppl["n_ctx"], kv_type, extra)
    json.dump(tok, open(os.path.join(out, "tokenize.json"), "w"), indent=1)
    json.dump({"tool": "llama-server /completion (tokenize.json: its /tokenize)",
               "settings": {"server_flags": ["--host", "127.0.0.1"] + flags, "request": REQUEST,
                            "threads_compared": [1, 2]},
               "determinism": {"identical_token_ids": same}, "cases": g1},
              open(os.path.join(out, "greedy.json"), "w"), indent=1)
    json.dump({"tool": "llama-perplexity", "settings": {"n_ctx": ppl["n_ctx"], "n_batch": ppl["n_ctx"],
                                                         "flags": cache_flags(kv_type),
                                                         "ppl_output_type": 1},
               "text_file": ppl["text_file"], "final_ppl": ppl1, "running": running,
               "per_chunk_mean_nll": per_chunk, "text_ids": text_ids,
               "determinism": {"threads_compared": [1, 2], "final_ppl_by_threads": {"1": ppl1, "2": ppl2}}},
              open(os.path.join(out, "perplexity.json"), "w"), indent=1)
    blob = open(model, "rb").read()
    gaps = [min(s["top1_top2_logit_gap"] for s in c["steps"]) for c in g1]
    json.dump({"model": name, "file": spec.get("file", name + ".gguf"), "kv_type": kv_type, "size_bytes": len(blob),
               "sha256": hashlib.sha256(blob).hexdigest(), "arch": spec["arch"], "vocab_only": False,
               "n_vocab": len(next(v for k, t, v in read_kv(model) if k == "tokenizer.ggml.tokens")[1]),
               "tensor_type_counts": {k: sum(1 for v in spec["tensor_types"].values() if v == k)
                                      for k in sorted(set(spec["tensor_types"].values()))},
               "tensor_types": spec["tensor_types"],
               "tokenizer_from": spec["donor"], "llama_cpp_bin_dir": bindir,
               **({"lora": {k: v for k, v in lora.items() if k != "flags"}} if lora and "-cvec" not in name else {}),
               **({"cvec": cvec} if "-cvec" in name else {}),
               **({"override_kv": spec["override_kv"]} if "override_kv" in spec else {}),
               "summary": {"description": spec["summary"], "greedy_identical_across_threads": same,
                           "ppl_identical_across_threads": ppl1 == ppl2, "final_ppl": ppl1,
                           "greedy_min_logit_gap": gaps},
               "commands": commands},
              open(os.path.join(out, "meta.json"), "w"), indent=1)
    print(f"{name}: {len(blob)} bytes, ppl {ppl1}, threads agree {same and ppl1 == ppl2}, min gaps {gaps}")
    if "override_kv" in spec:
        os.remove(model)  # the copy: BASE's file and the override make it again


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    for n in sys.argv[3:]:
        make(sys.argv[1], sys.argv[2], n)
