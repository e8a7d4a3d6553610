// kvllm serve with a Jinja chat template (--chat-template-file; a GGUF's
// tokenizer.chat_template takes the same path): the chat prompt is exactly
// transformers' rendering (same tokens as /v1/completions given the oracle's
// text, and the prefix cache reuses all but the last token), OpenAI content
// part arrays and tool-call argument strings are normalised first,
// chat_template_kwargs reach the template, continue_final_message (vLLM's,
// and Anthropic's prefill) cuts the rendering as transformers does, and a
// conversation the template refuses or fails on is a 400 naming why.
// usage: node test_chat_template.mjs BUILD/kvllm REPO_ROOT
import fs from 'node:fs';
import { spawnSync } from 'node:child_process';
import OpenAI from 'openai';
import { startServer, rawRequest, assert, assertEq, runTests } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const DIR = `${root}/tests/data/chat-templates`;
const NAME = 'Qwen-Qwen3-0.6B';
const oracle = JSON.parse(fs.readFileSync(`${DIR}/${NAME}.expected.json`, 'utf8'));
const cases = Object.fromEntries(JSON.parse(fs.readFileSync(`${DIR}/cases.json`, 'utf8')).cases.map((c) => [c.id, c]));
const rendered = (id, kwargs = {}) =>
  oracle.results.find((r) => r.case === id && JSON.stringify(r.kwargs) === JSON.stringify(kwargs)).rendered;

const server = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '1024',
  '--chat-template-file', `${DIR}/${NAME}.jinja`], { cwd: root, name: 'chat-template' });
const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const post = (path, body) => rawRequest(server.url, { path, body: JSON.stringify(body) });

// The chat request's prompt equals the completion of the oracle's text: same
// count, and sent second it is served from the cache but for the last token.
async function samePrompt(id, kwargs, body) {
  const completion = await post('/v1/completions', { prompt: rendered(id, kwargs), parse_special: true, max_tokens: 1 });
  assertEq(completion.status, 200, `${id}: completion`);
  const chat = await post('/v1/chat/completions', { messages: cases[id].messages, max_tokens: 1, ...body });
  assertEq(chat.status, 200, `${id}: chat ${chat.text.slice(0, 200)}`);
  const want = completion.json.usage.prompt_tokens;
  assertEq(chat.json.usage.prompt_tokens, want, `${id}: prompt tokens`);
  assert(chat.json.usage.prompt_tokens_details.cached_tokens >= want - 16, `${id}: chat prompt served from the cache`);
}

// transformers' continue_final_message cut (its apply_chat_template): the
// rendering ends right after the final message's text, found by the last
// place of its stripped text; kept whole where the template kept it whole.
const PY_SPACE = '[\\t\\n\\v\\f\\r \\x1c-\\x1f\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]';
const lstrip = (t) => t.replace(new RegExp(`^${PY_SPACE}+`), '');
const strip = (t) => lstrip(t).replace(new RegExp(`${PY_SPACE}+$`), '');
function continueCut(rendered, final) {
  const at = rendered.lastIndexOf(strip(final));
  assert(at >= 0, 'the final message is in the rendering');
  if (rendered.slice(at, at + lstrip(final).length) === final) return rendered.slice(0, at + lstrip(final).length);
  return rendered.slice(0, at + strip(final).length);
}
// A second template: Llama 3.1's (no thinking block, a header before content).
const LLAMA = 'meta-llama-Llama-3.1-8B-Instruct';
const llamaOracle = JSON.parse(fs.readFileSync(`${DIR}/${LLAMA}.expected.json`, 'utf8'));
const llama = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '1024',
  '--chat-template-file', `${DIR}/${LLAMA}.jinja`], { cwd: root, name: 'llama3' });

// --chat-template as llama-server and vLLM also take it: the template's text, or (vLLM) its file.
const llamaText = fs.readFileSync(`${DIR}/${LLAMA}.jinja`, 'utf8');
const inline = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '1024',
  '--chat-template', llamaText], { cwd: root, name: 'inline' });
const byPath = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '1024',
  '--chat-template', `${DIR}/${LLAMA}.jinja`], { cwd: root, name: 'by-path' });

