#!/usr/bin/env python3
"""Malformed-GGUF driver: generates corrupt files and checks that they are rejected.

usage: gguf_badfiles.py --gen tools/make_bad_gguf.py --out DIR
                        [--checker TEST_GGUF] [--bin KVLLM] [--good FILE ...]

  --checker     runs `TEST_GGUF --check-dir DIR`: every file must load or fail
                with the exact reason listed in DIR/expected.tsv (library level)
  --bin         runs `KVLLM info -m FILE` on every bad file: exit code exactly 1,
                a non-empty stderr naming the file, and no sanitizer report;
                generated good files must not crash; --good files must exit 0

The sanitizer stage of `make test` runs this driver again from build-asan
(the gguf_bad_files_* tests carry the unit label), so the same files go
through an ASan + UBSan reader there; SAN_ENV makes any report fail.
"""
import argparse
import os
import shutil
import subprocess
import sys

SAN_ENV = {
    # Distinct exit codes so that a sanitizer abort can never pass for the CLI's "exit 1".
    "ASAN_OPTIONS": "detect_leaks=1:exitcode=86:abort_on_error=0",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=87",
}
SAN_MARKERS = ("Sanitizer", "runtime error:", "LeakSanitizer")


def run(cmd, timeout=120, cwd=None):
    env = dict(os.environ, **SAN_ENV)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {timeout}s"
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def load_expected(out):
    rows = []
    with open(os.path.join(out, "expected.tsv")) as fh:
        for line in fh:
            name, want = line.rstrip("\n").split("\t", 1)
            rows.append((os.path.join(out, name), want))
    return rows


def check_cli_bad(kvllm, path):
    rc, _, err = run([kvllm, "info", "-m", path])
    problems = []
    if any(m in err for m in SAN_MARKERS):
        problems.append("sanitizer report")
    if rc != 1:
        problems.append(f"exit code {rc}, want 1")
    if not err.strip():
        problems.append("empty stderr")
    elif os.path.basename(path) not in err:
        problems.append("stderr does not name the file")
    return problems, err.strip().splitlines()[-1:] if err.strip() else [""]


def check_cli_good(kvllm, path, strict):
    rc, _, err = run([kvllm, "info", "-m", path])
    problems = []
    if any(m in err for m in SAN_MARKERS):
        problems.append("sanitizer report")
    if strict and rc != 0:
        problems.append(f"exit code {rc}, want 0")
    if not strict and rc not in (0, 1):
        problems.append(f"exit code {rc}, want 0 or 1 (a crash?)")
    return problems, err.strip().splitlines()[-1:] if err.strip() else [""]


def cli_checks(kvllm, rows, goods):
    failed = 0
    for path, want in rows:
        problems, last = (check_cli_good(kvllm, path, False) if want == "OK" else check_cli_bad(kvllm, path))
        failed += bool(problems)
        status = "FAIL " + "; ".join(problems) if problems else "ok"
        print(f"{status:>6}  {os.path.basename(path)}: {last[0]}")
    for path in goods:
        problems, last = check_cli_good(kvllm, path, True)
        failed += bool(problems)
        print(f"{'FAIL ' + '; '.join(problems) if problems else 'ok':>6}  {path} (must load)")
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bin")
    ap.add_argument("--checker")
    ap.add_argument("--good", action="append", default=[])
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    subprocess.run([sys.executable, a.gen, a.out], check=True)
    rows = load_expected(a.out)
    failed = 0
    if a.checker:
        rc, out, err = run([a.checker, "--check-dir", a.out], timeout=300)
        print(out + err)
        if rc != 0 or any(m in err for m in SAN_MARKERS):
            print(f"FAIL {a.checker} --check-dir: exit code {rc}")
            failed += 1
    if a.bin:
        failed += cli_checks(a.bin, rows, a.good)
    print(f"{len(rows)} generated files, {failed} failure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
