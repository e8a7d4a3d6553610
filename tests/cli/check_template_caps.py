#!/usr/bin/env python3
"""kvllm chat-template --caps against llama-server's /props chat_template_caps for every vendored
template (tests/data/llama_server/chat_template_caps.json, recorded from llama-server itself).
Four templates differ, each for one reason checked here: kvllm renders as transformers does, and
the probe conversation that llama.cpp's more permissive interpreter renders fails under
transformers' rules (a list's append in the sandbox, a generator given to tojson, an undefined
variable), so kvllm finds no tool support where none would render.
Usage: check_template_caps.py KVLLM REPO_ROOT"""
import json
import os
import subprocess
import sys
import tempfile

kv, root = sys.argv[1:3]
data = os.path.join(root, "tests", "data")
ref = json.load(open(os.path.join(data, "llama_server", "chat_template_caps.json")))["caps"]
# template -> (the error its tool-call probe gets in kvllm, as in transformers; the caps that differ)
DIFFER = {
    "chat-templates/Kimi-K2-Instruct.jinja": "access to attribute 'append' of 'list' object is unsafe",
    "chat-templates-more/Kimi-K2-Thinking.jinja": "access to attribute 'append' of 'list' object is unsafe",
    "chat-templates/llama-cpp-deepseek-r1.jinja": "Object of type generator is not JSON serializable",
    "chat-templates/fireworks-ai-llama-3-firefunction-v2.jinja": "'functions' is undefined",
}
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


probe = [{"role": "user", "content": "User message"},
         {"role": "assistant", "content": "", "tool_calls": [{"id": "call00001", "type": "function", "function": {
             "name": "tool1", "arguments": {"arg": "value"}}}]},
         {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
         {"role": "assistant", "content": "The tool response was 'tool response'"},
         {"role": "user", "content": "User message"}]
tools = [{"name": "tool", "type": "function", "function": {"name": "tool1", "description": "Tool description",
          "parameters": {"type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}},
                         "required": ["arg"]}}}]
with tempfile.TemporaryDirectory() as tmp:
    mpath, tpath = os.path.join(tmp, "m.json"), os.path.join(tmp, "t.json")
    json.dump(probe, open(mpath, "w"))
    json.dump(tools, open(tpath, "w"))
    agree = 0
    for name, want in sorted(ref.items()):
        tmpl = os.path.join(data, name)
        p = subprocess.run([kv, "chat-template", "--file", tmpl, "--caps"], capture_output=True, text=True,
                           timeout=60)
        got = json.loads(p.stdout) if p.returncode == 0 else None
        if name not in DIFFER:
            check(got == want, f"{name}: llama-server's caps" + ("" if got == want else f" (kvllm {got})"))
            agree += got == want
            continue
        r = subprocess.run([kv, "chat-template", "--file", tmpl, "--messages", mpath, "--tools", tpath],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 1 and DIFFER[name] in r.stderr and got is not None and not got["supports_tool_calls"],
              f"{name}: no tool calls, since the probe fails as in transformers ({DIFFER[name]})")
    print(f"{agree} of {len(ref) - len(DIFFER)} templates agree with llama-server exactly")
if failures:
    print(f"\n{len(failures)} failure(s)")
    sys.exit(1)
print("all ok")
