// Faults: a non-streaming request (n = 8) whose client hangs up is cancelled
// within an engine step; 1000 mid-stream disconnects leave the pool where it
// was; an overload of 10x capacity is answered 200 or 503, nothing dropped;
// SIGTERM drains (running requests finish, new ones get 503, exit 0) and
// cancels what outlives --shutdown-timeout.
// usage: node test_faults.mjs BUILD/kvllm REPO_ROOT
import http from 'node:http';
import {
  startServer, rawExchange, rawRequest, metrics, waitMetrics, assert, assertEq, runTests, sleep,
} from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const MODEL = 'models/stories260K.gguf';

function aborted(m) {
  for (const [k, v] of m) if (k.startsWith('kvllm:request_success_total{') && k.includes('"abort"')) return v;
  return 0;
}

// POSTs a body; resolves with { status, text, json } or { error } (a dropped
// connection), never rejects. onRequest(req) sees the request early.
const post = (port, body, { onRequest } = {}) => rawRequest(`http://127.0.0.1:${port}`,
  { body: JSON.stringify(body), agent: false, settle: true, onRequest });

// A streaming request read to the end: its finish reasons and whether [DONE] came.
function stream(port, body) {
  return new Promise((resolve) => {
    const req = http.request({ host: '127.0.0.1', port, path: '/v1/completions', method: 'POST',
      headers: { 'Content-Type': 'application/json' }, agent: false }, (res) => {
      let text = '';
      res.on('data', (c) => { text += c; });
      res.on('end', () => resolve({ status: res.statusCode, done: text.includes('data: [DONE]'),
        finish: [...text.matchAll(/"finish_reason":"(\w+)"/g)].map((m) => m[1]) }));
      res.on('error', (e) => resolve({ error: e }));
      // cut before its end (no 'end' then): an error, not a promise left pending
      res.on('close', () => resolve({ error: new Error('the stream was cut before its end') }));
    });
    req.on('error', (e) => resolve({ error: e }));
    req.end(JSON.stringify({ ...body, stream: true }));
  });
}

let failed = 0;
const server = await startServer(bin, ['-m', MODEL, '-c', '2048', '--max-seqs', '16'], { cwd: root, name: 'faults' });

