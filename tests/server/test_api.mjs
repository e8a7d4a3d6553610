// kvllm serve through the official OpenAI client: completions and chat,
// streaming, n, logprobs, stop, authentication, malformed requests, /metrics,
// clients that disconnect mid-stream, and a full queue.
// usage: node test_api.mjs BUILD/kvllm REPO_ROOT
import OpenAI from 'openai';
import http from 'node:http';
import { execFile } from 'node:child_process';
import {
  startServer, rawRequest, metrics, waitMetrics, assert, assertEq, runTests, sleep,
} from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const MODEL = 'models/stories260K.gguf';
const KEY = 'test-key-123';

const server = await startServer(bin, ['-m', MODEL, '-c', '512', '--api-key', KEY], { cwd: root, name: 'api' });
const models = await (await fetch(`${server.url}/v1/models`, { headers: { Authorization: `Bearer ${KEY}` } })).json();
const model = models.data[0].id;
const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 60000 });
const auth = { Authorization: `Bearer ${KEY}` };

// Requests that ended cancelled (finished_reason="abort").
function aborted(m) {
  for (const [k, v] of m) if (k.startsWith('kvllm:request_success_total{') && k.includes('"abort"')) return v;
  return 0;
}

async function stillServing() {
  const r = await client.completions.create({ model, prompt: 'Once', max_tokens: 2, temperature: 0 });
  assert(r.choices[0].text !== undefined, 'server answers after a bad request');
}

async function expectError(status, req, what) {
  const r = await rawRequest(server.url, { headers: auth, ...req });
  assert(r.status === status, `${what}: status ${r.status}, want ${status} (${r.text.slice(0, 200)})`);
  assert(r.json && r.json.error && typeof r.json.error.message === 'string', `${what}: OpenAI error object`);
  assert('type' in r.json.error && 'param' in r.json.error && 'code' in r.json.error, `${what}: error fields`);
  await stillServing();
  return r;
}

