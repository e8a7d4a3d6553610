// llama-server's own API, POST /completion, checked against llama.cpp itself:
// the golden requests replayed (tests/data/golden/qwen3-f32: llama-server's
// /completion answers, ids and top-10 logprobs), the answer's and the stream's
// shapes against ones llama-server wrote (tests/data/llama_server), its stop
// types, sampling defaults, logit_bias forms, mixed prompts, response_fields,
// several completions, and what it refuses.
// usage: node test_llama_api.mjs BUILD/kvllm REPO_ROOT
import { execFileSync } from 'node:child_process';
import { readFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import http from 'node:http';
import path from 'node:path';
import { startServer, rawRequest, assert, assertEq, runTests, stopAll } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const GOLDEN = path.join(root, 'tests/data/golden/qwen3-f32');
const greedy = JSON.parse(readFileSync(path.join(GOLDEN, 'greedy.json'), 'utf8'));
const shapes = JSON.parse(readFileSync(path.join(root, 'tests/data/llama_server/completion_shapes.json'), 'utf8'));
const infill = JSON.parse(readFileSync(path.join(root, 'tests/data/llama_server/infill.json'), 'utf8'));
const override = JSON.parse(readFileSync(path.join(root, 'tests/data/llama_server/override_kv.json'), 'utf8'));
const postSampling = JSON.parse(readFileSync(path.join(root, 'tests/data/llama_server/post_sampling.json'), 'utf8'));

// The golden's flags: an F32 cache, as llama-server ran (-ctk f32 -ctv f32).
const server = await startServer(bin, ['-m', 'tests/data/golden/models/qwen3-f32.gguf', '-c', '512',
  '--kv-type', 'f32'], { cwd: root, name: 'qwen3' });

// /infill needs fill-in-the-middle tokens: the same model with them named in its metadata,
// as llama-server read it when it answered tests/data/llama_server/infill.json
const fimModel = path.join(mkdtempSync(path.join(tmpdir(), 'kvllm-fim-')), 'qwen3-fim.gguf');
execFileSync('python3', [path.join(root, 'tests/server/gguf_edit.py'),
  path.join(root, 'tests/data/golden/models/qwen3-f32.gguf'), fimModel,
  ...Object.entries(infill.keys).map(([k, v]) => `${k}=${v}`)]);
const fim = await startServer(bin, ['-m', fimModel, '-c', '2600', '--kv-type', 'f32'], { cwd: root, name: 'fim' });

// --override-kv, as llama-server was started for override_kv.json (one expert of 8, BOS added)
const overridden = await startServer(bin, ['-m', override.model, '-c', '512', '--kv-type', 'f32',
  ...override.overrides.flatMap((o) => ['--override-kv', o])], { cwd: root, name: 'override' });

// llama-server's sampling flags as every request's defaults
const flagged = await startServer(bin, ['-m', 'tests/data/golden/models/qwen3-f32.gguf', '-c', '512',
  '--kv-type', 'f32', '--temp', '0', '--samplers', 'dry;top_k;temperature', '--top-k', '5', '--seed', '7',
  '--dry-multiplier', '1e6', '--mirostat-ent', '4', '-n', '3'], { cwd: root, name: 'flags' });

const post = (body, p = '/completion') => rawRequest(server.url, { path: p, body: JSON.stringify(body) });
async function ok(body, p) {
  const r = await post(body, p);
  assert(r.status === 200, `status ${r.status}: ${r.text.slice(0, 300)}`);
  return r;
}
async function refused(body, param, what) {
  const r = await post(body);
  assert(r.status === 400, `${what}: status ${r.status} (${r.text.slice(0, 200)})`);
  assertEq(r.json.error.param, param, `${what}: param`);
  return r;
}
const events = (text) => text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)));

// Every key of want is in got with the same JSON type, recursively into objects.
function sameShape(want, got, where) {
  const kind = (v) => (v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v);
  for (const [k, v] of Object.entries(want)) {
    assert(k in got, `${where}: no '${k}'`);
    assertEq(kind(got[k]), kind(v), `${where}.${k}: type`);
    if (kind(v) === 'object') sameShape(v, got[k], `${where}.${k}`);
  }
  for (const k of Object.keys(got)) assert(k in want, `${where}: '${k}' is not llama-server's`);
}

const greedyBody = (ids, extra = {}) => ({
  prompt: ids, n_predict: 8, temperature: 0, samplers: ['temperature'], n_probs: 5, return_tokens: true, ...extra,
});

