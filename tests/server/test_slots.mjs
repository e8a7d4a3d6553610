// llama-server's GET /slots over HTTP: one entry per slot (-np), idle ones
// with llama-server's four members, a running request's entry with its id,
// prompt counts, sampling parameters and next_token (an array of one object,
// as llama-server 81ff7abe answers); ?fail_on_no_slot=1 (503 when all are
// busy), --no-slots (501), the key rule of operational data (--api-key,
// --metrics-public), and the slot actions POST /slots/{id}?action=save|
// restore|erase with --slot-save-path: a slot's KV saved by one server and
// restored by another serves the same prompt from the cache with the same
// output; an action on a running slot waits for its request; bad names,
// actions, slot ids and files are 400s that do not show the server's paths;
// another tenant's slot is a 403; without --slot-save-path, 501.
// usage: node test_slots.mjs BUILD/kvllm REPO_ROOT
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, rawRequest, assert, assertEq, runTests, stopAll, sleep } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const MODEL = ['-m', 'models/stories260K.gguf', '-c', '512'];
const two = await startServer(bin, [...MODEL, '-np', '2'], { cwd: root, name: 'np2' });
const one = await startServer(bin, [...MODEL, '--parallel', '1'], { cwd: root, name: 'np1' });
const off = await startServer(bin, [...MODEL, '--no-slots'], { cwd: root, name: 'no-slots' });
const keyed = await startServer(bin, [...MODEL, '--api-key', 'k1'], { cwd: root, name: 'keyed' });
const pub = await startServer(bin, [...MODEL, '--api-key', 'k1', '--metrics-public'], { cwd: root, name: 'public' });
const dir = mkdtempSync(join(tmpdir(), 'kvllm-slots-'));
const keyFile = join(dir, 'keys.txt');
writeFileSync(keyFile, 'key-alice alice\nkey-bob bob\n');
const SAVE = ['--slot-save-path', dir];
const saver = await startServer(bin, [...MODEL, '-np', '2', '-v', ...SAVE], { cwd: root, name: 'saver' });
const tenants = await startServer(bin, [...MODEL, '--api-key-file', keyFile, ...SAVE], { cwd: root, name: 'slot-tenants' });
const slotAct = (srv, id, action, body, headers = {}) => rawRequest(srv.url, {
  path: `/slots/${id}?action=${action}`, headers, body: body === undefined ? '' : JSON.stringify(body) });
