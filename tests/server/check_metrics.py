#!/usr/bin/env python3
"""Checks a Prometheus text exposition (format 0.0.4) the way `promtool check
metrics` does: the parser's rules (names, labels, escapes, values, one HELP and
TYPE per family before its samples, families contiguous, no duplicate series,
histogram buckets cumulative with +Inf equal to _count) and promlint's
(help text present, counters end in _total and nothing else does, snake_case,
base units, reserved suffixes). The one lint accepted is "metric names should
not contain ':'": vLLM's naming, which kvllm keeps so dashboards carry over.

When promtool is installed (Debian: the prometheus package) it is run too, and
anything it reports other than the ':' note fails the check.

usage: check_metrics.py FILE   (exit 0: clean, 1: problems listed on stdout)
"""
import math
import re
import shutil
import subprocess
import sys

NAME = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*$')
LABEL = re.compile(r'[a-zA-Z_][a-zA-Z0-9_]*$')
TYPES = {'counter', 'gauge', 'histogram', 'summary', 'untyped'}
BAD_UNITS = {'milliseconds': 'seconds', 'microseconds': 'seconds', 'nanoseconds': 'seconds',
             'minutes': 'seconds', 'hours': 'seconds', 'days': 'seconds', 'kilobytes': 'bytes',
             'megabytes': 'bytes', 'gigabytes': 'bytes', 'percent': 'ratio', 'celsius': 'celsius'}


def parse_labels(s, where, problems):
    """'{a="x",b="y"}' -> tuple of (name, value); escapes \\\\ \\" \\n only."""
    labels, i = [], 1
    while i < len(s) and s[i] != '}':
        j = s.index('=', i)
        name = s[i:j]
        if not LABEL.match(name):
            problems.append(f'{where}: bad label name {name!r}')
        if s[j + 1] != '"':
            raise ValueError('label value not quoted')
        k, val = j + 2, []
        while s[k] != '"':
            if s[k] == '\\':
                esc = s[k + 1]
                if esc not in '\\"n':
                    problems.append(f'{where}: bad escape \\{esc} in a label value')
                val.append('\n' if esc == 'n' else esc)
                k += 2
            else:
                val.append(s[k])
                k += 1
        labels.append((name, ''.join(val)))
        i = k + 1
        if s[i] == ',':
            i += 1
    if s[i:] != '}':
        raise ValueError('junk after the labels')
    names = [n for n, _ in labels]
    if len(set(names)) != len(names):
        problems.append(f'{where}: a label repeats')
    return tuple(labels)


def family_of(sample, fam, ftype):
    if ftype == 'histogram':
        return sample in (fam + '_bucket', fam + '_sum', fam + '_count')
    if ftype == 'summary':
        return sample in (fam, fam + '_sum', fam + '_count')
    return sample == fam


