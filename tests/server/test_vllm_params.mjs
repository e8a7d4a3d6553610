// vLLM's request extras through the official OpenAI client (extra body
// fields, as vLLM's docs pass them): stop_token_ids (stop_reason the id, the
// token's text left out unless include_stop_str_in_output), min_tokens (EOS,
// stop ids and stop strings held off), include_stop_str_in_output,
// allowed_token_ids, skip_special_tokens, truncate_prompt_tokens, bad_words,
// structured_outputs, prompt_logprobs and stream_options.continuous_usage_stats,
// whole and streamed, and what is refused. Each is
// checked against the same request without it on stories260K, greedy:
// the reference is the model's own output, the expectations vLLM's rules.
// usage: node test_vllm_params.mjs BUILD/kvllm REPO_ROOT
import OpenAI from 'openai';
import { startServer, rawRequest, assert, assertEq, runTests, stopAll } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const server = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '256'], { cwd: root, name: 'stories' });
const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const model = (await client.models.list()).data[0].id;
const PROMPT = 'Once upon a time';
const EOS = 2, BOS = 1; // stories260K's </s> and <s> (a control token that does not end generation)

const complete = (extra) => client.completions.create({ model, prompt: PROMPT, temperature: 0, max_tokens: 24, ...extra });
// The generated ids of a greedy run (as vLLM's return_tokens_as_token_ids writes them).
async function ids(extra) {
  const r = await complete({ logprobs: 1, return_tokens_as_token_ids: true, ...extra });
  const lp = r.choices[0].logprobs; // null when nothing but the end was generated
  return { r, ids: lp ? lp.tokens.map((t) => Number(t.slice('token_id:'.length))) : [] };
}
async function refused(body, param) {
  const r = await rawRequest(server.url, { body: JSON.stringify({ model, prompt: PROMPT, ...body }) });
  assertEq(r.status, 400, `${JSON.stringify(body)}: ${r.text.slice(0, 200)}`);
  assertEq(r.json.error.param, param, `${JSON.stringify(body)}: param`);
}