const PROMPT = 'Once upon a time there was a little girl named Lily. She loved to play outside in the park with her friends every single day.';
const complete = (srv, prompt, extra = {}, headers = {}) => rawRequest(srv.url, { path: '/completion', headers,
  body: JSON.stringify({ prompt, n_predict: 8, temperature: 0, ...extra }) });

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

  ['--no-slots: 501 as llama-server; slot actions without --slot-save-path: 501 naming it', async () => {
    const r = await get(off, '/slots');
    assertEq([r.status, r.json.error.type], [501, 'not_supported_error'], 'no-slots');
    assertEq((await get(off, '/props')).json.endpoint_slots, false, '/props endpoint_slots');
    for (const action of ['save', 'restore', 'erase']) {
      const a = await rawRequest(two.url, { path: `/slots/0?action=${action}`, body: JSON.stringify({ filename: 'x.bin' }) });
      assertEq([a.status, a.json.error.type], [501, 'not_supported_error'], action);
      assert(a.json.error.message.includes('--slot-save-path'), `names --slot-save-path: ${a.json.error.message}`);
    }
  }],

  ['save, erase, and restore into another server: the prompt comes from the cache, the output is the same', async () => {
    const first = await complete(saver, PROMPT);
    assertEq(first.status, 200, `completion: ${first.text.slice(0, 200)}`);
    const nPrompt = first.json.tokens_evaluated, nGen = first.json.tokens_predicted;
    const saved = await slotAct(saver, 0, 'save', { filename: 'lily.bin' });
    assertEq(saved.status, 200, `save: ${saved.text}`);
    const held = nPrompt + nGen - 1; /* the last id was sampled, never fed back */
    assertEq([saved.json.id_slot, saved.json.filename, saved.json.n_saved], [0, 'lily.bin', Math.floor(held / 16) * 16],
      `save answer ${saved.text}`);
    assertEq(saved.json.n_written, statSync(join(dir, 'lily.bin')).size, 'n_written: the file\'s size');
    assert(saved.json.timings.save_ms >= 0, 'timings.save_ms');
    assertEq(readdirSync(dir).filter((f) => f.endsWith('.tmp')), [], 'no temporary left');
    const erased = await slotAct(saver, 0, 'erase');
    assertEq([erased.status, erased.json.id_slot, erased.json.n_erased], [200, 0, held], `erase ${erased.text}`);
    const again = await slotAct(saver, 0, 'save', { filename: 'none.bin' });
    assertEq(again.status, 400, 'an erased slot has nothing to save');

    const other = await startServer(bin, [...MODEL, ...SAVE], { cwd: root, name: 'restorer' });
    try {
      const restored = await slotAct(other, 1, 'restore', { filename: 'lily.bin' });
      assertEq(restored.status, 200, `restore: ${restored.text}`);
      assertEq([restored.json.id_slot, restored.json.filename, restored.json.n_restored, restored.json.n_read],
        [1, 'lily.bin', saved.json.n_saved, saved.json.n_written], 'restore answer');
      const r = await complete(other, PROMPT);
      assertEq(r.json.content, first.json.content, 'the same greedy text after the restore');
      assert(r.json.timings.cache_n >= 16, `the prompt found ${r.json.timings.cache_n} tokens cached`);
      /* the conversation goes on: all of the saved tokens come from the cache */
      const more = await complete(other, PROMPT + first.json.content);
      assertEq(more.json.timings.cache_n, saved.json.n_saved, 'the follow-up\'s cached tokens');
    } finally {
      await other.stop();
    }
  }],

  ['/completion\'s id_slot picks the slot (when idle) and the answer names it', async () => {
    const r = await complete(saver, PROMPT, { id_slot: 1, n_predict: 4 });
    assertEq([r.status, r.json.id_slot], [200, 1], `id_slot 1: ${r.text.slice(0, 200)}`);
    const saved = await slotAct(saver, 1, 'save', { filename: 'one.bin' });
    assertEq(saved.json.n_saved, Math.floor((r.json.tokens_evaluated + 3) / 16) * 16, `slot 1 holds it: ${saved.text}`);
    assertEq((await complete(saver, PROMPT, { n_predict: 2 })).json.id_slot, 0, 'no id_slot: the first idle');
    for (const id_slot of [2, -2, 'x']) {
      const bad = await complete(saver, PROMPT, { id_slot });
      assertEq(bad.status, 400, `id_slot ${id_slot}: ${bad.text.slice(0, 200)}`);
    }
  }],

  ['an action on a running slot waits for its request to end', async () => {
    const prompt = 'Once upon a time';
    const tok = (await rawRequest(saver.url, { path: '/tokenize', body: JSON.stringify({ content: prompt, add_special: true }) })).json;
    for (let attempt = 0; ; attempt++) {
      const ctl = new AbortController();
      const res = await fetch(`${saver.url}/completion`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: ctl.signal,
        body: JSON.stringify({ prompt, n_predict: 400, ignore_eos: true, stream: true, temperature: 0 }),
      });
      const reader = res.body.getReader();
      await reader.read(); /* admitted: it runs on slot 0 */
      const before = (saver.log().match(/slot 0 is busy/g) || []).length;
      const saved = await slotAct(saver, 0, 'save', { filename: 'busy.bin' });
      for (;;) if ((await reader.read()).done) break;
      assertEq(saved.status, 200, `save: ${saved.text}`);
      assertEq(saved.json.n_saved, Math.floor((tok.tokens.length + 399) / 16) * 16, 'saved after all 400 tokens');
      if ((saver.log().match(/slot 0 is busy/g) || []).length > before) break; /* it waited */
      assert(attempt < 4, 'the request always ended before the save arrived');
    }
  }],

  ['bad names, actions, slot ids and files: 400s that name the file, not the server\'s directory', async () => {
    for (const filename of ['../x.bin', 'a/b.bin', '', ' x.bin', 'x.', '..', 'a\\b', 'a\u0001b', 'x'.repeat(256)]) {
      const r = await slotAct(saver, 0, 'save', { filename });
      assertEq([r.status, r.json.error.type], [400, 'invalid_request_error'], `filename ${JSON.stringify(filename)}`);
    }
    assertEq((await slotAct(saver, 0, 'save', {})).status, 400, 'no filename');
    const extra = await slotAct(saver, 0, 'save', { filename: 'x.bin', compress: true });
    assertEq([extra.status, extra.json.error.param], [400, 'compress'], 'an unknown field');
    assertEq((await rawRequest(saver.url, { path: '/slots/0?action=save', body: '["x.bin"]' })).status, 400, 'an array');
    assertEq((await slotAct(saver, 0, 'save', { filename: 3 })).status, 400, 'a number');
    assertEq((await slotAct(saver, 0, 'dump', { filename: 'x.bin' })).status, 400, 'an unknown action');
    assertEq((await slotAct(saver, 0, '', { filename: 'x.bin' })).status, 400, 'no action');
    assertEq((await slotAct(saver, 2, 'erase')).status, 400, 'slot 2 of 2');
    assertEq((await slotAct(saver, 'x', 'erase')).status, 400, 'slot x');
    assertEq((await slotAct(saver, -1, 'erase')).status, 400, 'slot -1');
    const missing = await slotAct(saver, 0, 'restore', { filename: 'missing.bin' });
    assertEq(missing.status, 400, 'a missing file');
    assert(missing.json.error.message.includes('missing.bin') && !missing.json.error.message.includes(dir),
      `the file named, the directory not: ${missing.json.error.message}`);
    writeFileSync(join(dir, 'junk.bin'), 'not a slot file at all, but long enough to hold a header'.repeat(8));
    const junk = await slotAct(saver, 0, 'restore', { filename: 'junk.bin' });
    assert(junk.status === 400 && junk.json.error.message.includes('not a kvllm slot file'), junk.text);
    const tiny = await startServer(bin, ['-m', 'tests/data/llama-2-tiny-random.gguf', '-c', '256', ...SAVE],
      { cwd: root, name: 'tiny' });
    try {
      const r = await slotAct(tiny, 0, 'restore', { filename: 'lily.bin' });
      assert(r.status === 400 && r.json.error.message.includes('another model file'), r.text);
    } finally {
      await tiny.stop();
    }
    // the same model with a control vector computes other K and V: its identity differs
    const cvec = join(dir, 'cvec.gguf');
    execFileSync('python3', ['-c', 'import sys; sys.path.insert(0, sys.argv[1]); import cvec_check as c; ' +
      'c.write_cvec(sys.argv[2], [("direction.1", [0.25] * 64)])', join(root, 'tests'), cvec]);
    const steered = await startServer(bin, [...MODEL, '--control-vector', cvec, ...SAVE], { cwd: root, name: 'steered' });
    try {
      const r = await slotAct(steered, 0, 'restore', { filename: 'lily.bin' });
      assert(r.status === 400 && r.json.error.message.includes('another model file'), `with a control vector: ${r.text}`);
    } finally {
      await steered.stop();
    }
  }],

  ['a slot belongs to the tenant whose request left it', async () => {
    const alice = { Authorization: 'Bearer key-alice' }, bob = { Authorization: 'Bearer key-bob' };
    assertEq((await complete(tenants, PROMPT, {}, alice)).status, 200, 'alice\'s request');
    const r = await slotAct(tenants, 0, 'save', { filename: 'alice.bin' }, bob);
    assertEq(r.status, 403, `bob saving alice's slot: ${r.text}`);
    assertEq((await slotAct(tenants, 0, 'erase', undefined, bob)).status, 403, 'bob erasing it');
    assertEq((await slotAct(tenants, 0, 'save', { filename: 'alice.bin' }, alice)).status, 200, 'alice saving it');
    assertEq((await slotAct(tenants, 0, 'save', { filename: 'alice.bin' })).status, 401, 'no key');
  }],

  ['--slot-save-path must be a directory the server can write in', async () => {
    const r = spawnSync(bin, ['serve', '-m', 'models/stories260K.gguf', '--slot-save-path', join(dir, 'nope')],
      { cwd: root, encoding: 'utf8', timeout: 30000 });
    assert(r.status === 2 && r.stderr.includes('--slot-save-path') && r.stderr.includes('nope'),
      `exit ${r.status}: ${r.stderr}`);
  }],

  ['operational data: a key unless --metrics-public', async () => {
    assertEq((await get(keyed, '/slots')).status, 401, 'no key');
    assertEq((await get(keyed, '/slots', { Authorization: 'Bearer k1' })).status, 200, 'the key');
    assertEq((await get(pub, '/slots')).status, 200, '--metrics-public');
  }],
];

const failed = await runTests(tests);
const bad = await stopAll([two, one, off, keyed, pub, saver, tenants]);
rmSync(dir, { recursive: true, force: true });
process.exit(failed || bad ? 1 : 0);
