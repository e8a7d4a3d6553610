#!/usr/bin/env python3
"""Command-line habits: --help (and -h) on every subcommand `kvllm --help`
lists prints its usage and exits 0; `kvllm chat` and `run -cnv` hold a piped
conversation whose second turn takes the first turn's prompt from the KV cache;
/exit ends it; `-f -` reads the prompt from stdin; `-s` is `--seed`.

usage: test_cli.py KVLLM_BINARY REPO_ROOT
"""
import re
import os
import subprocess
import sys

BIN, ROOT = sys.argv[1], sys.argv[2]
MODEL = 'models/stories260K.gguf'
failures = []


def run(args, stdin=None):
    return subprocess.run([BIN] + args, input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=120)


def check(cond, what):
    print(('ok    ' if cond else 'FAIL  ') + what)
    if not cond:
        failures.append(what)


# --help on every subcommand
top = run(['--help'])
check(top.returncode == 0, 'kvllm --help exits 0')
commands = re.findall(r'^  ([a-z][a-z-]+) +\S', top.stdout.split('common options:')[0], re.M)
check(len(commands) >= 12 and 'chat' in commands and 'run' in commands, f'commands listed: {commands}')
for cmd in commands:
    for flag in ('--help', '-h'):
        r = run([cmd, flag])
        check(r.returncode == 0 and r.stdout.startswith(f'usage: kvllm {cmd}'),
              f'kvllm {cmd} {flag}: exit {r.returncode}, usage on stdout')

# chat: two piped turns, then /exit (the line after it must not be answered)
STATS = re.compile(r'^\[prompt (\d+) tokens: (\d+) cached, (\d+) new; (\d+) generated', re.M)
for argv in (['chat'], ['run', '-cnv']):
    r = run(argv + ['-m', MODEL, '-n', '12', '--temp', '0', '-c', '512'],
            stdin='Tell me a story about a cat.\nAnd then what happened?\n/exit\nnot answered\n')
    turns = [tuple(map(int, m)) for m in STATS.findall(r.stderr)]
    name = ' '.join(argv)
    check(r.returncode == 0, f'{name}: exit 0 ({r.stderr.strip()[-200:]})')
    check(len(turns) == 2, f'{name}: two turns answered, none after /exit ({turns})')
    if len(turns) == 2:
        (p1, c1, n1, g1), (p2, c2, n2, g2) = turns
        check(c1 == 0 and n1 == p1, f'{name}: turn 1 computes its whole prompt ({p1} tokens)')
        check(p2 > p1 + g1, f'{name}: turn 2 renders the whole conversation ({p2} > {p1} + {g1})')
        check(c2 > 0 and c2 + n2 == p2, f'{name}: turn 2 takes {c2} of {p2} prompt tokens from the KV cache')
        check(c2 >= p1 - p1 % 16, f'{name}: at least turn 1\'s full blocks are reused ({c2} >= {p1 - p1 % 16})')

# a Jinja template from a file (Qwen3's, vendored for the template tests) on the qwen3 golden model
r = run(['chat', '-m', 'tests/data/golden/models/qwen3-f32.gguf', '--chat-template-file',
         'tests/data/chat-templates/Qwen-Qwen3-0.6B.jinja', '-n', '6', '--temp', '0'],
        stdin='Hello\nMore please\n')
turns = [tuple(map(int, m)) for m in STATS.findall(r.stderr)]
check(r.returncode == 0 and 'Jinja' in r.stderr and len(turns) == 2 and turns[1][1] > 0,
      f'chat with --chat-template-file: turn 2 from the KV cache ({turns})')

# Ctrl-D (end of input) without /exit also ends cleanly
r = run(['chat', '-m', MODEL, '-n', '4'], stdin='Hello\n')
check(r.returncode == 0 and len(STATS.findall(r.stderr)) == 1, 'chat: end of input ends the conversation')

# -f - reads stdin; -s is --seed
a = run(['tokenize', '-m', MODEL, '-f', '-', '--json'], stdin='Once upon a time\n')
b = run(['tokenize', '-m', MODEL, '-p', 'Once upon a time\n', '--json'])
check(a.returncode == 0 and a.stdout == b.stdout, '-f - reads the prompt from stdin')
a = run(['run', '-m', MODEL, '-p', 'Once', '-n', '16', '--temp', '1', '-s', '7'])
b = run(['run', '-m', MODEL, '-p', 'Once', '-n', '16', '--temp', '1', '--seed', '7'])
c = run(['run', '-m', MODEL, '-p', 'Once', '-n', '16', '--temp', '1', '--seed', '8'])
check(a.returncode == 0 and a.stdout == b.stdout, '-s 7 samples as --seed 7')
check(a.stdout != c.stdout, 'and another seed samples differently')


