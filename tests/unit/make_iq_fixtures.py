#!/usr/bin/env python3
"""Writes tests/data/iq_dequant/<TYPE>.bin: blocks of a lattice ("i-quant")
type and their dequantized values as llama.cpp's Python package (gguf-py, an
implementation independent of kvllm's) computes them; test_kernels checks
kvllm's dequantization against them bit for bit.

Usage: make_iq_fixtures.py LLAMA_CPP_DIR OUT_DIR   (needs numpy)

The blocks are random, except that the codebook indices sweep every entry of
the type's codebook, so a wrong entry anywhere fails; d is kept finite.
File: the blocks, then their 256 floats each (little-endian float32)."""
import os
import random
import struct
import sys

sys.path.insert(0, os.path.join(sys.argv[1], "gguf-py"))
import numpy as np  # noqa: E402
from gguf.constants import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

rng = random.Random(20261206)


def f16_bits():
    """A finite fp16 in [1/64, 4) of either sign."""
    return (rng.getrandbits(1) << 15) | ((9 + rng.randrange(8)) << 10) | rng.getrandbits(10)


def rand(n):
    return bytearray(rng.getrandbits(8) for _ in range(n))


def iq2_xxs(b):  # 66 bytes: d, 32 x uint16
    blk = rand(66)
    struct.pack_into("<H", blk, 0, f16_bits())
    for g in range(8):
        for l in range(4):
            blk[2 + 8 * g + l] = (32 * b + 4 * g + l) % 256
    return blk


def iq2_xs(b):  # 74: d, 32 x uint16 (index | signs << 9), scales[8]
    blk = rand(74)
    struct.pack_into("<H", blk, 0, f16_bits())
    for r in range(32):
        q = struct.unpack_from("<H", blk, 2 + 2 * r)[0]
        struct.pack_into("<H", blk, 2 + 2 * r, (q & 0xFE00) | ((32 * b + r) % 512))
    return blk


def iq2_s(b):  # 82: d, qs[64] (32 index bytes, 32 sign bytes), qh[8], scales[8]
    blk = rand(82)
    struct.pack_into("<H", blk, 0, f16_bits())
    for g in range(8):
        h = 0
        for l in range(4):
            idx = (32 * b + 4 * g + l) % 1024
            blk[2 + 4 * g + l] = idx & 255
            h |= (idx >> 8) << (2 * l)
        blk[66 + g] = h
    return blk


def iq3_xxs(b):  # 98: d, qs[64] indices, 8 x uint32 signs + scale
    blk = rand(98)
    struct.pack_into("<H", blk, 0, f16_bits())
    for i in range(64):
        blk[2 + i] = (64 * b + i) % 256
    return blk


def iq3_s(b):  # 110: d, qs[64], qh[8], signs[32], scales[4]
    blk = rand(110)
    struct.pack_into("<H", blk, 0, f16_bits())
    for g in range(8):
        h = 0
        for k in range(8):
            idx = (64 * b + 8 * g + k) % 512
            blk[2 + 8 * g + k] = idx & 255
            h |= (idx >> 8) << k
        blk[66 + g] = h
    return blk


def iq1_s(b):  # 50: d, qs[32], qh[8] uint16
    blk = rand(50)
    struct.pack_into("<H", blk, 0, f16_bits())
    for g in range(8):
        h = struct.unpack_from("<H", blk, 34 + 2 * g)[0] & 0xF000
        for l in range(4):
            idx = (32 * b + 4 * g + l) % 2048
            blk[2 + 4 * g + l] = idx & 255
            h |= (idx >> 8) << (3 * l)
        struct.pack_into("<H", blk, 34 + 2 * g, h)
    return blk


def iq1_m(b):  # 56: qs[32], qh[16], scales[8] (d in the top nibbles)
    blk = rand(56)
    for g in range(8):
        for l in range(4):
            idx = (32 * b + 4 * g + l) % 2048
            blk[4 * g + l] = idx & 255
            q = 32 + 2 * g + l // 2
            sh = 4 * (l % 2)
            blk[q] = (blk[q] & ~(7 << sh) & 255) | ((idx >> 8) << sh)
    d = f16_bits()
    sc = list(struct.unpack_from("<4H", blk, 48))
    for k in range(4):
        sc[k] = (sc[k] & 0x0FFF) | (((d >> (4 * k)) & 15) << 12)
    struct.pack_into("<4H", blk, 48, *sc)
    return blk


TYPES = {  # name: (maker, ggml type, blocks: enough to sweep the codebook)
    "IQ2_XXS": (iq2_xxs, Q.IQ2_XXS, 8),
    "IQ2_XS": (iq2_xs, Q.IQ2_XS, 16),
    "IQ2_S": (iq2_s, Q.IQ2_S, 32),
    "IQ3_XXS": (iq3_xxs, Q.IQ3_XXS, 4),
    "IQ3_S": (iq3_s, Q.IQ3_S, 8),
    "IQ1_S": (iq1_s, Q.IQ1_S, 64),
    "IQ1_M": (iq1_m, Q.IQ1_M, 64),
}

os.makedirs(sys.argv[2], exist_ok=True)
for name, (make, qt, n) in TYPES.items():
    raw = b"".join(make(b) for b in range(n))
    vals = dequantize(np.frombuffer(raw, dtype=np.uint8).reshape(n, -1), qt)
    vals = np.asarray(vals, dtype=np.float32).reshape(-1)
    assert vals.size == 256 * n and np.all(np.isfinite(vals)), name
    with open(os.path.join(sys.argv[2], name + ".bin"), "wb") as f:
        f.write(raw)
        f.write(vals.astype("<f4").tobytes())
    print(name, n, "blocks")