const tests = [
  ['the golden requests replayed: llama.cpp\'s ids and logprobs', async () => {
    // the request each golden case was made with (meta.json "commands")
    const parser = JSON.stringify({ parsers: [{ type: 'epsilon' }], rules: {}, root: 0 });
    let compared = 0;
    for (const [ci, c] of greedy.cases.entries()) {
      const r = await ok({ prompt: c.prompt_ids, n_predict: 48, temperature: 0.0, samplers: ['temperature'],
        repeat_penalty: 1.0, n_probs: 10, post_sampling_probs: false, cache_prompt: false, return_tokens: true,
        seed: 0, chat_parser: parser });
      const got = r.json;
      // F32: every id, or a first difference where the golden's top two were within 1e-3 (README rule 3)
      let s = 0;
      while (s < c.ids.length && got.tokens[s] === c.ids[s]) s++;
      if (s < c.ids.length) {
        assert(c.steps[s].top1_top2_logit_gap < 1e-3 && got.tokens[s] === c.steps[s].top[1].id,
          `case ${ci}: id ${s} is ${got.tokens[s]}, llama.cpp's ${c.ids[s]} (gap ${c.steps[s].top1_top2_logit_gap})`);
      } else {
        assertEq([got.stop_type, got.tokens_predicted], [c.stop_type, c.n_generated], `case ${ci}: stop`);
      }
      assertEq(got.tokens_evaluated, c.prompt_ids.length, `case ${ci}: tokens_evaluated`);
      for (let k = 0; k < s; k++) {
        if (c.steps[k].source !== 'generation') continue; // llama-server's own answer, not a recomputed step
        const ours = new Map(got.completion_probabilities[k].top_logprobs.map((t) => [t.id, t.logprob]));
        for (const t of c.steps[k].top) {
          assert(ours.has(t.id), `case ${ci} step ${k}: id ${t.id} not in our top 10`);
          const d = Math.abs(ours.get(t.id) - t.logprob);
          assert(d <= 1e-3, `case ${ci} step ${k}: id ${t.id} logprob ${ours.get(t.id)} vs ${t.logprob}`);
          compared++;
        }
      }
    }
    assert(compared >= 100, `only ${compared} logprobs compared`);
  }],

  ['the answer has llama-server\'s shape, ids and text', async () => {
    const got = (await ok(shapes.request)).json;
    sameShape(shapes.response, got, 'answer');
    sameShape(shapes.response.completion_probabilities[0], got.completion_probabilities[0], 'probs[0]');
    sameShape(shapes.response.completion_probabilities[0].top_logprobs[0],
      got.completion_probabilities[0].top_logprobs[0], 'probs[0].top_logprobs[0]');
    assertEq(got.tokens, shapes.response.tokens, 'ids');
    assertEq(got.content, shapes.response.content, 'content');
    assertEq(got.prompt, shapes.response.prompt, 'prompt');
    assertEq([got.stop_type, got.stopping_word, got.tokens_predicted, got.tokens_evaluated],
      ['limit', '', 4, shapes.response.tokens_evaluated], 'stop');
    assertEq(got.tokens_cached, got.tokens_evaluated + 3, 'tokens_cached: prompt + all but the last token');
    for (const [k, v] of Object.entries(shapes.response.generation_settings)) {
      if (['seed', 'model', 'dry_penalty_last_n', 'chat_format', 'reasoning_format'].includes(k)) continue;
      if (typeof v === 'number') assert(Math.abs(got.generation_settings[k] - v) < 1e-6, `settings.${k}`);
    }
    assert(got.timings.prompt_n + got.timings.cache_n === got.tokens_evaluated, 'timings: prompt + cache');
  }],

  ['stream: a data line a token, then the final object; no [DONE]', async () => {
    const r = await ok(shapes.stream_request);
    assert(/text\/event-stream/.test(r.headers['content-type']), 'content type');
    assert(!r.text.includes('[DONE]'), 'llama-server ends its stream without [DONE]');
    const ev = events(r.text), want = shapes.stream_events;
    sameShape(want[0], ev[0], 'first event');
    sameShape(want[want.length - 1], ev[ev.length - 1], 'last event');
    const last = ev.pop();
    assert(last.stop === true && last.content === '' && last.tokens.length === 0, 'final: no text of its own');
    assert(ev.every((e) => e.stop === false && e.completion_probabilities.length === 1), 'partials');
    assertEq(ev.flatMap((e) => e.tokens), shapes.response.tokens, 'ids, one event each');
    assertEq(ev.map((e) => e.tokens_predicted), [1, 2, 3, 4], 'tokens_predicted counts');
    assertEq(ev.map((e) => e.content).join(''), shapes.response.content, 'the text');
  }],

  ['stop words: stop_type word and the stopping word, left out of the content', async () => {
    const c = greedy.cases[0];
    const full = (await ok(greedyBody(c.prompt_ids, { n_predict: 12 }))).json;
    const word = full.content.slice(8, 11);
    const at = full.content.indexOf(word);
    const got = (await ok(greedyBody(c.prompt_ids, { n_predict: 12, stop: ['', 'zzzz', word] }))).json;
    assertEq([got.stop_type, got.stopping_word, got.content], ['word', word, full.content.slice(0, at)], 'word stop');
    assertEq(got.generation_settings.stop, ['zzzz', word], 'empty stop strings dropped, as llama-server does');
  }],

  ['llama-server\'s sampling defaults; a seed repeats a sampled answer', async () => {
    const a = (await ok({ prompt: 'Once upon a time', n_predict: 12, seed: 7 })).json;
    const g = a.generation_settings;
    assertEq([g.temperature, g.top_k, g.repeat_last_n, g.repeat_penalty, g.seed],
      [0.800000011920929, 40, 64, 1, 7], 'defaults');
    assert(Math.abs(g.top_p - 0.95) < 1e-6 && Math.abs(g.min_p - 0.05) < 1e-6, 'top_p / min_p defaults');
    const b = (await ok({ prompt: 'Once upon a time', n_predict: 12, seed: 7 })).json;
    assertEq(b.content, a.content, 'the same seed, the same answer');
    assertEq((await ok({ prompt: 'x', n_predict: 1 })).json.generation_settings.seed, 4294967295, 'no seed: random');
    const sm = (await ok({ prompt: 'x', n_predict: 1, samplers: 'kt' })).json.generation_settings.samplers;
    assertEq(sm, ['top_k', 'temperature'], 'samplers by letter');
    // top_k 1 leaves only the greedy token, unless the list leaves top_k out
    const c = greedy.cases[0], hot = { n_predict: 16, temperature: 1.5, top_k: 1, seed: 3 };
    const g1 = (await ok(greedyBody(c.prompt_ids, { ...hot, samplers: ['top_k', 'temperature'] }))).json;
    assertEq(g1.tokens, c.ids.slice(0, 16), 'top_k 1: the greedy ids');
    const g2 = (await ok(greedyBody(c.prompt_ids, { ...hot, samplers: ['temperature'] }))).json;
    assert(JSON.stringify(g2.tokens) !== JSON.stringify(g1.tokens), 'top_k left out of samplers: off');
  }],

  ['logit_bias: pairs, objects, text keys and false; OpenAI\'s on /v1/completions', async () => {
    const c = greedy.cases[0], first = c.ids[0], second = c.steps[0].top[1].id;
    const one = async (extra) => (await ok(greedyBody(c.prompt_ids, { n_predict: 1, ...extra }))).json.tokens[0];
    assertEq(await one({}), first, 'unbiased');
    assertEq(await one({ logit_bias: [[first, false]] }), second, '[[id, false]] bans');
    assertEq(await one({ logit_bias: { [first]: -1e9 } }), second, '{"id": -1e9}');
    assertEq(await one({ logit_bias: [[c.steps[0].top[4].id, 100]] }), c.steps[0].top[4].id, '+100 chooses');
    const piece = (await ok({ prompt: [first], n_predict: 1 }, '/completion')).json.prompt;
    assertEq(await one({ logit_bias: { [piece]: false } }), second, 'a text key bans its tokens');
    const oai = await ok({ prompt: c.prompt_ids, max_tokens: 1, temperature: 0, logit_bias: { [first]: -100 },
      logprobs: 1, return_tokens_as_token_ids: true }, '/v1/completions');
    assertEq(oai.json.choices[0].logprobs.tokens[0], `token_id:${second}`, 'OpenAI logit_bias');
    // the reported logprob is the model's, before the bias
    const lp = (await ok(greedyBody(c.prompt_ids, { n_predict: 1, logit_bias: [[first, false]] }))).json;
    assert(Math.abs(lp.completion_probabilities[0].top_logprobs[0].logprob - c.steps[0].top[0].logprob) < 1e-3,
      'top_logprobs unbiased');
  }],

  ['prompts: text, ids, ids and text mixed, {prompt_string}', async () => {
    const tok = async (content) => (await ok({ content }, '/tokenize')).json.tokens;
    const a = await tok('The quick'), b = await tok(' brown fox');
    const mixed = (await ok({ prompt: ['The quick', ...b], n_predict: 1 })).json;
    assertEq(mixed.tokens_evaluated, a.length + b.length, 'mixed prompt tokens');
    assertEq(mixed.prompt, 'The quick brown fox', 'its text');
    const obj = (await ok({ prompt: { prompt_string: 'The quick brown fox' }, n_predict: 1 })).json;
    assertEq(obj.tokens_evaluated, a.length + b.length, '{prompt_string}');
    const special = (await ok({ prompt: '<|im_start|>user', n_predict: 1 })).json;
    assertEq(special.tokens_evaluated, (await ok({ content: '<|im_start|>user', parse_special: true },
      '/tokenize')).json.tokens.length, 'special tokens in a text prompt are parsed, as llama-server does');
  }],

  ['several prompts: an array of answers, each as if alone', async () => {
    const c = greedy.cases[0];
    const prompts = ['The quick brown fox', c.prompt_ids, ['The quick', ...c.prompt_ids.slice(0, 3)]];
    const many = (await ok({ prompt: prompts, n_predict: 6, temperature: 0, return_tokens: true })).json;
    assert(Array.isArray(many) && many.length === 3, 'three answers');
    for (const [k, p] of prompts.entries()) {
      const one = (await ok({ prompt: p, n_predict: 6, temperature: 0, return_tokens: true })).json;
      assertEq([many[k].index, many[k].tokens, many[k].tokens_evaluated, many[k].prompt],
        [k, one.tokens, one.tokens_evaluated, one.prompt], `prompt ${k}`);
    }
  }],

  ['response_fields, several completions, n_predict -1', async () => {
    const r = (await ok({ prompt: 'The', n_predict: 3, response_fields: ['content', 'generation_settings/n_predict',
      'no/such'] })).json;
    assertEq(Object.keys(r).sort(), ['content', 'generation_settings/n_predict'], 'fields');
    assertEq(r['generation_settings/n_predict'], 3, 'a nested field under its path');
    const many = (await ok({ prompt: 'The', n_predict: 3, n_cmpl: 2, temperature: 0 })).json;
    assert(Array.isArray(many) && many.length === 2, 'two answers');
    assertEq(many.map((m) => m.index), [0, 1], 'their indices');
    const long = (await ok({ prompt: greedy.cases[0].prompt_ids, n_predict: -1, ignore_eos: true, temperature: 0 })).json;
    assertEq([long.stop_type, long.tokens_predicted], ['limit', 512 - greedy.cases[0].prompt_ids.length],
      'until the context is full');
  }],

  ['/infill: llama-server\'s fill-in-the-middle prompt and answer', async () => {
    for (const [i, c] of infill.cases.entries()) {
      const r = await rawRequest(fim.url, { path: '/infill', body: JSON.stringify(c.request) });
      assert(r.status === 200, `case ${i}: status ${r.status}: ${r.text.slice(0, 300)}`);
      for (const k of c.compare || Object.keys(c.response)) assertEq(r.json[k], c.response[k], `case ${i}: ${k}`);
    }
    // llama.vim's chunks carry "time" as well (llama-server reads it nowhere): the same prompt
    const c0 = infill.cases[0];
    const timed = { ...c0.request, input_extra: c0.request.input_extra.map((x) => ({ ...x, time: 1733 })) };
    const t = await rawRequest(fim.url, { path: '/infill', body: JSON.stringify(timed) });
    assertEq([t.status, t.json.prompt], [200, c0.response.prompt], 'chunks with a time');
    const bad = async (body, status, param, what) => {
      const r = await rawRequest(fim.url, { path: '/infill', body: JSON.stringify(body) });
      assert(r.status === status, `${what}: status ${r.status} (${r.text.slice(0, 200)})`);
      if (param) assertEq(r.json.error.param, param, `${what}: param`);
    };
    await bad({ input_prefix: 'a' }, 400, 'input_suffix', 'no suffix');
    await bad({ input_suffix: 'a' }, 400, 'input_prefix', 'no prefix');
    await bad({ input_prefix: 'a', input_suffix: 'b', input_extra: [{ filename: 'x' }] }, 400, 'input_extra',
      'a chunk without text');
    await bad({ input_prefix: 'a', input_suffix: 'b', prompt: [1] }, 400, 'prompt', 'a prompt of ids');
    await bad({ input_prefix: 'a', input_suffix: 'b', n_indent: -1 }, 400, 'n_indent', 'a negative n_indent');
    await bad({ input_prefix: 'a', input_suffix: 'b', samplers: ['infill'] }, 400, 'samplers',
      'the infill sampler without top_k before it');
    // llama.vscode's warm-up: n_predict 0 computes and caches the prompt, answers nothing
    const warm = { input_prefix: 'def g(x):\n    ', input_suffix: '\n', input_extra: [{ text: 'y = 2\n' }],
      n_predict: 0, samplers: [], cache_prompt: true, t_max_prompt_ms: 500, t_max_predict_ms: 1 };
    const w = await rawRequest(fim.url, { path: '/infill', body: JSON.stringify(warm) });
    assertEq([w.status, w.json.content, w.json.tokens_predicted, w.json.stop_type], [200, '', 0, 'limit'], 'warm-up');
    const again = await rawRequest(fim.url, { path: '/infill', body: JSON.stringify({ ...warm, n_predict: 4 }) });
    assert(again.json.timings.cache_n >= 16, `the warm-up's prompt was cached (${again.json.timings.cache_n})`);
    assertEq(again.json.tokens_predicted, 4, 'then answered');
    const none = await post({ input_prefix: 'a', input_suffix: 'b' }, '/infill');
    assert(none.status === 501 && /prefix token is missing/.test(none.text), `no FIM tokens: ${none.status}`);
  }],

  ['--override-kv: llama-server\'s answers with the same overrides', async () => {
    let compared = 0;
    for (const [i, c] of override.cases.entries()) {
      // our top 20 against llama's top 5 (its 5th may be our 6th by a last-bit difference)
      const r = await rawRequest(overridden.url, { path: '/completion', body: JSON.stringify({ ...c.request,
        n_probs: 20 }) });
      assert(r.status === 200, `case ${i}: status ${r.status}: ${r.text.slice(0, 200)}`);
      const got = r.json, want = c.response;
      assertEq(got.tokens_evaluated, want.tokens_evaluated, `case ${i}: BOS added (the bool override)`);
      let s = 0;
      while (s < want.tokens.length && got.tokens[s] === want.tokens[s]) s++;
      if (s < want.tokens.length) { // only where llama.cpp's top two were within 1e-3
        const top = want.completion_probabilities[s].top_logprobs;
        assert(top[0].logprob - top[1].logprob < 1e-3 && got.tokens[s] === top[1].id,
          `case ${i}: id ${s} is ${got.tokens[s]}, llama.cpp's ${want.tokens[s]}`);
      }
      // llama's entries follow its text pieces: a byte token held for the next one gets none, so
      // each entry is matched to our token of its id, in order
      let k = 0;
      for (const w of want.completion_probabilities) {
        while (k < s && got.tokens[k] !== w.id) k++;
        if (k >= s) break;
        const ours = new Map(got.completion_probabilities[k++].top_logprobs.map((t) => [t.id, t.logprob]));
        for (const t of w.top_logprobs) {
          assert(ours.has(t.id) && Math.abs(ours.get(t.id) - t.logprob) <= 1e-3,
            `case ${i}: id ${t.id}: ${ours.get(t.id)} vs ${t.logprob}`);
          compared++;
        }
      }
    }
    assert(compared >= 100, `only ${compared} logprobs compared`);
    // without the overrides the same file routes to 2 experts: another answer
    const plain = await post(override.cases[0].request);
    assert(JSON.stringify(plain.json.tokens) !== JSON.stringify(override.cases[0].response.tokens) ||
      plain.json.tokens_evaluated !== override.cases[0].response.tokens_evaluated, 'the overrides matter');
  }],

  ['/v1/completions echo + logprobs (lm-eval\'s loglikelihood requests): the prompt\'s logprobs are llama.cpp\'s',
    async () => {
      let compared = 0;
      for (const [ci, c] of greedy.cases.entries()) {
        const seq = [...c.prompt_ids, ...c.ids];
        for (const max_tokens of [0, 1]) {
          const r = await ok({ prompt: seq, max_tokens, echo: true, logprobs: 5, temperature: 0 }, '/v1/completions');
          const ch = r.json.choices[0], lp = ch.logprobs;
          assertEq(lp.tokens.length, seq.length + max_tokens, `case ${ci}: the prompt's tokens, then the output's`);
          assertEq([lp.token_logprobs[0], lp.top_logprobs[0]], [null, null], 'nothing predicts the first token');
          assertEq([ch.finish_reason, r.json.usage.prompt_tokens, r.json.usage.completion_tokens],
            ['length', seq.length, max_tokens], `case ${ci}: finish and usage`);
          for (const [s, st] of c.steps.entries()) { // teacher-forced: llama.cpp's logprob of each golden id
            const pos = c.prompt_ids.length + s;
            assert(Math.abs(lp.token_logprobs[pos] - st.logprob) <= 1e-3,
              `case ${ci} position ${pos}: ${lp.token_logprobs[pos]} vs llama.cpp's ${st.logprob}`);
            const n = Object.keys(lp.top_logprobs[pos]).length; // tokens of the same text share a key
            assert(n >= 1 && n <= 5, `five alternatives at most (${n})`);
            compared++;
          }
          assert(lp.text_offset.every((o, i) => i === 0 || o >= lp.text_offset[i - 1]), 'offsets grow');
        }
      }
      assert(compared >= 200, `only ${compared} compared`);
      // a text prompt is echoed as sent; without logprobs only the text; streamed, the prompt comes first
      const t = await ok({ prompt: 'The quick brown fox', max_tokens: 3, echo: true, temperature: 0 }, '/v1/completions');
      assert(t.json.choices[0].text.startsWith('The quick brown fox') && t.json.choices[0].logprobs === null, 'text echo');
      const st = await ok({ prompt: 'The quick brown fox', max_tokens: 3, echo: true, temperature: 0, stream: true },
        '/v1/completions');
      const chunks = events(st.text.replace('data: [DONE]', ''));
      assertEq(chunks[0].choices[0].text, 'The quick brown fox', 'first chunk: the prompt');
      assertEq(chunks.map((x) => x.choices[0]?.text ?? '').join(''), t.json.choices[0].text, 'streamed = whole');
      const z = await ok({ prompt: 'The quick', max_tokens: 0, echo: true, stream: true }, '/v1/completions');
      assert(z.text.endsWith('data: [DONE]\n\n') && events(z.text.replace('data: [DONE]', ''))[0].choices[0].text ===
        'The quick', 'max_tokens 0, streamed');
      // a body of 300k biases (the even ids, each many times over: they add up) is taken whole
      const pairs = Array.from({ length: 300000 }, (_, i) => [(i % 2048) * 2, -0.25]);
      const biased = await ok({ prompt: 'x', n_predict: 1, logit_bias: pairs });
      assertEq(biased.json.generation_settings.logit_bias.length, 2048, 'one entry per token');
      // several prompts in one request (lm-eval's batches, vLLM's answer): choices prompt-major,
      // each prompt's as if alone, usage over all; with echo each choice starts with its prompt
      const seqs = greedy.cases.map((c) => [...c.prompt_ids, ...c.ids]);
      const batch = await ok({ prompt: seqs, max_tokens: 1, echo: true, logprobs: 2, temperature: 0, n: 2 },
        '/v1/completions');
      assertEq(batch.json.choices.map((ch) => ch.index), [0, 1, 2, 3, 4, 5], 'prompt-major indices');
      assertEq(batch.json.usage.prompt_tokens, seqs.reduce((a, q) => a + q.length, 0), 'prompt tokens of all');
      for (const [k, q] of seqs.entries()) {
        const alone = await ok({ prompt: q, max_tokens: 1, echo: true, logprobs: 2, temperature: 0 },
          '/v1/completions');
        for (const i of [2 * k, 2 * k + 1])
          assertEq(batch.json.choices[i].logprobs.token_logprobs, alone.json.choices[0].logprobs.token_logprobs,
            `prompt ${k}, choice ${i}: as alone`);
      }
      const texts = await ok({ prompt: ['The quick', 'brown fox'], max_tokens: 2, echo: true, temperature: 0,
        stream: true }, '/v1/completions');
      const firsts = events(texts.text.replace('data: [DONE]', '')).filter((x) => x.choices?.length);
      assert(firsts.some((x) => x.choices[0].index === 1 && x.choices[0].text === 'brown fox'), 'streamed echo of prompt 1');
      const noEcho = await post({ prompt: 'x', max_tokens: 0 }, '/v1/completions');
      assertEq(noEcho.status, 400, 'max_tokens 0 without echo');
    }],

  ['what /completion refuses, and what it accepts unchanged', async () => {
    await refused({ prompt: 'a', mirostat: 3 }, 'mirostat', 'mirostat 3');
    await refused({ prompt: 'a', min_keep: -1 }, 'min_keep', 'a negative min_keep');
    await refused({ prompt: 'a', typical_p: 'x' }, 'typical_p', 'a typical_p that is not a number');
    await refused({ prompt: 'a', dry_multiplier: 0.8, dry_sequence_breakers: [] }, 'dry_sequence_breakers',
      'an empty list of DRY breakers');
    await refused({ prompt: 'a', dry_sequence_breakers: ['x', 3] }, 'dry_sequence_breakers', 'a breaker not a string');
    await refused({ prompt: 'a', dry_allowed_length: -1 }, 'dry_allowed_length', 'a negative dry_allowed_length');
    await refused({ prompt: 'a', adaptive_target: 0.5 }, 'adaptive_target', 'adaptive-p');
    await refused({ prompt: 'a', frobnicate: 1 }, 'frobnicate', 'unknown field');
    await refused({ prompt: 'a', samplers: ['top_k', 'typ_p', 'infill'], top_k: 4, typical_p: 0.5 }, 'samplers',
      'the infill sampler with typical sampling');
    await refused({ prompt: 'a', samplers: ['bogus'] }, 'samplers', 'unknown sampler');
    await refused({ prompt: 'a', chat_parser: '{"parsers":[]}' }, 'chat_parser', 'a parser');
    await refused({ prompt: 'a', logit_bias: [[1]] }, 'logit_bias', 'a malformed bias');
    await refused({ prompt: 'a', logit_bias: [[1e9, 1]] }, 'logit_bias', 'an id outside the vocabulary');
    await refused({ prompt: 'a', n_probs: 50 }, 'n_probs', 'n_probs beyond 20');
    await refused({ prompt: { prompt_string: 'a', multimodal_data: ['AAAA'] } }, 'prompt', 'multimodal data');
    // the samplers' off values and the fields that change nothing are taken
    await ok({ prompt: 'a', n_predict: 1, mirostat: 0, typical_p: 1, dry_multiplier: 0, xtc_probability: 0,
      top_n_sigma: -1, min_keep: 0, cache_prompt: true, id_slot: -1, n_keep: 4, n_discard: 0, n_cache_reuse: 0,
      dry_base: 1.75, mirostat_tau: 5, timings_per_token: false, stream_options: { include_usage: true } });
  }],

  ['post_sampling_probs: the sampler chain\'s probabilities, as llama-server computed them', async () => {
    // each case's first token: the candidates its samplers left and their probabilities
    // (typical, top-n-sigma, min_p, dynamic temperature, min_keep, mirostat 1 and 2, penalties,
    // XTC, DRY, orders), recorded from llama-server on the same model (tests/data/llama_server)
    for (const c of postSampling.cases) {
      const r = await ok(c.request);
      const first = r.json.completion_probabilities[0];
      assert('prob' in first && 'top_probs' in first && !('logprob' in first), `${c.name}: llama's names`);
      const got = first.top_probs;
      assertEq(got.map((t) => t.id), c.top_probs.map((t) => t.id), `${c.name}: the candidates, in order`);
      for (const [k, t] of c.top_probs.entries())
        assert(Math.abs(got[k].prob - t.prob) < 2e-5, `${c.name}: p of ${t.id} ${got[k].prob} vs ${t.prob}`);
    }
    // the token's own probability is its entry's among the chain's candidates
    const r = await ok({ ...postSampling.cases[0].request, n_predict: 4 });
    for (const e of r.json.completion_probabilities) {
      const mine = e.top_probs.find((t) => t.id === e.id);
      assert(mine && mine.prob === e.prob, 'the sampled token is one of the top_k 5, with its prob');
    }
    await refused({ prompt: 'a', n_probs: 2, post_sampling_probs: true, samplers: ['top_k', 'infill'], top_k: 4 },
      'post_sampling_probs', 'post_sampling_probs with the infill sampler');
  }],

  ['the server\'s sampling flags: every request\'s defaults, on /completion and the OpenAI endpoints', async () => {
    const at = (body, p = '/completion') => rawRequest(flagged.url, { path: p, body: JSON.stringify(body) });
    const prompt = greedy.cases[0].prompt_ids;
    // -n 3: the length of a request that gives none, on every endpoint
    const short = await at({ prompt, return_tokens: true });
    assertEq(short.json.tokens_predicted, 3, '/completion: -n 3');
    for (const [p, body] of [['/v1/completions', { prompt }], ['/v1/chat/completions',
      { messages: [{ role: 'user', content: 'hi' }] }]]) {
      const u = (await at({ ...body, ignore_eos: true }, p)).json.usage;
      assertEq(u.completion_tokens, 3, `${p}: -n 3`);
    }
    const r = await at({ prompt, n_predict: 4, return_tokens: true });
    assertEq(r.status, 200, 'status');
    const g = r.json.generation_settings;
    assertEq([g.temperature, g.top_k, g.seed, g.dry_multiplier, g.mirostat_tau], [0, 5, 7, 1e6, 4], 'the flags');
    assertEq(g.samplers, ['dry', 'top_k', 'temperature'], '--samplers');
    // /props shows them as llama-server does (default_generation_settings.params)
    const props = (await rawRequest(flagged.url, { method: 'GET', path: '/props' })).json;
    const dp = props.default_generation_settings.params;
    assertEq([dp.temperature, dp.top_k, dp.seed, dp.n_predict, dp.dry_multiplier], [0, 5, 7, 3, 1e6], '/props');
    assertEq(dp.samplers, ['dry', 'top_k', 'temperature'], '/props: the list');
    const plain = (await rawRequest(server.url, { method: 'GET', path: '/props' })).json;
    const pp = plain.default_generation_settings.params;
    assertEq([Math.fround(pp.temperature), pp.top_k, pp.n_predict, pp.samplers.length],
      [Math.fround(0.8), 40, -1, 9], '/props of a server without flags: llama\'s defaults');
    // temperature 0 by default: the greedy tokens, on /completion and on /v1/completions
    const greedyTokens = (await ok({ prompt, n_predict: 4, temperature: 0, return_tokens: true })).json.tokens;
    assertEq(r.json.tokens, greedyTokens, '/completion: greedy by the server\'s --temp 0');
    const oa = await at({ prompt, max_tokens: 4, logprobs: 1, return_tokens_as_token_ids: true }, '/v1/completions');
    assertEq(oa.json.choices[0].logprobs.tokens, greedyTokens.map((t) => `token_id:${t}`),
      '/v1/completions: greedy by the server\'s --temp 0');
    // the server's DRY by default; a request's own value wins
    const [a, b, c, d] = [100, 200, 300, 400];
    const first = async (extra) => (await at({ prompt: [a, b, c, d, a, b], n_predict: 1, return_tokens: true,
      logit_bias: [[c, 30]], ...extra })).json.tokens[0];
    assert(await first({}) !== c, 'the server\'s DRY penalises the repeat');
    assertEq(await first({ dry_multiplier: 0 }), c, 'the request turns DRY off');
    // a request's temperature wins over the server's
    const warm = [];
    for (const seed of [1, 2, 3, 4])
      warm.push((await at({ prompt, n_predict: 4, temperature: 1.5, top_k: 0, seed, return_tokens: true,
        samplers: ['top_k', 'temperature'] })).json.tokens.join());
    assert(new Set(warm).size > 1, 'temperature 1.5 from the request: the seeds differ');
  }],

  ['llama\'s other samplers and its lists in any order', async () => {
    // the step-0 top 3 and the greedy text of a prompt (temperature 0)
    const prompt = greedy.cases[0].prompt_ids;
    const g = await ok({ prompt, n_predict: 6, temperature: 0, n_probs: 3, return_tokens: true });
    const top = g.json.completion_probabilities[0].top_logprobs.map((t) => t.id);
    const firsts = async (extra, seeds = [1, 2, 3, 4, 5, 6]) => {
      const got = [];
      for (const seed of seeds)
        got.push((await ok({ prompt, n_predict: 6, temperature: 1, top_k: 0, top_p: 1, min_p: 0, seed,
          return_tokens: true, ...extra })).json.tokens);
      return got;
    };
    // plain temperature 1 on a random model: the seeds disagree
    const plain = await firsts({});
    assert(new Set(plain.map((t) => t.join())).size > 1, 'temperature 1 alone varies with the seed');
    // each of these leaves one candidate a step, the greedy one: every seed gives the greedy text
    for (const [what, extra] of [
      ['top_n_sigma 1e-6', { top_n_sigma: 1e-6 }],
      ['mirostat 2, tau 0', { mirostat: 2, mirostat_tau: 0, mirostat_eta: 0 }],
      ['mirostat 1, tau 0', { mirostat: 1, mirostat_tau: 0, mirostat_eta: 0 }],
      ['temperature before top_k 1', { samplers: ['temperature', 'top_k'], top_k: 1 }],
      ['dynamic temperature 0 +- 0', { temperature: 0, dynatemp_range: 1e-9, samplers: ['temperature'] }],
    ]) {
      const got = await firsts(extra, [1, 2, 3]);
      for (const t of got) assertEq(t, g.json.tokens, `${what}: the greedy tokens`);
    }
    // XTC at probability 1 over the top 2 with threshold 0: the likelier is always excluded, so
    // the first token is the step's second likeliest, whatever the seed
    for (const t of await firsts({ top_k: 2, xtc_probability: 1, xtc_threshold: 0,
      samplers: ['top_k', 'xtc', 'temperature'] }, [1, 2, 3]))
      assertEq(t[0], top[1], 'XTC: the second likeliest');
    // typical at 0 keeps the single most typical token (llama's typ_p <= 0): one answer for all seeds
    const typ = await firsts({ typical_p: 0, top_k: 3, samplers: ['top_k', 'typ_p', 'temperature'] }, [1, 2, 3]);
    assertEq(new Set(typ.map((t) => t.join())).size, 1, 'typical_p 0: the same tokens whatever the seed');
    assert(top.includes(typ[0][0]), 'typical_p 0: a token of the top 3');
    // top_p 0 keeps min_keep tokens: the first tokens stay within the step's top 2
    for (const t of await firsts({ top_p: 0, min_keep: 2, samplers: ['top_p', 'temperature'] }))
      assert(top.slice(0, 2).includes(t[0]), `min_keep 2: ${t[0]} within the top 2 ${top}`);
    // DRY: the prompt a b c d a b with c pushed to the top (logit_bias): greedy writes c, which
    // would extend the repeat of "a b"; DRY takes multiplier * base^(2 - allowed 2) from it
    const [a, b, c, d] = [100, 200, 300, 400];
    const dryBody = (extra) => ({ prompt: [a, b, c, d, a, b], n_predict: 1, temperature: 0, return_tokens: true,
      logit_bias: [[c, 30]], ...extra });
    const first = async (extra) => (await ok(dryBody(extra))).json.tokens[0];
    assertEq(await first({}), c, 'the biased token, without DRY');
    assert(await first({ dry_multiplier: 1e6 }) !== c, 'DRY: the token that extends the repeat loses');
    assertEq(await first({ dry_multiplier: 1e6, dry_allowed_length: 3 }), c, 'DRY: a repeat of 2 is allowed at 3');
    assertEq(await first({ dry_multiplier: 1e6, dry_penalty_last_n: 3 }), c, 'DRY: the window does not reach back');
    assertEq(await first({ dry_multiplier: 1e6, samplers: ['top_k', 'temperature'] }), c, 'DRY: not in the list');
    // a sequence breaker: c's own text as one makes c a breaker, never penalised
    const cText = (await ok({ tokens: [c] }, '/detokenize')).json.content;
    assertEq(await first({ dry_multiplier: 1e6, dry_sequence_breakers: [cText] }), c, 'DRY: a breaker is free');
    // a breaker between the repeats cuts them: b's text stops the repeat reaching back
    const bText = (await ok({ tokens: [b] }, '/detokenize')).json.content;
    assertEq(await first({ dry_multiplier: 1e6, dry_sequence_breakers: [bText] }), c, 'DRY: no repeat across a breaker');
    // the same on the OpenAI endpoint, by llama-server's field names there
    const dryOa = await ok({ prompt: [a, b, c, d, a, b], max_tokens: 1, temperature: 0, logit_bias: { [c]: 30 },
      dry_multiplier: 1e6, logprobs: 1, return_tokens_as_token_ids: true }, '/v1/completions');
    assert(dryOa.json.choices[0].logprobs.tokens[0] !== `token_id:${c}`, '/v1/completions: DRY as on /completion');
    // the settings say what ran
    const st = (await ok({ prompt, n_predict: 1, typical_p: 0.5, top_n_sigma: 2, xtc_probability: 0.5,
      xtc_threshold: 0.2, dynatemp_range: 0.3, dynatemp_exponent: 2, min_keep: 3, mirostat_tau: 4,
      samplers: 'kysxt' })).json.generation_settings;
    assertEq([st.typical_p, st.top_n_sigma, st.xtc_probability, st.min_keep, st.mirostat_tau],
      [0.5, 2, 0.5, 3, 4], 'generation_settings');
    assertEq(st.samplers, ['top_k', 'typ_p', 'top_n_sigma', 'xtc', 'temperature'], 'the list by name, in its order');
    // the same fields on the OpenAI endpoints, as llama-server reads them there
    const oa = await ok({ prompt, max_tokens: 6, temperature: 1, top_n_sigma: 1e-6, seed: 7 }, '/v1/completions');
    const oaGreedy = await ok({ prompt, max_tokens: 6, temperature: 0 }, '/v1/completions');
    assertEq(oa.json.choices[0].text, oaGreedy.json.choices[0].text, '/v1/completions top_n_sigma: greedy');
    // llama-server's samplers list there too: top_k 1 (then temperature 1.5) is greedy
    const oaList = await ok({ prompt, max_tokens: 6, temperature: 1.5, top_k: 1, seed: 3,
      samplers: ['top_k', 'temperature'] }, '/v1/completions');
    assertEq(oaList.json.choices[0].text, oaGreedy.json.choices[0].text, '/v1/completions samplers: greedy');
    const oaOff = await ok({ prompt, max_tokens: 6, temperature: 0, top_k: 1, samplers: ['top_p'] },
      '/v1/completions'); // temperature left out of the list: sampling at 1, top_k off
    assert(oaOff.status === 200, 'a list without temperature');
    for (const [list, what] of [[['infill'], 'the infill sampler'], [['bogus'], 'an unknown sampler']]) {
      const bad = await post({ prompt, max_tokens: 2, samplers: list }, '/v1/completions');
      assertEq([bad.status, bad.json.error.param], [400, 'samplers'], `/v1/completions: ${what}`);
    }
  }],
];