const tests = [
  ['health and models', async () => {
    assert((await fetch(`${server.url}/health`)).status === 200, '/health');
    assertEq(models.object, 'list', 'models.object');
    assert(model === 'stories260K', `model id ${model}`);
  }],

  ['completion: text, finish_reason, usage with KV fields', async () => {
    const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 16, temperature: 0 });
    assertEq(r.object, 'text_completion', 'object');
    const c = r.choices[0];
    assert(typeof c.text === 'string' && c.text.length > 0, 'text');
    assertEq(c.finish_reason, 'length', 'finish_reason');
    const u = r.usage;
    assert(u.prompt_tokens > 0 && u.completion_tokens === 16, `usage ${JSON.stringify(u)}`);
    assertEq(u.total_tokens, u.prompt_tokens + u.completion_tokens, 'total_tokens');
    assert(u.kv_lower_bound_bytes > 0 && u.kv_allocated_bytes >= u.kv_lower_bound_bytes, 'KV bytes');
    assert(u.prompt_tokens_details && u.prompt_tokens_details.cached_tokens >= 0, 'cached_tokens');
  }],

  ['completion: streaming equals non-streaming (greedy), usage chunk', async () => {
    const req = { model, prompt: 'The little dog', max_tokens: 24, temperature: 0 };
    const full = await client.completions.create(req);
    const stream = await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    let text = '', finish = null, usage = null, chunks = 0;
    for await (const ch of stream) {
      chunks++;
      if (ch.usage) usage = ch.usage;
      for (const c of ch.choices) {
        text += c.text;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assertEq(text, full.choices[0].text, 'streamed text');
    assertEq(finish, 'length', 'finish_reason');
    assert(usage && usage.completion_tokens === 24, `usage chunk ${JSON.stringify(usage)}`);
    assert(chunks >= 24, `a chunk per token (${chunks})`);
  }],

  ['completion: prompt as token ids', async () => {
    const r = await client.completions.create({ model, prompt: [1, 403, 407], max_tokens: 4, temperature: 0 });
    assertEq(r.usage.prompt_tokens, 3, 'prompt tokens');
  }],

  ['chat: non-streaming and streaming agree', async () => {
    const req = { model, messages: [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'Once upon a time' }],
      max_tokens: 20, temperature: 0 };
    const full = await client.chat.completions.create(req);
    assertEq(full.object, 'chat.completion', 'object');
    const msg = full.choices[0].message;
    assertEq(msg.role, 'assistant', 'role');
    assert(typeof msg.content === 'string', 'content');
    assert(['stop', 'length'].includes(full.choices[0].finish_reason), 'finish_reason');
    const stream = await client.chat.completions.create({ ...req, stream: true });
    let text = '', role = null, finish = null;
    for await (const ch of stream) {
      assertEq(ch.object, 'chat.completion.chunk', 'chunk object');
      for (const c of ch.choices) {
        if (c.delta.role) role = c.delta.role;
        if (c.delta.content) text += c.delta.content;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assertEq(role, 'assistant', 'delta role');
    assertEq(text, msg.content, 'streamed content');
    assertEq(finish, full.choices[0].finish_reason, 'finish_reason');
  }],

  ['n=2: two choices (seed, seed+1), streaming too', async () => {
    const req = { model, prompt: 'Once upon a time', max_tokens: 12, temperature: 1.0, seed: 42, n: 2 };
    const r = await client.completions.create(req);
    assertEq(r.choices.map((c) => c.index), [0, 1], 'indices');
    assertEq(r.usage.completion_tokens, 24, 'completion tokens summed');
    const again = await client.completions.create(req);
    assertEq(again.choices.map((c) => c.text), r.choices.map((c) => c.text), 'seeded sampling reproduces');
    const one = await client.completions.create({ ...req, n: 1, seed: 43 });
    assertEq(one.choices[0].text, r.choices[1].text, 'choice 1 used seed + 1');
    const texts = ['', ''];
    for await (const ch of await client.completions.create({ ...req, stream: true })) {
      for (const c of ch.choices) texts[c.index] += c.text;
    }
    assertEq(texts, r.choices.map((c) => c.text), 'streamed choices');
  }],

  ['logprobs: completions (int) and chat (bool + top_logprobs)', async () => {
    const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, logprobs: 3 });
    const lp = r.choices[0].logprobs;
    assertEq(lp.tokens.length, 8, 'a logprob per token');
    assertEq(lp.tokens.join(''), r.choices[0].text, 'tokens spell the text');
    for (let i = 0; i < 8; i++) {
      const top = Object.values(lp.top_logprobs[i]);
      assert(top.length >= 1 && top.length <= 3, 'top_logprobs size');
      assert(lp.token_logprobs[i] <= 0 && Math.abs(lp.token_logprobs[i] - Math.max(...top)) < 1e-4, 'greedy = top-1');
    }
    const c = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 6,
      temperature: 0, logprobs: true, top_logprobs: 2 });
    const content = c.choices[0].logprobs.content;
    assert(content.length >= 1, 'chat logprobs content');
    for (const e of content) {
      assertEq(e.top_logprobs.length, 2, 'two alternatives');
      assert(Array.isArray(e.bytes) && typeof e.token === 'string', 'token and bytes');
      assert(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-4, 'greedy = top-1');
    }
  }],

  ['stop: string and list, finish_reason stop, stop_reason the string (vLLM)', async () => {
    const base = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 40, temperature: 0 });
    const text = base.choices[0].text;
    const words = text.split(' ').filter((w) => w.length >= 3);
    assert(words.length >= 3, `enough words in '${text}'`);
    const stop = words[2];
    const cut = text.slice(0, text.indexOf(stop));
    for (const s of [stop, ['zzzz-not-there', stop]]) {
      const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 40, temperature: 0, stop: s });
      assertEq(r.choices[0].text, cut, 'text before the stop string');
      assertEq(r.choices[0].finish_reason, 'stop', 'finish_reason');
      assertEq(r.choices[0].stop_reason, stop, 'stop_reason: which string');
    }
    assertEq(base.choices[0].stop_reason, null, 'no stop string: null');
    let streamed = '', last = null;
    for await (const ch of await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 40, temperature: 0,
      stop, stream: true })) {
      streamed += ch.choices.map((c) => c.text).join('');
      if (ch.choices[0]?.finish_reason) last = ch.choices[0];
    }
    assertEq(streamed, cut, 'streamed text before the stop string');
    assertEq(last.stop_reason, stop, 'streamed stop_reason');
    const chat = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Once upon a time' }],
      max_tokens: 40, temperature: 0 });
    const ctext = chat.choices[0].message.content, cstop = ctext.split(' ').filter((w) => w.length >= 3)[1];
    if (cstop) {
      const c2 = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Once upon a time' }],
        max_tokens: 40, temperature: 0, stop: [cstop] });
      assertEq(c2.choices[0].stop_reason, cstop, 'chat stop_reason');
    }
  }],

  ['authentication: missing or wrong key -> 401', async () => {
    const bad = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
    let status = 0;
    try { await bad.completions.create({ model, prompt: 'x', max_tokens: 1 }); } catch (e) { status = e.status; }
    assertEq(status, 401, 'wrong key');
    await expectError(401, { headers: {}, body: '{"prompt":"x"}' }, 'no key');
    assertEq((await fetch(`${server.url}/metrics`)).status, 401, '/metrics needs the key too');
    assertEq((await fetch(`${server.url}/health`)).status, 200, '/health needs no key');
  }],

  ['bad requests get the right 4xx and the server keeps serving', async () => {
    await expectError(400, { body: '{"prompt": "x", "max_tokens": ' }, 'invalid JSON');
    await expectError(400, { body: '[1, 2]' }, 'not an object');
    const r = await expectError(400, { body: JSON.stringify({ model, prompt: 'x', max_tokens: 'ten' }) }, 'wrong type');
    assertEq(r.json.error.param, 'max_tokens', 'param');
    await expectError(400, { body: JSON.stringify({ model, prompt: 42 }) }, 'prompt type');
    await expectError(400, { body: JSON.stringify({ model, prompt: 'x', temperature: -1 }) }, 'temperature < 0');
    await expectError(400, { body: JSON.stringify({ model, prompt: 'x', max_tokens: -5 }) }, 'negative max_tokens');
    await expectError(400, { body: JSON.stringify({ model, prompt: 'x', stream: 'yes' }) }, 'stream type');
    await expectError(400, { body: JSON.stringify({ model, prompt: 'x', n: 0 }) }, 'n = 0');
    await expectError(400, { body: JSON.stringify({ model, prompt: [1, 999999] }) }, 'token id out of range');
    await expectError(400, { path: '/v1/chat/completions', body: JSON.stringify({ model, messages: [] }) }, 'no messages');
    await expectError(400, { path: '/v1/chat/completions', body: JSON.stringify({ model, messages: [{ role: 'user', content: [{ type: 'image_url' }] }] }) }, 'image part');
    const long = Array.from({ length: 3000 }, (_, i) => `word${i}`).join(' ');
    const ctx = await expectError(400, { body: JSON.stringify({ model, prompt: long, max_tokens: 4 }) }, 'prompt longer than the context');
    assertEq(ctx.json.error.code, 'context_length_exceeded', 'code');
    await expectError(413, { body: Buffer.alloc(10 * 1024 * 1024, 0x61) }, '10 MB body');
    const badUtf8 = Buffer.concat([Buffer.from('{"prompt": "'), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}')]);
    await expectError(400, { body: badUtf8 }, 'invalid UTF-8');
    await expectError(404, { path: '/v1/nothing', body: '{}' }, 'unknown route');
    await expectError(404, { body: JSON.stringify({ model: 'gpt-17', prompt: 'x' }) }, 'unknown model');
    const m = await expectError(405, { method: 'GET' }, 'GET on a POST route');
    assertEq(m.headers.allow, 'POST', 'Allow header');
  }],

  ['/metrics: every vLLM-style name, histograms complete', async () => {
    const m = await metrics(server.url, KEY);
    const names = ['kvllm:num_requests_running', 'kvllm:num_requests_waiting', 'kvllm:kv_cache_usage_perc',
      // counters: TYPE names the series as its samples do (text format 0.0.4, what promtool checks)
      'kvllm:prefix_cache_queries_total', 'kvllm:prefix_cache_hits_total', 'kvllm:num_preemptions_total',
      'kvllm:prompt_tokens_total', 'kvllm:generation_tokens_total', 'kvllm:request_success_total',
      'kvllm:time_to_first_token_seconds', 'kvllm:time_per_output_token_seconds',
      'kvllm:inter_token_latency_seconds', 'kvllm:e2e_request_latency_seconds', 'kvllm:request_queue_time_seconds',
      'kvllm:request_prefill_time_seconds', 'kvllm:request_decode_time_seconds', 'kvllm:kv_blocks_used',
      'kvllm:kv_blocks_cached', 'kvllm:kv_blocks_free'];
    for (const n of names) assert(m.text.includes(`# TYPE ${n} `), `TYPE line for ${n}`);
    for (const h of names.filter((n) => n.endsWith('_seconds'))) {
      assert(m.text.includes(`${h}_bucket{`) && m.text.includes('le="+Inf"'), `${h} buckets`);
      assert(m.has(`${h}_sum`) && m.has(`${h}_count`), `${h} sum/count`);
    }
    assert(m.text.includes('kvllm:time_to_first_token_seconds_bucket{model_name="stories260K",le="0.001"}'), 'vLLM TTFT bounds');
    assert(m.get('kvllm:prompt_tokens_total') > 0 && m.get('kvllm:generation_tokens_total') > 0, 'token counters');
    assert(m.get('kvllm:e2e_request_latency_seconds_count') > 0, 'e2e observed');
    assert(m.get('kvllm:kv_blocks_used') + m.get('kvllm:kv_blocks_free') + m.get('kvllm:kv_blocks_cached') > 0, 'block gauges');
  }],

  ['prefix cache: repeated prompt reports cached tokens, cache_salt isolates', async () => {
    // a fresh start, so that no earlier test's blocks match
    const prompt = `Zq${Date.now() % 100000} Once upon a time, there was a little girl named Lily. She loved to play outside in the sun `
      + 'with her friends. One day, she saw a big red ball in the park and ran to get it.';
    const ask = (extra = {}) => client.completions.create({ model, prompt, max_tokens: 8, temperature: 0, ...extra });
    const m0 = await metrics(server.url, KEY);
    const first = await ask();
    const second = await ask();
    const cached = second.usage.prompt_tokens_details.cached_tokens;
    assertEq(first.usage.prompt_tokens_details.cached_tokens, 0, 'first time: nothing cached');
    assert(cached > 0 && cached % 16 === 0 && cached < second.usage.prompt_tokens, `cached_tokens ${cached}`);
    assertEq(second.choices[0].text, first.choices[0].text, 'same output from cached blocks');
    const m1 = await metrics(server.url, KEY);
    assert(m1.get('kvllm:prefix_cache_hits_total') - m0.get('kvllm:prefix_cache_hits_total') >= cached, 'hits counted');
    assert(m1.get('kvllm:prefix_cache_queries_total') - m0.get('kvllm:prefix_cache_queries_total')
      >= 2 * second.usage.prompt_tokens - 2, 'queries counted');
    assert(m1.get('kvllm:kv_blocks_cached') > 0, 'blocks kept for the cache');
    const salted = await ask({ cache_salt: 'tenant-a' });
    assertEq(salted.usage.prompt_tokens_details.cached_tokens, 0, 'another salt does not see the blocks');
    const salted2 = await ask({ cache_salt: 'tenant-a' });
    assert(salted2.usage.prompt_tokens_details.cached_tokens > 0, 'the same salt does');
    assertEq(salted2.choices[0].text, first.choices[0].text, 'same output');
  }],

  ['100 clients disconnecting mid-stream return every block', async () => {
    const before = await waitMetrics(server.url, (m) => m.get('kvllm:num_requests_running') === 0, 10000, KEY);
    const used0 = before.get('kvllm:kv_blocks_used'), aborted0 = aborted(before);
    const body = (i) => JSON.stringify({ model, prompt: `Once upon a time ${i}`, max_tokens: 400, temperature: 0,
      ignore_eos: true, stream: true });
    let firstChunks = 0;
    const reqs = Array.from({ length: 100 }, (_, i) => new Promise((resolve) => {
      const req = http.request({ host: '127.0.0.1', port: server.port, path: '/v1/completions', method: 'POST',
        headers: { 'Content-Type': 'application/json', ...auth } }, (res) => {
        res.once('data', () => {
          firstChunks++;
          // half leave after the first chunk, half a little later
          setTimeout(() => { req.destroy(); resolve(); }, i % 2 ? 0 : 50);
        });
      });
      req.on('error', () => resolve());
      req.end(body(i));
      if (i % 10 === 9) setTimeout(() => { req.destroy(); resolve(); }, 5); // some leave before any token
    }));
    await Promise.all(reqs);
    assert(firstChunks > 0, 'some streams started');
    const after = await waitMetrics(server.url, (m) => m.get('kvllm:kv_blocks_used') === used0 &&
      m.get('kvllm:num_requests_running') === 0 && m.get('kvllm:num_requests_waiting') === 0, 15000, KEY);
    assertEq(after.get('kvllm:kv_blocks_used'), used0, 'kv_blocks_used back to where it started');
    assertEq(after.get('kvllm:num_requests_running'), 0, 'nothing running');
    assert(aborted(after) - aborted0 >= 80, `requests cancelled (${aborted(after) - aborted0})`);
    await stillServing();
  }],

  ['kvllm loadgen: streaming load, JSON report', async () => {
    const out = await new Promise((resolve, reject) => execFile(bin, ['loadgen', '--url', server.url, '--api-key', KEY,
      '--concurrency', '4', '--requests', '12', '--prompt-tokens', '24', '--shared-prefix', '8', '--max-tokens', '10',
      '--json'], { cwd: root }, (err, stdout, stderr) => (err ? reject(new Error(`${err}: ${stderr}`)) : resolve(stdout))));
    const r = JSON.parse(out);
    assertEq([r.completed, r.failed, r.total_output_tokens], [12, 0, 120], 'requests and tokens');
    for (const k of ['output_throughput', 'median_ttft_ms', 'p99_ttft_ms', 'median_tpot_ms', 'p95_itl_ms', 'p99_e2el_ms'])
      assert(r[k] > 0, `${k} = ${r[k]}`);
  }],
];