def check(text):
    problems, notes = [], set()
    helps, types, seen_fams, series, sampled = {}, {}, [], set(), set()
    hist = {}  # (family, labels without le) -> {'buckets': [(le, v)], 'count': v}
    cur = None
    for ln, line in enumerate(text.split('\n'), 1):
        where = f'line {ln}'
        if not line.strip():
            continue
        if line.startswith('#'):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ('HELP', 'TYPE'):
                name = parts[2]
                if not NAME.match(name):
                    problems.append(f'{where}: bad metric name {name!r}')
                if parts[1] == 'HELP':
                    if name in helps:
                        problems.append(f'{where}: second HELP line for {name}')
                    helps[name] = parts[3] if len(parts) > 3 else ''
                else:
                    t = parts[3].strip() if len(parts) > 3 else ''
                    if t not in TYPES:
                        problems.append(f'{where}: unknown type {t!r}')
                    if name in types:
                        problems.append(f'{where}: second TYPE line for {name}')
                    if name in sampled:
                        problems.append(f'{where}: TYPE for {name} after its samples')
                    types[name] = t
                if cur != name:
                    if name in seen_fams:
                        problems.append(f'{where}: family {name} is not contiguous')
                    cur = name
                    seen_fams.append(name)
            continue
        m = re.match(r'([^{\s]+)(\{.*\})?\s+(\S+)(\s+-?\d+)?$', line)
        if not m:
            problems.append(f'{where}: not a sample line: {line!r}')
            continue
        name, lab, val = m.group(1), m.group(2) or '{}', m.group(3)
        if not NAME.match(name):
            problems.append(f'{where}: bad metric name {name!r}')
        try:
            labels = parse_labels(lab, where, problems)
        except (ValueError, IndexError) as e:
            problems.append(f'{where}: bad labels ({e})')
            continue
        try:
            v = float(val)
        except ValueError:
            problems.append(f'{where}: bad value {val!r}')
            continue
        if cur is None or not family_of(name, cur, types.get(cur, 'untyped')):
            if name in seen_fams:
                problems.append(f'{where}: family {name} is not contiguous')
            cur = name
            seen_fams.append(name)
        sampled.add(cur)
        key = (name, labels)
        if key in series:
            problems.append(f'{where}: duplicate series {name}{lab}')
        series.add(key)
        if types.get(cur) == 'histogram':
            le = dict(labels).get('le')
            rest = tuple(kv for kv in labels if kv[0] != 'le')
            h = hist.setdefault((cur, rest), {'buckets': [], 'count': None})
            if name == cur + '_bucket':
                if le is None:
                    problems.append(f'{where}: bucket without le')
                else:
                    h['buckets'].append((float(le), v))
            elif name == cur + '_count':
                h['count'] = v
    for (fam, rest), h in hist.items():
        b = sorted(h['buckets'])
        if not b or not math.isinf(b[-1][0]):
            problems.append(f'{fam}{dict(rest)}: no +Inf bucket')
            continue
        if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
            problems.append(f'{fam}{dict(rest)}: buckets not cumulative')
        if h['count'] is None or h['count'] != b[-1][1]:
            problems.append(f'{fam}{dict(rest)}: _count differs from the +Inf bucket')
    # promlint
    for fam in seen_fams:
        t = types.get(fam, 'untyped')
        if not helps.get(fam):
            problems.append(f'{fam}: no help text')
        if t == 'counter' and not fam.endswith('_total'):
            problems.append(f'{fam}: counter metrics should have "_total" suffix')
        if t != 'counter' and fam.endswith('_total'):
            problems.append(f'{fam}: non-counter metrics should not have "_total" suffix')
        if t not in ('histogram', 'summary') and re.search(r'_(count|sum|bucket)$', fam):
            problems.append(f'{fam}: non-histogram and non-summary metrics should not have a _count/_sum/_bucket suffix')
        if re.search(r'[A-Z]', fam.split(':')[-1]):
            problems.append(f"{fam}: metric names should be written in 'snake_case' not 'camelCase'")
        for unit, base in BAD_UNITS.items():
            if unit != base and re.search(rf'_{unit}(_|$)', fam):
                problems.append(f'{fam}: use base unit "{base}" instead of "{unit}"')
        if ':' in fam:
            notes.add("metric names should not contain ':' (accepted: vLLM's naming)")
    return problems, notes


def main():
    text = open(sys.argv[1], encoding='utf-8').read()
    problems, notes = check(text)
    promtool = shutil.which('promtool')
    if promtool:
        r = subprocess.run([promtool, 'check', 'metrics'], input=text, capture_output=True, text=True)
        for line in (r.stdout + r.stderr).splitlines():
            if line.strip() and "should not contain ':'" not in line:
                problems.append(f'promtool: {line}')
    for p in problems:
        print(p)
    print(f"{'promtool and ' if promtool else ''}the exposition-format checker: "
          f"{len(problems)} problem(s); notes: {sorted(notes) or 'none'}")
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