// --special: control tokens' text in the output, the end of generation's too (stories260K:
// <s> is 1, </s> 2); a request's skip_special_tokens true undoes it; without the flag neither
const special = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '256', '--special'],
  { cwd: root, name: 'special' });
const plain = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '256'], { cwd: root, name: 'plain' });
tests.push(['--special: control tokens and the end of generation write their text', async () => {
  const ask = (srv, body, p = '/completion') => rawRequest(srv.url, { path: p, body: JSON.stringify({ prompt: 'Once upon', ...body }) });
  const eos = { n_predict: 3, logit_bias: [[2, 100]] }, bos = { n_predict: 2, logit_bias: [[1, 100]] };
  let r = await ask(special, eos);
  assertEq([r.json.content, r.json.stop_type, r.json.tokens_predicted], ['</s>', 'eos', 1], '--special: </s> ends it');
  assertEq((await ask(special, bos)).json.content, '<s><s>', '--special: <s> written');
  r = await ask(special, { max_tokens: 2, logit_bias: { 1: 100 }, skip_special_tokens: true }, '/v1/completions');
  assertEq(r.json.choices[0].text, '', 'skip_special_tokens true undoes it');
  assertEq((await ask(plain, eos)).json.content, '', 'without --special: no </s>');
  assertEq((await ask(plain, bos)).json.content, '', 'without --special: no <s>');
  r = await ask(plain, { max_tokens: 3, logit_bias: { 2: 100 }, skip_special_tokens: false }, '/v1/completions');
  assertEq(r.json.choices[0].text, '', 'vLLM\'s skip_special_tokens false alone leaves the end of generation out');
}]);

