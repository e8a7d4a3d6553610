#!/usr/bin/env python3
"""`kvllm chat-template -m FILE.gguf`: the template comes from the file's
tokenizer.chat_template and bos_token / eos_token from its vocabulary.

Writes a copy of a vocabulary-only GGUF (no tensors) with a
tokenizer.chat_template key added, renders it with -m, and checks the result
against --file with the same template and the vocabulary's BOS/EOS texts; a
file without the key must be refused with a message naming it.

usage: chat_template_gguf.py KVLLM VOCAB.gguf BOS EOS TMPDIR
"""
import json
import os
import struct
import subprocess
import sys

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>\n"
            "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token }}")

# GGUF value types and the byte sizes of the scalar ones
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9


def skip_value(b, off, t):
    if t in SCALAR:
        return off + SCALAR[t]
    if t == STRING:
        (n,) = struct.unpack_from("<Q", b, off)
        return off + 8 + n
    if t == ARRAY:
        et, n = struct.unpack_from("<IQ", b, off)
        off += 12
        if et in SCALAR:
            return off + SCALAR[et] * n
        for _ in range(n):
            off = skip_value(b, off, et)
        return off
    raise ValueError("unknown GGUF value type %d" % t)


def with_template(src, dst, template):
    b = open(src, "rb").read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", b, 0)
    assert magic == b"GGUF" and n_tensors == 0, "expected a vocabulary-only GGUF"
    off = 24
    for _ in range(n_kv):
        (klen,) = struct.unpack_from("<Q", b, off)
        off += 8 + klen
        (t,) = struct.unpack_from("<I", b, off)
        off = skip_value(b, off + 4, t)
    key, val = b"tokenizer.chat_template", template.encode("utf-8")
    kv = struct.pack("<Q", len(key)) + key + struct.pack("<IQ", STRING, len(val)) + val
    out = bytearray(b[:off] + kv)
    struct.pack_into("<Q", out, 16, n_kv + 1)
    out += b"\0" * ((-len(out)) % 32)
    open(dst, "wb").write(out)


def main():
    kvllm, vocab, bos, eos, tmp = sys.argv[1:6]
    os.makedirs(tmp, exist_ok=True)
    gguf = os.path.join(tmp, "with_template.gguf")
    with_template(vocab, gguf, TEMPLATE)
    msgs = os.path.join(tmp, "messages.json")
    json.dump([{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi \u2603"}],
              open(msgs, "w", encoding="utf-8"))
    tfile = os.path.join(tmp, "t.jinja")
    open(tfile, "w", encoding="utf-8").write(TEMPLATE)
    failures = 0
    want = "%s<system>Be brief.</system>\n<user>Hi \u2603</user>\n<assistant>%s" % (bos, eos)
    for args in (["-m", gguf], ["--file", tfile, "--bos", bos, "--eos", eos]):
        p = subprocess.run([kvllm, "chat-template", *args, "--messages", msgs], capture_output=True)
        got = p.stdout.decode("utf-8", "replace")
        if p.returncode != 0 or got != want:
            print("FAIL %s: exit %d\n  want %r\n  got  %r\n  %s" % (" ".join(args), p.returncode, want, got,
                                                                 p.stderr.decode()))
            failures += 1
    p = subprocess.run([kvllm, "chat-template", "-m", vocab, "--messages", msgs], capture_output=True)
    if p.returncode == 0 or "no tokenizer.chat_template" not in p.stderr.decode():
        print("FAIL: a file without a template must be refused: exit %d %r" % (p.returncode, p.stderr.decode()))
        failures += 1
    print("chat_template_gguf: %d failures" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