failed += await runTests([
  ['non-streaming n=8 request: the client hangs up, all 8 cancelled at the next engine step', async () => {
    const m0 = await waitMetrics(server.url, (m) => m.get('kvllm:num_requests_running') === 0);
    let request;
    const pending = post(server.port, { prompt: 'Once upon a time', n: 8, max_tokens: 2000, ignore_eos: true,
      temperature: 1 }, { onRequest: (r) => { request = r; } });
    const mRun = await waitMetrics(server.url, (m) => m.get('kvllm:num_requests_running') === 8 &&
      m.get('kvllm:generation_tokens_total') - m0.get('kvllm:generation_tokens_total') >= 8 * 50, 20000);
    assertEq(mRun.get('kvllm:num_requests_running'), 8, 'eight choices running');
    const genAtHangup = (await metrics(server.url)).get('kvllm:generation_tokens_total');
    const t0 = performance.now();
    request.destroy();
    let m;
    do {
      m = await metrics(server.url);
    } while (!(m.get('kvllm:num_requests_running') === 0 && aborted(m) - aborted(m0) >= 8) && performance.now() - t0 < 10000);
    const ms = performance.now() - t0;
    const after = m.get('kvllm:generation_tokens_total') - genAtHangup;
    const itl = mRun.get('kvllm:inter_token_latency_seconds_sum') / Math.max(1, mRun.get('kvllm:inter_token_latency_seconds_count'));
    console.log(`  cancelled ${ms.toFixed(1)} ms after the hang-up (mean step ${(itl * 1000).toFixed(2)} ms); ` +
      `${after} tokens generated after it, ${m.get('kvllm:generation_tokens_total') - m0.get('kvllm:generation_tokens_total')} of 16000 in all`);
    assertEq(aborted(m) - aborted(m0), 8, 'eight choices ended as abort');
    assertEq(m.get('kvllm:client_disconnects_total') - m0.get('kvllm:client_disconnects_total'), 1, 'one client gone');
    // The engine thread polls the clients before every step. What is timed
    // here also includes this process asking /metrics (milliseconds, and far
    // more on a loaded machine), so the bounds are loose; without the poll the
    // request would run to its end: 16000 tokens, about 2000 steps.
    const total = m.get('kvllm:generation_tokens_total') - m0.get('kvllm:generation_tokens_total');
    assert(total < 16000 / 2, `the request did not run on (${total} tokens)`);
    assert(ms < 1000, `cancelled within a second (${ms.toFixed(1)} ms)`);
    const back = await waitMetrics(server.url, (x) => x.get('kvllm:kv_blocks_used') === m0.get('kvllm:kv_blocks_used'));
    assertEq(back.get('kvllm:kv_blocks_used'), m0.get('kvllm:kv_blocks_used'), 'blocks back in the pool');
    const r = await pending;
    assert(r.error, 'the client saw its own hang-up');
  }],

  ['1000 clients disconnecting mid-stream: the pool back at its baseline', async () => {
    const before = await waitMetrics(server.url, (m) => m.get('kvllm:num_requests_running') === 0);
    const used0 = before.get('kvllm:kv_blocks_used'), ab0 = aborted(before);
    let started = 0;
    for (let batch = 0; batch < 10; batch++) {
      await Promise.all(Array.from({ length: 100 }, (_, i) => new Promise((resolve) => {
        const req = http.request({ host: '127.0.0.1', port: server.port, path: '/v1/completions', method: 'POST',
          headers: { 'Content-Type': 'application/json' }, agent: false }, (res) => {
          res.once('data', () => { started++; setTimeout(() => { req.destroy(); resolve(); }, i % 3 ? 0 : 20); });
          res.on('error', () => resolve());
        });
        req.on('error', () => resolve());
        req.end(JSON.stringify({ prompt: `Once upon a time ${batch} ${i}`, max_tokens: 1000, ignore_eos: true, stream: true }));
        if (i % 10 === 9) setTimeout(() => { req.destroy(); resolve(); }, 2); // some before any token
      })));
    }
    const after = await waitMetrics(server.url, (m) => m.get('kvllm:kv_blocks_used') === used0 &&
      m.get('kvllm:num_requests_running') === 0 && m.get('kvllm:num_requests_waiting') === 0, 20000);
    console.log(`  1000 disconnects: ${started} had started streaming, ${aborted(after) - ab0} cancelled; ` +
      `kv_blocks_used ${used0} -> ${after.get('kvllm:kv_blocks_used')}`);
    assertEq(after.get('kvllm:kv_blocks_used'), used0, 'kv_blocks_used back to the baseline');
    assert(aborted(after) - ab0 >= 900, `cancelled (${aborted(after) - ab0})`);
    assertEq((await post(server.port, { prompt: 'Once', max_tokens: 2 })).status, 200, 'still serving');
  }],
]);
let code = await server.stop();
if (code !== 0) { console.log(`faults server exit ${code}:\n${server.log()}`); failed++; }

// ------------------------------------------------------------- overload --
{
  const s = await startServer(bin, ['-m', MODEL, '-c', '512', '--max-seqs', '4', '--max-queue', '16'],
    { cwd: root, name: 'overload' });
  failed += await runTests([['overload 10x capacity (20): every request answered 200 or 503, none dropped', async () => {
    const N = 200;
    const t0 = Date.now();
    const rs = await Promise.all(Array.from({ length: N }, (_, i) => post(s.port,
      { prompt: `Once upon a time ${i}`, max_tokens: 48, ignore_eos: true, temperature: 0 })));
    const ok = rs.filter((r) => r.status === 200), busy = rs.filter((r) => r.status === 503);
    const dropped = rs.filter((r) => r.error), other = rs.filter((r) => !r.error && r.status !== 200 && r.status !== 503);
    console.log(`  overload: ${N} at once -> ${ok.length} x 200, ${busy.length} x 503, ${dropped.length} dropped, ` +
      `${other.length} other, in ${Date.now() - t0} ms`);
    assertEq(dropped.length, 0, 'no connection dropped');
    assertEq(other.length, 0, `no other status (${other.map((r) => r.status)})`);
    assert(ok.length >= 20, `at least capacity served (${ok.length})`);
    for (const r of ok) assertEq(r.json.usage.completion_tokens, 48, 'a full answer');
    for (const r of busy) {
      assertEq(r.headers['retry-after'], '1', 'Retry-After');
      assertEq(r.json.error.code, 'server_overloaded', 'error code');
    }
  }]]);
  code = await s.stop();
  if (code !== 0) { console.log(`overload server exit ${code}:\n${s.log()}`); failed++; }
}