// llama-server's /metrics series (llamacpp:*) beside kvllm's: totals of finished requests'
// computed prompt tokens and generated tokens, steps, and throughput gauges over the requests
// finished since the previous read (llama-server resets that bucket at each read)
tests.push(['/metrics: llama-server\'s llamacpp: series', async () => {
  const read = async () => {
    const r = await rawRequest(plain.url, { path: '/metrics', method: 'GET' });
    assertEq(r.status, 200, '/metrics status');
    const v = {};
    for (const m of r.text.matchAll(/^llamacpp:([a-z_]+) (\S+)$/gm)) v[m[1]] = Number(m[2]);
    return v;
  };
  const before = await read();
  assertEq(Object.keys(before).length, 11, `llamacpp: series ${Object.keys(before)}`);
  const ask = (body) => rawRequest(plain.url, { path: '/completion', body: JSON.stringify(body) });
  const story = 'Once upon a time there was a little dog. The dog liked to play in the park with his ball ' +
    'every day, and one day he met a big cat who wanted to play too.';
  const a = (await ask({ prompt: story, n_predict: 6, temperature: 0 })).json;
  const b = (await ask({ prompt: story + ' They played all day', n_predict: 4, temperature: 0 })).json;
  const after = await read();
  const computed = (r) => r.timings.prompt_n; /* the prompt less its cached part (cache_n) */
  assertEq(after.tokens_predicted_total - before.tokens_predicted_total, a.tokens_predicted + b.tokens_predicted,
    'tokens_predicted_total counts the generated tokens');
  assertEq(after.prompt_tokens_total - before.prompt_tokens_total, computed(a) + computed(b),
    `prompt_tokens_total counts the computed prompt tokens (cached ones not: ${b.timings?.cache_n} of the second)`);
  assert(b.timings.cache_n > 0, 'the second prompt reused the first one\'s blocks');
  assert(after.n_decode_total - before.n_decode_total >= a.tokens_predicted + b.tokens_predicted - 2,
    `n_decode_total counts the steps (${after.n_decode_total - before.n_decode_total})`);
  assert(after.n_tokens_max >= computed(a), `n_tokens_max ${after.n_tokens_max}`);
  assert(after.prompt_seconds_total > before.prompt_seconds_total && after.tokens_predicted_seconds_total > before.tokens_predicted_seconds_total,
    'the seconds totals grow');
  assert(after.prompt_tokens_seconds > 0 && after.predicted_tokens_seconds > 0, 'throughput over the bucket');
  assert(after.requests_processing <= 1 && after.requests_deferred === 0, 'processing / deferred');
  assert(after.n_busy_slots_per_decode >= 1, `busy slots per decode ${after.n_busy_slots_per_decode}`);
  let again = await read();
  assertEq([again.prompt_tokens_seconds, again.predicted_tokens_seconds], [0, 0], 'a read resets the bucket');
  for (let i = 0; i < 50 && again.requests_processing !== 0; i++) {
    await new Promise((res) => setTimeout(res, 20)); /* the engine publishes after its step */
    again = await read();
  }
  assertEq([again.requests_processing, again.requests_deferred], [0, 0], 'nothing running or waiting');
  assertEq(again.tokens_predicted_total, after.tokens_predicted_total, 'the totals stay');
}]);

