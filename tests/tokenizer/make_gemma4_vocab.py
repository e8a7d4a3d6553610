#!/usr/bin/env python3
"""Makes tests/data/tokenizer/ggml-vocab-gemma4.gguf: a small vocabulary with tokenizer.ggml.model
"gemma4", laid out as llama.cpp's converter writes Gemma 4 (conversion/gemma.py, Gemma4Model.set_vocab:
every score -1000, <0xNN> tokens BYTE, special tokens CONTROL, the tokens the chat parser must see
USER_DEFINED, add_space_prefix false, add_bos_token true), with merges learned by a plain BPE over
text in this repository. Gemma 4's own vocabulary is 262k tokens; what is tested is the algorithm.

Usage: make_gemma4_vocab.py OUT_DIR [LLAMA_TOKENIZE]
Writes OUT_DIR/ggml-vocab-gemma4.gguf and its .inp (llama.cpp's gemma-4 cases plus cases of our own);
with the path of llama.cpp's llama-tokenize also the .out (no BOS, special text not parsed) and
gemma4-special.inp/.out (BOS added, special text parsed), from llama.cpp's own ids.
Standard library only; deterministic.
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "golden"))
from make_golden import T_ARR, T_BOOL, T_F32, T_I32, T_STR, T_U32, write_gguf  # noqa: E402

SPACE = "\u2581"  # what Gemma's normalizer writes for " "
N_MERGES = 2600
SEP = "\n__ggml_vocab_test__\n"

NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6

# id 0..14 as (text, type). <|tool_response> is user-defined as the converter writes it
# (llama.cpp then makes it control, being end-of-generation); </s> is an ordinary token
# that llama.cpp must not take for end-of-generation in a gemma4 vocabulary.
SPECIALS = [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", CONTROL),
            ("<mask>", CONTROL), ("<|turn>", CONTROL), ("<turn|>", CONTROL),
            ("<|tool_call>", USER_DEFINED), ("<tool_call|>", USER_DEFINED),
            ("<|tool_response>", USER_DEFINED), ("<tool_response|>", USER_DEFINED),
            ('<|"|>', USER_DEFINED), ("<|channel>", USER_DEFINED), ("<channel|>", USER_DEFINED),
            ("</s>", NORMAL)]
# Runs of newlines that are tokens (5 and 7 are not: they go through the merges).
NEWLINES = ["\n" * k for k in (1, 2, 3, 4, 6, 8)]

# Our cases beyond llama.cpp's gemma-4 file.
EXTRA_CASES = [
    "a  b   c    d", "  leading", "trailing  ", " ", "      ", "\t", "\t\tx\ty", " \t \n ",
    "\n" * 5, "\n" * 7, "\n" * 12, "a\nb", "a\n\nb\n\n\nc", "x\n\n\n\n\n\ny",
    "\r\n", "a\r\nb\r\n\r\nc", "\n\r\n\n", "\r", "line one\r\nline two\n",
    "\u4f60\u597d\u4e16\u754c", "\uc548\ub155\ud558\uc138\uc694", "\U0001f999\U0001f680",
    "caf\u00e9 e\u0301", "non\u00a0breaking", "\u2581already\u2581escaped \u2581", "<0x41>",
    "<|turn>user\nhi<turn|>", '<|"|>quoted<|"|>', "<|channel>thought<channel|>",
    "<eos></s><bos>", "<|tool_call>call<tool_call|>", "<|tool_response>r<tool_response|>",
    "\x00\x01\x7f", "The quick brown fox jumps over the lazy dog.",
]
SPECIAL_CASES = [
    "<|turn>user\nHello<turn|>\n<|turn>model\n", "<bos>hi", "</s>", "a</s>b",
    "<|tool_response>x", '<|"|>', "<unk><pad><mask>", "<eos>", "text<turn|>", "<|channel>",
    " <|turn> spaced <turn|> ", "\n<|turn>\n\n", "plain text only", "",
]


def corpus():
    parts = []
    for rel in ("tests/data/tiny_story.txt", "README.md", "ARCHITECTURE.md",
                "tests/data/tokenizer/tests-without-gguf/ggml-vocab-gemma-4.gguf.inp"):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            parts.append(f.read().replace(SEP, "\n"))
    return "\n".join(parts)


def learn(text):
    """The alphabet (characters seen twice or more) and N_MERGES merges, learned on words that
    start at a space (as "\u2581word") or are runs of spaces, within lines."""
    text = text.replace(" ", SPACE)
    chars = collections.Counter(text)
    alphabet = sorted(c for c, n in chars.items() if n >= 2 and c not in "\n\r")
    words = collections.Counter()
    for line in text.split("\n"):
        words.update(re.findall(SPACE + "+|" + SPACE + "?[^" + SPACE + "]+", line))
    known = set(alphabet)
    segs = {w: [c for c in w] for w in words}
    merges = []
    while len(merges) < N_MERGES:
        pairs = collections.Counter()
        for w, n in words.items():
            s = segs[w]
            for a, b in zip(s, s[1:]):
                if a in known and b in known:
                    pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merges.append((a, b))
        known.add(a + b)
        for w in words:
            s, out, i = segs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            segs[w] = out
    return alphabet, merges


def build():
    alphabet, merges = learn(corpus())
    tokens = list(SPECIALS) + [(t, NORMAL) for t in NEWLINES]
    tokens += [("<0x%02X>" % b, BYTE) for b in range(256)]
    seen = {t for t, _ in tokens}
    for c in alphabet:
        if c not in seen:
            tokens.append((c, NORMAL))
            seen.add(c)
    # Newline runs also merge (as "\n\n" + "\n\n" would be), and so do spaces.
    merges = [("\n", "\n"), ("\n\n", "\n\n")] + merges
    for a, b in merges:
        if a + b not in seen:
            tokens.append((a + b, NORMAL))
            seen.add(a + b)
    texts = [t for t, _ in tokens]
    n = len(texts)
    kvs = [
        ("general.architecture", T_STR, "llama"),
        ("general.name", T_STR, "gemma4-vocab-test"),
        ("llama.block_count", T_U32, 1),
        ("llama.context_length", T_U32, 4096),
        ("llama.embedding_length", T_U32, 64),
        ("llama.feed_forward_length", T_U32, 128),
        ("llama.attention.head_count", T_U32, 2),
        ("llama.attention.head_count_kv", T_U32, 2),
        ("llama.attention.layer_norm_rms_epsilon", T_F32, 1e-6),
        ("llama.vocab_size", T_U32, n),
        ("tokenizer.ggml.model", T_STR, "gemma4"),
        ("tokenizer.ggml.tokens", T_ARR, (T_STR, texts)),
        ("tokenizer.ggml.scores", T_ARR, (T_F32, [-1000.0] * n)),
        ("tokenizer.ggml.token_type", T_ARR, (T_I32, [t for _, t in tokens])),
        ("tokenizer.ggml.merges", T_ARR, (T_STR, ["%s %s" % m for m in merges])),
        ("tokenizer.ggml.bos_token_id", T_U32, 2),
        ("tokenizer.ggml.eos_token_id", T_U32, 1),
        ("tokenizer.ggml.unknown_token_id", T_U32, 3),
        ("tokenizer.ggml.padding_token_id", T_U32, 0),
        ("tokenizer.ggml.mask_token_id", T_U32, 4),
        ("tokenizer.ggml.add_space_prefix", T_BOOL, False),
        ("tokenizer.ggml.add_bos_token", T_BOOL, True),
        ("tokenizer.ggml.add_eos_token", T_BOOL, False),
    ]
    return kvs, n, len(merges)


def llama_ids(tool, gguf, text, bos, special):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
    try:
        cmd = [tool, "-m", gguf, "-f", f.name, "--ids", "--no-escape", "--log-disable"]
        cmd += [] if bos else ["--no-bos"]
        cmd += [] if special else ["--no-parse-special"]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    line = out.strip().splitlines()[-1]
    assert line.startswith("[") and line.endswith("]"), out
    return [int(x) for x in line[1:-1].split(",") if x.strip()]


def write_cases(path, cases, tool, gguf, bos, special):
    with open(path + ".inp", "wb") as f:
        f.write(SEP.join(cases).encode("utf-8") + SEP.encode())
    if tool:
        with open(path + ".out", "w") as f:
            for c in cases:
                f.write(" ".join(str(i) for i in llama_ids(tool, gguf, c, bos, special)) + "\n")


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    out_dir, tool = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
    kvs, n, n_merges = build()
    gguf = os.path.join(out_dir, "ggml-vocab-gemma4.gguf")
    write_gguf(gguf, kvs, [])
    inp = os.path.join(ROOT, "tests/data/tokenizer/tests-without-gguf/ggml-vocab-gemma-4.gguf.inp")
    with open(inp, encoding="utf-8") as f:
        upstream = f.read()
    cases = [c for c in upstream.split(SEP)]
    if cases and cases[-1] == "":
        cases.pop()
    write_cases(gguf, cases + EXTRA_CASES, tool, gguf, False, False)
    write_cases(os.path.join(out_dir, "gemma4-special"), SPECIAL_CASES, tool, gguf, True, True)
    print("%s: %d tokens, %d merges, %d + %d cases" % (gguf, n, n_merges, len(cases) + len(EXTRA_CASES),
                                                      len(SPECIAL_CASES)))


if __name__ == "__main__":
    main()
