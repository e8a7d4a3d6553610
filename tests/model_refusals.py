#!/usr/bin/env python3
"""Model files kvllm must refuse, with a message naming the key or tensor.

Usage: model_refusals.py KVLLM_BIN GOLDEN_MODELS_DIR OUT_DIR

Each case rewrites one of the golden models (tests/data/golden/models) with a
metadata key set, removed or a tensor renamed, runs `kvllm info -m` on it and
checks exit status 1 and the expected text in the message. The unmodified
mixture-of-experts files must load and report their experts, a qwen2moe
file made from qwen3moe-f32 must load and generate, and copies with fused
gate+up expert tensors must give the unfused files' outputs.
Standard library only.
"""
import os
import struct
import subprocess
import sys

T_U32, T_I32, T_STR, T_ARR = 4, 5, 8, 9
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class Reader:
    def __init__(self, b):
        self.b, self.o = b, 0

    def take(self, n):
        v = self.b[self.o:self.o + n]
        self.o += n
        return v

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def raw_str(self):
        n = self.u64()
        return struct.pack("<Q", n) + self.take(n)

    def str(self):
        return self.raw_str()[8:].decode()

    def raw_value(self, t):
        if t in SCALAR:
            return self.take(SCALAR[t])
        if t == T_STR:
            return self.raw_str()
        if t == T_ARR:
            et, n = self.u32(), self.u64()
            head = struct.pack("<IQ", et, n)
            return head + b"".join(self.raw_value(et) for _ in range(n))
        raise SystemExit(f"unknown GGUF value type {t}")


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def load(path):
    r = Reader(open(path, "rb").read())
    assert r.take(4) == b"GGUF"
    version, n_t, n_kv = r.u32(), r.u64(), r.u64()
    kvs = []
    for _ in range(n_kv):
        k = r.str()
        t = r.u32()
        kvs.append([k, t, r.raw_value(t)])
    tensors = []
    for _ in range(n_t):
        name = r.str()
        nd = r.u32()
        dims = [r.u64() for _ in range(nd)]
        tensors.append([name, dims, r.u32(), r.u64()])
    align = 32
    r.o += (align - r.o % align) % align
    return version, kvs, tensors, r.b[r.o:]


def save(path, version, kvs, tensors, data):
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)))
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + v
    for name, dims, dt, off in tensors:
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", dt, off)
    out += bytes((32 - len(out) % 32) % 32)
    open(path, "wb").write(bytes(out) + data)


def set_kv(kvs, key, t, raw):
    for kv in kvs:
        if kv[0] == key:
            kv[1], kv[2] = t, raw
            return
    kvs.append([key, t, raw])


def drop_kv(kvs, key):
    kvs[:] = [kv for kv in kvs if kv[0] != key]


def rename(tensors, old_suffix, new_suffix):
    for t in tensors:
        if t[0].endswith(old_suffix):
            t[0] = t[0][: -len(old_suffix)] + new_suffix


# The edits of the cases: each returns what changes a file's (metadata, tensors).
def set_u32(key, v):
    return lambda kv, ts: set_kv(kv, key, T_U32, struct.pack("<I", v))


def drop(key):
    return lambda kv, ts: drop_kv(kv, key)


def rename_tensor(old_suffix, new_suffix):
    return lambda kv, ts: rename(ts, old_suffix, new_suffix)


