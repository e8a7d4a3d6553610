#!/usr/bin/env python3
"""Writes a small valid GGUF and hand-made corruptions of it into a directory.

usage: make_bad_gguf.py OUT_DIR

Files:
  good_*.gguf  valid files every reader must accept
  bad_*.gguf   corrupt files every reader must reject with a message
  expected.tsv one line per file: NAME<TAB>OK, or NAME<TAB>text the error message must contain

Only the standard library is used. Each corruption is built by encoding the
base file with one field replaced, so the damage is exactly where the name says.
"""
import os
import struct
import sys

ALIGN = 32
F32, Q8_0, TQ1_0 = 0, 8, 34  # TQ1_0: a ggml type kvllm knows by name only
T_U32, T_F32, T_BOOL, T_STR, T_ARR = 4, 6, 7, 8, 9


def u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)


def u64(v):
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b)) + b


def pad(n):
    return (ALIGN - n % ALIGN) % ALIGN


# ---- base file description: metadata as (key, type, payload bytes) so that a
# corruption can put any type code or raw payload there.

def base_kvs():
    tokens = [b"a", b"b", b"c"]
    return [
        ("general.architecture", T_STR, gstr("llama")),
        ("general.alignment", T_U32, u32(ALIGN)),
        ("llama.block_count", T_U32, u32(1)),
        ("test.flag", T_BOOL, b"\x01"),
        ("tokenizer.ggml.tokens", T_ARR, u32(T_STR) + u64(len(tokens)) + b"".join(gstr(t) for t in tokens)),
        ("tokenizer.ggml.scores", T_ARR, u32(T_F32) + u64(3) + struct.pack("<3f", 0.0, -1.0, -2.0)),
    ]


def base_tensors():
    """(name, dims, dtype, offset, data); offsets follow llama.cpp's padded layout."""
    w = struct.pack("<12f", *range(12))                          # F32 [4, 3]: 48 bytes
    q = (b"\x00\x3c" + bytes(range(32))) * 2                     # Q8_0 [32, 2]: 2 blocks x 34 bytes
    return [
        ["tok.weight", [4, 3], F32, 0, w],
        ["blk.0.w", [32, 2], Q8_0, 64, q],
    ]


def encode(kvs=None, tensors=None, magic=b"GGUF", version=3, n_kv=None, n_tensors=None,
           raw_dims=None, data=True):
    """raw_dims: {tensor index: n_dims value written instead of len(dims)}."""
    kvs = base_kvs() if kvs is None else kvs
    tensors = base_tensors() if tensors is None else tensors
    raw_dims = raw_dims or {}
    out = bytearray(magic + u32(version))
    out += u64(len(tensors) if n_tensors is None else n_tensors)
    out += u64(len(kvs) if n_kv is None else n_kv)
    for key, typ, payload in kvs:
        out += gstr(key) + u32(typ) + payload
    for i, (name, dims, dtype, off, _) in enumerate(tensors):
        out += gstr(name) + u32(raw_dims.get(i, len(dims)))
        for ne in dims:
            out += u64(ne)
        out += u32(dtype) + u64(off)
    if data and tensors:
        out += bytes(pad(len(out)))
        for *_, blob in tensors:
            out += blob + bytes(pad(len(blob)))
    return bytes(out)


def with_kv(key, typ, payload, replace=None):
    """Base metadata with one entry added (or the entry named `replace` swapped)."""
    kvs = base_kvs()
    if replace is None:
        kvs.append((key, typ, payload))
    else:
        kvs = [(key, typ, payload) if k == replace else (k, t, p) for k, t, p in kvs]
    return encode(kvs=kvs)


def with_tensor(i, **fields):
    ts = base_tensors()
    for f, v in fields.items():
        ts[i][["name", "dims", "dtype", "offset", "data"].index(f)] = v
    return encode(tensors=ts)


