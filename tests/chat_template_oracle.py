#!/usr/bin/env python3
"""Writes T.expected.json for every template of a chat-template oracle folder,
rendering as Hugging Face transformers' apply_chat_template does, by the rules
in tests/data/chat-templates/SOURCES.md: jinja2's ImmutableSandboxedEnvironment
(trim_blocks, lstrip_blocks, loopcontrols, a {% generation %} block that
renders its body), tojson as json.dumps (non-ASCII kept, no key sorting),
raise_exception, strftime_now fixed at 2024-07-26, and messages, tools,
documents (None), add_generation_prompt, bos_token, eos_token and the case's
kwargs passed to render(). Each base case of cases.json is rendered, then each
kwarg variant whose variable the template reads. Run over the shared folder's
39 templates it gives all 847 of their results (renders, and which fail and
how) exactly.

The folder holds cases.json, templates.json ({"T": {"family", "bos_token",
"eos_token"}}) and each T.jinja. Needs python3-jinja2 (3.1.6 made the files
here); the tests read the JSON it writes and need no jinja2.

usage: chat_template_oracle.py DIR
"""
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_DATE = "2024-07-26"


class GenerationBlock(jinja2.ext.Extension):
    """transformers' {% generation %} ... {% endgeneration %}: the body as it is."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_body", []), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    day = datetime.strptime(FIXED_DATE, "%Y-%m-%d")
    env.globals["strftime_now"] = lambda fmt: day.strftime(fmt)
    return env


def render_one(template, case, variant, bos, eos):
    agp = case["add_generation_prompt"]
    result = {"case": case["id"], "add_generation_prompt": agp, "kwargs": variant}
    args = dict(messages=case["messages"], tools=case.get("tools"), documents=None,
                add_generation_prompt=agp, bos_token=bos, eos_token=eos)
    args.update(case.get("kwargs") or {})
    args.update(variant)
    try:
        result["rendered"] = template.render(**args)
    except Exception as e:  # the template's own refusal, or Jinja / Python failing
        raised = type(e) is jinja2.exceptions.TemplateError
        result.update(error=str(e), error_type=type(e).__name__,
                      error_source="raise_exception" if raised else "jinja_runtime")
    return result


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    folder = sys.argv[1]
    cases = json.load(open(os.path.join(folder, "cases.json"), encoding="utf-8"))
    specs = json.load(open(os.path.join(folder, "templates.json"), encoding="utf-8"))
    env = environment()
    for name, spec in sorted(specs.items()):
        source = open(os.path.join(folder, name + ".jinja"), encoding="utf-8").read()
        template = env.from_string(source)
        reads = jinja2.meta.find_undeclared_variables(env.parse(source))
        runs = [(c, {}) for c in cases["cases"]]
        for v in cases["kwarg_variants"]:
            if v["applies_when_template_reads"] in reads:
                runs += [(next(c for c in cases["cases"] if c["id"] == cid), v["kwargs"])
                         for cid in v["cases"]]
        results = [render_one(template, c, v, spec["bos_token"], spec["eos_token"])
                   for c, v in runs]
        out = {"template": name + ".jinja", "family": spec["family"], "bos_token": spec["bos_token"],
               "eos_token": spec["eos_token"], "fixed_date": FIXED_DATE, "results": results}
        with open(os.path.join(folder, name + ".expected.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print("%-50s %3d results" % (name, len(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
