// LoRA adapters over HTTP, through the official OpenAI client where a client
// would use it: llama.cpp's way (--lora, a request's "lora": [{id, scale}],
// GET / POST /lora-adapters) and vLLM's (--lora-modules NAME=FILE, "model":
// NAME, the adapters in /v1/models with their parent).
// - The adapter's greedy ids are those of `kvllm run --lora` (which the
//   llama.cpp golden llama-gqa-bpe-f32-lora_f32 checks), whichever way a
//   request names it; scale 0, the base model's; the server's scales follow
//   POST /lora-adapters; embeddings through an adapter differ from the base's.
// - The prefix cache never serves one adapter's blocks to another.
// - Errors: 400 naming the field, 404 for an unknown model.
// - vLLM's runtime adapters (VLLM_ALLOW_RUNTIME_LORA_UPDATING): /v1/load_lora_adapter and
//   /v1/unload_lora_adapter with vLLM's answers; an adapter in use stays (409).
// usage: node test_lora.mjs BUILD/kvllm REPO_ROOT
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, rawRequest, assert, assertEq, runTests, stopAll } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const MODELS = `${root}/tests/data/golden/models`;
const BASE = `${MODELS}/llama-gqa-bpe-f32.gguf`;
const ADAPTER = `${MODELS}/llama-gqa-bpe-f32-lora_f32.gguf`;
const srv = await startServer(bin, ['-m', BASE, '-c', '512', '--lora', ADAPTER, '--lora-init-without-apply',
  '--lora-modules', `tuned=${ADAPTER},half=${ADAPTER}`], { cwd: root, name: 'lora' });
const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'none', maxRetries: 0 });
const post = (path, body) => rawRequest(srv.url, { path, body: JSON.stringify(body) });
const get = (path) => rawRequest(srv.url, { method: 'GET', path });

const PROMPT = 'The quick brown fox jumps over the lazy dog. Once upon a time, in a small village by the sea, there lived a';
const N = 16;