const tests = Object.entries({
  async 'stream_options.continuous_usage_stats: every chunk carries the usage so far'() {
    for (const chat of [false, true]) {
      const body = { model, temperature: 0, max_tokens: 5, stream: true, stream_options: { include_usage: true, continuous_usage_stats: true } };
      const st = chat ? await client.chat.completions.create({ ...body, messages: [{ role: 'user', content: PROMPT }] })
        : await client.completions.create({ ...body, prompt: PROMPT });
      const usages = [];
      let final;
      for await (const ch of st) {
        if (ch.choices.length) usages.push(ch.usage);
        else final = ch.usage;
      }
      const what = chat ? 'chat' : 'completions';
      assert(usages.length >= 5 && usages.every((u) => u && u.prompt_tokens === final.prompt_tokens),
        `${what}: every chunk with the prompt's count (${JSON.stringify(usages)})`);
      const counts = usages.map((u) => u.completion_tokens);
      assert(counts.every((c, i) => i === 0 || c >= counts[i - 1]) && counts.at(-1) === final.completion_tokens,
        `${what}: the counts grow to the final ${final.completion_tokens}: ${counts}`);
      assert(usages.every((u) => u.total_tokens === u.prompt_tokens + u.completion_tokens), `${what}: totals`);
      if (chat) assertEq(counts[0], 0, 'chat: the role chunk before any token');
    }
    // without include_usage it changes nothing (vLLM's rule)
    const st = await client.completions.create({ model, prompt: PROMPT, max_tokens: 3, stream: true, stream_options: { include_usage: false, continuous_usage_stats: true } });
    for await (const ch of st) assert(!ch.usage, 'no usage without include_usage');
  },

  async 'prompt_logprobs: per position the prompt token (its rank) and the top k, as echo computes them'() {
    // the reference: the same prompt's echo with logprobs (OpenAI's shape, checked against llama.cpp)
    const r = await complete({ max_tokens: 1, echo: true, logprobs: 3, prompt_logprobs: 3, return_tokens_as_token_ids: true });
    const c = r.choices[0], lp = c.logprobs;
    const n = r.usage.prompt_tokens;
    const plp = c.prompt_logprobs;
    assertEq([plp.length, plp[0]], [n, null], 'one entry a prompt token, the first null');
    const promptIds = lp.tokens.slice(0, n).map((t) => Number(t.slice('token_id:'.length)));
    for (let p = 1; p < n; p++) {
      const e = plp[p], own = e[String(promptIds[p])];
      assert(own, `position ${p}: the prompt token ${promptIds[p]} is in the entry`);
      assertEq(own.logprob, lp.token_logprobs[p], `position ${p}: its logprob is echo's`);
      const keys = Object.keys(e); // (JavaScript orders integer keys: the text's order is not seen here)
      const top = keys.filter((k) => e[k].rank <= 3).sort((a, b) => e[a].rank - e[b].rank);
      const echoTop = Object.entries(lp.top_logprobs[p]).map(([t, v]) => [Number(t.slice('token_id:'.length)), v]);
      assertEq(top.map((k) => [Number(k), e[k].logprob]), echoTop, `position ${p}: the top 3 and their logprobs`);
      assert(own.rank >= 1 && (own.rank <= 3) === top.includes(String(promptIds[p])),
        `position ${p}: rank ${own.rank} says whether it is among the top 3`);
      assertEq(keys.length, own.rank <= 3 ? 3 : 4, `position ${p}: the prompt token once`);
      assert(typeof own.decoded_token === 'string', 'decoded_token');
    }
    // chat: beside the choices, over the rendered prompt
    const chat = await client.chat.completions.create({ model, messages: [{ role: 'user', content: PROMPT }], max_tokens: 1, prompt_logprobs: 0 });
    assertEq(chat.prompt_logprobs.length, chat.usage.prompt_tokens, 'chat: one entry a prompt token');
    assert(chat.prompt_logprobs.slice(1).every((e) => Object.keys(e).length === 1), 'k 0: the prompt token alone');
    // not in a stream, not the whole vocabulary (vLLM's -1), not beyond 20
    await refused({ prompt_logprobs: 2, stream: true }, 'prompt_logprobs');
    await refused({ prompt_logprobs: -1 }, 'prompt_logprobs');
    await refused({ prompt_logprobs: 21 }, 'prompt_logprobs');
  },

  async 'stop_token_ids: ends at the id, stop_reason the id, its text out unless included'() {
    const base = await ids({});
    const stopId = base.ids[2]; // the third token of the greedy output
    const first = base.ids.indexOf(stopId);
    const a = await ids({ stop_token_ids: [stopId] });
    assertEq(a.r.choices[0].finish_reason, 'stop', 'finish_reason');
    assertEq(a.r.choices[0].stop_reason, stopId, 'stop_reason: the id');
    assertEq(a.r.usage.completion_tokens, first + 1, 'the stop token counts');
    const b = await complete({ stop_token_ids: [stopId], include_stop_str_in_output: true });
    assert(b.choices[0].text.startsWith(a.r.choices[0].text) && b.choices[0].text.length > a.r.choices[0].text.length,
      `included: '${b.choices[0].text}' after '${a.r.choices[0].text}'`);
    assertEq(b.choices[0].text, base.r.choices[0].text.slice(0, b.choices[0].text.length), 'the same text up to it');
    // streamed: the same text and the id in the last chunk's stop_reason
    let text = '', last;
    const st = await client.completions.create({ model, prompt: PROMPT, temperature: 0, max_tokens: 24, stream: true, stop_token_ids: [stopId] });
    for await (const ch of st) { text += ch.choices[0]?.text ?? ''; if (ch.choices[0]?.finish_reason) last = ch.choices[0]; }
    assertEq(text, a.r.choices[0].text, 'streamed text');
    assertEq(last.stop_reason, stopId, 'streamed stop_reason');
  },

  async 'min_tokens: EOS and stop ids masked, stop strings held off until then'() {
    const early = await ids({ logit_bias: { [EOS]: 30 }, max_tokens: 60 }); // EOS pushed: ends at once
    assertEq(early.r.usage.completion_tokens, 1, 'EOS first without min_tokens');
    const held = await ids({ logit_bias: { [EOS]: 30 }, max_tokens: 60, min_tokens: 10 });
    assert(held.r.usage.completion_tokens > 10, `min_tokens 10: ${held.r.usage.completion_tokens} tokens`);
    assert(!held.ids.slice(0, 10).includes(EOS), 'no EOS among the first 10');
    const base = await ids({});
    const stopId = base.ids[2];
    const masked = await ids({ stop_token_ids: [stopId], min_tokens: 3 });
    assert(masked.ids[2] !== stopId, 'the stop id is masked at the third token');
    // a stop string completed before min_tokens is passed over; at min_tokens it counts
    const word = base.r.choices[0].text.split(' ').filter(Boolean)[1]; // the output's second word
    const at = base.r.choices[0].text.indexOf(word);
    const plain = await complete({ stop: [word] });
    assertEq(plain.choices[0].text, base.r.choices[0].text.slice(0, at), 'stop string');
    const n = plain.usage.completion_tokens;
    const later = await complete({ stop: [word], min_tokens: n + 1, max_tokens: 24 });
    assert(later.choices[0].text.length > at, `held off: '${later.choices[0].text}'`);
    const same = await complete({ stop: [word], min_tokens: n });
    assertEq(same.choices[0].text, plain.choices[0].text, 'at min_tokens the stop string counts');
    const inc = await complete({ stop: [word], include_stop_str_in_output: true });
    assertEq(inc.choices[0].text, base.r.choices[0].text.slice(0, at + word.length), 'include_stop_str_in_output');
    assertEq(inc.choices[0].stop_reason, word, 'stop_reason: the string');
  },

  async 'allowed_token_ids, skip_special_tokens, truncate_prompt_tokens'() {
    const base = await ids({});
    const allowed = [base.ids[3], base.ids[5]];
    for (const seed of [1, 2, 3]) {
      const r = await ids({ allowed_token_ids: allowed, temperature: 1, seed, max_tokens: 12 });
      assert(r.ids.every((t) => allowed.includes(t)), `seed ${seed}: ${r.ids} outside ${allowed}`);
    }
    const hidden = await complete({ logit_bias: { [BOS]: 100 }, max_tokens: 4 });
    assertEq(hidden.choices[0].text, '', 'control tokens print as nothing by default');
    const shown = await complete({ logit_bias: { [BOS]: 100 }, max_tokens: 4, skip_special_tokens: false });
    assertEq(shown.choices[0].text, '<s><s><s><s>', 'skip_special_tokens false: their text');
    const long = 'Once upon a time there was a little girl';
    const full = await client.completions.create({ model, prompt: long, temperature: 0, max_tokens: 8 });
    const cut = await client.completions.create({ model, prompt: long, temperature: 0, max_tokens: 8, truncate_prompt_tokens: 4 });
    assertEq(cut.usage.prompt_tokens, 4, 'truncated prompt');
    assert(full.usage.prompt_tokens > 4, 'the prompt is longer than the cut');
    const ctx = await client.completions.create({ model, prompt: long, temperature: 0, max_tokens: 8, truncate_prompt_tokens: -1 });
    assertEq(ctx.choices[0].text, full.choices[0].text, '-1: the context, which holds it all');
  },

  async 'bad_words: a word\'s token sequence (and " word"\'s) never appears in the output'() {
    const has = (hay, needle) => hay.some((_, i) => needle.every((t, k) => hay[i + k] === t));
    const tok = async (text) => (await rawRequest(server.url, { path: '/tokenize', body: JSON.stringify({ content: text }) })).json.tokens;
    const base = await ids({ max_tokens: 30 });
    const seqs = [await tok('girl'), await tok(' girl')];
    // stories260K's SentencePiece writes 'girl' as ' g' 'ir' 'l' (its dummy prefix), as in the text
    assert(has(base.ids, seqs[0]), `the greedy output has 'girl': ${base.r.choices[0].text}`);
    const one = await ids({ max_tokens: 30, bad_words: ['girl'] });
    for (const q of seqs) assert(!has(one.ids, q), `${JSON.stringify(q)} banned: ${one.r.choices[0].text}`);
    const first = base.ids.findIndex((_, i) => seqs[0].every((t, k) => base.ids[i + k] === t));
    assertEq(one.ids.slice(0, first + seqs[0].length - 1).join(), base.ids.slice(0, first + seqs[0].length - 1).join(),
      'the same output up to the banned last token');
    // a two-word sequence: its last token is banned only right after the rest
    const two = await complete({ max_tokens: 30, bad_words: ['little girl'] });
    assert(!two.choices[0].text.includes('little girl'), `'little girl' banned: ${two.choices[0].text}`);
    await refused({ bad_words: [''] }, 'bad_words');
    await refused({ bad_words: 'girl' }, 'bad_words');
  },

  async 'structured_outputs: choice, regex, json_object'() {
    const c = await complete({ structured_outputs: { choice: ['cat', 'dog'] } });
    assert(['cat', 'dog'].includes(c.choices[0].text), `choice: '${c.choices[0].text}'`);
    const r = await complete({ structured_outputs: { regex: '[0-9]{3}' } });
    assert(/^[0-9]{3}$/.test(r.choices[0].text), `regex: '${r.choices[0].text}'`);
    const j = await complete({ structured_outputs: { json_object: true }, max_tokens: 60 });
    if (j.choices[0].finish_reason === 'stop') JSON.parse(j.choices[0].text);
    assert(j.choices[0].text.trimStart().startsWith('{'), `json_object: '${j.choices[0].text}'`);
  },

  async 'refusals name the field'() {
    await refused({ stop_token_ids: [512] }, 'stop_token_ids');
    await refused({ stop_token_ids: [] }, 'stop_token_ids');
    await refused({ allowed_token_ids: [-1] }, 'allowed_token_ids');
    await refused({ min_tokens: 9, max_tokens: 8 }, 'min_tokens');
    await refused({ min_tokens: -1 }, 'min_tokens');
    await refused({ truncate_prompt_tokens: 0 }, 'truncate_prompt_tokens');
    await refused({ skip_special_tokens: 'no' }, 'skip_special_tokens');
    await refused({ structured_outputs: { json: {}, regex: 'a' } }, 'structured_outputs');
    await refused({ structured_outputs: { structural_tag: 'x' } }, 'structured_outputs');
    await refused({ structured_outputs: { choice: ['a'] }, guided_regex: 'b' }, 'structured_outputs');
  },
});

