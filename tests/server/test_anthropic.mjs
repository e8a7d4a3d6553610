// POST /v1/messages (Anthropic's Messages API: Claude Code's, the Anthropic
// SDKs') through the official Anthropic client.
// - The same conversation gives the same prompt as /v1/chat/completions and as
//   transformers' rendering of it (tests/data/chat-templates): system, text,
//   tool_use, tool_result and thinking blocks become the chat messages they
//   stand for; count_tokens counts that prompt.
// - Greedy text equals the chat endpoint's, whole and streamed (the SDK's
//   stream helper rebuilds the same message); stop reasons end_turn,
//   max_tokens, stop_sequence (with the string) and tool_use.
// - Client tools with tool_choice any / tool: tool_use blocks whose input
//   validates (zod), streamed as input_json_delta; a round trip; thinking
//   blocks (DeepSeek R1's think block).
// - Errors in Anthropic's shape, raised by the SDK; x-api-key authenticates.
// usage: node test_anthropic.mjs BUILD/kvllm REPO_ROOT
import fs from 'node:fs';
import Anthropic from '@anthropic-ai/sdk';
import { z } from 'zod';
import { startServer, rawRequest, leaveMidStream, assert, assertEq, runTests, stopAll } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const DIR = `${root}/tests/data/chat-templates`;
const cases = Object.fromEntries(JSON.parse(fs.readFileSync(`${DIR}/cases.json`, 'utf8')).cases.map((c) => [c.id, c]));
const oracle = JSON.parse(fs.readFileSync(`${DIR}/Qwen-Qwen3-0.6B.expected.json`, 'utf8'));
const rendered = (id) => oracle.results.find((r) => r.case === id && JSON.stringify(r.kwargs) === '{}').rendered;

const KEY = 'sk-test-anthropic';
const start = (name, extra) => startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '2048', ...extra],
  { cwd: root, name });
const qwen = await start('qwen3', ['--chat-template-file', `${DIR}/Qwen-Qwen3-0.6B.jinja`]);
const r1 = await start('r1', ['--chat-template-file', `${DIR}/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja`]);
const keyed = await start('keyed', ['--chat-template-file', `${DIR}/Qwen-Qwen3-0.6B.jinja`, '--api-key', KEY]);
const servers = [qwen, r1, keyed];
const clientOf = (s, apiKey = 'none') => new Anthropic({ baseURL: s.url, apiKey, maxRetries: 0, timeout: 120000 });
const post = (s, path, body, headers) => rawRequest(s.url, { path, body: JSON.stringify(body), headers });
const MODEL = 'stories260K';

const WEATHER = {
  name: 'get_weather',
  description: 'Get the current weather for a city.',
  input_schema: {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 12 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
    required: ['city', 'unit'],
    additionalProperties: false,
  },
};
const weatherArgs = z.object({ city: z.string().max(12), unit: z.enum(['celsius', 'fahrenheit']) }).strict();
const user = 'What is the weather in Paris?';

// A chat case as a Messages request: system apart; tool calls as tool_use
// blocks (their input the parsed arguments), results as tool_result blocks
// of a user message, reasoning_content as a thinking block.
function messagesOf(chat) {
  let system;
  const out = [];
  for (const m of chat) {
    if (m.role === 'system') {
      system = m.content;
    } else if (m.role === 'tool') {
      const block = { type: 'tool_result', tool_use_id: m.tool_call_id, content: m.content };
      const last = out.at(-1);
      if (last?.role === 'user' && Array.isArray(last.content) && last.content.every((b) => b.type === 'tool_result')) last.content.push(block);
      else out.push({ role: 'user', content: [block] });
    } else if (m.role === 'assistant') {
      const blocks = [];
      if (m.reasoning_content) blocks.push({ type: 'thinking', thinking: m.reasoning_content, signature: '' });
      if (m.content) blocks.push({ type: 'text', text: m.content });
      for (const c of m.tool_calls ?? []) {
        const args = typeof c.function.arguments === 'string' ? JSON.parse(c.function.arguments) : c.function.arguments;
        blocks.push({ type: 'tool_use', id: c.id, name: c.function.name, input: args });
      }
      out.push({ role: 'assistant', content: blocks });
    } else {
      out.push({ role: m.role, content: m.content });
    }
  }
  return { system, messages: out };
}
const toolsOf = (tools) => tools?.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters }));

