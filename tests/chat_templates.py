#!/usr/bin/env python3
"""Runs `kvllm chat-template` over every template x case of a chat-template
oracle folder (T.jinja + T.expected.json + cases.json, see its SOURCES.md) and
compares byte for byte with what transformers' apply_chat_template rendered.
An expected error must be a non-zero exit; when the template itself refused
(raise_exception), its message must be on stderr.

usage: chat_templates.py KVLLM DATA_DIR [-v] [NAME_SUBSTRING ...]
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    verbose = "-v" in sys.argv[1:]
    if len(args) < 2:
        print(__doc__)
        return 2
    kvllm, data = args[0], args[1]
    only = args[2:]
    cases = {c["id"]: c for c in json.load(open(os.path.join(data, "cases.json"), encoding="utf-8"))["cases"]}
    names = sorted(f[: -len(".expected.json")] for f in os.listdir(data) if f.endswith(".expected.json"))
    if only:
        names = [n for n in names if any(o in n for o in only)]
    if not names:
        print("no templates found in", data)
        return 1
    full, total_ok, total = 0, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            exp = json.load(open(os.path.join(data, name + ".expected.json"), encoding="utf-8"))
            def check(k, r):
                """One result: None when it matches, else why not."""
                case = cases[r["case"]]
                msg_path = os.path.join(tmp, "%s.%d.messages.json" % (name, k))
                with open(msg_path, "w", encoding="utf-8") as f:
                    json.dump(case["messages"], f, ensure_ascii=False)
                cmd = [kvllm, "chat-template", "--file", os.path.join(data, name + ".jinja"),
                       "--messages", msg_path, "--bos", exp["bos_token"], "--eos", exp["eos_token"],
                       "--now", exp["fixed_date"]]
                if case.get("tools") is not None:
                    tools_path = os.path.join(tmp, "%s.%d.tools.json" % (name, k))
                    with open(tools_path, "w", encoding="utf-8") as f:
                        json.dump(case["tools"], f, ensure_ascii=False)
                    cmd += ["--tools", tools_path]
                if not r["add_generation_prompt"]:
                    cmd.append("--no-generation-prompt")
                kwargs = dict(case.get("kwargs") or {})
                kwargs.update(r.get("kwargs") or {})
                if kwargs:
                    cmd += ["--kwargs", json.dumps(kwargs, ensure_ascii=False)]
                p = subprocess.run(cmd, capture_output=True, timeout=60)
                stderr = p.stderr.decode("utf-8", "replace")
                label = "%s %s" % (r["case"], json.dumps(r.get("kwargs") or {}))
                if p.returncode < 0 or p.returncode > 3:
                    return "%s: crashed (exit %d): %s" % (label, p.returncode, stderr.strip())
                if "rendered" in r:
                    want = r["rendered"].encode("utf-8")
                    if p.returncode != 0:
                        return "%s: failed: %s" % (label, stderr.strip())
                    if p.stdout != want:
                        i = next((k for k in range(min(len(want), len(p.stdout))) if want[k] != p.stdout[k]),
                                 min(len(want), len(p.stdout)))
                        return "%s: differs at byte %d\n      want: %r\n      got:  %r" % (
                            label, i, want[max(0, i - 60):i + 60], p.stdout[max(0, i - 60):i + 60])
                    return None
                if p.returncode == 0:
                    return "%s: rendered, but transformers fails: %s" % (label, r["error"])
                if r.get("error_source") == "raise_exception" and r["error"] not in stderr:
                    return "%s: refused with another message:\n      want: %r\n      got:  %r" % (
                        label, r["error"], stderr.strip())
                return None

            with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
                outcomes = list(pool.map(check, range(len(exp["results"])), exp["results"]))
            fails = [o for o in outcomes if o]
            ok = len(outcomes) - len(fails)
            n = len(exp["results"])
            total_ok += ok
            total += n
            if ok == n:
                full += 1
            print("%-50s %3d/%3d%s" % (name, ok, n, "" if ok == n else "  FAIL"))
            if fails and verbose:
                for f in fails:
                    print("    " + f)
    print("templates fully matched: %d/%d; results matched: %d/%d" % (full, len(names), total_ok, total))
    return 0 if full == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