CASES = [
    # (name, base model, edit, text the message must contain)
    ("experts_on_dense_arch", "qwen3-f32", set_u32("qwen3.expert_count", 8),
     "key 'qwen3.expert_count' = 8: mixture-of-experts layers are not supported for architecture 'qwen3'"),
    ("moe_arch_without_experts", "qwen3moe-f32", drop("qwen3moe.expert_count"),
     "key 'qwen3moe.expert_count' missing or 0"),
    ("router_without_expert_count", "llama-moe-f32", drop("llama.expert_count"),
     "tensor 'blk.0.ffn_gate_inp.weight': a router in a layer that key 'llama.expert_count' makes dense"),
    ("mixtral_one_tensor_per_expert", "llama-moe-f32", rename_tensor("ffn_gate_exps.weight", "ffn_gate.0.weight"),
     "tensor 'blk.0.ffn_gate_exps.weight' missing: this file stores each expert as its own tensor"),
    ("fused_gate_up_experts_wrong_shape", "qwen3moe-f32",
     rename_tensor("ffn_gate_exps.weight", "ffn_gate_up_exps.weight"),
     "tensor 'blk.0.ffn_gate_up_exps.weight': shape [256, 256, 8, 1], expected [256, 512, 8]"),
    ("fused_gate_up_experts_gpt_oss", "gpt-oss-mxfp4",
     rename_tensor("ffn_gate_exps.weight", "ffn_gate_up_exps.weight"),
     "tensor 'blk.0.ffn_gate_up_exps.weight': fused gate/up experts are not supported for gpt-oss"),
    ("missing_expert_tensor", "qwen3moe-f32", rename_tensor("blk.1.ffn_down_exps.weight", "blk.1.ffn_down_exps.other"),
     "tensor 'blk.1.ffn_down_exps.weight' missing"),
    ("unknown_gating", "deepseek2-moe-f32", set_u32("deepseek2.expert_gating_func", 5),
     "key 'deepseek2.expert_gating_func' = 5 is not supported"),
    ("used_over_count", "qwen3moe-f32", set_u32("qwen3moe.expert_used_count", 9),
     "'qwen3moe.expert_used_count' = 9: need 1 <= used <= count"),
    ("groups_do_not_fit", "deepseek2-moe-f32", set_u32("deepseek2.expert_group_count", 3),
     "'deepseek2.expert_group_count' = 3"),
    ("deepseek2_moe_without_experts", "deepseek2-moe-f32", drop("deepseek2.expert_count"),
     "key 'deepseek2.leading_dense_block_count' = 1 < 2 layers, but key 'deepseek2.expert_count' is missing"),
    ("command_r_plus_without_qk_norm", "command-r-f32", set_u32("command-r.block_count", 64),
     "tensor 'blk.0.attn_q_norm.weight' missing"),
    ("layer_norm_without_epsilon", "command-r-f32", drop("command-r.attention.layer_norm_epsilon"),
     "key 'command-r.attention.layer_norm_epsilon' missing"),
    ("cohere2_without_window", "cohere2-swa-f32", drop("cohere2.attention.sliding_window"),
     "key 'cohere2.attention.sliding_window' missing"),
    ("granite_without_logit_scale", "granite-f32", drop("granite.logit_scale"),
     "key 'granite.logit_scale' missing"),
    ("fused_qkv_wrong_shape", "phi3-f32", set_u32("phi3.attention.head_count_kv", 2),
     "tensor 'blk.0.attn_qkv.weight': shape [32, 64, 1, 1], expected [32, 96, 1]"),
    ("phi3_without_gate_up", "phi3-f32", rename_tensor("blk.1.ffn_up.weight", "blk.1.ffn_up.other"),
     "tensor 'blk.1.ffn_up.weight' missing"),
    ("glm4moe_mrope_sections", "glm4moe-f32",
     lambda kv, ts: set_kv(kv, "glm4moe.rope.dimension_sections", T_ARR,
                           struct.pack("<IQ", T_I32, 4) + struct.pack("<4i", 8, 4, 4, 0)),
     "key 'glm4moe.rope.dimension_sections': multimodal rope sections are not supported"),
    ("glm4moe_all_layers_mtp", "glm4moe-f32", set_u32("glm4moe.nextn_predict_layers", 3),
     "key 'glm4moe.nextn_predict_layers' = 3: must be below 3"),
    ("olmoe_without_k_norm", "olmoe-f32",
     rename_tensor("blk.1.attn_k_norm.weight", "blk.1.attn_k_norm.other"),
     "tensor 'blk.1.attn_k_norm.weight' missing"),
    ("gpt_oss_without_sinks", "gpt-oss-mxfp4",
     rename_tensor("blk.1.attn_sinks.weight", "blk.1.attn_sinks.other"),
     "tensor 'blk.1.attn_sinks.weight' missing"),
    ("gpt_oss_without_expert_bias", "gpt-oss-mxfp4",
     rename_tensor("blk.0.ffn_down_exps.bias", "blk.0.ffn_down_exps.other"),
     "tensor 'blk.0.ffn_down_exps.bias' missing"),
    ("gpt_oss_without_expert_width", "gpt-oss-mxfp4", drop("gpt-oss.expert_feed_forward_length"),
     "key 'gpt-oss.expert_feed_forward_length' missing"),
    ("llama4_without_interleave_step", "llama4-f32", drop("llama4.interleave_moe_layer_step"),
     "key 'llama4.interleave_moe_layer_step' missing"),
    ("llama4_partial_rope", "llama4-f32", set_u32("llama4.rope.dimension_count", 8),
     "key 'llama4.rope.dimension_count' = 8: llama4 rotates whole heads (16)"),
    ("rope_scaling_unknown", "deepseek2-yarn-f32",
     lambda kv, ts: set_kv(kv, "deepseek2.rope.scaling.type", T_STR, gstr("longrope")),
     "key 'deepseek2.rope.scaling.type': rope scaling 'longrope' is not supported"),
    # gemma4-f32's layers slide as [yes, no, yes, no]
    ("kv_heads_differ_within_kind", "gemma4-f32",
     lambda kv, ts: set_kv(kv, "gemma4.attention.head_count_kv", T_ARR,
                           struct.pack("<IQ4I", T_U32, 4, 2, 1, 4, 1)),
     "key 'gemma4.attention.head_count_kv' differs between layers of one kind (2, then 4 at layer 2)"),
    ("kv_heads_array_length", "gemma4-f32",
     lambda kv, ts: set_kv(kv, "gemma4.attention.head_count_kv", T_ARR,
                           struct.pack("<IQ3I", T_U32, 3, 2, 1, 2)),
     "key 'gemma4.attention.head_count_kv' has 3 entries, expected one per layer (4)"),
    ("shared_kv_all_layers", "gemma4-f32", set_u32("gemma4.attention.shared_kv_layers", 4),
     "key 'gemma4.attention.shared_kv_layers' = 4: must be below 4"),
    ("shared_kv_other_kind", "gemma4-kvshare-f32", set_u32("gemma4.attention.shared_kv_layers", 3),
     "layer 3 would read the cache of layer 2, which is not of its kind"),
    ("per_layer_inputs_elsewhere", "qwen3-f32", set_u32("qwen3.embedding_length_per_layer_input", 8),
     "per-layer embeddings are supported for gemma4 only"),
    ("gemma4_full_layer_without_v_mismatched", "gemma4-f32",
     set_u32("gemma4.attention.value_length", 16),
     "tensor 'blk.1.attn_v.weight' missing (V is K only where the head widths agree"),
]