// kvllm run's greedy ids for the prompt, with these flags
function cliIds(flags) {
  const out = execFileSync(bin, ['run', '-m', BASE, '-p', PROMPT, '-n', String(N), '--temp', '0', '--ignore-eos',
    '--json', '-c', '512', ...flags], { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  return out.split('\n').filter((l) => l.includes('"id"')).map((l) => JSON.parse(l).id);
}

async function ids(extra) {
  const r = await post('/v1/completions', { model: 'llama-gqa-bpe-f32', prompt: PROMPT, max_tokens: N, temperature: 0,
    ignore_eos: true, logprobs: 1, return_tokens_as_token_ids: true, ...extra });
  assertEq(r.status, 200, `completion ${JSON.stringify(extra)}: ${r.text}`);
  return { ids: r.json.choices[0].logprobs.tokens.map((t) => Number(t.slice('token_id:'.length))),
    cached: r.json.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

const withAdapter = cliIds(['--lora', ADAPTER]);
const plain = cliIds([]);

const failed = await runTests([
  ['the adapters are listed: /lora-adapters and /v1/models', async () => {
    const l = await get('/lora-adapters');
    assertEq(l.status, 200, l.text);
    assertEq(l.json.map((a) => [a.id, a.scale, a.name ?? '-', a.rank, a.alpha].join(':')).join(' '),
      '0:0:-:8:16 1:0:tuned:8:16 2:0:half:8:16', 'ids, scales (--lora-init-without-apply: 0), names, rank, alpha');
    assertEq(l.json[0].path, ADAPTER, 'path');
    const models = (await client.models.list()).data;
    assertEq(models.map((m) => m.id).join(), 'llama-gqa-bpe-f32,tuned,half', 'models.list');
    assertEq(models[1].parent, 'llama-gqa-bpe-f32', 'an adapter\'s parent');
    assertEq(models[1].root, ADAPTER, 'its file');
    assertEq((await client.models.retrieve('tuned')).id, 'tuned', 'models.retrieve an adapter');
  }],
  ['each way of naming the adapter gives kvllm run --lora\'s ids', async () => {
    assert(withAdapter.join() !== plain.join(), 'the adapter changes the output');
    assertEq((await ids({})).ids.join(), plain.join(), 'no adapter applied by default (scale 0)');
    assertEq((await ids({ lora: [{ id: 0, scale: 1 }] })).ids.join(), withAdapter.join(), '"lora": [{id 0, scale 1}]');
    assertEq((await ids({ model: 'tuned' })).ids.join(), withAdapter.join(), '"model": "tuned"');
    assertEq((await ids({ lora: [{ id: 2, scale: 1 }, { id: 0, scale: 0 }] })).ids.join(), withAdapter.join(), 'adapter 2');
    assertEq((await ids({ lora: [] })).ids.join(), plain.join(), 'an empty list: the server\'s (0)');
    const c = await client.completions.create({ model: 'tuned', prompt: PROMPT, max_tokens: N, temperature: 0,
      ignore_eos: true });
    const cli = execFileSync(bin, ['run', '-m', BASE, '-p', PROMPT, '-n', String(N), '--temp', '0', '--ignore-eos',
      '-c', '512', '--lora', ADAPTER], { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
    assert(cli.includes(c.choices[0].text), `the SDK's text ${JSON.stringify(c.choices[0].text)} in run's output`);
    const half = cliIds(['--lora-scaled', `${ADAPTER}:0.5`]);
    assertEq((await ids({ lora: [{ id: 1, scale: 0.5 }] })).ids.join(), half.join(), 'scale 0.5 = --lora-scaled :0.5');
  }],
  ['POST /lora-adapters sets the scales of requests that name none', async () => {
    const r = await post('/lora-adapters', [{ id: 0, scale: 1 }]);
    assertEq(r.status, 200, r.text);
    assertEq(r.json.success, true, 'success');
    assertEq((await get('/lora-adapters')).json.map((a) => a.scale).join(), '1,0,0', 'listed scales');
    assertEq((await ids({})).ids.join(), withAdapter.join(), 'applied by default now');
    assertEq((await ids({ model: 'half' })).ids.join(), withAdapter.join(), 'a named adapter: only it');
    assertEq((await ids({ lora: [{ id: 0, scale: 0 }] })).ids.join(), plain.join(), 'a request\'s own list still wins');
    assertEq((await ids({ lora: [] })).ids.join(), withAdapter.join(), 'an empty list: the server\'s scales (llama-server\'s rule)');
    assertEq((await post('/lora-adapters', [])).status, 200, 'all off');
    assertEq((await ids({})).ids.join(), plain.join(), 'off again');
  }],
  ['the prefix cache keeps adapters apart', async () => {
    const P = { prompt: `A new text. ${PROMPT} ${PROMPT} ${PROMPT}`, max_tokens: 2 }; // no earlier prefix
    const a = await ids({ ...P, lora: [{ id: 0, scale: 1 }] });
    const b = await ids({ ...P });
    const c = await ids({ ...P, lora: [{ id: 0, scale: 1 }] });
    const d = await ids({ ...P, lora: [{ id: 0, scale: 0.5 }] });
    assertEq(a.cached, 0, 'first');
    assertEq(b.cached, 0, 'without the adapter: nothing of its blocks');
    assert(c.cached >= 32, `the same adapter again: ${c.cached} cached`);
    assertEq(d.cached, 0, 'another scale: nothing');
  }],
  ['chat and embeddings through an adapter', async () => {
    const chat = await client.chat.completions.create({ model: 'tuned', messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 4, temperature: 0 });
    assertEq(chat.model, 'tuned', 'answered under the adapter\'s name, as vLLM does');
    const plainChat = await client.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 1 });
    assertEq(plainChat.model, 'llama-gqa-bpe-f32', 'and the base model under its own');
    const e1 = await client.embeddings.create({ model: 'llama-gqa-bpe-f32', input: 'hello there' });
    const e2 = await client.embeddings.create({ model: 'tuned', input: 'hello there' });
    const diff = e1.data[0].embedding.reduce((s, v, i) => s + Math.abs(v - e2.data[0].embedding[i]), 0);
    assert(diff > 0.01, `the adapter changes the embedding (${diff})`);
  }],
  ['bad requests: 400 naming the field, 404 for an unknown model', async () => {
    const cases = [
      [{ lora: [{ id: 3, scale: 1 }] }, 400, 'no such adapter'],
      [{ lora: [{ id: 0 }] }, 400, 'a number \'scale\''],
      [{ lora: [{ id: 0, scale: 1, x: 2 }] }, 400, 'unknown member'],
      [{ lora: { id: 0 } }, 400, 'must be an array'],
      [{ lora: [{ id: 0.5, scale: 1 }] }, 400, 'no such adapter'],
      [{ model: 'tuned', lora: [{ id: 1, scale: 1 }] }, 400, 'both given'],
      [{ model: 'nope' }, 404, 'does not exist'],
    ];
    for (const [body, status, text] of cases) {
      const r = await post('/v1/completions', { prompt: 'hi', max_tokens: 1, ...body });
      assertEq(r.status, status, `${JSON.stringify(body)}: ${r.text}`);
      assert(r.json.error.message.includes(text), `${JSON.stringify(body)}: ${r.json.error.message}`);
      if (status === 400) assertEq(r.json.error.param, 'lora', 'param');
    }
    const r = await post('/lora-adapters', { id: 0, scale: 1 });
    assertEq(r.status, 400, `POST /lora-adapters with an object: ${r.text}`);
    const big = await post('/lora-adapters', [{ id: 0, scale: 1e300 }]);
    assertEq(big.status, 400, 'a scale out of range');
  }],
]);

// vLLM's runtime adapters (VLLM_ALLOW_RUNTIME_LORA_UPDATING): a server started without any
const rt = await startServer(bin, ['-m', BASE, '-c', '512'], { cwd: root, name: 'lora-runtime',
  env: { VLLM_ALLOW_RUNTIME_LORA_UPDATING: 'True' } });
const rpost = (p, body) => rawRequest(rt.url, { path: p, body: typeof body === 'string' ? body : JSON.stringify(body) });
async function rtIds(extra) {
  const r = await rpost('/v1/completions', { model: 'llama-gqa-bpe-f32', prompt: PROMPT, max_tokens: N,
    temperature: 0, ignore_eos: true, logprobs: 1, return_tokens_as_token_ids: true, ...extra });
  return r.status === 200 ? r.json.choices[0].logprobs.tokens.map((t) => Number(t.slice('token_id:'.length))).join()
    : `${r.status} ${r.text}`;
}
const rtModels = async () => (await rawRequest(rt.url, { method: 'GET', path: '/v1/models' })).json.data.map((m) => m.id).join();

const failedRt = await runTests([
  ['without VLLM_ALLOW_RUNTIME_LORA_UPDATING the routes are not there', async () => {
    for (const p of ['/v1/load_lora_adapter', '/v1/unload_lora_adapter']) {
      const r = await post(p, { lora_name: 'x', lora_path: ADAPTER });
      assertEq(r.status, 404, `${p}: ${r.text}`);
      assert(r.json.error.message.includes('VLLM_ALLOW_RUNTIME_LORA_UPDATING'), r.json.error.message);
    }
  }],
  ['load, use, replace and unload an adapter at run time, as vLLM answers', async () => {
    assertEq(await rtModels(), 'llama-gqa-bpe-f32', 'no adapter yet');
    const r = await rpost('/v1/load_lora_adapter', { lora_name: 'sql', lora_path: ADAPTER });
    assertEq([r.status, r.text], [200, "Success: LoRA adapter 'sql' added successfully."], 'loaded');
    assertEq(await rtModels(), 'llama-gqa-bpe-f32,sql', 'listed in /v1/models');
    assertEq(await rtIds({ model: 'sql' }), withAdapter.join(), '"model": "sql" gives kvllm run --lora\'s ids');
    assertEq(await rtIds({}), plain.join(), 'the base model otherwise');
    const again = await rpost('/v1/load_lora_adapter', { lora_name: 'sql', lora_path: ADAPTER });
    assertEq(again.status, 400, again.text);
    assert(again.json.error.message.includes("The lora adapter 'sql' has already been loaded."), again.text);
    const inplace = await rpost('/v1/load_lora_adapter', { lora_name: 'sql', lora_path: ADAPTER, load_inplace: true });
    assertEq(inplace.status, 200, `load_inplace replaces it: ${inplace.text}`);
    assertEq(await rtIds({ model: 'sql' }), withAdapter.join(), 'the replaced adapter applies');
    const refused = await rpost('/v1/load_lora_adapter', { lora_name: 'sql', lora_path: BASE, load_inplace: true });
    assertEq(refused.status, 400, `not an adapter: ${refused.text}`);
    assertEq(await rtIds({ model: 'sql' }), withAdapter.join(), 'a refused replacement leaves the adapter in place');
    const u = await rpost('/v1/unload_lora_adapter', { lora_name: 'sql' });
    assertEq([u.status, u.text], [200, "Success: LoRA adapter 'sql' removed successfully."], 'unloaded');
    assertEq(await rtModels(), 'llama-gqa-bpe-f32', 'gone from /v1/models');
    assert((await rtIds({ model: 'sql' })).startsWith('404 '), 'its name is unknown now');
    const gone = await rpost('/v1/unload_lora_adapter', { lora_name: 'sql' });
    assertEq(gone.status, 404, gone.text);
    assert(gone.json.error.message.includes("The lora adapter 'sql' cannot be found."), gone.text);
    const l = await rawRequest(rt.url, { method: 'GET', path: '/lora-adapters' });
    assertEq(l.json.length, 0, `/lora-adapters lists no unloaded adapter: ${l.text}`);
    const old = await rpost('/v1/completions', { prompt: 'hi', max_tokens: 1, lora: [{ id: 0, scale: 1 }] });
    assertEq(old.status, 400, `an unloaded adapter's id: ${old.text}`);
    const again2 = await rpost('/v1/load_lora_adapter', { lora_name: 'sql2', lora_path: ADAPTER });
    assertEq(again2.status, 200, again2.text);
    assertEq(await rtIds({ model: 'sql2' }), withAdapter.join(), 'loaded again under another name');
  }],
  ['an adapter in use is not taken away (409), then is', async () => {
    let busy = false;
    for (let attempt = 0; attempt < 5 && !busy; attempt++) {
      const res = await fetch(`${rt.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'sql2', prompt: PROMPT, max_tokens: 450, ignore_eos: true, stream: true }) });
      const reader = res.body.getReader();
      await reader.read(); // the request runs
      const u = await rpost('/v1/unload_lora_adapter', { lora_name: 'sql2' });
      if (u.status === 409) {
        busy = true;
        assert(u.json.error.message.includes("The lora adapter 'sql2' is in use by 1 request"), u.text);
      } else assertEq(u.status, 200, `unloaded after the request ended: ${u.text}`);
      while (!(await reader.read()).done) { /* to its end */ }
      if (!busy) assertEq((await rpost('/v1/load_lora_adapter', { lora_name: 'sql2', lora_path: ADAPTER })).status, 200,
        'loaded again for another try');
    }
    assert(busy, 'a running request held the adapter in one of 5 tries');
    const u = await rpost('/v1/unload_lora_adapter', { lora_name: 'sql2' });
    assertEq(u.status, 200, `once the request has ended: ${u.text}`);
  }],
  ['bad loads: 400 naming the field', async () => {
    const fifo = path.join(mkdtempSync(path.join(tmpdir(), 'kvllm-lora-')), 'fifo');
    execFileSync('mkfifo', [fifo]);
    const cases = [
      [{ lora_name: 'a' }, 'lora_path', "Both 'lora_name' and 'lora_path' must be provided."],
      [{ lora_path: ADAPTER }, 'lora_name', "Both 'lora_name' and 'lora_path' must be provided."],
      [{ lora_name: 'a', lora_path: `${MODELS}/no-such.gguf` }, 'lora_path', 'no-such.gguf'],
      [{ lora_name: 'a', lora_path: BASE }, 'lora_path', 'adapter'],
      [{ lora_name: 'a', lora_path: ADAPTER, x: 1 }, 'x', 'unknown member'],
      [{ lora_name: 'llama-gqa-bpe-f32', lora_path: ADAPTER }, 'lora_name', 'own name'],
      [{ lora_name: 'a', lora_path: ADAPTER, load_inplace: 'yes' }, 'load_inplace', 'true or false'],
      [{ lora_name: 'a', lora_path: fifo }, 'lora_path', 'not a regular file'], // never waits on it
    ];
    for (const [body, param, text] of cases) {
      const r = await rpost('/v1/load_lora_adapter', body);
      assertEq([r.status, r.json?.error?.param], [400, param], `${JSON.stringify(body)}: ${r.text}`);
      assert(r.json.error.message.includes(text), `${JSON.stringify(body)}: ${r.json.error.message}`);
    }
    const u = await rpost('/v1/unload_lora_adapter', {});
    assertEq(u.status, 400, u.text);
    assert(u.json.error.message.includes("'lora_name' needs to be provided"), u.text);
    assertEq((await rpost('/v1/load_lora_adapter', '[1')).status, 400, 'not JSON');
    assertEq(await rtModels(), 'llama-gqa-bpe-f32', 'nothing was loaded by them');
    rmSync(path.dirname(fifo), { recursive: true });
  }],
]);

process.exit(failed || failedRt || (await stopAll([srv, rt])) ? 1 : 0);
