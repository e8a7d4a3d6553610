// The endpoints besides generation and the request-field rules, over HTTP:
// /v1/models/{id} (the SDK's models.retrieve), /tokenize and /detokenize
// against llama.cpp's tokenization of the golden model, /v1/embeddings through
// the OpenAI client, /props, CORS (--cors) and its absence, unknown request
// fields refused with a 400 naming them, the documented ignored fields
// accepted, /metrics checked as promtool checks it (check_metrics.py), and
// every route under --api-prefix (llama-server's), the OpenAI client included.
// usage: node test_endpoints.mjs BUILD/kvllm REPO_ROOT
import OpenAI from 'openai';
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { startServer, rawRequest, assert, assertEq, runTests } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const GOLDEN = 'tests/data/golden/qwen3-f32';
const ORIGIN = 'https://app.example';
const golden = JSON.parse(readFileSync(path.join(root, GOLDEN, 'tokenize.json'), 'utf8'));

// qwen3-f32: llama.cpp's tokenization is known for it; stories260K: a BOS-adding vocabulary, no CORS.
const server = await startServer(bin, ['-m', 'tests/data/golden/models/qwen3-f32.gguf', '-c', '512', '--cors', ORIGIN],
  { cwd: root, name: 'qwen3' });
const small = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '256'], { cwd: root, name: 'stories' });
const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const model = (await client.models.list()).data[0].id;
const props = await (await fetch(`${server.url}/props`)).json();

const post = (srv, p, body) => rawRequest(srv.url, { path: p, body: JSON.stringify(body) });

async function expect400(p, body, param, what) {
  const r = await post(server, p, body);
  assert(r.status === 400, `${what}: status ${r.status} (${r.text.slice(0, 200)})`);
  assertEq(r.json.error.param, param, `${what}: param`);
  return r;
}

// The OpenAI client's error for a request (status, param, code).
async function sdkError(fn) {
  try {
    await fn();
  } catch (e) {
    return e;
  }
  throw new Error('the request succeeded, an error was expected');
}

const utf8 = (s) => Buffer.from(s, 'utf8');
/* fn(server) on a server of its own started with args (stopped afterwards, whatever fn does) */
const withServer = async (args, name, fn) => {
  const srv = await startServer(bin, args, { cwd: root, name });
  try {
    return await fn(srv);
  } finally {
    await srv.stop();
  }
};
const STORIES = ['-m', 'models/stories260K.gguf', '-c', '256'];
/* check_metrics.py's verdict on a scrape (its output; throws with the problems), through a
 * temporary file removed afterwards */