// ---------------------------------------------------------------- drain --
{
  const s = await startServer(bin, ['-m', MODEL, '-c', '2048', '--shutdown-timeout', '30'], { cwd: root, name: 'drain' });
  failed += await runTests([['SIGTERM drains: running streams finish, new requests get 503, exit 0', async () => {
    const streams = Array.from({ length: 4 }, (_, i) => stream(s.port,
      { prompt: `Once upon a time ${i}`, max_tokens: 1200, ignore_eos: true }));
    const blocking = post(s.port, { prompt: 'The dog', max_tokens: 1200, ignore_eos: true });
    await waitMetrics(s.url, (m) => m.get('kvllm:num_requests_running') === 5 && m.get('kvllm:generation_tokens_total') > 50);
    const t0 = Date.now();
    const exited = new Promise((r) => s.proc.on('exit', (c, sig) => r(c ?? sig)));
    s.proc.kill('SIGTERM');
    await sleep(200);
    const late = await rawExchange(s.port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 29\r\n\r\n{"prompt":"x","max_tokens":2}');
    assertEq(late.status(), 503, 'a new connection while draining');
    assert(/Retry-After: 1/i.test(late.text()), 'with Retry-After');
    const done = await Promise.all(streams);
    for (const d of done) {
      assert(!d.error, `stream kept (${d.error})`);
      assertEq(d.finish.at(-1), 'length', 'stream finished normally');
      assert(d.done, 'stream ended with [DONE]');
    }
    const b = await blocking;
    assertEq(b.status, 200, 'non-streaming request answered');
    assertEq(b.json.choices[0].finish_reason, 'length', 'and finished');
    assertEq(b.json.usage.completion_tokens, 1200, 'all its tokens');
    const rc = await exited;
    console.log(`  drain: 5 running requests finished, exit ${rc} ${Date.now() - t0} ms after SIGTERM`);
    assertEq(rc, 0, 'exit code');
  }]]);
  if (s.proc.exitCode === null) await s.stop();
}
{
  // A context long enough that no request can finish in 1 s even on a fast,
  // idle machine (stories260K decodes ~5,000 tokens/s; 2,000 did finish).
  const s = await startServer(bin, ['-m', MODEL, '-c', '16384', '--max-seqs', '2', '--shutdown-timeout', '1'],
    { cwd: root, name: 'drain-timeout' });
  failed += await runTests([['SIGTERM past --shutdown-timeout: the rest cancelled (abort), exit 0', async () => {
    // two run, four wait: none can finish in 1 s
    const streams = Array.from({ length: 3 }, (_, i) => stream(s.port,
      { prompt: `Once upon a time ${i}`, max_tokens: 16000, ignore_eos: true }));
    const blocking = Array.from({ length: 3 }, (_, i) => post(s.port, { prompt: `The dog ${i}`, max_tokens: 16000, ignore_eos: true }));
    await waitMetrics(s.url, (m) => m.get('kvllm:num_requests_running') === 2 && m.get('kvllm:num_requests_waiting') === 4);
    const t0 = Date.now();
    const exited = new Promise((r) => s.proc.on('exit', (c, sig) => r(c ?? sig)));
    s.proc.kill('SIGTERM');
    const done = await Promise.all(streams);
    for (const d of done) {
      assert(!d.error, `stream answered (${d.error})`);
      assertEq(d.finish.at(-1), 'abort', 'stream cut with finish_reason abort');
      assert(d.done, 'and [DONE]');
    }
    for (const r of await Promise.all(blocking)) {
      assert(!r.error, `non-streaming request answered (${r.error})`);
      assertEq(r.status, 200, 'status');
      assertEq(r.json.choices[0].finish_reason, 'abort', 'finish_reason');
    }
    const rc = await exited;
    const ms = Date.now() - t0;
    console.log(`  shutdown timeout 1 s: 6 requests cancelled, exit ${rc} ${ms} ms after SIGTERM`);
    assertEq(rc, 0, 'exit code');
    assert(ms >= 900 && ms < 6000, `exit after about the timeout (${ms} ms)`);
  }]]);
  if (s.proc.exitCode === null) await s.stop();
}

process.exit(failed ? 1 : 0);