const failed = await runTests([
  ['the same prompt as the chat endpoint and transformers; count_tokens counts it', async () => {
    const client = clientOf(qwen);
    for (const id of ['c02_system_user', 'c03_multi_turn', 'c07b_tool_roundtrip_args_string', 'c10_reasoning_content',
      'c11_parallel_tool_calls']) {
      const c = await post(qwen, '/v1/completions', { prompt: rendered(id), max_tokens: 1 });
      assertEq(c.status, 200, c.text);
      const body = { ...messagesOf(cases[id].messages), tools: toolsOf(cases[id].tools) };
      const r = await post(qwen, '/v1/messages', { ...body, max_tokens: 1 });
      assertEq(r.status, 200, `${id}: ${r.text.slice(0, 300)}`);
      const u = r.json.usage;
      assertEq(u.input_tokens + u.cache_read_input_tokens, c.json.usage.prompt_tokens, `${id}: input tokens`);
      assert(u.cache_read_input_tokens >= c.json.usage.prompt_tokens - 16, `${id}: same text (cache)`);
      const n = await client.messages.countTokens({ model: MODEL, ...body });
      assertEq(n.input_tokens, c.json.usage.prompt_tokens, `${id}: count_tokens`);
    }
  }],
  ['greedy text equals the chat endpoint, whole and streamed; stop reasons', async () => {
    const client = clientOf(qwen);
    const chat = await post(qwen, '/v1/chat/completions', { messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 12, temperature: 0 });
    const m = await client.messages.create({ model: MODEL, max_tokens: 12, temperature: 0, messages: [{ role: 'user', content: 'Hello there' }] });
    assertEq(m.type, 'message', 'type');
    assert(/^msg_[0-9a-f]{24}$/.test(m.id), `id ${m.id}`);
    assertEq(m.content.length, 1, 'one block');
    assertEq(m.content[0].text, chat.json.choices[0].message.content, 'text = chat content');
    assertEq(m.stop_reason, chat.json.choices[0].finish_reason === 'length' ? 'max_tokens' : 'end_turn', 'stop reason');
    assertEq(m.usage.output_tokens, chat.json.usage.completion_tokens, 'output tokens');
    // streamed: raw events in order, and the SDK's helper rebuilds the message
    const stream = await client.messages.create({ model: MODEL, max_tokens: 12, temperature: 0, stream: true,
      messages: [{ role: 'user', content: 'Hello there' }] });
    const types = [];
    let text = '';
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === 'content_block_delta') text += ev.delta.text;
    }
    assertEq(types[0], 'message_start', 'first event');
    assertEq(types.slice(-2).join(), 'message_delta,message_stop', 'last events');
    assertEq(text, m.content[0].text, 'streamed = whole');
    const fin = await client.messages.stream({ model: MODEL, max_tokens: 12, temperature: 0,
      messages: [{ role: 'user', content: 'Hello there' }] }).finalMessage();
    assertEq(JSON.stringify(fin.content), JSON.stringify(m.content), 'messages.stream() final message');
    assertEq(fin.stop_reason, m.stop_reason, 'streamed stop reason');
    // a stop sequence: the text before it, and which one
    const full = m.content[0].text;
    const seq = full.slice(4, 7);
    const cut = await client.messages.create({ model: MODEL, max_tokens: 12, temperature: 0, stop_sequences: ['zzz', seq],
      messages: [{ role: 'user', content: 'Hello there' }] });
    assertEq(cut.stop_reason, 'stop_sequence', `stop reason (${JSON.stringify(seq)})`);
    assertEq(cut.stop_sequence, seq, 'which sequence');
    assertEq(cut.content[0].text, full.slice(0, full.indexOf(seq)), 'text before it');
  }],
  ['client tools: tool_use blocks, streamed as input_json_delta, then a round trip', async () => {
    const client = clientOf(qwen);
    const body = { model: MODEL, max_tokens: 300, temperature: 0, tools: [WEATHER], tool_choice: { type: 'any', disable_parallel_tool_use: true },
      messages: [{ role: 'user', content: user }], thinking: { type: 'disabled' } };
    const m = await client.messages.create(body);
    assertEq(m.stop_reason, 'tool_use', JSON.stringify(m.content));
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assertEq(uses.length, 1, 'one call');
    assertEq(uses[0].name, 'get_weather', 'name');
    weatherArgs.parse(uses[0].input);
    const fin = await client.messages.stream(body).finalMessage();
    const noId = (c) => JSON.stringify(c.map((b) => ({ ...b, id: undefined })));
    assertEq(noId(fin.content), noId(m.content), 'streamed = whole (input rebuilt from input_json_delta)');
    const next = await client.messages.create({ model: MODEL, max_tokens: 8, tools: [WEATHER],
      messages: [{ role: 'user', content: user }, { role: 'assistant', content: m.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: uses[0].id, content: '{"temp": 21}' }] }] });
    const chat = await post(qwen, '/v1/chat/completions', { max_tokens: 1,
      tools: [{ type: 'function', function: { name: WEATHER.name, description: WEATHER.description, parameters: WEATHER.input_schema } }],
      messages: [{ role: 'user', content: user },
        { role: 'assistant', content: '', tool_calls: [{ id: uses[0].id, type: 'function', function: { name: 'get_weather', arguments: JSON.stringify(uses[0].input) } }] },
        { role: 'tool', tool_call_id: uses[0].id, content: '{"temp": 21}' }] });
    assertEq(chat.status, 200, chat.text);
    assertEq(next.usage.input_tokens + next.usage.cache_read_input_tokens, chat.json.usage.prompt_tokens, 'same prompt as the chat round trip');
    const named = await client.messages.create({ ...body, tool_choice: { type: 'tool', name: 'get_weather' } });
    assertEq(named.content.find((b) => b.type === 'tool_use')?.name, 'get_weather', 'tool_choice tool');
  }],
  ['thinking blocks: DeepSeek R1 think block', async () => {
    const body = { model: MODEL, max_tokens: 24, temperature: 0, messages: [{ role: 'user', content: 'Tell me a story.' }] };
    const chat = await post(r1, '/v1/chat/completions', { messages: body.messages, max_tokens: 24, temperature: 0 });
    const cm = chat.json.choices[0].message;
    const m = await clientOf(r1).messages.create(body);
    const th = m.content.find((b) => b.type === 'thinking');
    if (cm.reasoning_content) assertEq(th?.thinking, cm.reasoning_content, 'thinking = chat reasoning_content');
    else assertEq(th, undefined, 'no thinking block');
    assertEq(m.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), cm.content ?? '', 'text = chat content');
    const fin = await clientOf(r1).messages.stream(body).finalMessage();
    assertEq(JSON.stringify(fin.content), JSON.stringify(m.content), 'streamed = whole');
  }],
  ['a client that leaves mid-stream: the request is cancelled, its blocks come back', async () => {
    await leaveMidStream(qwen.url, () => clientOf(qwen).messages.create({ model: MODEL, max_tokens: 1500, temperature: 0, ignore_eos: true,
      messages: [{ role: 'user', content: 'Hello there' }], stream: true }),
      (ev) => ev.type === 'content_block_delta');
  }],
  ['errors in Anthropic\'s shape; x-api-key authenticates', async () => {
    const bad = async (body, want) => {
      const r = await post(qwen, '/v1/messages', { max_tokens: 4, messages: [{ role: 'user', content: 'hi' }], ...body });
      assertEq(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
      assertEq(r.json.type, 'error', 'shape');
      assertEq(r.json.error.type, 'invalid_request_error', 'error type');
      assert(r.json.error.message.includes(want), `${r.json.error.message} lacks ${want}`);
    };
    await bad({ messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: '' } }] }] }, 'image');
    await bad({ tools: [{ type: 'web_search_20250305', name: 'web_search' }] }, 'web_search_20250305');
    await bad({ tool_choice: { type: 'sometimes' } }, 'tool_choice');
    await bad({ frobnicate: 1 }, 'frobnicate');
    await bad({ messages: [{ role: 'system', content: 'x' }] }, 'role');
    await bad({ messages: [{ role: 'user', content: [{ type: 'text', text: 'x', color: 'red' }] }] }, 'color');
    await bad({ thinking: { type: 'sometimes' } }, 'thinking');
    await bad({ max_tokens: 0 }, 'max_tokens');
    // more than the context leaves: capped, not refused (clients send their model's largest)
    const big = await post(qwen, '/v1/messages', { max_tokens: 100000, temperature: 0, stop_sequences: ['.'],
      messages: [{ role: 'user', content: 'hi' }] });
    assertEq(big.status, 200, big.text);
    assert(big.json.usage.output_tokens <= 2048, 'within the context');
    let raised = null;
    try {
      await clientOf(qwen).messages.create({ model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'http://x/y.png' } }] }] });
    } catch (e) {
      raised = e;
    }
    assertEq(raised?.status, 400, 'the SDK raises a 400');
    assert(raised instanceof Anthropic.BadRequestError, 'as BadRequestError');
    // the model list as the Anthropic SDK reads it
    const models = [];
    for await (const m of clientOf(keyed, KEY).models.list()) models.push(m);
    assertEq(models.map((m) => [m.id, m.type, m.display_name]).flat().join(), `${MODEL},model,${MODEL}`, 'models.list');
    assert(!Number.isNaN(Date.parse(models[0].created_at)), `created_at ${models[0].created_at}`);
    assertEq((await clientOf(keyed, KEY).models.retrieve(MODEL)).id, MODEL, 'models.retrieve');
    const ok = await clientOf(keyed, KEY).messages.create({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
    assertEq(ok.type, 'message', 'x-api-key accepted');
    const no = await post(keyed, '/v1/messages', { max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }, { 'x-api-key': 'wrong' });
    assertEq(no.status, 401, 'a wrong x-api-key');
  }],
]);

process.exit(failed || (await stopAll(servers)) ? 1 : 0);
