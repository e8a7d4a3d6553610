#!/usr/bin/env python3
"""kvllm run-batch (vLLM's offline batch runner) against the server it runs on:
each result line's body is what `kvllm serve` answers the same request (greedy
chat and completion texts, embeddings), in the input's order with its
custom_id; unsupported urls, streamed bodies, lines that are not requests and
requests the server refuses get vLLM's error lines; stdin / stdout and http(s)
URLs (GET in, PUT out) work; a model that cannot load fails the run.

usage: test_run_batch.py KVLLM_BIN REPO_ROOT
"""
import http.client
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

BIN, ROOT = sys.argv[1], sys.argv[2]
MODEL = ['-m', 'tests/data/golden/models/qwen3-f32.gguf', '-c', '512']
failures = []


def check(cond, what):
    print(('ok    ' if cond else 'FAIL  ') + what)
    if not cond:
        failures.append(what)


CHAT = {'model': 'qwen3-f32', 'messages': [{'role': 'user', 'content': 'Hello world!'}], 'max_completion_tokens': 8,
        'temperature': 0}
COMPL = {'model': 'qwen3-f32', 'prompt': 'Once upon a time', 'max_tokens': 6, 'temperature': 0}
EMBED = {'model': 'qwen3-f32', 'input': 'Hello'}
LINES = [
    {'custom_id': 'chat', 'method': 'POST', 'url': '/v1/chat/completions', 'body': CHAT},
    {'custom_id': 'embed', 'method': 'POST', 'url': '/v1/embeddings', 'body': EMBED},
    {'custom_id': 'compl', 'method': 'POST', 'url': '/v1/completions', 'body': COMPL},
    {'custom_id': 'resp', 'method': 'POST', 'url': '/v1/responses', 'body': {}},
    {'custom_id': 'stream', 'method': 'POST', 'url': '/v1/chat/completions', 'body': dict(CHAT, stream=True)},
    'not a request',
    {'custom_id': 'get', 'method': 'GET', 'url': '/v1/chat/completions', 'body': CHAT},
    {'custom_id': 'bad', 'method': 'POST', 'url': '/v1/chat/completions', 'body': dict(CHAT, max_tokens='x')},
] + [{'custom_id': f'many{i}', 'method': 'POST', 'url': '/v1/completions', 'body': dict(COMPL, prompt=f'Story {i}:')}
     for i in range(20)]
text = '\n'.join(l if isinstance(l, str) else json.dumps(l) for l in LINES) + '\n\n'

work = tempfile.mkdtemp(prefix='kvllm-batch-')
inp, outp = os.path.join(work, 'in.jsonl'), os.path.join(work, 'out.jsonl')
open(inp, 'w').write(text)
r = subprocess.run([BIN, 'run-batch', '-i', inp, '-o', outp, '--concurrency', '4'] + MODEL, cwd=ROOT,
                   capture_output=True, text=True, timeout=300)
check(r.returncode == 0 and re.search(r'28 requests: 23 answered, 5 failed', r.stderr),
      f'run-batch: exit 0 and its summary ({r.stderr[-300:]})')
out = [json.loads(l) for l in open(outp)] if os.path.exists(outp) else []
check([o.get('custom_id') for o in out] == [l['custom_id'] if isinstance(l, dict) else None for l in LINES],
      'one line per request, in order, with its custom_id')
check(all(re.fullmatch(r'kvllm-[0-9a-f]{32}', o['id']) and re.fullmatch(r'kvllm-batch-[0-9a-f]{32}',
          o['response']['request_id']) for o in out), 'ids and request ids')