let failed = await runTests(tests);

// A full queue: one running sequence, no waiting room -> 503 with Retry-After.
const small = await startServer(bin, ['-m', MODEL, '-c', '512', '--max-seqs', '1', '--max-queue', '0', '--no-prefix-cache'],
  { cwd: root, name: 'queue' });
failed += await runTests([['full queue -> 503 with Retry-After', async () => {
  const ac = new AbortController();
  const first = await fetch(`${small.url}/v1/completions`, { method: 'POST', signal: ac.signal,
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once', max_tokens: 500, ignore_eos: true, stream: true }) });
  assertEq(first.status, 200, 'first request streams');
  const second = await rawRequest(small.url, { body: JSON.stringify({ prompt: 'Once', max_tokens: 4 }) });
  assertEq(second.status, 503, 'second request');
  assert(second.headers['retry-after'] !== undefined, 'Retry-After header');
  ac.abort();
  // the snapshot may predate the first request: wait for its cancellation itself
  const m = await waitMetrics(small.url, (x) => aborted(x) >= 1 && x.get('kvllm:num_requests_running') === 0);
  assertEq(aborted(m), 1, 'the abandoned stream was cancelled');
  const third = await rawRequest(small.url, { body: JSON.stringify({ prompt: 'Once', max_tokens: 4 }) });
  assertEq(third.status, 200, 'room again after the first one left');
}], ['--no-prefix-cache: nothing is ever cached', async () => {
  const body = JSON.stringify({ prompt: 'Once upon a time, there was a little girl named Lily who liked to play.', max_tokens: 2 });
  for (let i = 0; i < 2; i++) {
    const r = await rawRequest(small.url, { body });
    assertEq(r.json.usage.prompt_tokens_details.cached_tokens, 0, 'cached_tokens');
  }
  assertEq((await metrics(small.url)).get('kvllm:prefix_cache_hits_total'), 0, 'no hits');
}]]);

const codes = [await server.stop(), await small.stop()];
if (codes.some((c) => c !== 0)) {
  console.log(`server exit codes ${codes}; log:\n${server.log()}`);
  failed++;
}
process.exit(failed ? 1 : 0);
