#!/usr/bin/env python3
"""Copies a GGUF file with uint32 metadata keys added (or replaced), e.g. the
fill-in-the-middle token ids a test gives a golden model that has none:
    gguf_add_keys.py IN OUT tokenizer.ggml.fim_pre_token_id=4000 ...
Pure Python; the tensors are copied as they are (their offsets are relative
to the data section, which is re-aligned after the longer header)."""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from chat_template_gguf import skip_value  # noqa: E402  (tests/: one GGUF value walker)

T_U32 = 4


def main():
    src, dst, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
    data = open(src, "rb").read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
    assert magic == b"GGUF" and version == 3, "a GGUF v3 file"
    pos = 24
    add = {}
    for p in pairs:
        k, v = p.split("=", 1)
        add[k] = int(v)

    kept, alignment = [], 32
    for _ in range(n_kv):
        start = pos
        (klen,) = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8:pos + 8 + klen].decode()
        pos += 8 + klen
        (t,) = struct.unpack_from("<I", data, pos)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", data, pos + 4)
        pos = skip_value(data, pos + 4, t)
        if key not in add:
            kept.append(data[start:pos])
    infos_start = pos
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + nlen
        (nd,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * nd + 4 + 8
    infos = data[infos_start:pos]
    data_start = (pos + alignment - 1) // alignment * alignment
    for k, v in add.items():
        kb = k.encode()
        kept.append(struct.pack("<Q", len(kb)) + kb + struct.pack("<II", T_U32, v))
    head = struct.pack("<4sIQQ", b"GGUF", 3, n_tensors, len(kept)) + b"".join(kept) + infos
    head += b"\0" * ((-len(head)) % alignment)
    with open(dst, "wb") as f:
        f.write(head)
        f.write(data[data_start:])


if __name__ == "__main__":
    main()
