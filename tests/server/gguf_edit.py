#!/usr/bin/env python3
"""Copies a GGUF file with metadata keys added (or replaced) and F32 tensors
added, for tests that need a golden model with something it lacks:
    gguf_edit.py IN OUT tokenizer.ggml.fim_pre_token_id=4000 ...
    gguf_edit.py IN OUT qwen3.pooling_type=4 'qwen3.classifier.output_labels=strs:["yes","no"]'
        tokenizer.chat_template.rerank=str:TEXT cls.output.weight=rows:token_embd.weight:9693,2152
A value is an unsigned 32-bit integer, `bool:true` / `bool:false`, `str:` text, `strs:` a JSON array of
strings, or `rows:SRC:I,J,...` (a new F32 tensor of SRC's rows I, J, ...; SRC
an F32 matrix). Pure Python; the tensors are copied as they are (their offsets
are relative to the data section, which is re-aligned after the longer
header; new tensors go after the old ones)."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from chat_template_gguf import skip_value  # noqa: E402  (tests/: one GGUF value walker)

T_U32, T_BOOL, T_STRING, T_ARRAY, GGML_F32 = 4, 7, 8, 9, 0


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def encode_value(v):
    if v.startswith("str:"):
        return struct.pack("<I", T_STRING) + gguf_str(v[4:])
    if v in ("bool:true", "bool:false"):
        return struct.pack("<IB", T_BOOL, v == "bool:true")
    if v.startswith("strs:"):
        items = json.loads(v[5:])
        assert isinstance(items, list) and all(isinstance(s, str) for s in items), v
        return struct.pack("<IIQ", T_ARRAY, T_STRING, len(items)) + b"".join(map(gguf_str, items))
    return struct.pack("<II", T_U32, int(v))


def main():
    src, dst, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
    data = open(src, "rb").read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
    assert magic == b"GGUF" and version == 3, "a GGUF v3 file"
    pos = 24
    add, new_tensors = {}, []
    for p in pairs:
        k, v = p.split("=", 1)
        if v.startswith("rows:"):
            tsrc, rows = v[5:].rsplit(":", 1)
            new_tensors.append((k, tsrc, [int(r) for r in rows.split(",")]))
        else:
            add[k] = encode_value(v)

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
    infos_start, tensors = pos, {}
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", data, pos)
        name = data[pos + 8:pos + 8 + nlen].decode()
        pos += 8 + nlen
        (nd,) = struct.unpack_from("<I", data, pos)
        ne = struct.unpack_from("<%dQ" % nd, data, pos + 4)
        ttype, off = struct.unpack_from("<IQ", data, pos + 4 + 8 * nd)
        tensors[name] = (ne, ttype, off)
        pos += 4 + 8 * nd + 4 + 8
    infos = data[infos_start:pos]
    data_start = (pos + alignment - 1) // alignment * alignment
    body = bytearray(data[data_start:])
    for name, tsrc, rows in new_tensors:
        ne, ttype, off = tensors[tsrc]
        assert ttype == GGML_F32 and len(ne) == 2, "rows: needs an F32 matrix"
        width = ne[0] * 4
        body += b"\0" * ((-len(body)) % alignment)
        at = len(body)
        for r in rows:
            assert 0 <= r < ne[1], "row %d of %s" % (r, tsrc)
            body += data[data_start + off + r * width:data_start + off + (r + 1) * width]
        infos += gguf_str(name) + struct.pack("<I2QIQ", 2, ne[0], len(rows), GGML_F32, at)
    for k, v in add.items():
        kept.append(gguf_str(k) + v)
    n_out = n_tensors + len(new_tensors)
    head = struct.pack("<4sIQQ", b"GGUF", 3, n_out, len(kept)) + b"".join(kept) + infos
    head += b"\0" * ((-len(head)) % alignment)
    with open(dst, "wb") as f:
        f.write(head)
        f.write(body)


if __name__ == "__main__":
    main()