// llama.cpp's web UI streams chat with return_progress and timings_per_token: prompt progress
// chunks (processed rising to the prompt's length, chunk by chunk of --max-batch-tokens 16)
// before the answer, and "timings" in every chunk; the answer itself unchanged
const chunked = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '512', '--max-batch-tokens', '16'],
  { cwd: root, name: 'chunked' });
tests.push(['return_progress and timings_per_token (llama.cpp\'s web UI): progress chunks, timings in every chunk', async () => {
  const messages = [{ role: 'user', content: 'Once upon a time there was a little dog who liked to play in the park' }];
  const ask = async (p, body) => {
    const r = await rawRequest(chunked.url, { path: p, body: JSON.stringify(body) });
    assertEq(r.status, 200, `${p}: ${r.text.slice(0, 200)}`);
    return r.text.split('\n').filter((l) => l.startsWith('data: {')).map((l) => JSON.parse(l.slice(6)));
  };
  const base = { messages, max_tokens: 4, temperature: 0, stream: true, stream_options: { include_usage: true } };
  // the UI's request first: its prompt is computed from scratch (the second one finds it cached)
  const ui = await ask('/v1/chat/completions', { ...base, return_progress: true, timings_per_token: true });
  const plainRun = await ask('/v1/chat/completions', base);
  const text = (evs) => evs.map((e) => e.choices?.[0]?.delta?.content ?? '').join('');
  assertEq(text(ui), text(plainRun), 'the answer is unchanged');
  const prog = ui.filter((e) => e.prompt_progress).map((e) => e.prompt_progress);
  const total = plainRun.at(-1).usage.prompt_tokens;
  assert(prog.length >= 4, `progress chunks: ${prog.length}`);
  assertEq(prog.map((p) => p.total), prog.map(() => total), 'total is the prompt');
  assertEq([prog[0].processed, prog.at(-1).processed], [0, total], 'processed from 0 to the prompt');
  assert(prog.every((p, i) => i === 0 || p.processed > prog[i - 1].processed), 'processed rises chunk by chunk');
  assert(ui.filter((e) => e.choices?.length).every((e) => e.timings && 'predicted_per_second' in e.timings),
    'every chunk carries timings');
  assertEq(ui.filter((e) => e.prompt_progress).map((e) => e.choices[0].delta),
    prog.map(() => ({ role: 'assistant', content: null })), 'progress chunks: an assistant delta, null content');
  assert(!plainRun.some((e) => e.prompt_progress || e.timings), 'nothing of the kind unasked');
  // /completion: llama-server's partials with prompt_progress, then the tokens as without
  const cbody = { prompt: 'Once upon a time there was a little dog who liked to play', n_predict: 3, temperature: 0, stream: true };
  const c0 = await ask('/completion', cbody), c1 = await ask('/completion', { ...cbody, return_progress: true });
  const ctext = (evs) => evs.filter((e) => !e.prompt_progress).map((e) => e.content).join('');
  assertEq(ctext(c1), ctext(c0), '/completion: the answer is unchanged');
  assert(c1.filter((e) => e.prompt_progress).length >= 2, '/completion: progress partials');
  // not streamed: accepted, nothing changes; a wrong type is a 400
  const r = await rawRequest(chunked.url, { path: '/v1/chat/completions',
    body: JSON.stringify({ messages, max_tokens: 2, return_progress: true, timings_per_token: true }) });
  assertEq(r.status, 200, 'not streamed: accepted');
  assertEq(r.json.timings?.predicted_n, r.json.usage.completion_tokens, 'not streamed: the answer\'s timings');
  const bad = await rawRequest(chunked.url, { path: '/v1/chat/completions',
    body: JSON.stringify({ messages, max_tokens: 2, return_progress: 'yes' }) });
  assertEq([bad.status, bad.json.error.param], [400, 'return_progress'], 'a wrong type');
}]);