// llama-server's --prefill-assistant: a final assistant message is continued by default.
const prefill = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '1024', '--prefill-assistant',
  '--chat-template-file', `${DIR}/${NAME}.jinja`], { cwd: root, name: 'prefill' });

// Server-wide template variables: llama-server's --reasoning-budget 0 (enable_thinking false).
const nothink = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '1024', '--reasoning-budget', '0',
  '--chat-template-file', `${DIR}/${NAME}.jinja`], { cwd: root, name: 'no-thinking' });

// Gemma 2's template takes no system role (its caps): llama-server puts the system text in front
// of the next message, as kvllm does; the prompts below are llama-server 81ff7abe's /apply-template.
const gemma2 = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '1024',
  '--chat-template-file', `${DIR}/google-gemma-2-2b-it.jinja`], { cwd: root, name: 'gemma2' });

const failed = await runTests([
  ['a template without a system role: the system text joins the next message, as llama-server does', async () => {
    const apply = async (messages) => {
      const r = await rawRequest(gemma2.url, { path: '/apply-template', body: JSON.stringify({ messages }) });
      assertEq(r.status, 200, r.text);
      return r.json.prompt;
    };
    const sys = { role: 'system', content: 'Be brief.' };
    const merged = await apply([sys, { role: 'user', content: 'Hi there' }]);
    assert(merged.endsWith('<start_of_turn>user\nBe brief.\nHi there<end_of_turn>\n<start_of_turn>model\n'), merged);
    assertEq(merged, await apply([{ role: 'user', content: 'Be brief.\nHi there' }]), 'as if the user had sent both');
    const turns = await apply([sys, { role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello' },
      { role: 'user', content: 'More' }]);
    assert(turns.endsWith('<start_of_turn>user\nBe brief.\nHi<end_of_turn>\n<start_of_turn>model\nHello' +
      '<end_of_turn>\n<start_of_turn>user\nMore<end_of_turn>\n<start_of_turn>model\n'), turns);
    const chat = await rawRequest(gemma2.url, { path: '/v1/chat/completions', body: JSON.stringify({
      messages: [sys, { role: 'user', content: 'Hi there' }], max_tokens: 1 }) });
    assertEq(chat.status, 200, `a chat request with a system message: ${chat.text}`);
    const props = await rawRequest(gemma2.url, { method: 'GET', path: '/props' });
    assertEq(props.json.chat_template_caps.supports_system_role, false, '/props says so');
  }],
  ['the log names the template', async () => {
    assert(server.log().includes('chat template: Jinja, from the file'), server.log());
  }],
  ['chat prompt = transformers rendering (system + multi-turn)', async () => {
    await samePrompt('c03_multi_turn', {}, {});
  }],
  ['/apply-template: the prompt is transformers\' text (llama-server\'s endpoint)', async () => {
    for (const [id, kwargs] of [['c03_multi_turn', {}], ['c01_single_user', { enable_thinking: false }]]) {
      const body = { messages: cases[id].messages };
      if (Object.keys(kwargs).length) body.chat_template_kwargs = kwargs;
      const r = await post('/apply-template', body);
      assertEq(r.status, 200, `${id}: ${r.text.slice(0, 200)}`);
      assertEq(r.json.prompt, rendered(id, kwargs), `${id}: rendered text`);
    }
    const bad = await post('/apply-template', { messages: [] });
    assertEq([bad.status, bad.json.error.param], [400, 'messages'], 'no messages');
  }],
  ['--chat-template TEXT and --chat-template FILE: that template, rendered as transformers does', async () => {
    /* its bos_token is the served vocabulary's (stories260K's <s>), not Llama 3's */
    const want = llamaOracle.results.find((r) => r.case === 'c03_multi_turn' && JSON.stringify(r.kwargs) === '{}')
      .rendered.replace('<|begin_of_text|>', '<s>');
    for (const [srv, source] of [[inline, 'inline'], [byPath, `file:${DIR}/${LLAMA}.jinja`]]) {
      const props = (await rawRequest(srv.url, { method: 'GET', path: '/props' })).json;
      assertEq([props.chat_template, props.chat_template_source], [llamaText, source], `${source}: /props`);
      const r = await rawRequest(srv.url, { path: '/apply-template', body: JSON.stringify({ messages: cases.c03_multi_turn.messages }) });
      assertEq(r.json.prompt, want, `${source}: rendered text`);
    }
  }],
  ['--prefill-assistant: a final assistant message is continued unless the request says otherwise', async () => {
    const messages = [{ role: 'user', content: 'Tell me a story.' }, { role: 'assistant', content: 'Once upon a time' }];
    const at = (srv, extra) => rawRequest(srv.url, { path: '/apply-template', body: JSON.stringify({ messages, ...extra }) })
      .then((r) => r.json.prompt);
    const continued = await at(server, { continue_final_message: true, add_generation_prompt: false });
    const newTurn = await at(server, {});
    assert(continued !== newTurn && continued.endsWith('Once upon a time'), 'the two renderings differ');
    assertEq(await at(prefill, {}), continued, 'continued by default');
    assertEq(await at(prefill, { add_generation_prompt: true }), newTurn, 'add_generation_prompt: a new turn');
    assertEq(await at(prefill, { messages: [messages[0]] }), await at(server, { messages: [messages[0]] }),
      'a final user message: as without the flag');
  }],
  ['chat_template_kwargs: enable_thinking false', async () => {
    await samePrompt('c01_single_user', { enable_thinking: false }, { chat_template_kwargs: { enable_thinking: false } });
  }],
  ['content part arrays become strings', async () => {
    const msgs = cases.c08_content_parts.messages;
    const joined = msgs.map((m) => (Array.isArray(m.content) ? { ...m, content: m.content.map((p) => p.text).join('\n') } : m));
    const a = await post('/v1/chat/completions', { messages: msgs, max_tokens: 1 });
    const b = await post('/v1/chat/completions', { messages: joined, max_tokens: 1 });
    assertEq(a.status, 200, `parts: ${a.text.slice(0, 200)}`);
    assertEq(a.json.usage.prompt_tokens, b.json.usage.prompt_tokens, 'same prompt as the joined string');
  }],
  ['tool-call arguments strings become objects', async () => {
    const conv = (args) => [{ role: 'user', content: 'Weather?' },
      { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'w', arguments: args } }] },
      { role: 'tool', tool_call_id: 'c1', content: 'Sunny and warm all day, with a light breeze from the river in the evening.' }];
    const a = await post('/v1/chat/completions', { messages: conv({ city: 'Paris' }), max_tokens: 1 });
    const b = await post('/v1/chat/completions', { messages: conv('{"city":"Paris"}'), max_tokens: 1 }); // compact: only tojson adds the spaces
    assertEq(a.status, 200, a.text.slice(0, 200));
    assertEq(b.status, 200, b.text.slice(0, 200));
    const n = a.json.usage.prompt_tokens;
    assertEq(b.json.usage.prompt_tokens, n, 'string arguments render as the object');
    // the same text: the second is served from the cache up to its last block
    assert(b.json.usage.prompt_tokens_details.cached_tokens >= n - 16,
      `cached ${b.json.usage.prompt_tokens_details.cached_tokens} of ${n}: the prompts differ`);
  }],
  ['the OpenAI client gets a chat completion', async () => {
    const r = await client.chat.completions.create({ model: 'stories260K', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 3 });
    assertEq(r.object, 'chat.completion', 'object');
  }],
  ['continue_final_message: transformers\' cut of the final message; Anthropic\'s prefill', async () => {
    const id = 'c09_no_generation_prompt', msgs = cases[id].messages;
    const final = msgs[msgs.length - 1].content;
    for (const [srv, want] of [[server, rendered(id)],
      // its bos_token is the served vocabulary's (stories260K's <s>), not Llama 3's
      [llama, llamaOracle.results.find((r) => r.case === id && JSON.stringify(r.kwargs) === '{}').rendered
        .replace('<|begin_of_text|>', '<s>')]]) {
      const r = await rawRequest(srv.url, { path: '/apply-template', body: JSON.stringify({ messages: msgs, continue_final_message: true }) });
      assertEq(r.status, 200, r.text.slice(0, 200));
      assertEq(r.json.prompt, continueCut(want, final), 'the rendering cut after the final message');
      assert(r.json.prompt.endsWith(final), 'ends with the assistant text');
    }
    // trailing white space the template keeps stays; the last text part is the one continued
    const spaced = [msgs[0], { role: 'assistant', content: 'Hi there!  ' }];
    const open = await post('/apply-template', { messages: spaced, add_generation_prompt: false });
    const cont = await post('/apply-template', { messages: spaced, continue_final_message: true, add_generation_prompt: false });
    assertEq(cont.json.prompt, continueCut(open.json.prompt, 'Hi there!  '), 'trailing spaces');
    const parts = [msgs[0], { role: 'assistant', content: [{ type: 'text', text: 'One.' }, { type: 'text', text: 'Two <|im_end|> x' }] }];
    const p = await post('/apply-template', { messages: parts, continue_final_message: true });
    assert(p.json.prompt.endsWith('One.\nTwo <|im_end|> x'), `parts: ${JSON.stringify(p.json.prompt.slice(-40))}`);
    // the client's <|im_end|> stays text: the same count as the cut text sent as text
    const both = await post('/v1/chat/completions', { messages: [msgs[0], { role: 'assistant', content: 'Hi there' }], continue_final_message: true, max_tokens: 1 });
    const text = continueCut(rendered(id).replace('Hi there!', 'Hi there'), 'Hi there');
    const compl = await post('/v1/completions', { prompt: text, parse_special: true, max_tokens: 1 });
    assertEq(both.json.usage.prompt_tokens, compl.json.usage.prompt_tokens, 'chat prompt = the cut text');
    // Anthropic's Messages API continues a final assistant message (its prefill)
    const count = await post('/v1/messages/count_tokens', { model: 'stories260K', messages: [msgs[0], { role: 'assistant', content: 'Hi there' }] });
    assertEq(count.json.input_tokens, compl.json.usage.prompt_tokens, 'prefill: the same prompt');
    const bad = await post('/v1/chat/completions', { messages: msgs, continue_final_message: true, add_generation_prompt: true });
    assertEq([bad.status, bad.json.error.param], [400, 'continue_final_message'], 'both true');
  }],
  ['--reasoning-budget 0 / --chat-template-kwargs: defaults a request\'s kwargs override', async () => {
    const body = { messages: cases.c01_single_user.messages };
    const a = await rawRequest(nothink.url, { path: '/apply-template', body: JSON.stringify(body) });
    assertEq(a.json.prompt, rendered('c01_single_user', { enable_thinking: false }), 'the server default');
    const b = await rawRequest(nothink.url, { path: '/apply-template',
      body: JSON.stringify({ ...body, chat_template_kwargs: { enable_thinking: true } }) });
    assertEq(b.json.prompt, rendered('c01_single_user', {}), 'the request wins');
    assertEq(b.json.prompt, (await post('/apply-template', body)).json.prompt, 'as without the default');
    for (const [flag, v] of [['--chat-template-kwargs', '[1]'], ['--reasoning-budget', '-7'], ['--reasoning-format', 'x']]) {
      const p = spawnSync(bin, ['serve', flag, v], { encoding: 'utf8' });
      assert(p.status === 2 && p.stderr.includes(flag), `${flag} ${v}: ${p.status} ${p.stderr}`);
    }
  }],
  ['a conversation the template fails on is a 400 naming why', async () => {
    const r = await post('/v1/chat/completions', { messages: cases.c07c_tool_roundtrip_no_content_key.messages, max_tokens: 1 });
    assertEq(r.status, 400, r.text);
    assert(r.json.error.message.includes("has no attribute 'content'"), r.json.error.message);
    const k = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], chat_template_kwargs: 3 });
    assertEq(k.status, 400, 'chat_template_kwargs not an object');
  }],
]);

let bad = 0;
for (const srv of [server, llama, nothink, inline, byPath, prefill, gemma2]) {
  const code = await srv.stop();
  if (code !== 0) console.log(`server exit code ${code}; log:\n${srv.log()}`), bad++;
}
process.exit(failed || bad ? 1 : 0);