// several names (vLLM's --served-model-name, llama-server's --alias a,b): each is listed and
// accepted as a request's model; answers carry the first; another name is a 404
// (vLLM's form, names apart; llama-server's --alias takes them comma-separated, the same list)
const named = await startServer(bin, ['--served-model-name', 'tiny', 'stories/260k', 'alt',
  '-m', 'models/stories260K.gguf', '-c', '256'], { cwd: root, name: 'named' });
tests.push(['--served-model-name a b c: every name listed and served, answers under the first', async () => {
  const models = await rawRequest(named.url, { path: '/v1/models', method: 'GET' });
  assertEq(models.json.data.map((m) => m.id), ['tiny', 'stories/260k', 'alt'], '/v1/models ids');
  for (const name of ['tiny', 'stories/260k', 'alt']) {
    const r = await rawRequest(named.url, { path: '/v1/completions',
      body: JSON.stringify({ model: name, prompt: 'Once upon', max_tokens: 2, temperature: 0 }) });
    assertEq([r.status, r.json.model], [200, 'tiny'], `model ${name}`);
  }
  const one = await rawRequest(named.url, { path: '/v1/models/alt', method: 'GET' });
  assertEq([one.status, one.json.id], [200, 'alt'], '/v1/models/alt');
  const r = await rawRequest(named.url, { path: '/v1/completions',
    body: JSON.stringify({ model: 'other', prompt: 'Once upon', max_tokens: 2 }) });
  assertEq(r.status, 404, 'another name');
}]);