// llama.cpp's web UI (tools/ui, chat.service.ts) posts its chat requests with llama-server's
// fields: the body it builds with its default settings, on a thinking template, is served
const thinker = await startServer(bin, ['-m', 'tests/data/golden/models/qwen3-f32.gguf', '-c', '512',
  '--kv-type', 'f32', '--chat-template-file', 'tests/data/chat-templates/Qwen3.5-4B.jinja'],
{ cwd: root, name: 'thinker' });
const budgets = JSON.parse(readFileSync(path.join(root, 'tests/data/llama_server/reasoning_budget.json'), 'utf8'));
tests.push(['llama.cpp\'s web UI request: served; its llama-server fields do what llama-server does', async () => {
  const chat = (body) => rawRequest(thinker.url, { path: '/v1/chat/completions', body: JSON.stringify(body) });
  const messages = [{ role: 'user', content: 'Write one word.' }];
  const ui = { messages, stream: true, return_progress: true, sse_ping_interval: 1, reasoning_format: 'auto',
    chat_template_kwargs: { enable_thinking: true }, reasoning_control: true, temperature: 0.8, max_tokens: -1,
    dynatemp_range: 0, dynatemp_exponent: 1, top_k: 40, top_p: 0.95, min_p: 0.05, xtc_probability: 0,
    xtc_threshold: 0.1, typ_p: 1, repeat_last_n: 64, repeat_penalty: 1, presence_penalty: 0,
    frequency_penalty: 0, dry_multiplier: 0, dry_base: 1.75, dry_allowed_length: 2, dry_penalty_last_n: -1,
    samplers: ['penalties', 'dry', 'top_n_sigma', 'top_k', 'typ_p', 'top_p', 'min_p', 'xtc', 'temperature'],
    backend_sampling: false, timings_per_token: true };
  let r = await chat(ui);
  assertEq(r.status, 200, `the UI's request: ${r.text.slice(0, 300)}`);
  assert(r.text.trimEnd().endsWith('data: [DONE]') && r.text.includes('"prompt_progress"'), 'streamed to the end');
  // max_tokens -1: until the context is full
  r = await chat({ messages, max_tokens: -1, temperature: 0, ignore_eos: true });
  assertEq([r.status, r.json.choices[0].finish_reason], [200, 'length'], 'max_tokens -1');
  assertEq(r.json.usage.total_tokens, 512, 'max_tokens -1 runs to the end of the context');
  // thinking_budget_tokens: llama-server's reasoning budget, case by case as llama-server streamed
  // it (its texts stop short of an incomplete UTF-8 character at the end: a prefix of ours)
  for (const c of budgets.cases) {
    const got = await chat({ messages: budgets.messages, max_tokens: 16, temperature: 0,
      thinking_budget_tokens: c.thinking_budget_tokens });
    const m = got.json.choices[0].message;
    const [r, t] = [m.reasoning_content ?? '', m.content ?? ''];
    assert(c.content ? r === c.reasoning_content && t.startsWith(c.content) : r.startsWith(c.reasoning_content),
      `budget ${c.thinking_budget_tokens}: ${JSON.stringify([r, t])} against llama-server's ${JSON.stringify([c.reasoning_content, c.content])}`);
  }
  assert(budgets.cases.filter((c) => c.content).length >= 3, 'the budgets end the thinking');
  // Anthropic's thinking.budget_tokens is the same budget
  const four = budgets.cases.find((c) => c.thinking_budget_tokens === 4);
  const msg = await rawRequest(thinker.url, { path: '/v1/messages', body: JSON.stringify({ model: 'qwen3-f32',
    max_tokens: 16, temperature: 0, messages: budgets.messages, thinking: { type: 'enabled', budget_tokens: 4 } }) });
  assertEq([msg.json.content[0].thinking, msg.json.content[1].text.startsWith(four.content)],
    [four.reasoning_content, true], '/v1/messages thinking.budget_tokens');
  assertEq((await chat({ messages, max_tokens: 1, thinking_budget_tokens: -2 })).json.error.param,
    'thinking_budget_tokens', 'a budget below -1');
  assertEq((await chat({ messages, max_tokens: 1, reasoning_format: 'deepseek-legacy' })).json.error.param,
    'reasoning_format', 'an unknown reasoning_format');
  // typ_p is typical_p; repeat_penalty is llama's penalty over the last repeat_last_n tokens,
  // the same as /completion's on the rendered prompt
  const same = { messages, max_tokens: 8, temperature: 0.9, seed: 5 };
  assertEq((await chat({ ...same, typ_p: 0.3 })).json.choices[0].message.content,
    (await chat({ ...same, typical_p: 0.3 })).json.choices[0].message.content, 'typ_p = typical_p');
  assertEq((await chat({ ...same, typ_p: 0.3, typical_p: 0.3 })).status, 400, 'typ_p with typical_p');
  assertEq((await chat({ ...same, repeat_penalty: 1.3, repetition_penalty: 1.3 })).status, 400,
    'repeat_penalty with repetition_penalty');
  const prompt = (await rawRequest(thinker.url, { path: '/apply-template', body: JSON.stringify({ messages }) })).json.prompt;
  const greedy = { temperature: 0, repeat_penalty: 1.5, repeat_last_n: 16 };
  const viaChat = await chat({ messages, max_tokens: 12, ...greedy });
  const viaCompletion = await rawRequest(thinker.url, { path: '/completion',
    body: JSON.stringify({ prompt, n_predict: 12, samplers: ['penalties', 'temperature'], ...greedy }) });
  const said = (r) => (r.json.choices[0].message.reasoning_content ?? '') + (r.json.choices[0].message.content ?? '');
  assertEq(said(viaChat), viaCompletion.json.content, 'repeat_penalty as /completion\'s');
  assert(said(viaChat) !== said(await chat({ messages, max_tokens: 12, temperature: 0 })), 'the penalty acts');
}]);