# the same requests straight to a server of the same model
srv = subprocess.Popen([BIN, 'serve', '--port', '0'] + MODEL, cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
port = None
for line in srv.stderr:
    m = re.search(r'listening on http://[^:]+:(\d+)', line)
    if m:
        port = int(m.group(1))
        break


def post(path, body):
    c = http.client.HTTPConnection('127.0.0.1', port, timeout=60)
    c.request('POST', path, json.dumps(body), {'Content-Type': 'application/json'})
    resp = c.getresponse()
    return resp.status, json.loads(resp.read())


by = {o['custom_id']: o for o in out}
if port and len(out) == len(LINES):
    chat = post('/v1/chat/completions', CHAT)[1]
    check(by['chat']['response']['status_code'] == 200 and by['chat']['error'] is None and
          by['chat']['response']['body']['choices'][0]['message']['content'] == chat['choices'][0]['message']['content'],
          'chat: the server\'s answer')
    compl = post('/v1/completions', COMPL)[1]
    check(by['compl']['response']['body']['choices'][0]['text'] == compl['choices'][0]['text'], 'completion: the same text')
    emb = post('/v1/embeddings', EMBED)[1]
    check(by['embed']['response']['body']['data'][0]['embedding'] == emb['data'][0]['embedding'], 'embeddings: the same vector')
    for i in range(20):
        want = post('/v1/completions', dict(COMPL, prompt=f'Story {i}:'))[1]['choices'][0]['text']
        if by[f'many{i}']['response']['body']['choices'][0]['text'] != want:
            check(False, f'many{i}: the server\'s text')
            break
    else:
        check(True, '20 completions four at a time: each the server\'s text')
    status, err = post('/v1/chat/completions', dict(CHAT, max_tokens='x'))
    check(by['bad']['response']['status_code'] == status == 400 and by['bad']['response']['body'] is None and
          by['bad']['error'] == err, 'a request the server refuses: its status and error object')
srv.terminate()
srv.wait(timeout=60)
check(by.get('resp', {}).get('error', '').startswith('URL /v1/responses was used'), 'an unsupported url: vLLM\'s message')
check(by.get('stream', {}).get('error') == 'Request must not be sent in stream mode', 'stream: true refused')
check(out[5]['custom_id'] is None and 'not a JSON object' in out[5]['error'] and out[5]['response']['status_code'] == 400,
      'a line that is not a request')
check('POST' in by.get('get', {}).get('error', ''), 'method other than POST')

# a server whose queue is smaller than --concurrency answers 503: those are sent again
few = [dict(LINES[2], custom_id=f'q{i}', body=dict(COMPL, prompt=f'Q{i}', max_tokens=60, ignore_eos=True)) for i in range(4)]
r = subprocess.run([BIN, 'run-batch', '-i', '-', '-o', '-', '--concurrency', '4', '--max-seqs', '1', '--max-queue', '0']
                   + MODEL, cwd=ROOT, input=''.join(json.dumps(l) + '\n' for l in few), capture_output=True, text=True,
                   timeout=300)
got = [json.loads(l) for l in r.stdout.strip().split('\n')] if r.returncode == 0 else []
check(len(got) == 4 and all(o['response']['status_code'] == 200 and
                            o['response']['body']['usage']['completion_tokens'] == 60 for o in got),
      f'--max-queue 0 under --concurrency 4: the 503s sent again, all answered ({r.stderr[-200:]})')

# stdin to stdout: nothing but the result lines on stdout
r = subprocess.run([BIN, 'run-batch', '-i', '-', '-o', '-'] + MODEL, cwd=ROOT, input=json.dumps(LINES[2]) + '\n',
                   capture_output=True, text=True, timeout=300)
lines = r.stdout.strip().split('\n')
check(r.returncode == 0 and len(lines) == 1 and json.loads(lines[0])['custom_id'] == 'compl', f'-i - -o - ({r.stdout[:200]})')


# http(s) URLs: the input by GET, the results by PUT
class Files(http.server.BaseHTTPRequestHandler):
    put = None

    def do_GET(self):
        body = text.encode()
        self.send_response(200 if self.path == '/in.jsonl' else 404)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        Files.put = self.rfile.read(int(self.headers['Content-Length']))
        self.send_response(200)
        self.send_header('Content-Length', '0')
        self.end_headers()

    def log_message(self, *a):
        pass


hs = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Files)
threading.Thread(target=hs.serve_forever, daemon=True).start()
base = f'http://127.0.0.1:{hs.server_address[1]}'
r = subprocess.run([BIN, 'run-batch', '-i', f'{base}/in.jsonl', '-o', f'{base}/out.jsonl', '--output-tmp-dir', work] + MODEL,
                   cwd=ROOT, capture_output=True, text=True, timeout=300)
put = [json.loads(l) for l in Files.put.decode().strip().split('\n')] if Files.put else []
check(r.returncode == 0 and [o['custom_id'] for o in put] == [o['custom_id'] for o in out] and
      os.listdir(work) == ['in.jsonl', 'out.jsonl'], f'URLs: GET in, PUT out, the temporary file removed ({r.stderr[-200:]})')
r = subprocess.run([BIN, 'run-batch', '-i', f'{base}/missing', '-o', outp] + MODEL, cwd=ROOT, capture_output=True,
                   text=True, timeout=60)
check(r.returncode != 0 and 'missing' in r.stderr, 'an input URL that answers 404: refused')
hs.shutdown()

r = subprocess.run([BIN, 'run-batch', '-i', inp, '-o', outp, '-m', '/nonexistent.gguf'], cwd=ROOT, capture_output=True,
                   text=True, timeout=60)
check(r.returncode != 0 and 'did not start' in r.stderr, f'a model that cannot load: the run fails ({r.stderr[-160:]})')
r = subprocess.run([BIN, 'run-batch', '-o', outp] + MODEL, cwd=ROOT, capture_output=True, text=True, timeout=60)
check(r.returncode == 2 and '-i INPUT' in r.stderr, 'no -i: usage')

shutil.rmtree(work, ignore_errors=True)
print(f'{len(failures)} failed' if failures else 'all passed')
sys.exit(1 if failures else 0)