# serve sizes its KV pool for the draft model's pools too (same block count,
# so --kv-memory buys half the blocks when the draft is the model itself); the
# bytes per block come from run's own measured allocation.
def serve_pool_line(extra):
    p = subprocess.Popen([BIN, 'serve', '-m', MODEL, '--port', '0', '-c', '256'] + extra, cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in p.stderr:
            lines.append(line)
            if 'KV pool ' in line and 'blocks x' in line:
                break
    finally:
        p.terminate()
        p.wait(timeout=30)
    return ''.join(lines)


js = run(['run', '-m', MODEL, '-p', 'Once', '-n', '4', '--json']).stdout.strip().splitlines()[-1]
import json
st = json.loads(js)['stats']
bb = st['kv_allocated_bytes'] // st['kv_blocks']
mib4 = 4 << 20
for extra, blocks in ((['--kv-memory', '4MiB'], mib4 // bb),
                      (['--kv-memory', '4MiB', '--model-draft', MODEL], mib4 // (2 * bb))):
    out = serve_pool_line(extra)
    m = re.search(r'KV pool (\d+) blocks', out)
    check(m is not None and int(m.group(1)) == blocks,
          f'serve {" ".join(extra)}: {blocks} blocks of {bb} bytes ({m.group(0) if m else out[-300:]})')
out = serve_pool_line(['--model-draft', MODEL])
m = re.search(r"draft model's KV takes (\d+) of (\d+) bytes per block", out)
check(m is not None and int(m.group(1)) == bb and int(m.group(2)) == 2 * bb and
      'KV pool from memory' in out, f'serve from MemAvailable counts the draft KV ({m.group(0) if m else out[-300:]})')

# --override-kv (llama.cpp's flag): info and kv-plan read the overridden metadata; a bad spec
# is an error that names it
MOE = 'tests/data/golden/models/qwen3moe-f32.gguf'
r = run(['info', '-m', MOE, '--override-kv', 'qwen3moe.expert_used_count=int:1'])
check(r.returncode == 0 and '1 used per token' in r.stdout, f'info --override-kv ({r.stdout[-300:]})')
r = run(['kv-plan', '-m', MOE, '--override-kv', 'qwen3moe.block_count=int:1', '--context', '128', '--json'])
check(r.returncode == 0 and '"n_layers":1' in r.stdout.replace(' ', ''), f'kv-plan --override-kv ({r.stdout[-300:]})')
for spec, why in (('qwen3moe.expert_used_count=float:1', 'use int:'), ('nokey', 'KEY=TYPE:VALUE'),
                  ('general.architecture=int:3', 'use str:')):
    r = run(['run', '-m', MOE, '-p', 'x', '-n', '1', '--override-kv', spec])
    check(r.returncode != 0 and why in r.stderr and spec in r.stderr, f'--override-kv {spec}: refused ({r.stderr[-300:]})')

# a llama-server command line: its flags do what llama-server's do (-np slots, -ctk K only,
# --alias) or say that they change nothing here (-ngl, -fa, --jinja, --metrics, -cb)
out = serve_pool_line(['--jinja', '-ngl', '99', '-fa', 'on', '-np', '3', '-ctk', 'q8_0', '--alias', 'm',
                       '--metrics', '-cb', '--mlock'])
check('K q8_0, V f16' in out and 'max 3 running' in out and all(
    f'note: {f}:' in out for f in ('--jinja', '-ngl', '-fa', '--metrics', '-cb', '--mlock')),
    f'serve with llama-server flags ({out[-400:]})')
# more of llama-server's habits: GPU placement, batch threads, cache reuse noted; its names of
# two settings used (--threads-http, --timeout); what would change the output refused, naming
# what to do instead; kvllm run's own flags refused by serve
out = serve_pool_line(['-ot', 'exps=CPU', '--n-cpu-moe', '8', '-tb', '2', '--cache-reuse', '256',
                       '--no-warmup', '--threads-http', '3', '-to', '60', '--draft-max', '8', '--cache-ram',
                       '2048', '-ctxcp', '4', '--fit', 'on', '--sse-ping-interval', '5', '-lv', '3', '-a', 'm',
                       '-rea', 'off', '--cache-prompt', '--webui', '--mmap', '-kvo', '--reuse-port'])
check(all(f'note: {f}:' in out for f in ('-ot', '--n-cpu-moe', '-tb', '--cache-reuse', '--no-warmup', '--cache-ram',
                                         '-ctxcp', '--fit', '--sse-ping-interval', '-lv', '--cache-prompt', '--webui',
                                         '--mmap', '-kvo', '--reuse-port'))
      and 'KV pool' in out, f'serve with more llama-server flags ({out[-400:]})')
for flags, why in ((['--path', '/tmp'], 'own pages'), (['--mmproj', 'x.gguf'], 'text models'),
                   (['--skip-chat-parsing'], 'always parsed'),
                   (['--context-shift'], 'does not shift')):
    r = run(['serve', '-m', MODEL, '--port', '0'] + flags)
    check(r.returncode != 0 and 'not supported' in r.stderr and why in r.stderr,
          f'serve {flags[0]}: refused naming what to do ({r.stderr[-200:]})')
# a vLLM command line (`vllm serve MODEL ...`): the model as the bare argument, its names of the
# settings kvllm has used (context, running sequences, tokens per step, KV type, prefix caching,
# CORS), what it asks of a GPU or of Python noted, what kvllm cannot do refused naming why
p = subprocess.Popen([BIN, 'serve', MODEL, '--port', '0', '--max-model-len', '0.25K', '--max-num-seqs', '3',
                      '--max-num-batched-tokens', '128', '--kv-cache-dtype', 'fp8', '--gpu-memory-utilization',
                      '0.9', '--no-enable-prefix-caching', '--tensor-parallel-size', '1', '--dtype', 'auto',
                      '--trust-remote-code', '--enable-auto-tool-choice', '--tool-call-parser', 'hermes',
                      '--allowed-origins', '["*"]', '--disable-log-requests', '--download-dir', '/tmp',
                      '--guided-decoding-backend', 'xgrammar', '--data-parallel-size', '1'], cwd=ROOT,
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
out = ''
try:
    for line in p.stderr:
        out += line
        if 'listening' in line:
            break
finally:
    p.terminate()
    p.wait(timeout=30)
check('K fp8, V fp8' in out and 'max 3 running' in out and '128 tokens per step' in out and
      '(256-token)' in out and 'prefix cache off' in out and 'listening' in out and all(
          f'note: {f}:' in out for f in ('--gpu-memory-utilization', '--tensor-parallel-size', '--dtype',
                                         '--trust-remote-code', '--enable-auto-tool-choice', '--tool-call-parser')),
      f'serve with a vLLM command line ({out[-600:]})')
for flags, why in ((['--tensor-parallel-size', '2'], '--pp N'), (['--kv-cache-dtype', 'fp8_e5m2'], 'E4M3'),
                   (['--tokenizer', 'org/tok'], 'vocabulary'), (['--quantization', 'awq'], 'GGUF'),
                   (['--response-role', 'user'], 'assistant'), (['--max-model-len', '1.5'], 'not a length'),
                   (['--allowed-origins', '["a", "b"]'], 'one origin'),
                   (['--speculative-config', '{}'], '--spec'), (['--data-parallel-size', '2'], '--pp N'),
                   (['--limit-mm-per-prompt', '{"image":1}'], 'text models')):
    r = run(['serve', MODEL, '--port', '0'] + flags)
    check(r.returncode != 0 and why in r.stderr and 'listening' not in r.stderr,
          f'serve {" ".join(flags)}: refused naming why ({r.stderr[-200:]})')
r = run(['serve', '-m', MODEL, '--port', '0', '-p', 'hello'])
check(r.returncode != 0 and 'kvllm run' in r.stderr, f'serve -p: refused ({r.stderr[-200:]})')
# a KV pool larger than the memory left is refused at start, not filled until the process is killed
r = run(['serve', '-m', MODEL, '--port', '0', '--kv-memory', '64TiB'])
check(r.returncode != 0 and 'is more than the' in r.stderr and 'listening' not in r.stderr,
      f'serve --kv-memory 64TiB: refused ({r.stderr[-200:]})')
# sizes as everywhere else (kvl_parse_size): a bare letter is binary, whole bytes only
out = serve_pool_line(['--kv-memory', '512M'])
check('(512.0 MiB' in out, f'serve --kv-memory 512M: 512 MiB ({out[-300:]})')
r = run(['serve', '-m', MODEL, '--port', '0', '--kv-memory', '1.3G'])
check(r.returncode != 0 and 'whole bytes' in r.stderr, f'serve --kv-memory 1.3G: refused ({r.stderr[-200:]})')
# a draft model's pools count too: a pool of 70% of the memory left, the draft's as large
avail = int(re.search(r'MemAvailable:\s+(\d+)', open('/proc/meminfo').read()).group(1)) * 1024
r = run(['run', '-m', MODEL, '-p', 'x', '-n', '1', '--kv-blocks', str(int(0.7 * avail / bb)), '--model-draft', MODEL,
         '--spec', 'draft'])
check(r.returncode != 0 and "the draft model's pools included" in r.stderr,
      f'run with a draft: its pools in the memory check ({r.stderr[-300:]})')
# llama-server's environment variables (its Docker images' way): each stands for its flag, the
# command line's own flag winning; a switch takes 1/true or 0/false (its negative flag)
env = dict(os.environ, LLAMA_ARG_MODEL=MODEL, LLAMA_ARG_CTX_SIZE='192', LLAMA_ARG_N_PARALLEL='3',
           LLAMA_ARG_CACHE_TYPE_K='q8_0', LLAMA_ARG_ENDPOINT_SLOTS='false')
p = subprocess.Popen([BIN, 'serve', '--port', '0', '-np', '2'], cwd=ROOT, env=env,
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
out = ''
for line in p.stderr:
    out += line
    if 'listening' in line or 'KV pool ' in line and 'blocks x' in line:
        break
p.terminate()
p.wait(timeout=30)
check('K q8_0, V f16' in out and '(192-token)' in out and 'max 2 running' in out and
      'note: LLAMA_ARG_ENDPOINT_SLOTS: --no-slots' in out and 'LLAMA_ARG_N_PARALLEL' not in out,
      f'serve from LLAMA_ARG_* variables, the command line winning ({out[-500:]})')
r = subprocess.run([BIN, 'serve', '--port', '0'], cwd=ROOT, capture_output=True, text=True, timeout=60,
                   env=dict(os.environ, LLAMA_ARG_MODEL=MODEL, LLAMA_ARG_MMPROJ='vision.gguf'))
check(r.returncode != 0 and '--mmproj is not supported' in r.stderr, f'LLAMA_ARG_MMPROJ: refused as --mmproj')
r = run(['serve', '-m', MODEL, '--port', '0', '--metrics-prefix', 'a-b'])
check(r.returncode != 0 and 'not a metric namespace' in r.stderr, f'--metrics-prefix a-b: refused ({r.stderr[-200:]})')
# --log-file (llama.cpp's): everything on stderr also goes to the file, to its last line at exit
import shutil
import tempfile
logf = os.path.join(tempfile.mkdtemp(prefix='kvllm-log-'), 'run.log')
r = run(['run', '-m', MODEL, '-p', 'Once', '-n', '4', '--log-file', logf])
text = open(logf).read() if os.path.exists(logf) else ''
check(r.returncode == 0 and 'KV allocated' in r.stderr and text == r.stderr,
      f'--log-file: the file holds what stderr showed ({len(text)} of {len(r.stderr)} bytes)')
slog = os.path.join(os.path.dirname(logf), 'serve.log')
p = subprocess.Popen([BIN, 'serve', '-m', MODEL, '--port', '0', '-c', '256', '--log-file', slog], cwd=ROOT,
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
seen = ''
for line in p.stderr:
    seen += line
    if 'listening' in line:
        break
import time
for _ in range(100):  # the copier writes the console first, then the file
    live = open(slog).read()
    if 'listening on' in live:
        break
    time.sleep(0.02)
p.terminate()
_, rest = p.communicate(timeout=30)
final = open(slog).read()
check('listening on' in live and 'drained' in rest and final == seen + rest,
      f'serve --log-file: the file follows stderr while serving and to the end ({final[-200:]})')
shutil.rmtree(os.path.dirname(logf), ignore_errors=True)
r = run(['run', '-m', MODEL, '-p', 'x', '-n', '1', '--log-file', '/nonexistent/dir/x.log'])
check(r.returncode != 0 and 'cannot create /nonexistent/dir/x.log' in r.stderr, f'--log-file: bad path refused')
# a bandwidth probe larger than the memory left is refused, not touched until the process is killed
r = run(['bench', '--membw', '--membw-mb', '100000000'])
check(r.returncode != 0 and 'does not fit' in r.stderr, f'bench --membw-mb 1e8: refused ({r.stderr[-200:]})')
r = run(['run', '-m', MODEL, '-p', 'x', '-n', '1', '-c', '1000000000'])
check(r.returncode != 0 and 'is more than the' in r.stderr and '-c' in r.stderr,
      f'run -c 1e9: the KV pool refused at start ({r.stderr[-200:]})')
r = run(['run', '-m', MODEL, '-p', 'x', '-n', '1', '--draft-max', '0'])
check(r.returncode != 0 and '--draft-max: must be' in r.stderr, f'--draft-max is --spec-k ({r.stderr[-200:]})')
# llama.cpp's rope flags (--rope-scaling, --rope-scale, --rope-freq-scale, --rope-freq-base,
# --yarn-orig-ctx) as the GGUF keys they stand for: the first token and its top 10 as
# llama-server computed them with the same flags (tests/data/llama_server/rope_flags.json)
rope = json.load(open(os.path.join(ROOT, 'tests/data/llama_server/rope_flags.json')))
ids = ','.join(map(str, rope['prompt_ids']))
firsts = set()
for case in rope['cases']:
    r = run(['run', '-m', 'tests/data/golden/models/qwen3-f32.gguf', '--prompt-ids', ids, '-n', '1',
             '--temp', '0', '--top-logprobs', '10', '--json', '-c', '512', '--kv-type', 'f32'] + case['flags'])
    ev = json.loads(r.stdout.splitlines()[0]) if r.returncode == 0 and r.stdout else {}
    got = {t['id']: t['logprob'] for t in ev.get('top_logprobs', [])}
    worst = max((abs(got[t['id']] - t['logprob']) if t['id'] in got else 99) for t in case['top'])
    firsts.add(ev.get('id'))
    check(ev.get('id') == case['id'] and worst < 1e-3,
          f"rope flags {case['flags']}: llama-server's token {case['id']} and top 10 (worst {worst:.2g})")
check(len(firsts) >= 4, f'the rope flags change the answer ({sorted(firsts, key=str)})')
r = run(['run', '-p', 'x', '-n', '1', '-fa', 'sometimes'])
check(r.returncode != 0 and '-fa: on, off or auto' in r.stderr, f'-fa sometimes: refused ({r.stderr[-200:]})')

# llama.cpp's newer spellings and its answer-and-exit flags on every subcommand
for cmd in ('run', 'serve', 'bench'):
    r = run([cmd, '-m', MODEL, '--version'])
    check(r.returncode == 0 and r.stdout.startswith('kvllm '), f'{cmd} --version')
r = run(['run', '-m', MODEL, '-p', 'Once upon a time', '--predict', '3', '--temperature', '0', '--json'])
r2 = run(['run', '-m', MODEL, '-p', 'Once upon a time', '-n', '3', '--temp', '0', '--json'])
ids = lambda out: [l for l in out.splitlines() if l.startswith('{"id"')]
check(r.returncode == 0 and len(ids(r.stdout)) == 3 and ids(r.stdout) == ids(r2.stdout),
      '--predict / --temperature are -n / --temp')
r = run(['run', '-m', MODEL, '-p', 'Once upon a time', '-n', '8', '--temp', '0', '--cpu-mask', 'ff', '--prio', '2'])
check(r.returncode == 0 and 'note: --cpu-mask:' in r.stderr and 'note: --prio:' in r.stderr,
      f'CPU placement flags noted ({r.stderr[-200:]})')
for flags, why in ((['--pooling', 'none'], 'pooled'), (['--models-dir', '/tmp'], 'one model'),
                   (['-mm', 'x.gguf'], 'text models'), (['--tools', 'all'], 'agent tools'),
                   (['--webui-mcp-proxy'], 'CORS proxy'), (['-ag'], 'agent tools'),
                   (['--ui-config', '[1]'], 'JSON object'), (['--ui-config-file', '/nonexistent'], '/nonexistent')):
    r = run(['serve', '-m', MODEL, '--port', '0'] + flags)
    check(r.returncode != 0 and why in r.stderr, f'serve {flags[0]}: refused naming why ({r.stderr[-160:]})')

# llama-cli's system prompt flags on chat: -sys TEXT, --system-prompt TEXT, -sysf FILE = --system TEXT
sysfile = os.path.join(tempfile.mkdtemp(), 'sys.txt')
open(sysfile, 'w').write('You are brief.')
counts = []
for flags in (['--system', 'You are brief.'], ['-sys', 'You are brief.'], ['--system-prompt', 'You are brief.'],
              ['-sysf', sysfile], []):
    r = run(['chat', '-m', 'tests/data/golden/models/qwen3-f32.gguf', '--chat-template-file',
             'tests/data/chat-templates/Qwen-Qwen3-0.6B.jinja', '-n', '2', '--temp', '0'] + flags, stdin='Hi\n')
    counts.append(tuple(map(int, STATS.findall(r.stderr)[0][:1])) if STATS.findall(r.stderr) else None)
check(len(set(counts[:4])) == 1 and counts[0] and counts[4] and counts[0][0] > counts[4][0],
      f'chat -sys / --system-prompt / -sysf: the system message ({counts})')
shutil.rmtree(os.path.dirname(sysfile), ignore_errors=True)

# llama-perplexity's --chunks N: the first N chunks, llama.cpp's running value after them
gold = json.load(open(os.path.join(ROOT, 'tests/data/golden/qwen3-f32/perplexity.json')))
r = run(['perplexity', '-m', 'tests/data/golden/models/qwen3-f32.gguf', '-f', 'tests/data/golden/ppl_text.txt',
         '-c', '128', '--kv-type', 'f32', '--chunks', '2', '--json'])
got = json.loads(r.stdout) if r.returncode == 0 else {}
want = gold['running'][1]['running_ppl']
check(got.get('n_chunks') == 2 and abs(got.get('final_ppl', 0) - want) / want < 1e-4,
      f"perplexity --chunks 2: {got.get('final_ppl')} against llama-perplexity's running {want}")

# llama.cpp's --spec-type: the n-gram kinds are prompt lookup, none is off, the rest refused by name
plain = run(['run', '-m', MODEL, '-p', 'Once upon a time', '-n', '16', '--temp', '0', '--json'])
r = run(['run', '-m', MODEL, '-p', 'Once upon a time', '-n', '16', '--temp', '0', '--json', '--spec-type', 'ngram-mod'])
check(r.returncode == 0 and ids(r.stdout) == ids(plain.stdout) and '"spec_drafts"' in r.stdout,
      f'--spec-type ngram-mod: prompt lookup, the same output ({r.stderr[-160:]})')
r = run(['run', '-m', MODEL, '-p', 'x', '-n', '1', '--spec-type', 'draft-eagle3'])
check(r.returncode != 0 and 'draft-eagle3' in r.stderr, '--spec-type draft-eagle3: refused by name')

# llama.cpp's -e (its default): -p's escapes processed; --no-escape as written; -f as written
def ids_of(args, stdin=None):
    r = run(['tokenize', '-m', MODEL, '--json'] + args, stdin=stdin)
    return json.loads(r.stdout)['ids'] if r.returncode == 0 else r.stderr
raw = 'a\\nb\\x41\\q\\"'  # a\nb\x41\q\" as typed
processed = 'a\nbA\\q"'
check(ids_of(['-p', raw]) == ids_of(['-f', '-'], stdin=processed) != ids_of(['-f', '-'], stdin=raw),
      f'-p: escapes processed as llama.cpp does ({ids_of(["-p", raw])})')
check(ids_of(['-p', raw, '--no-escape']) == ids_of(['-f', '-'], stdin=raw), '--no-escape: -p as written')
check(ids_of(['--no-escape', '-p', raw, '-e']) == ids_of(['-f', '-'], stdin=processed), '-e after --no-escape: processed')
r = run(['tokenize', '-m', MODEL, '-p', 'a\\x00b'])
check(r.returncode != 0 and 'x00' in r.stderr, f'-p with \\x00: refused ({r.stderr[-120:]})')
out = run(['run', '-m', MODEL, '-p', 'Once upon a time', '-n', '64', '--temp', '0', '--stop', '\\n']).stdout
full = run(['run', '-m', MODEL, '-p', 'Once upon a time', '-n', '64', '--temp', '0']).stdout
check('\n' in full and out == full[:full.index('\n')], f'--stop "\\n": the escape is a newline ({out!r} / {full[:80]!r})')

print(f'{len(failures)} failed' if failures else 'all passed')
sys.exit(1 if failures else 0)
