#!/usr/bin/env python3
"""kvllm bench, llama-bench's way, against llama-bench's own output
(tests/data/llama_bench, made by llama.cpp's llama-bench): the same fields in
the same order with the same JSON types, the same markdown columns, the same
tests in the same order, value lists and ranges as llama-bench takes them,
the depth reused through the prefix cache, and clear refusals. Never asserts
a time: only that each figure is consistent with its own samples.
Usage: check_bench_llama.py KVLLM REPO_ROOT OUT_DIR"""
import csv
import io
import json
import os
import sqlite3
import subprocess
import sys

kv, root, out = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
ref = os.path.join(root, "tests", "data", "llama_bench")
model = os.path.join(root, "models", "stories260K.gguf")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def bench(args, want_rc=0, models=None):
    m = ["-m", model] if models is None else models
    p = subprocess.run([kv, "bench"] + m + args, capture_output=True, text=True, timeout=240)
    if p.returncode != want_rc:
        failures.append(f"bench {' '.join(args)}: exit {p.returncode}, wanted {want_rc}\n{p.stderr[-1500:]}")
    return p


def ref_text(name):
    with open(os.path.join(ref, name), encoding="utf-8") as f:
        return f.read()


MATRIX = ["-p", "16", "-n", "8", "-pg", "16,8", "-d", "0,32", "-r", "2", "-t", "2"]


def md_cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


# --- JSON: the fields, their order and types, the tests in order --------------
want = json.loads(ref_text("llama_bench.json"))
p = bench(MATRIX + ["-o", "json"])
got = json.loads(p.stdout) if p.returncode == 0 else []
check([list(r.keys()) for r in got] == [list(r.keys()) for r in want],
      "json: llama-bench's fields in its order, for each of its tests")
types = lambda r: [type(v).__name__.replace("int", "float") for v in r.values()]
check(all(types(g) == types(w) for g, w in zip(got, want)), "json: every value of llama-bench's JSON type")
key = lambda r: (r["n_prompt"], r["n_gen"], r["n_depth"], r["n_threads"])
check([key(r) for r in got] == [key(r) for r in want], "json: the tests of -p -n -pg -d in llama-bench's order")
for r in got:
    n = r["n_prompt"] + r["n_gen"]
    ok = len(r["samples_ns"]) == 2 and len(r["samples_ts"]) == 2 and all(
        abs(ts - 1e9 * n / ns) <= 1e-6 * ts for ns, ts in zip(r["samples_ns"], r["samples_ts"]))
    ok = ok and abs(r["avg_ts"] - sum(r["samples_ts"]) / 2) <= 1e-3 * r["avg_ts"]
    ok = ok and abs(r["avg_ns"] - sum(r["samples_ns"]) / 2) <= 1
    check(ok, f"json {key(r)}: 2 samples, t/s = tokens / time, the averages theirs")
if got:
    g = got[0]
    check(g["model_size"] == want[0]["model_size"] and g["model_n_params"] == want[0]["model_n_params"],
          "json: model_size and model_n_params as llama.cpp counts them")
    check(g["backends"] == "CPU" and g["n_gpu_layers"] == 0 and g["type_k"] == "f16" and g["n_batch"] == 2048
          and g["n_ubatch"] == 512 and g["model_filename"] == model, "json: what the fields say here")
    check(g["model_type"] == want[0]["model_type"],
          f"json: model_type as llama.cpp describes a file without general.file_type ({g['model_type']})")
check("prefix cache gave" not in p.stderr and "whole number" not in p.stderr,
      "depth 32: reused whole from the prefix cache")

# --- jsonl, csv, sql: the same fields ----------------------------------------
want_jsonl = [json.loads(l) for l in ref_text("llama_bench.jsonl").splitlines() if l.strip()]
p = bench(MATRIX + ["-o", "jsonl"])
got = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
check(len(got) == 6 and [list(r) for r in got] == [list(r) for r in want_jsonl], "jsonl: one record per test, llama-bench's fields")

want_csv = list(csv.reader(io.StringIO(ref_text("llama_bench.csv"))))
p = bench(MATRIX + ["-o", "csv"])
got = list(csv.reader(io.StringIO(p.stdout)))
check(got[:1] == want_csv[:1], "csv: llama-bench's header")
check(len(got) == len(want_csv) and all(len(r) == len(want_csv[0]) for r in got), "csv: a row of every field per test")
col = {n: i for i, n in enumerate(want_csv[0])}
check([(r[col["n_prompt"]], r[col["n_gen"]], r[col["n_depth"]]) for r in got[1:]] ==
      [(r[col["n_prompt"]], r[col["n_gen"]], r[col["n_depth"]]) for r in want_csv[1:]], "csv: the tests in order")