const checkMetrics = (text) => {
  const dir = mkdtempSync(path.join(tmpdir(), 'kvllm-metrics-'));
  const file = path.join(dir, 'metrics.txt');
  writeFileSync(file, text);
  try {
    return execFileSync('python3', [path.join(root, 'tests/server/check_metrics.py'), file], { encoding: 'utf8' });
  } catch (e) {
    throw new Error(`check_metrics.py:\n${e.stdout}${e.stderr}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
};
const norm = (v) => Math.sqrt(v.reduce((a, x) => a + x * x, 0));

const tests = [
  ['models.retrieve: the served model, 404 for others', async () => {
    const m = await client.models.retrieve(model);
    assertEq([m.id, m.object, m.owned_by], [model, 'model', 'kvllm'], 'model object');
    assertEq(m.max_model_len, 512, 'max_model_len');
    const e = await sdkError(() => client.models.retrieve('no-such-model'));
    assertEq([e.status, e.code, e.param], [404, 'model_not_found', 'model'], 'unknown model');
  }],

  ['/v1/models: llama-server\'s "meta" of the model (as it answered on the same files) and its Ollama-style "models"', async () => {
    const rec = JSON.parse(readFileSync(path.join(root, 'tests/data/llama_server/models.json'), 'utf8'));
    for (const c of rec.cases) {
      await withServer(['-m', c.model, '-c', '512'], 'models-meta', async (srv) => {
        const got = await (await fetch(`${srv.url}/v1/models`)).json();
        assertEq(got.data[0].meta, c.answer.data[0].meta, `${c.model}: meta`);
        assertEq(Object.keys(got.data[0]).filter((k) => k in c.answer.data[0]).sort(),
          ['aliases', 'created', 'id', 'meta', 'object', 'owned_by', 'tags'], `${c.model}: llama-server's members`);
        assertEq([got.data[0].aliases, got.data[0].tags], [[got.data[0].id], []], `${c.model}: its name, no tags`);
        const o = got.models?.[0];
        assert(o && o.name === got.data[0].id && o.model === o.name && o.details.format === 'gguf' &&
          o.capabilities.includes('completion'), `${c.model}: models[0] ${JSON.stringify(o)}`);
        assertEq(o.size, c.answer.data[0].meta.size, `${c.model}: models[0].size in bytes`);
      });
    }
  }],

  ['llama-server\'s paths without /v1: a client whose base URL is the bare host', async () => {
    const bare = new OpenAI({ baseURL: server.url, apiKey: 'none', maxRetries: 0, timeout: 60000 });
    assertEq((await bare.models.list()).data[0].id, model, '/models');
    const req = { model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, temperature: 0 };
    const a = await bare.chat.completions.create(req), b = await client.chat.completions.create(req);
    assertEq(a.choices[0].message.content, b.choices[0].message.content, '/chat/completions = /v1/chat/completions');
    const r = await bare.responses.create({ model, input: 'Hi', max_output_tokens: 4, temperature: 0 });
    assertEq(r.object, 'response', '/responses');
    assertEq((await fetch(`${server.url}/v1/health`)).status, 200, '/v1/health');
    // vLLM's /ping (GET and POST) and /version
    assertEq((await fetch(`${server.url}/ping`)).status, 200, 'GET /ping');
    assertEq((await fetch(`${server.url}/ping`, { method: 'POST' })).status, 200, 'POST /ping');
    const version = execFileSync(bin, ['--version'], { encoding: 'utf8' }).trim().split(' ').pop();
    assertEq(await (await fetch(`${server.url}/version`)).json(), { version }, '/version: kvllm --version\'s');
  }],

  ['unknown request fields: 400 naming them', async () => {
    const base = { model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 };
    const e = await sdkError(() => client.chat.completions.create({ ...base, frobnicate: 1 }));
    assertEq([e.status, e.param], [400, 'frobnicate'], 'chat: unknown field');
    assert(/frobnicate/.test(e.message), 'the message names it');
    await expect400('/v1/completions', { model, prompt: 'a', suffix: 'b' }, 'suffix', 'completions: suffix');
    await expect400('/v1/completions', { model, prompt: 'a', max_completion_tokens: 2 }, 'max_completion_tokens',
      'completions: a chat-only field');
    await expect400('/v1/completions', { model, prompt: 'a', messages: [] }, 'messages', 'completions: messages');
    await expect400('/v1/chat/completions', { ...base, max_completion_tokens: 3, max_tokens: 'x' }, 'max_tokens',
      'chat: max_tokens beside max_completion_tokens is still checked');
    await expect400('/v1/chat/completions', { ...base, functions: [{ name: 'f' }] }, 'functions', 'legacy functions');
    await expect400('/v1/chat/completions', { ...base, audio: { voice: 'x' } }, 'audio', 'audio output');
    const r = await expect400('/v1/chat/completions', { ...base, messages: [{ role: 'user', content: 'Hi', weird: 1 }] },
      'messages', 'message field');
    assert(/messages\[0\]\.weird/.test(r.json.error.message), 'message field named');
    await expect400('/v1/chat/completions', { ...base, stream: true, stream_options: { include_usage: true, foo: 1 } },
      'stream_options', 'stream_options field');
    await expect400('/tokenize', { content: 'a', foo: 1 }, 'foo', '/tokenize field');
    await expect400('/v1/embeddings', { input: 'a', foo: 1 }, 'foo', '/v1/embeddings field');
  }],

  ['accepted and ignored fields; null fields; message fields the SDKs echo', async () => {
    const r = await client.chat.completions.create({
      model, max_tokens: 2, temperature: 0, user: 'u1', metadata: { k: 'v' }, store: false, service_tier: 'auto',
      prompt_cache_key: 'k', safety_identifier: 's', some_future_field: null,
      stream_options: null,
      messages: [{ role: 'user', content: 'Hi', name: 'ann' },
        { role: 'assistant', content: 'Hello', refusal: null, annotations: [] }, { role: 'user', content: 'Again' }],
    });
    assert(r.choices[0].message.role === 'assistant', 'answered');
    const c = await client.completions.create({ model, prompt: 'a', max_tokens: 2, user: 'u1', echo: false, best_of: 1 });
    assert(typeof c.choices[0].text === 'string', 'completions answered');
  }],

  ['/tokenize: llama.cpp ids for every golden case; /detokenize gives the text back', async () => {
    for (const c of golden.cases) {
      const r = await post(server, '/tokenize', { content: c.text, add_special: c.bos_added, parse_special: c.parse_special });
      assertEq(r.status, 200, `${c.name}: status`);
      assertEq(r.json.tokens, c.ids, `${c.name}: ids`);
      const d = await post(server, '/detokenize', { tokens: c.ids });
      assertEq(d.json.content, c.text, `${c.name}: detokenize`);
    }
  }],

  ['vLLM\'s /tokenize (prompt or messages) and /detokenize answer', async () => {
    const text = golden.cases[0].text;
    const llama = await post(server, '/tokenize', { content: text, add_special: true });
    const v = await post(server, '/tokenize', { prompt: text, return_token_strs: true });
    assertEq(v.status, 200, v.text.slice(0, 200));
    assertEq(JSON.stringify(v.json.tokens), JSON.stringify(llama.json.tokens), 'the same ids as llama\'s shape');
    assertEq([v.json.count, v.json.max_model_len], [llama.json.tokens.length, 512], 'count, max_model_len');
    assertEq(v.json.token_strs.length, v.json.count, 'token_strs');
    const msgs = [{ role: 'user', content: 'Hello there' }];
    const chat = await post(server, '/v1/chat/completions', { messages: msgs, max_tokens: 1 });
    const vt = await post(server, '/tokenize', { messages: msgs });
    assertEq(vt.json.count, chat.json.usage.prompt_tokens, 'messages: the chat prompt');
    assertEq(vt.json.token_strs, null, 'token_strs null unless asked');
    const d = await post(server, '/detokenize', { tokens: v.json.tokens });
    assertEq([d.json.prompt, d.json.content], [text, text], 'detokenize: vLLM\'s prompt and llama\'s content');
  }],

  ['/tokenize with_pieces: strings, or bytes where a piece is not UTF-8', async () => {
    let sawBytes = false;
    for (const c of golden.cases) {
      const r = await post(server, '/tokenize', { content: c.text, with_pieces: true, parse_special: c.parse_special });
      assertEq(r.json.tokens.map((t) => t.id), c.ids, `${c.name}: ids`);
      const parts = r.json.tokens.map((t) => {
        if (typeof t.piece === 'string') return utf8(t.piece);
        sawBytes = true;
        assert(Array.isArray(t.piece) && t.piece.every((b) => b >= 0 && b < 256), 'byte array');
        assert(!utf8(Buffer.from(t.piece).toString('utf8')).equals(Buffer.from(t.piece)), 'bytes only when not UTF-8');
        return Buffer.from(t.piece);
      });
      assert(Buffer.concat(parts).equals(utf8(c.text)), `${c.name}: pieces spell the text`);
    }
    assert(sawBytes, 'the emoji and CJK cases split characters across tokens');
  }],

  ['/tokenize add_special adds BOS where the vocabulary does', async () => {
    const plain = await post(small, '/tokenize', { content: 'Once upon a time' });
    const withBos = await post(small, '/tokenize', { content: 'Once upon a time', add_special: true });
    const p = await (await fetch(`${small.url}/props`)).json();
    assertEq(p.bos_token, '<s>', 'stories260K BOS');
    assertEq(withBos.json.tokens, [1, ...plain.json.tokens], 'BOS id 1 first');
    const bad = await post(small, '/detokenize', { tokens: [1, 999999] });
    assertEq([bad.status, bad.json.error.param], [400, 'tokens'], 'id out of the vocabulary');
  }],

  ['/props: model, context, template source, build, BOS/EOS', async () => {
    assertEq(props.model, model, 'model');
    assertEq(props.model_path, 'tests/data/golden/models/qwen3-f32.gguf', 'model_path');
    assertEq([props.n_ctx, props.default_generation_settings.n_ctx], [512, 512], 'n_ctx');
    assert(/^kvllm \d/.test(props.build_info), `build_info ${props.build_info}`);
    assert(typeof props.eos_token === 'string' && props.eos_token.length > 0, 'eos_token');
    assert(['gguf', 'builtin:chatml'].includes(props.chat_template_source), `source ${props.chat_template_source}`);
    assert(props.n_embd > 0, 'n_embd');
    // what llama.cpp's web UI reads besides (llama-server 81ff7abe's values on this file)
    assertEq([props.model_alias, props.model_ftype, props.modalities, props.ui, props.ui_settings, props.is_sleeping,
      props.cors_proxy_enabled, props.endpoint_props],
    [model, 'all F32', { vision: false, video: false, audio: false }, true, {}, false, false, false], 'the web UI\'s fields');
    // llama-server 81ff7abe's on this file (no template in it: its default ChatML one)
    assertEq(props.chat_template_caps, { supports_object_arguments: false, supports_parallel_tool_calls: false,
      supports_preserve_reasoning: false, supports_string_content: true, supports_system_role: true,
      supports_tool_calls: false, supports_tools: false, supports_typed_content: false }, 'chat_template_caps');
    for (const [method, p] of [['GET', '/tools'], ['POST', '/tools'], ['GET', '/cors-proxy'], ['POST', '/cors-proxy']]) {
      const r = await rawRequest(server.url, { method, path: p, body: method === 'POST' ? '{}' : undefined });
      assertEq([r.status, r.json?.error?.type], [403, 'feature_disabled'], `${method} ${p}: off, as llama-server's`);
    }
  }],
  ['--alias and --tags: /v1/models\' aliases and tags (sorted, each once, trimmed)', async () => {
    await withServer([...STORIES, '--alias', 'b,a', '--tags', 'x, y,x'], 'tags', async (t) => {
      const d = (await (await fetch(`${t.url}/v1/models`)).json()).data[0];
      assertEq([d.id, d.aliases, d.tags], ['b', ['a', 'b'], ['x', 'y']], 'the served model');
    });
  }],
  ['--ui-config: the web UI\'s settings in /props', async () => {
    await withServer([...STORIES, '--ui-config', '{"showTokensPerSecond": true}'], 'ui-config', async (ui) => {
      assertEq((await (await fetch(`${ui.url}/props`)).json()).ui_settings, { showTokensPerSecond: true }, 'ui_settings');
    });
  }],

  ['/v1/embeddings: shape, L2 norm 1, deterministic, batch = singles, ids = text', async () => {
    const one = await client.embeddings.create({ model, input: 'The quick brown fox' }); // base64 by default
    assertEq(one.object, 'list', 'object');
    assertEq(Object.keys(one).sort(), ['data', 'model', 'object', 'usage'], 'OpenAI\'s members, no others');
    const v = one.data[0].embedding;
    assertEq([one.data.length, one.data[0].object, one.data[0].index, v.length], [1, 'embedding', 0, props.n_embd], 'shape');
    assert(Math.abs(norm(v) - 1) < 1e-5, `norm ${norm(v)}`);
    const ids = (await post(server, '/tokenize', { content: 'The quick brown fox', add_special: true })).json.tokens;
    assertEq(one.usage, { prompt_tokens: ids.length, total_tokens: ids.length }, 'usage');
    const again = await client.embeddings.create({ model, input: 'The quick brown fox', encoding_format: 'float' });
    assertEq(again.data[0].embedding.map(Math.fround), v, 'float format = base64, and deterministic');
    const batch = await client.embeddings.create({ model, input: ['The quick brown fox', 'Hello world'] });
    assertEq(batch.data.map((d) => d.index), [0, 1], 'indices');
    assertEq(batch.data[0].embedding, v, 'in a batch as alone');
    assert(batch.data[1].embedding.some((x, i) => x !== v[i]), 'another text, another vector');
    const fromIds = await client.embeddings.create({ model, input: ids });
    assertEq(fromIds.data[0].embedding, v, 'token ids as input');
    const fromIds2 = await client.embeddings.create({ model, input: [ids, ids] });
    assertEq(fromIds2.data[1].embedding, v, '[[ids]] as input');
    const same = await client.embeddings.create({ model, input: 'x', dimensions: props.n_embd });
    assertEq(same.data[0].embedding.length, props.n_embd, 'dimensions equal to the model size');
  }],

  ['/v1/embeddings refusals: dimensions, format, empty input', async () => {
    const e = await sdkError(() => client.embeddings.create({ model, input: 'x', dimensions: 8 }));
    assertEq([e.status, e.param], [400, 'dimensions'], 'dimensions');
    await expect400('/v1/embeddings', { input: 'x', encoding_format: 'int8' }, 'encoding_format', 'format');
    await expect400('/v1/embeddings', { input: '' }, 'input', 'empty string');
    await expect400('/v1/embeddings', { input: [] }, 'input', 'empty array');
    await expect400('/v1/embeddings', { input: [[1, -2]] }, 'input', 'bad id');
    await expect400('/v1/embeddings', {}, 'input', 'missing input');
  }],

  ['CORS: preflight 204, the origin on every response (errors and streams too)', async () => {
    const pre = await rawRequest(server.url, { method: 'OPTIONS', path: '/v1/chat/completions',
      headers: { Origin: ORIGIN, 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization,content-type' } });
    assertEq(pre.status, 204, 'preflight status');
    assertEq(pre.headers['access-control-allow-origin'], ORIGIN, 'allow-origin');
    assert(/POST/.test(pre.headers['access-control-allow-methods']), 'allow-methods');
    assert(/authorization/i.test(pre.headers['access-control-allow-headers']) &&
      /content-type/i.test(pre.headers['access-control-allow-headers']), 'allow-headers');
    for (const [method, p] of [['GET', '/v1/models'], ['GET', '/nope'], ['GET', '/props']]) {
      const r = await rawRequest(server.url, { method, path: p, headers: { Origin: ORIGIN } });
      assertEq(r.headers['access-control-allow-origin'], ORIGIN, `${method} ${p} (${r.status})`);
    }
    const s = await rawRequest(server.url, { path: '/v1/completions', headers: { Origin: ORIGIN },
      body: JSON.stringify({ model, prompt: 'a', max_tokens: 2, stream: true }) });
    assertEq([s.status, s.headers['access-control-allow-origin']], [200, ORIGIN], 'stream');
  }],

  ['no --cors: no CORS headers, OPTIONS is 405', async () => {
    const pre = await rawRequest(small.url, { method: 'OPTIONS', path: '/v1/chat/completions',
      headers: { Origin: ORIGIN, 'Access-Control-Request-Method': 'POST' } });
    assertEq(pre.status, 405, 'OPTIONS without --cors');
    const r = await rawRequest(small.url, { method: 'GET', path: '/v1/models', headers: { Origin: ORIGIN } });
    assert(!('access-control-allow-origin' in r.headers), 'no allow-origin');
  }],

  ['/metrics: promtool-clean, request phase histograms filled', async () => {
    await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4 });
    const text = await (await fetch(`${server.url}/metrics`)).text();
    const out = checkMetrics(text);
    console.log(`      ${out.trim().split('\n').pop()}`);
    for (const h of ['request_queue_time_seconds', 'request_prefill_time_seconds', 'request_decode_time_seconds']) {
      const m = text.match(new RegExp(`^kvllm:${h}_count\\{[^}]*\\} (\\d+)`, 'm'));
      assert(m && Number(m[1]) >= 1, `${h}_count >= 1`);
    }
    assert(/^# TYPE kvllm:prompt_tokens_total counter$/m.test(text), 'counter TYPE names the _total series');
    // memory: what the process may still take, its resident set, the weights copied or mapped
    const gauge = (n) => Number((text.match(new RegExp(`^kvllm:${n}\\{[^}]*\\} (-?[0-9.e+]+)$`, 'm')) || [])[1]);
    assert(gauge('memory_available_bytes') > 0, 'memory_available_bytes');
    assert(gauge('memory_cgroup_limit_bytes') === -1 || gauge('memory_cgroup_limit_bytes') > 0, 'cgroup limit');
    assert(gauge('process_resident_bytes') > 1e6, 'resident bytes');
    const info = execFileSync(bin, ['info', '-m', 'tests/data/golden/models/qwen3-f32.gguf'], { cwd: root, encoding: 'utf8' });
    assertEq(gauge('weights_repacked_bytes') + gauge('weights_mapped_bytes'), Number(info.match(/\((\d+) bytes of weights\)/)[1]),
      'repacked + mapped = the weights kvllm info counts');
  }],
  ['POST /props: 501 naming --props, and with --props llama-server\'s {success: true}', async () => {
    const no = await rawRequest(small.url, { path: '/props', body: '{}' });
    assert(no.status === 501 && no.json.error.type === 'not_supported_error' && no.json.error.message.includes('--props'),
      no.text);
    await withServer([...STORIES, '--props'], 'props', async (withProps) => {
      const r = await rawRequest(withProps.url, { path: '/props', body: '{"n_ctx": 128}' });
      assertEq([r.status, r.json], [200, { success: true }], r.text);
      assertEq((await rawRequest(withProps.url, { path: '/props', body: '[1]' })).status, 400, 'not an object');
      assertEq((await rawRequest(withProps.url, { method: 'GET', path: '/props' })).json.n_ctx, 256, 'GET unchanged');
    });
  }],
  ['--metrics-prefix vllm: the same series under vLLM\'s namespace, promtool-clean', async () => {
    await withServer([...STORIES, '--metrics-prefix', 'vllm'], 'metrics-prefix', async (vllm) => {
      const names = (t, ns) => [...t.matchAll(new RegExp(`^(?:# (?:HELP|TYPE) )?${ns}:([a-z_]+)`, 'gm'))].map((m) => m[1]).sort();
      const ours = await (await fetch(`${small.url}/metrics`)).text();
      const theirs = await (await fetch(`${vllm.url}/metrics`)).text();
      assert(!/kvllm:/.test(theirs), 'no kvllm: name left');
      assertEq(names(theirs, 'vllm'), names(ours, 'kvllm'), 'the same series');
      for (const n of ['num_requests_running', 'num_requests_waiting', 'kv_cache_usage_perc', 'prompt_tokens_total',
        'generation_tokens_total', 'time_to_first_token_seconds_bucket', 'e2e_request_latency_seconds_count'])
        assert(new RegExp(`^vllm:${n}\\{model_name="stories260K"`, 'm').test(theirs), `vllm:${n}`);
      checkMetrics(theirs);
    });
  }],
  ['--api-prefix /llm: every route under it, nothing outside; the pages link relatively', async () => {
    const pre = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '256', '--api-prefix', '/llm'],
      { cwd: root, name: 'prefix' });
    try {
      assert(/listening on http:\/\/[^ ]+:\d+\/llm /.test(pre.log()), 'the listening line names the prefix');
      assert(pre.url.endsWith('/llm'), `the server's URL: ${pre.url}`);
      const base = pre.url, origin = new URL(pre.url).origin;
      const c = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
      const r = await c.chat.completions.create({ model: 'stories260K', messages: [{ role: 'user', content: 'Hi' }],
        max_tokens: 4 });
      assertEq(r.usage.completion_tokens, 4, 'a chat completion under the prefix');
      for (const [p, want] of [['/llm/health', 200], ['/llm/v1/models', 200], ['/llm/kv', 200], ['/llm/web/common.js', 200],
        ['/health', 404], ['/v1/models', 404], ['/llmx/health', 404], ['/', 404]])
        assertEq((await fetch(`${origin}${p}`)).status, want, p);
      const bare = await fetch(base, { redirect: 'manual' });
      assertEq([bare.status, bare.headers.get('location')], [308, '/llm/'], 'the prefix alone goes to its root page');
      const page = await (await fetch(`${base}/`)).text();
      assert(page.includes('src="web/common.js"') && !/(src|href)="\//.test(page), 'relative links only');
    } finally {
      assertEq(await pre.stop(), 0, 'clean shutdown');
    }
    for (const bad of ['llm', '/llm/', '/l m', '/a?b']) {
      const r = spawnSync(bin, ['serve', '-m', 'models/stories260K.gguf', '--port', '0', '--api-prefix', bad],
        { cwd: root, encoding: 'utf8', timeout: 60000 });
      assert(r.status !== 0 && r.stderr.includes('--api-prefix'), `'${bad}' refused: ${r.stderr.slice(-200)}`);
    }
  }],
];

const failed = await runTests(tests);
const codes = [await server.stop(), await small.stop()];
assertEq(codes, [0, 0], 'clean shutdown');
process.exit(failed ? 1 : 0);
