// Tool calling and reasoning through kvllm serve, with the official OpenAI client.
// - The template renders `tools` and the tool-call history exactly as
//   transformers does (the prompt equals the oracle's rendering of the same
//   conversation, tests/data/chat-templates).
// - tool_choice "required" / a named function constrain the output to calls in
//   the model's own format: even stories260K (a tiny story model) then answers
//   with valid calls whose arguments match the function's schema (checked with
//   zod, an independent validator), non-streaming and streamed as OpenAI streams
//   them (delta.tool_calls). Without a template, the generic JSON format.
// - <think> templates: the output is split into reasoning_content and content
//   (DeepSeek R1's prompt opens the think block, so a random model's whole
//   answer is reasoning; Qwen3 with enable_thinking false has none).
// - Bad tools / tool_choice values are 400s naming the field.
// usage: node test_tools.mjs BUILD/kvllm REPO_ROOT
import fs from 'node:fs';
import OpenAI from 'openai';
import { z } from 'zod';
import { startServer, rawRequest, assert, assertEq, runTests, stopAll } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const DIR = `${root}/tests/data/chat-templates`;
const cases = Object.fromEntries(JSON.parse(fs.readFileSync(`${DIR}/cases.json`, 'utf8')).cases.map((c) => [c.id, c]));
const oracle = (name) => JSON.parse(fs.readFileSync(`${DIR}/${name}.expected.json`, 'utf8'));
const rendered = (o, id, kwargs = {}) =>
  o.results.find((r) => r.case === id && JSON.stringify(r.kwargs) === JSON.stringify(kwargs)).rendered;

const start = (name, extra) => startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '2048', ...extra],
  { cwd: root, name });
const qwen = await start('qwen3', ['--chat-template-file', `${DIR}/Qwen-Qwen3-0.6B.jinja`]);
const r1 = await start('r1', ['--chat-template-file', `${DIR}/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja`]);
const plain = await start('no-template', []);
const oss = await start('gpt-oss', ['--chat-template-file', `${DIR}/openai-gpt-oss-120b.jinja`]);
const servers = [qwen, r1, plain, oss];
const clientOf = (s) => new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
const post = (s, path, body) => rawRequest(s.url, { path, body: JSON.stringify(body) });

const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the current weather for a city.',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', maxLength: 12 },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
        days: { type: 'integer', minimum: 1, maximum: 7 },
      },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};
const weatherArgs = z.object({
  city: z.string().max(12), unit: z.enum(['celsius', 'fahrenheit']), days: z.number().int().min(1).max(7).optional(),
}).strict();
const TIME = {
  type: 'function',
  function: {
    name: 'get_time',
    description: 'Current time in a time zone.',
    parameters: { type: 'object', properties: { zone: { type: 'string', enum: ['UTC', 'Asia/Seoul'] } }, required: ['zone'] },
  },
};
const timeArgs = z.object({ zone: z.enum(['UTC', 'Asia/Seoul']) });
const validate = (call) => {
  assertEq(call.type, 'function', 'type');
  assert(/^call_[A-Za-z0-9]{24}$/.test(call.id), `id ${call.id}`);
  const args = JSON.parse(call.function.arguments);
  if (call.function.name === 'get_weather') weatherArgs.parse(args);
  else if (call.function.name === 'get_time') timeArgs.parse(args);
  else throw new Error(`unknown function ${call.function.name}`);
  return args;
};
const user = [{ role: 'user', content: 'What is the weather in Paris?' }];

// The chat prompt equals the oracle's text: the same token count as the
// completion of that text, and served from the prefix cache after it.
async function samePrompt(s, o, id, body) {
  const c = await post(s, '/v1/completions', { prompt: rendered(o, id), max_tokens: 1 });
  assertEq(c.status, 200, `${id}: completion ${c.text.slice(0, 200)}`);
  const chat = await post(s, '/v1/chat/completions', { messages: cases[id].messages, tools: cases[id].tools, max_tokens: 1, ...body });
  assertEq(chat.status, 200, `${id}: chat ${chat.text.slice(0, 300)}`);
  assertEq(chat.json.usage.prompt_tokens, c.json.usage.prompt_tokens, `${id}: prompt tokens`);
  assert(chat.json.usage.prompt_tokens_details.cached_tokens >= c.json.usage.prompt_tokens - 16, `${id}: same text (cache)`);
}