def cases():
    good = encode()
    meta_end = len(encode(tensors=[]))           # header + metadata, no descriptors
    desc_end = len(encode(data=False))          # header + metadata + descriptors
    kv0 = 24 + len(gstr("general.architecture")) + 4  # offset of the first value payload
    yield "good_small.gguf", good, "OK"
    yield "good_vocab_only.gguf", encode(tensors=[]), "OK"
    yield "good_v2.gguf", encode(version=2), "OK"
    yield "bad_empty.gguf", b"", "too small"
    yield "bad_trunc_header.gguf", good[:12], "truncated"
    yield "bad_trunc_metadata.gguf", good[:kv0 + 4], "truncated"
    yield "bad_trunc_metadata_key.gguf", good[:meta_end - 30], "truncated"
    yield "bad_trunc_tensor_info.gguf", good[:desc_end - 5], "truncated"
    yield "bad_trunc_tensor_data.gguf", good[:len(good) - 40], "past the end"
    yield "bad_trunc_before_data.gguf", good[:desc_end], "past the end"
    yield "bad_magic.gguf", encode(magic=b"GGML"), "not a GGUF file"
    yield "bad_version_1.gguf", encode(version=1), "version 1"
    yield "bad_version_99.gguf", encode(version=99), "version 99"
    yield "bad_big_endian.gguf", encode(version=0x03000000), "big-endian"
    yield "bad_absurd_n_kv.gguf", encode(n_kv=1 << 60), "absurd metadata count"
    yield "bad_absurd_n_tensors.gguf", encode(n_tensors=1 << 60), "absurd tensor count"
    yield "bad_n_kv_too_big.gguf", encode(tensors=[], n_kv=7), "truncated"
    yield "bad_absurd_key_length.gguf", encode(kvs=[("x", T_U32, u32(1))])[:24] + u64(1 << 60) + bytes(100), \
        "length 1152921504606846976"
    yield "bad_absurd_string_length.gguf", with_kv("general.name", T_STR, u64(1 << 60) + b"abc"), \
        "exceeds"
    yield "bad_absurd_array_count.gguf", with_kv("test.arr", T_ARR, u32(T_U32) + u64(1 << 60) + u32(1)), \
        "absurd array count"
    yield "bad_absurd_str_array_count.gguf", with_kv("test.arr", T_ARR, u32(T_STR) + u64(1 << 61) + gstr("x")), \
        "absurd array count"
    yield "bad_unknown_value_type.gguf", with_kv("test.weird", 13, u32(0)), "unknown value type 13"
    yield "bad_unknown_array_type.gguf", with_kv("test.weird", T_ARR, u32(77) + u64(1) + u32(0)), \
        "unknown array element type 77"
    yield "bad_nested_array.gguf", with_kv("test.nested", T_ARR, u32(T_ARR) + u64(1) + u32(T_U32) + u64(0)), \
        "nested arrays"
    yield "bad_invalid_bool.gguf", with_kv("test.flag", T_BOOL, b"\x02", replace="test.flag"), \
        "invalid bool value 2"
    yield "bad_duplicate_key.gguf", with_kv("llama.block_count", T_U32, u32(2)), "duplicate key"
    yield "bad_empty_key.gguf", with_kv("", T_U32, u32(2)), "empty key"
    yield "bad_key_with_nul.gguf", with_kv("test.a\0b", T_U32, u32(2)), "NUL byte"
    yield "bad_alignment_0.gguf", with_kv("general.alignment", T_U32, u32(0), replace="general.alignment"), \
        "not a nonzero power of two"
    yield "bad_alignment_3.gguf", with_kv("general.alignment", T_U32, u32(3), replace="general.alignment"), \
        "not a nonzero power of two"
    yield "bad_alignment_string.gguf", with_kv("general.alignment", T_STR, gstr("32"), replace="general.alignment"), \
        "general.alignment"
    yield "bad_duplicate_tensor.gguf", with_tensor(1, name="tok.weight"), "duplicate tensor name"
    yield "bad_empty_tensor_name.gguf", with_tensor(1, name=""), "empty tensor name"
    yield "bad_n_dims_0.gguf", with_tensor(1, dims=[]), "invalid number of dimensions 0"
    yield "bad_n_dims_5.gguf", with_tensor(1, dims=[32, 2, 1, 1, 1]), "invalid number of dimensions 5"
    yield "bad_n_dims_huge.gguf", encode(raw_dims={0: 0xFFFFFFFF}), "invalid number of dimensions"
    yield "bad_ne_negative.gguf", with_tensor(0, dims=[4, -3]), "invalid size"
    yield "bad_ne_overflow.gguf", with_tensor(0, dims=[1 << 32, 1 << 32, 1 << 32]), "overflows"
    yield "bad_bytes_overflow.gguf", with_tensor(0, dims=[1 << 31, 1 << 31]), "overflows"
    yield "bad_row_not_block_multiple.gguf", with_tensor(1, dims=[33, 2]), "not a multiple of the Q8_0 block"
    yield "bad_unknown_tensor_type.gguf", with_tensor(0, dtype=99), "unknown tensor type 99"
    yield "bad_unsupported_tensor_type.gguf", with_tensor(0, dtype=TQ1_0), "unsupported tensor type 34 (TQ1_0)"
    yield "bad_misaligned_offset.gguf", with_tensor(1, offset=52), "not a multiple of the alignment"
    yield "bad_offset_past_end.gguf", with_tensor(1, offset=1 << 20), "past the end"
    yield "bad_offset_overflow.gguf", with_tensor(1, offset=(1 << 64) - 32), "past the end"


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    out = argv[1]
    os.makedirs(out, exist_ok=True)
    lines = []
    for name, blob, want in cases():
        with open(os.path.join(out, name), "wb") as fh:
            fh.write(blob)
        lines.append(f"{name}\t{want}\n")
    with open(os.path.join(out, "expected.tsv"), "w") as fh:
        fh.writelines(lines)
    print(f"wrote {len(lines)} files to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