// The UI's stop-thinking button: POST /v1/chat/completions/control {id, action: reasoning_end}
// on a streaming completion that armed it (reasoning_control): its thinking ends at once and the
// answer follows (3500 tokens to generate leave the control plenty of time to land mid-thought)
const ctl = await startServer(bin, ['-m', 'tests/data/golden/models/qwen3-f32.gguf', '-c', '4096',
  '--chat-template-file', 'tests/data/chat-templates/Qwen3.5-4B.jinja'], { cwd: root, name: 'control' });
tests.push(['POST /v1/chat/completions/control reasoning_end: the thinking ends mid-stream', async () => {
  const control = (body) => rawRequest(ctl.url, { path: '/v1/chat/completions/control', body: JSON.stringify(body) });
  const u = new URL(ctl.url);
  const events = await new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, path: '/v1/chat/completions', method: 'POST',
      headers: { 'Content-Type': 'application/json' } }, (res) => {
      let text = '', sent = false;
      res.on('data', (c) => {
        text += c.toString('utf8');
        const m = !sent && text.match(/"id":"(chatcmpl-[0-9a-f]+)"/);
        if (m) {
          sent = true;
          control({ id: m[1], action: 'reasoning_end' }).then((r) => {
            if (r.status !== 200 || r.json.success !== true) reject(new Error(`control: ${r.text}`));
          }, reject);
        }
      });
      res.on('end', () => resolve(text.split('\n').filter((l) => l.startsWith('data: {')).map((l) => JSON.parse(l.slice(6)))));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 3500, ignore_eos: true,
      temperature: 0, stream: true, reasoning_control: true }));
  });
  const deltas = events.flatMap((e) => e.choices).map((c) => c.delta ?? {});
  const nReason = deltas.filter((d) => d.reasoning_content).length, nContent = deltas.filter((d) => d.content).length;
  assert(nReason > 0 && nReason < 1000 && nContent > 2000, `thinking cut short: ${nReason} reasoning deltas, ${nContent} content`);
  let r = await control({ id: events[0].id, action: 'reasoning_end' });
  assertEq([r.status, r.json.success, r.json.message], [200, false, 'no active completion for this id'], 'a finished one');
  r = await control({ id: events[0].id, action: 'stop' });
  assertEq([r.status, r.json.error.param], [400, 'action'], 'another action');
  r = await control({ action: 'reasoning_end' });
  assertEq([r.status, r.json.error.param], [400, 'id'], 'no id');
}]);

const failed = await runTests(tests);
const bad = await stopAll([server, fim, overridden, flagged, special, plain, chunked, thinker, ctl]);
rmSync(path.dirname(fimModel), { recursive: true, force: true });
process.exit(failed || bad ? 1 : 0);