// Streams a chat request and rebuilds the message from the deltas, checking
// the chunk shapes OpenAI uses for tool calls.
async function streamed(client, body) {
  const stream = await client.chat.completions.create({ ...body, stream: true });
  const calls = [];
  let content = '', reasoning = '', finish = null;
  for await (const chunk of stream) {
    for (const ch of chunk.choices) {
      const d = ch.delta ?? {};
      if (d.content) content += d.content;
      if (d.reasoning_content) reasoning += d.reasoning_content;
      for (const tc of d.tool_calls ?? []) {
        if (tc.id) {
          assertEq(tc.index, calls.length, 'a new call takes the next index');
          assertEq(tc.type, 'function', 'first chunk: type');
          assertEq(tc.function.arguments, '', 'first chunk: empty arguments');
          calls.push({ id: tc.id, type: tc.type, function: { name: tc.function.name, arguments: '' } });
        } else {
          assert(calls[tc.index], `fragment for unknown call ${tc.index}`);
          calls[tc.index].function.arguments += tc.function.arguments;
        }
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { content, reasoning, calls, finish };
}

const failed = await runTests([
  ['the template renders tools and the tool-call history as transformers does', async () => {
    const q = oracle('Qwen-Qwen3-0.6B');
    await samePrompt(qwen, q, 'c06_tools', {});
    await samePrompt(qwen, q, 'c07b_tool_roundtrip_args_string', {});
    await samePrompt(qwen, q, 'c11_parallel_tool_calls', {});
  }],
  ['tool_choice none: tools rendered, output not parsed', async () => {
    const r = await post(qwen, '/v1/chat/completions', { messages: user, tools: [WEATHER], tool_choice: 'none', max_tokens: 8 });
    assertEq(r.status, 200, r.text);
    assertEq(r.json.choices[0].message.tool_calls, undefined, 'no calls');
    assertEq(typeof r.json.choices[0].message.content, 'string', 'content');
  }],
  ['tool_choice required: a valid call from a random model (Hermes format)', async () => {
    const client = clientOf(qwen);
    for (let seed = 1; seed <= 3; seed++) {
      const r = await client.chat.completions.create({
        model: 'stories260K', messages: user, tools: [WEATHER, TIME], tool_choice: 'required', seed, max_tokens: 400,
        chat_template_kwargs: { enable_thinking: false },
      });
      const m = r.choices[0].message;
      assertEq(r.choices[0].finish_reason, 'tool_calls', `seed ${seed}: finish ${JSON.stringify(r.choices[0])}`);
      assert(m.tool_calls.length >= 1, 'at least one call');
      m.tool_calls.forEach(validate);
      // parallel calls are allowed: a call cut off by max_tokens stays content
      if (r.usage.completion_tokens < 400) assertEq(m.content, null, 'no content besides the calls');
      else assert(m.content === null || m.content.startsWith('<tool_call>'), `the cut call: ${m.content}`);
    }
  }],
  ['a named function, parallel_tool_calls false: exactly that one call', async () => {
    const r = await clientOf(qwen).chat.completions.create({
      model: 'stories260K', messages: user, tools: [WEATHER, TIME], max_tokens: 200, seed: 7,
      tool_choice: { type: 'function', function: { name: 'get_time' } }, parallel_tool_calls: false,
    });
    const calls = r.choices[0].message.tool_calls;
    assertEq(calls.length, 1, 'one call');
    assertEq(calls[0].function.name, 'get_time', 'the named function');
    validate(calls[0]);
  }],
  ['streaming: delta.tool_calls as OpenAI streams them', async () => {
    const body = { model: 'stories260K', messages: user, tools: [WEATHER, TIME], tool_choice: 'required', seed: 11, max_tokens: 200,
      temperature: 0 };
    const s = await streamed(clientOf(qwen), body);
    assertEq(s.finish, 'tool_calls', 'finish');
    assert(s.calls.length >= 1, 'calls');
    s.calls.forEach(validate);
    const whole = await clientOf(qwen).chat.completions.create(body);
    assertEq(JSON.stringify(s.calls.map((c) => c.function)), JSON.stringify(whole.choices[0].message.tool_calls.map((c) => c.function)),
      'streamed calls = non-streamed calls (greedy)');
  }],
  ['a tool round trip: the result goes back and the model answers', async () => {
    const client = clientOf(qwen);
    const first = await client.chat.completions.create({
      model: 'stories260K', messages: user, tools: [WEATHER], tool_choice: 'required', max_tokens: 200, seed: 3 });
    const call = first.choices[0].message.tool_calls[0];
    const second = await client.chat.completions.create({
      model: 'stories260K', tools: [WEATHER], max_tokens: 8,
      messages: [...user, first.choices[0].message, { role: 'tool', tool_call_id: call.id, content: '{"temp": 21}' }],
    });
    assert(['stop', 'length', 'tool_calls'].includes(second.choices[0].finish_reason), 'answered');
  }],
  ['no template: the generic JSON call format', async () => {
    const r = await clientOf(plain).chat.completions.create({
      model: 'stories260K', messages: user, tools: [WEATHER], tool_choice: 'required', max_tokens: 200, seed: 5 });
    assertEq(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(r.choices[0]));
    validate(r.choices[0].message.tool_calls[0]);
  }],
  ['DeepSeek R1: reasoning_content is the answer the prompt opened a think block for', async () => {
    const body = { messages: [{ role: 'user', content: 'Tell me a story.' }], max_tokens: 24, temperature: 0 };
    const chat = await post(r1, '/v1/chat/completions', body);
    assertEq(chat.status, 200, chat.text);
    const m = chat.json.choices[0].message;
    // the raw output, token by token (stories260K's tokens are plain text)
    const lp = await post(r1, '/v1/chat/completions', { ...body, logprobs: true });
    const want = lp.json.choices[0].logprobs.content.map((t) => t.token).join('');
    if (want.includes('</think>')) return; // the tiny model closed it: nothing to compare
    assertEq(m.reasoning_content ?? '', want.replace(/^\s+/, ''), 'reasoning = the raw output');
    assertEq(m.content, '', 'no content');
    const s = await streamed(clientOf(r1), { model: 'stories260K', ...body });
    assertEq(s.reasoning, m.reasoning_content ?? '', 'streamed delta.reasoning_content');
    assertEq(s.content, '', 'streamed content');
  }],
  ['Qwen3 enable_thinking false: no reasoning, all content', async () => {
    const body = { messages: user, max_tokens: 16, temperature: 0, chat_template_kwargs: { enable_thinking: false } };
    const r = await post(qwen, '/v1/chat/completions', body);
    const m = r.json.choices[0].message;
    assertEq(m.reasoning_content, undefined, 'no reasoning');
    assert(m.content.length > 0, 'content');
  }],
  ['required with R1: the grammar closes the open think block first', async () => {
    const r = await clientOf(r1).chat.completions.create({
      model: 'stories260K', messages: user, tools: [WEATHER], tool_choice: 'required', max_tokens: 200, seed: 2 });
    assertEq(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(r.choices[0]));
    validate(r.choices[0].message.tool_calls[0]);
  }],
  ['reasoning_effort reaches the template (gpt-oss)', async () => {
    const o = oracle('openai-gpt-oss-120b');
    const d = new Date();
    const today = `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, '0')}-${String(d.getDate()).padStart(2, '0')}`;
    for (const effort of ['low', 'high']) {
      const kw = effort === 'low' ? { reasoning_effort: 'low' } : {};
      let text = rendered(o, 'c10_reasoning_content', kw).replaceAll(o.fixed_date, today);
      if (effort === 'high') text = text.replace('Reasoning: medium', 'Reasoning: high');
      const c = await post(oss, '/v1/completions', { prompt: text, max_tokens: 1 });
      const chat = await post(oss, '/v1/chat/completions', { messages: cases.c10_reasoning_content.messages, max_tokens: 1,
        reasoning_effort: effort });
      assertEq(chat.status, 200, chat.text);
      assertEq(chat.json.usage.prompt_tokens, c.json.usage.prompt_tokens, `${effort}: prompt tokens`);
      assert(chat.json.usage.prompt_tokens_details.cached_tokens >= c.json.usage.prompt_tokens - 16, `${effort}: same text`);
    }
  }],
  ['gpt-oss: output without harmony channels is content, streamed or not', async () => {
    const body = { model: 'stories260K', messages: user, max_tokens: 16, temperature: 0 };
    const whole = await clientOf(oss).chat.completions.create(body);
    const s = await streamed(clientOf(oss), body);
    assertEq(s.content, whole.choices[0].message.content, 'same content');
    assert(s.content.length > 0, 'content');
  }],
  ['bad tools and tool_choice are 400s naming the field', async () => {
    const bad = async (body, param) => {
      const r = await post(qwen, '/v1/chat/completions', { messages: user, ...body });
      assertEq(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
      assert(r.json.error.param.startsWith(param), `param ${r.json.error.param}, want ${param}`);
    };
    await bad({ tools: [WEATHER], tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice');
    await bad({ tools: [WEATHER], tool_choice: 'maybe' }, 'tool_choice');
    await bad({ tool_choice: 'required' }, 'tool_choice');
    await bad({ tools: [{ type: 'code_interpreter' }] }, 'tools[0]');
    await bad({ tools: [{ type: 'function', function: { description: 'no name' } }] }, 'tools[0]');
    await bad({ tools: [WEATHER], parallel_tool_calls: 'yes' }, 'parallel_tool_calls');
    await bad({ reasoning_effort: 'extreme' }, 'reasoning_effort');
  }],
]);

process.exit(failed || (await stopAll(servers)) ? 1 : 0);