// vLLM's /invocations (SageMaker's one route): the request's kind from its body
tests.push(['/invocations: a chat, a completion or an embedding request by its body', async () => {
  const inv = (body) => rawRequest(server.url, { path: '/invocations', body: JSON.stringify(body) });
  const chat = { messages: [{ role: 'user', content: 'Once upon' }], max_tokens: 3, temperature: 0 };
  let r = await inv(chat);
  const direct = await rawRequest(server.url, { path: '/v1/chat/completions', body: JSON.stringify(chat) });
  assertEq([r.status, r.json.object, r.json.choices[0].message.content],
    [200, 'chat.completion', direct.json.choices[0].message.content], 'messages: a chat completion');
  r = await inv({ prompt: 'Once upon', max_tokens: 3, temperature: 0 });
  assertEq([r.status, r.json.object], [200, 'text_completion'], 'prompt: a completion');
  r = await inv({ input: 'Once upon' });
  assertEq([r.status, r.json.object, Array.isArray(r.json.data?.[0]?.embedding)], [200, 'list', true], 'input: embeddings');
  r = await inv({ text: 'x' });
  assertEq(r.status, 400, 'neither');
}]);

// llama-server's input_tokens counts (OpenAI's for responses): what the request's usage reports
tests.push(['POST .../input_tokens: the prompt tokens the request would take', async () => {
  const post = (p, body) => rawRequest(server.url, { path: p, body: JSON.stringify(body) });
  const chat = { messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Once upon' }] };
  let r = await post('/v1/chat/completions/input_tokens', chat);
  const ran = await post('/v1/chat/completions', { ...chat, max_tokens: 1 });
  assertEq([r.status, r.json.object, r.json.input_tokens], [200, 'response.input_tokens', ran.json.usage.prompt_tokens],
    'chat');
  r = await post('/v1/responses/input_tokens', { input: 'Once upon', instructions: 'Be brief.' });
  const resp = await post('/v1/responses', { input: 'Once upon', instructions: 'Be brief.', max_output_tokens: 1 });
  assertEq([r.status, r.json.input_tokens], [200, resp.json.usage.input_tokens], 'responses');
  r = await post('/v1/chat/completions/input_tokens', { messages: [] });
  assertEq([r.status, r.json.error.param], [400, 'messages'], 'a bad request is the request\'s 400');
}]);

const failed = await runTests(tests);
const bad = await stopAll([server, named]);
process.exit(failed || bad ? 1 : 0);
