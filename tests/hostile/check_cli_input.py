#!/usr/bin/env python3
"""Hostile input through the CLI: prompts that are not UTF-8, and a GGUF that
claims a huge context_length.

1. `run`, `score`, `perplexity` and `tokenize` take any bytes as a prompt (16
   bytes of 0xFF, GBK-encoded Chinese) on byte-level BPE models: exit 0, no
   abort. Byte-level BPE yielded more ids than bytes + 8 here, which once freed
   the id buffer twice. The ids must equal those of the same text with each
   invalid byte replaced by U+FFFD, llama.cpp's rule (unicode_cpts_from_utf8:
   a lead byte whose continuation bytes are all there is one code point, any
   other byte is U+FFFD on its own), written out below as `replace_invalid`.
2. A copy of a golden model with context_length 2^32 - 1 (tests/kv_variants/
   gguf_add_key.py): `kvllm run` without -c sizes its scratch from the default
   context, so its peak RSS stays within 64 MiB of the unmodified model's.

Usage: check_cli_input.py KVLLM SOURCE_DIR WORK_DIR"""
import json
import os
import subprocess
import sys
import tempfile

KVLLM, SRC = sys.argv[1], sys.argv[2]
WORK = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp()
os.makedirs(WORK, exist_ok=True)
MODELS = os.path.join(SRC, "tests/data/golden/models")
BPE = [os.path.join(MODELS, m) for m in ("llama-gqa-bpe-q4_0.gguf", "qwen3-f32.gguf")]
failures = []


def run(args, timeout=120):
    """Runs kvllm; returns (rc, stdout bytes, the last line of stderr, None)."""
    try:
        p = subprocess.run([KVLLM] + args, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -9, b"", "(timed out)", None
    lines = p.stderr.decode(errors="replace").strip().splitlines()
    return p.returncode, p.stdout, lines[-1] if p.returncode and lines else "", None


def peak_rss_kib(args, timeout=120):
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.execv(KVLLM, [KVLLM] + args)
    _, status, ru = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), ru.ru_maxrss


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)


def replace_invalid(raw):
    out, i, n = bytearray(), 0, len(raw)
    cont = lambda k: k < n and (raw[k] & 0xC0) == 0x80
    while i < n:
        b = raw[i]
        need = 1 if b < 0x80 else 2 if (b & 0xE0) == 0xC0 else 3 if (b & 0xF0) == 0xE0 else 4 if (b & 0xF8) == 0xF0 else 0
        if need and all(cont(i + k) for k in range(1, need)):
            out += raw[i:i + need]
            i += need
        else:
            out += "\ufffd".encode()
            i += 1
    return bytes(out)


def tokenize(model, path):
    rc, out, err, _ = run(["tokenize", "-m", model, "-f", path, "--json"])
    check(rc == 0, f"tokenize {os.path.basename(path)} on {os.path.basename(model)} exits 0 ({err.strip()[-200:]})")
    return json.loads(out)["ids"] if rc == 0 else None


ff16 = os.path.join(WORK, "ff16.txt")
open(ff16, "wb").write(b"\xff" * 16)
gbk = os.path.join(WORK, "gbk.txt")
gbk_text = ("从前有一只小猫，它住在一个安静的村子里。每天早上它都去河边看太阳升起。" * 2).encode("gbk")
open(gbk, "wb").write(gbk_text)

for model in BPE:
    name = os.path.basename(model)
    for path, raw in ((ff16, b"\xff" * 16), (gbk, gbk_text)):
        base = os.path.basename(path)
        ids = tokenize(model, path)
        fixed = os.path.join(WORK, "replaced-" + base)
        open(fixed, "wb").write(replace_invalid(raw))
        ref = tokenize(model, fixed)
        if ids is not None and ref is not None:
            check(ids == ref, f"{name} {base}: ids equal those of the text with U+FFFD per invalid byte")
            check(len(ids) > len(raw) + 8, f"{name} {base}: more ids ({len(ids)}) than bytes + 8 ({len(raw) + 8})")
        rc, out, err, _ = run(["run", "-m", model, "-f", path, "-n", "2", "--temp", "0"])
        check(rc == 0, f"run {base} on {name} exits 0 (rc {rc}) {err.strip()[-200:]}")
        rc, out, err, _ = run(["score", "-m", model, "-f", path])
        check(rc == 0, f"score {base} on {name} exits 0 (rc {rc}) {err.strip()[-200:]}")
    rc, out, err, _ = run(["perplexity", "-m", model, "-f", gbk, "-c", "32"])
    check(rc == 0, f"perplexity gbk.txt on {name} exits 0 (rc {rc}) {err.strip()[-200:]}")

# The hostile context_length: same model, one key changed.
src = os.path.join(MODELS, "llama-gqa-bpe-q4_0.gguf")
hostile = os.path.join(WORK, "ctx-4294967295.gguf")
subprocess.run([sys.executable, os.path.join(SRC, "tests/kv_variants/gguf_add_key.py"), src, hostile,
                "llama.context_length", str(2**32 - 1)], check=True)
args = ["run", "-p", "Once upon a time", "-n", "4", "--temp", "0"]
rc0, base_kib = peak_rss_kib(["run", "-m", src] + args[1:])
rc1, hostile_kib = peak_rss_kib(["run", "-m", hostile] + args[1:])
check(rc0 == 0 and rc1 == 0, f"run on the original and the context_length 2^32-1 copy exit 0 ({rc0}, {rc1})")
check(hostile_kib < base_kib + 64 * 1024,
      f"peak RSS with context_length 2^32-1: {hostile_kib} KiB, original {base_kib} KiB (bound: +64 MiB)")
rc2, c_kib = peak_rss_kib(["run", "-m", hostile, "-c", "256"] + args[1:])
check(rc2 == 0 and c_kib < base_kib + 64 * 1024, f"with -c 256: rc {rc2}, peak RSS {c_kib} KiB")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all passed")