want_sql = ref_text("llama_bench.sql")
p = bench(MATRIX + ["-o", "sql"])
create = lambda s: s[:s.index(");") + 2]
check(create(p.stdout) == create(want_sql), "sql: llama-bench's CREATE TABLE")
check(p.stdout.count("INSERT INTO llama_bench (") == 6, "sql: an INSERT per test")
db = sqlite3.connect(":memory:")  # as llama.cpp's compare-llama-bench.py reads it
try:
    db.executescript(p.stdout)
    got = db.execute("SELECT n_prompt, n_gen, n_depth, typeof(avg_ts), avg_ts > 0, typeof(n_threads) "
                     "FROM llama_bench").fetchall()
except sqlite3.Error as e:
    got = [str(e)]
check([r[:3] for r in got] == [(16, 0, 0), (0, 8, 0), (16, 8, 0), (16, 0, 32), (0, 8, 32), (16, 8, 32)]
      and all(r[3:] == ("real", 1, "integer") for r in got), f"sql: loads into sqlite, typed ({got[:2]})")

# --- md: the columns, their widths and the test names --------------------------
want_md = ref_text("llama_bench.md").splitlines()
p = bench(MATRIX)  # md is the default once llama-bench's flags are used
got_md = p.stdout.splitlines()
check(got_md[:2] == want_md[:2], "md: llama-bench's header and alignment row")
rows = lambda lines: [md_cells(l) for l in lines[2:] if l.startswith("|")]
check([r[5] for r in rows(got_md)] == [r[5] for r in rows(want_md)], "md: the test names (pp16, tg8, pp16+tg8, @ d32)")
same_width = lambda lines: all(len(l) == len(lines[0]) for l in lines if l.startswith("|"))
check(same_width(want_md) and same_width(got_md), "md: rows as wide as the header (the ± one column), as llama-bench's")
check(all(r[1] == "1.12 MiB" and r[2] == "0.29 M" and r[3] == "CPU" and r[4] == "2" for r in rows(got_md)),
      "md: size, params, backend and threads as llama-bench prints them")
check(any(l.startswith("build: kvllm ") for l in got_md), "md: the build line")
opt_md = ref_text("llama_bench_options.md").splitlines()
p = bench(["-p", "16", "-n", "0", "-r", "1", "-t", "2", "-b", "256", "-ub", "128", "-ctk", "q8_0", "-ctv", "q8_0",
           "-o", "md"])
check(p.stdout.splitlines()[:2] == opt_md[:2], "md: n_batch, n_ubatch, type_k, type_v columns where not the defaults")
check(md_cells(p.stdout.splitlines()[2])[7:9] == ["q8_0", "q8_0"], "md: the cache types the test ran with")

# --- lists, ranges, threads, both outputs ---------------------------------------
p = bench(["-p", "8-32*2", "-p", "5", "-n", "1-3+2", "-r", "1", "-o", "jsonl"])
got = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
check([(r["n_prompt"], r["n_gen"]) for r in got] == [(8, 0), (16, 0), (32, 0), (5, 0), (0, 1), (0, 3)],
      "ranges 8-32*2, 1-3+2 and a repeated flag, in order")
p = bench(["-p", "0", "-n", "4", "-t", "1,2", "-r", "1", "-o", "jsonl", "-oe", "md", "--progress"])
got = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
check([r["n_threads"] for r in got] == [1, 2], "-t 1,2: a test per thread count")
check(p.stderr.count("tg4") == 2 and "benchmark 2/2: generation run 1/1" in p.stderr,
      "-oe md on stderr beside -o jsonl on stdout; --progress lines")
p = bench(["-p", "16", "-n", "0", "-d", "20", "-r", "1", "-o", "jsonl"])
check("not a whole number of 16-token blocks" in p.stderr, "depth 20: says that 4 of its tokens are computed again")

# --- -m, -b, -ctk and -ctv lists: llama-bench's outer loops -------------------------
tiny = os.path.join(root, "tests", "data", "llama-2-tiny-random.gguf")
p = bench(["-m", f"{model},{tiny}", "-b", "64,2048", "-ctk", "f16,f32", "-p", "8", "-n", "0", "-r", "1",
           "-o", "jsonl"], models=[])
got = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
check([(os.path.basename(r["model_filename"]), r["n_batch"], r["type_k"], r["type_v"]) for r in got] ==
      [(os.path.basename(m), b, k, "f16") for m in (model, tiny) for b in (64, 2048) for k in ("f16", "f32")],
      "-m a,b -b 64,2048 -ctk f16,f32: models, then batch sizes, then K types (V stays f16)")
p = bench(["-m", model, "-m", tiny, "-ctv", "f32", "-p", "8", "-n", "0", "-r", "1"], models=[])
rows_md = [md_cells(l) for l in p.stdout.splitlines()[2:] if l.startswith("|")]
head = md_cells(p.stdout.splitlines()[0]) if p.stdout else []
check("type_v" in head and "type_k" not in head and len(rows_md) == 2 and rows_md[0][1] != rows_md[1][1],
      "-m repeated: a row per model; a -ctv column only where it differs from f16")
p = bench(["-m", f"{model},{os.path.join(out, 'missing.gguf')}", "-p", "8", "-n", "0", "-r", "1", "-o", "jsonl"],
          want_rc=1, models=[])
check(len([l for l in p.stdout.splitlines() if l.strip()]) == 1 and "missing.gguf" in p.stderr,
      "a model that does not load: the tests before it printed, then its error")

# --- llama-bench's 0/1 flags and -fa lists: noted, or refused where they would measure another thing
p = bench(["-p", "8", "-n", "0", "-r", "1", "-o", "jsonl", "-mmp", "0", "-nkvo", "0,1", "-fa", "1,0", "-ngl", "99"])
check(len([l for l in p.stdout.splitlines() if l.strip()]) == 1 and "-mmp: weights are repacked" in p.stderr
      and "-fa: attention is kvllm's own kernel" in p.stderr, "-mmp 0 -nkvo 0,1 -fa 1,0 -ngl 99: run, each noted")
for args, says in ((["-embd", "1"], "embeddings are not benchmarked"), (["-mmp", "2"], "0 or 1"),
                   (["-fa", "maybe"], "on, off, auto")):
    p = bench(["-p", "8", "-n", "0", "-o", "jsonl"] + args, want_rc=2)
    check(says in p.stderr and not p.stdout.strip(), f"{' '.join(args)}: refused ({says})")

# --- the file type as llama.cpp describes it -----------------------------------
synth = os.path.join(out, "tiny-q4_k_m.gguf")
subprocess.run([kv, "synth", "--shape", "tiny", "--type", "q4_k_m", "-o", synth], capture_output=True, timeout=120)
p = subprocess.run([kv, "bench", "-m", synth, "-p", "8", "-n", "0", "-r", "1", "-o", "jsonl"], capture_output=True,
                   text=True, timeout=120)
check(p.returncode == 0 and "Q4_K - Medium" in json.loads(p.stdout)["model_type"],
      "general.file_type 15: model_type says Q4_K - Medium")

# --- refusals --------------------------------------------------------------------
for args, says in ((["-o", "xml"], "csv, json, jsonl, md or sql"), (["-pg", "5"], "PP,TG"),
                   (["-p", "8-4"], "expected values"), (["-p", "8-16*1"], "never ends"),
                   (["-t", "0"], "at least one thread"), (["-o", "md", "--batch", "4"], "--batch is kvllm's own"),
                   (["-ctk", "f16,q9"], "not a KV cache type"), (["-b", "0,8"], "at least one token"),
                   (["-d", "16", "--json"], "use -o json"), (["-p", "0", "-n", "0", "-o", "md"], "no test to run")):
    p = bench(args, want_rc=1 if "no test" in says else 2)
    check(says in p.stderr and p.stdout.strip() == "", f"{' '.join(args)}: refused, saying '{says}'")

# --- kvllm's own report is unchanged by a single value ----------------------------
p = bench(["-p", "16", "-n", "4", "-r", "1", "-t", "2", "--no-progress", "--no-warmup", "--json"])
j = json.loads(p.stdout) if p.returncode == 0 else {}
check(j.get("n_prefill") == 16 and j.get("n_decode") == 4 and j.get("threads") == 2,
      "single values keep kvllm's own report (-p 16 -n 4 -t 2 --json, --no-warmup)")

if failures:
    print(f"\n{len(failures)} failure(s)")
    for f in failures:
        print(" -", f.splitlines()[0])
    sys.exit(1)
print("all ok")
