// llama-server's GET /slots over HTTP: one entry per slot (-np), idle ones
// with llama-server's four members, a running request's entry with its id,
// prompt counts, sampling parameters and next_token (an array of one object,
// as llama-server 81ff7abe answers); ?fail_on_no_slot=1 (503 when all are
// busy), --no-slots (501), POST /slots/{id}?action= (501), and the key rule
// of operational data (--api-key, --metrics-public).
// usage: node test_slots.mjs BUILD/kvllm REPO_ROOT
import { startServer, rawRequest, assert, assertEq, runTests, stopAll, sleep } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const MODEL = ['-m', 'models/stories260K.gguf', '-c', '512'];
const two = await startServer(bin, [...MODEL, '-np', '2'], { cwd: root, name: 'np2' });
const one = await startServer(bin, [...MODEL, '--parallel', '1'], { cwd: root, name: 'np1' });
const off = await startServer(bin, [...MODEL, '--no-slots'], { cwd: root, name: 'no-slots' });
const keyed = await startServer(bin, [...MODEL, '--api-key', 'k1'], { cwd: root, name: 'keyed' });
const pub = await startServer(bin, [...MODEL, '--api-key', 'k1', '--metrics-public'], { cwd: root, name: 'public' });

const get = (srv, p, headers = {}) => rawRequest(srv.url, { method: 'GET', path: p, headers });

// Polls /slots while a long streamed completion runs; the first answer that
// shows it running (the engine answers between two steps, so a poll can miss
// a short request: a few tries).
async function whileRunning(srv, body, query = '') {
  for (let attempt = 0; attempt < 5; attempt++) {
    const ctl = new AbortController();
    const res = await fetch(`${srv.url}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: ctl.signal,
      body: JSON.stringify({ ...body, stream: true }),
    });
    const reader = res.body.getReader();
    await reader.read(); /* the first chunk: the request is admitted */
    let seen = null;
    for (let i = 0; i < 200 && !seen; i++) {
      const r = await get(srv, `/slots${query}`);
      if (r.status !== 200) { seen = r; break; }
      if (r.json.some((s) => s.is_processing)) seen = r;
    }
    ctl.abort();
    await reader.cancel().catch(() => {});
    if (seen) return seen;
    await sleep(50);
  }
  throw new Error('never saw the request running');
}

const tests = [
  ['idle: one entry per slot, llama-server\'s four members', async () => {
    const props = (await get(two, '/props')).json;
    assertEq([props.total_slots, props.endpoint_slots], [2, true], '/props');
    const r = await get(two, '/slots');
    assertEq(r.status, 200, 'status');
    assertEq(r.json, [0, 1].map((id) => ({ id, n_ctx: props.n_ctx, speculative: false, is_processing: false })),
      'idle slots');
  }],

  ['a running request: its id, prompt counts, sampling and progress', async () => {
    const body = { prompt: 'Once upon a time there was', max_tokens: 400, temperature: 0.7, seed: 42,
      top_k: 17, top_p: 0.9, presence_penalty: 0.25, logprobs: 2, ignore_eos: true };
    const r = await whileRunning(two, body);
    const busy = r.json.filter((s) => s.is_processing);
    assertEq(busy.length, 1, 'one slot busy');
    const s = busy[0];
    assertEq(s.id, 0, 'the first slot');
    assert(Number.isInteger(s.id_task) && s.id_task >= 0, `id_task ${s.id_task}`);
    const tok = (await rawRequest(two.url, { path: '/tokenize', body: JSON.stringify({ content: body.prompt, add_special: true }) })).json;
    assertEq(s.n_prompt_tokens, tok.tokens.length, 'n_prompt_tokens: the prompt with its BOS');
    assertEq(s.n_prompt_tokens_processed + s.n_prompt_tokens_cache, s.n_prompt_tokens, 'processed + cached');
    const p = s.params;
    assertEq([p.n_predict, p.max_tokens, p.seed, p.top_k, p.n_probs, p.ignore_eos], [400, 400, 42, 17, 2, true], 'params');
    assert(Math.abs(p.temperature - 0.7) < 1e-6 && Math.abs(p.top_p - 0.9) < 1e-6 &&
      Math.abs(p.presence_penalty - 0.25) < 1e-6, `float params ${JSON.stringify(p)}`);
    assertEq([p.mirostat, p.typical_p], [0, 1], 'mirostat and typical sampling off by default');
    assert(Array.isArray(s.next_token) && s.next_token.length === 1, 'next_token: an array of one');
    const nt = s.next_token[0];
    assert(nt.has_next_token === true && typeof nt.has_new_line === 'boolean', `next_token ${JSON.stringify(nt)}`);
    assert(nt.n_decoded >= 0 && nt.n_decoded <= 400 && nt.n_remain === 400 - nt.n_decoded,
      `n_decoded ${nt.n_decoded}, n_remain ${nt.n_remain}`);
    assertEq(r.json[1], { id: 1, n_ctx: s.n_ctx, speculative: false, is_processing: false }, 'the other slot idle');
  }],

  ['?fail_on_no_slot=1: 503 while the only slot is busy, 200 when it is free', async () => {
    const idle = await get(one, '/slots?fail_on_no_slot=1');
    assertEq([idle.status, idle.json.length], [200, 1], 'idle');
    const r = await whileRunning(one, { prompt: 'Once', max_tokens: 400, ignore_eos: true }, '?fail_on_no_slot=1');
    assertEq(r.status, 503, `busy: ${r.text.slice(0, 200)}`);
    assertEq([r.json.error.message, r.json.error.type], ['no slot available', 'unavailable_error'], 'error');
  }],

  ['--no-slots: 501 as llama-server; POST /slots/{id}?action=: 501 naming the alternative', async () => {
    const r = await get(off, '/slots');
    assertEq([r.status, r.json.error.type], [501, 'not_supported_error'], 'no-slots');
    assertEq((await get(off, '/props')).json.endpoint_slots, false, '/props endpoint_slots');
    for (const action of ['save', 'restore', 'erase']) {
      const a = await rawRequest(two.url, { path: `/slots/0?action=${action}`, body: JSON.stringify({ filename: 'x.bin' }) });
      assertEq([a.status, a.json.error.type], [501, 'not_supported_error'], action);
      assert(a.json.error.message.includes('/v1/kv/save'), `names /v1/kv/save: ${a.json.error.message}`);
    }
  }],

  ['operational data: a key unless --metrics-public', async () => {
    assertEq((await get(keyed, '/slots')).status, 401, 'no key');
    assertEq((await get(keyed, '/slots', { Authorization: 'Bearer k1' })).status, 200, 'the key');
    assertEq((await get(pub, '/slots')).status, 200, '--metrics-public');
  }],
];

const failed = await runTests(tests);
const bad = await stopAll([two, one, off, keyed, pub]);
process.exit(failed || bad ? 1 : 0);