def qwen2moe_from_qwen3moe(models, path):
    """No golden exists for qwen2moe: its shape (shared expert, sigmoid-gated by
    ffn_gate_inp_shexp, no q/k norms) is made from qwen3moe-f32, the shared
    expert's tensors reusing same-shaped attention data, to check that it loads,
    reports its shared expert and generates."""
    version, kvs, tensors, data = load(os.path.join(models, "qwen3moe-f32.gguf"))
    for kv in kvs:
        if kv[0].startswith("qwen3moe."):
            kv[0] = "qwen2moe." + kv[0][len("qwen3moe."):]
    set_kv(kvs, "general.architecture", T_STR, gstr("qwen2moe"))
    set_kv(kvs, "qwen2moe.expert_shared_feed_forward_length", T_U32, struct.pack("<I", 256))
    tensors[:] = [t for t in tensors if "attn_q_norm" not in t[0] and "attn_k_norm" not in t[0]]
    by = {t[0]: t for t in tensors}
    for il in range(2):
        q, o = by[f"blk.{il}.attn_q.weight"], by[f"blk.{il}.attn_output.weight"]
        tensors.append([f"blk.{il}.ffn_gate_shexp.weight", [256, 256], 0, q[3]])
        tensors.append([f"blk.{il}.ffn_up_shexp.weight", [256, 256], 0, o[3]])
        tensors.append([f"blk.{il}.ffn_down_shexp.weight", [256, 256], 0, q[3]])
        tensors.append([f"blk.{il}.ffn_gate_inp_shexp.weight", [256], 0, by[f"blk.{il}.attn_norm.weight"][3]])
    save(path, version, kvs, tensors, data)


BLOCK = {0: (4, 1), 8: (34, 32)}  # F32, Q8_0: bytes per block, values per block


