#!/usr/bin/env python3
"""Copies a GGUF file adding (or replacing) one uint32 metadata key.

Usage: gguf_add_key.py IN.gguf OUT.gguf KEY VALUE

Used to turn a golden llama model into a Mistral-style sliding-window one
(llama.attention.sliding_window) without a second copy in the repository.
Tensor offsets are relative to the aligned data section, so they stay valid."""
import struct
import sys

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def read_str(b, o):
    n = struct.unpack_from("<Q", b, o)[0]
    return b[o + 8:o + 8 + n], o + 8 + n


def skip_value(b, o, t):
    if t in SIZES:
        return o + SIZES[t]
    if t == 8:
        return read_str(b, o)[1]
    if t == 9:
        et, n = struct.unpack_from("<IQ", b, o)
        o += 12
        for _ in range(n):
            o = skip_value(b, o, et)
        return o
    raise SystemExit(f"unknown value type {t}")


def main():
    src, dst, key, value = sys.argv[1], sys.argv[2], sys.argv[3].encode(), int(sys.argv[4])
    b = open(src, "rb").read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", b, 0)
    assert magic == b"GGUF" and version in (2, 3)
    o, kvs, align = 24, [], 32
    for _ in range(n_kv):
        k, o2 = read_str(b, o)
        t = struct.unpack_from("<I", b, o2)[0]
        end = skip_value(b, o2 + 4, t)
        if k == b"general.alignment":
            align = struct.unpack_from("<I", b, o2 + 4)[0]
        if k != key:
            kvs.append(b[o:end])
        o = end
    info_start = o
    for _ in range(n_tensors):
        _, o = read_str(b, o)
        nd = struct.unpack_from("<I", b, o)[0]
        o += 4 + 8 * nd + 4 + 8
    infos = b[info_start:o]
    data_start = (o + align - 1) // align * align
    kvs.append(struct.pack("<Q", len(key)) + key + struct.pack("<II", 4, value))
    head = struct.pack("<4sIQQ", b"GGUF", version, n_tensors, len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * ((-len(head)) % align)
    open(dst, "wb").write(head + b[data_start:])


if __name__ == "__main__":
    main()
