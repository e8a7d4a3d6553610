#!/usr/bin/env python3
"""Splits a GGUF file the way llama.cpp's gguf-split --split-max-tensors N
lays a split model out: files PREFIX-00001-of-0000K.gguf ... each holding up
to N tensors; the first carries every metadata key, and every file the keys
split.no (u16), split.tensors.count (i32) and split.count (u16). Tensor data
is copied as it is, re-aligned in each file. Pure Python (no llama.cpp).

    gguf_split.py IN.gguf PREFIX N [--break KIND]

--break makes a damaged set for refusal tests: 'dup' puts the first tensor in
the last file too, 'count' writes a wrong split.tensors.count.
"""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_template_gguf import skip_value  # noqa: E402  (one GGUF value walker)

T_U16, T_I32 = 2, 5


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def read(path):
    data = open(path, "rb").read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
    assert magic == b"GGUF" and version == 3, "a GGUF v3 file"
    pos, kvs, alignment = 24, [], 32
    for _ in range(n_kv):
        start = pos
        (klen,) = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8:pos + 8 + klen].decode()
        (t,) = struct.unpack_from("<I", data, pos + 8 + klen)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", data, pos + 12 + klen)
        pos = skip_value(data, pos + 12 + klen, t)
        kvs.append(data[start:pos])
    infos = []
    for _ in range(n_tensors):
        start = pos
        (nlen,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + nlen
        (nd,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * nd + 4
        (off,) = struct.unpack_from("<Q", data, pos)
        infos.append((data[start:pos], off))
        pos += 8
    data_start = (pos + alignment - 1) // alignment * alignment
    offs = sorted(o for _, o in infos) + [len(data) - data_start]
    size = {o: offs[i + 1] - o for i, o in enumerate(offs[:-1])}  # up to the next tensor (padding included)
    return data, kvs, infos, data_start, alignment, size


def main():
    src, prefix, per = sys.argv[1], sys.argv[2], int(sys.argv[3])
    brk = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--break" else None
    data, kvs, infos, data_start, alignment, size = read(src)
    groups = [infos[i:i + per] for i in range(0, len(infos), per)]
    if brk == "dup":
        groups[-1] = groups[-1] + groups[0][:1]
    n, total = len(groups), len(infos) + (7 if brk == "count" else 0)
    for i, group in enumerate(groups):
        keys = (kvs if i == 0 else []) + [
            gguf_str("split.no") + struct.pack("<IH", T_U16, i),
            gguf_str("split.tensors.count") + struct.pack("<Ii", T_I32, total),
            gguf_str("split.count") + struct.pack("<IH", T_U16, n),
        ]
        head, body = b"", b""
        for desc, off in group:
            body += b"\0" * ((-len(body)) % alignment)
            head += desc + struct.pack("<Q", len(body))
            body += data[data_start + off:data_start + off + size[off]]
        out = struct.pack("<4sIQQ", b"GGUF", 3, len(group), len(keys)) + b"".join(keys) + head
        out += b"\0" * ((-len(out)) % alignment)
        with open("%s-%05d-of-%05d.gguf" % (prefix, i + 1, n), "wb") as f:
            f.write(out + body)


if __name__ == "__main__":
    main()