def fuse_gate_up(models, base, path):
    """BASE with each layer's ffn_gate_exps and ffn_up_exps fused into one ffn_gate_up_exps
    {E, 2F, n_expert}, as convert_hf_to_gguf --fuse-gate-up-exps writes it: expert e's F gate
    rows, then its F up rows."""
    version, kvs, tensors, data = load(os.path.join(models, base + ".gguf"))
    data = bytearray(data)
    by = {t[0]: t for t in tensors}
    for gate in [t for t in tensors if t[0].endswith("ffn_gate_exps.weight")]:
        up = by[gate[0].replace("ffn_gate_exps", "ffn_up_exps")]
        (E, F, NE), dt = gate[1], gate[2]
        bpb, vpb = BLOCK[dt]
        half = E * F // vpb * bpb
        fused = b"".join(data[t[3] + e * half:t[3] + (e + 1) * half] for e in range(NE) for t in (gate, up))
        data += bytes((32 - len(data) % 32) % 32)
        tensors.append([gate[0].replace("ffn_gate_exps", "ffn_gate_up_exps"), [E, 2 * F, NE], dt, len(data)])
        data += fused
        tensors.remove(gate)
        tensors.remove(up)
    save(path, version, kvs, tensors, bytes(data))


def check_fused_gate_up(kv_bin, models, out):
    """A fused gate+up expert file computes exactly what the unfused one does: the same greedy
    ids and log-probabilities (F32: the plain kernels; Q8_0: the repacked ones)."""
    failures = 0
    for base in ("deepseek2-moe-f32", "qwen3moe-q8_0"):
        fused = os.path.join(out, base + "-fused-gate-up.gguf")
        fuse_gate_up(models, base, fused)
        runs = []
        for path in (os.path.join(models, base + ".gguf"), fused):
            r = subprocess.run([kv_bin, "run", "-m", path, "--prompt-ids", "1,2,3,4,5", "-n", "12", "--temp", "0",
                                "--ignore-eos", "--json", "--top-logprobs", "4", "-t", "2"],
                               capture_output=True, text=True)
            runs.append((r.returncode, [l for l in r.stdout.splitlines() if '"id"' in l], r.stderr))
        if runs[0][0] != 0 or runs[1][0] != 0 or len(runs[0][1]) != 12 or runs[0][1] != runs[1][1]:
            print(f"FAIL fused gate/up {base}: exits {runs[0][0]} / {runs[1][0]}, outputs equal "
                  f"{runs[0][1] == runs[1][1]}\n{runs[1][2]}")
            failures += 1
        else:
            print(f"ok   fused gate/up {base}: 12 ids and log-probabilities equal to the unfused file's")
    return failures


def main():
    kv_bin, models, out = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(out, exist_ok=True)
    failures = 0
    for name, base, edit, want in CASES:
        version, kvs, tensors, data = load(os.path.join(models, base + ".gguf"))
        edit(kvs, tensors)
        path = os.path.join(out, name + ".gguf")
        save(path, version, kvs, tensors, data)
        p = subprocess.run([kv_bin, "info", "-m", path], capture_output=True, text=True)
        if p.returncode != 1 or want not in p.stderr:
            print(f"FAIL {name}: exit {p.returncode}, stderr: {p.stderr.strip()!r}\n  want: {want!r}")
            failures += 1
        else:
            print(f"ok   {name}: {p.stderr.strip()}")
    for base, want in [("qwen3moe-q8_0", "experts       8, 2 used per token, softmax gating"),
                       ("deepseek2-moe-f32", "experts       8, 2 used per token, sigmoid gating in groups"),
                       ("llama-moe-f32", "weights read  3288064 bytes per token")]:
        p = subprocess.run([kv_bin, "info", "-m", os.path.join(models, base + ".gguf")], capture_output=True,
                           text=True)
        if p.returncode != 0 or want not in p.stdout:
            print(f"FAIL info {base}: exit {p.returncode}, want {want!r} in:\n{p.stdout}{p.stderr}")
            failures += 1
        else:
            print(f"ok   info {base}")
    q2 = os.path.join(out, "qwen2moe.gguf")
    qwen2moe_from_qwen3moe(models, q2)
    p = subprocess.run([kv_bin, "info", "-m", q2], capture_output=True, text=True)
    r = subprocess.run([kv_bin, "run", "-m", q2, "--prompt-ids", "1,2,3", "-n", "8", "--temp", "0", "--ignore-eos",
                        "--json"], capture_output=True, text=True)
    n_ids = r.stdout.count('"id"')
    if p.returncode != 0 or "shared ff 256" not in p.stdout or r.returncode != 0 or n_ids != 8:
        print(f"FAIL qwen2moe: info exit {p.returncode}, run exit {r.returncode}, {n_ids} ids\n{p.stderr}{r.stderr}")
        failures += 1
    else:
        print("ok   qwen2moe (from qwen3moe): loads, shared expert reported, 8 ids generated")
    failures += check_fused_gate_up(kv_bin, models, out)
    print("PASS" if not failures else f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
