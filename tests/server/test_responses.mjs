// POST /v1/responses (OpenAI's Responses API) through the official OpenAI
// client, the OpenAI Agents SDK (whose default it is) and LangChain's
// Responses mode.
// - The same conversation gives the same prompt as /v1/chat/completions and as
//   transformers' rendering of it (tests/data/chat-templates): input items
//   (messages, function_call, function_call_output, reasoning) and
//   instructions become the chat messages they stand for.
// - Greedy output equals the chat endpoint's, whole and streamed; the stream's
//   events are OpenAI's (numbered from 0, output items opened and closed,
//   deltas that add up to the final response), which the SDK's own stream
//   helper accumulates into the same response.
// - Function tools (flat shape), tool_choice, text.format json_schema,
//   reasoning items (DeepSeek R1's think block), logprobs through include,
//   status "incomplete" when max_output_tokens cuts the output.
// - What kvllm does not do is a 400 naming the field.
// usage: node test_responses.mjs BUILD/kvllm REPO_ROOT
import fs from 'node:fs';
import OpenAI from 'openai';
import { ChatOpenAI } from '@langchain/openai';
import { Agent, run, tool, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled } from '@openai/agents';
import { z } from 'zod';
import { startServer, rawRequest, leaveMidStream, assert, assertEq, runTests, stopAll } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const DIR = `${root}/tests/data/chat-templates`;
const cases = Object.fromEntries(JSON.parse(fs.readFileSync(`${DIR}/cases.json`, 'utf8')).cases.map((c) => [c.id, c]));
const oracle = JSON.parse(fs.readFileSync(`${DIR}/Qwen-Qwen3-0.6B.expected.json`, 'utf8'));
const rendered = (id) => oracle.results.find((r) => r.case === id && JSON.stringify(r.kwargs) === '{}').rendered;

const start = (name, extra) => startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '2048', ...extra],
  { cwd: root, name });
const qwen = await start('qwen3', ['--chat-template-file', `${DIR}/Qwen-Qwen3-0.6B.jinja`]);
const r1 = await start('r1', ['--chat-template-file', `${DIR}/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja`]);
const keyDir = fs.mkdtempSync('/tmp/kvllm-resp-');
const keyFile = `${keyDir}/keys`;
fs.writeFileSync(keyFile, 'sk-alice alice\nsk-bob bob\n');
const keyed = await start('keyed', ['--chat-template-file', `${DIR}/Qwen-Qwen3-0.6B.jinja`, '--api-key-file', keyFile]);
const servers = [qwen, r1, keyed];
const clientOf = (s) => new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
const post = (s, path, body) => rawRequest(s.url, { path, body: JSON.stringify(body) });
const MODEL = 'stories260K';

const WEATHER = {
  type: 'function',
  name: 'get_weather',
  description: 'Get the current weather for a city.',
  parameters: {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 12 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
    required: ['city', 'unit'],
    additionalProperties: false,
  },
  strict: true,
};
const weatherArgs = z.object({ city: z.string().max(12), unit: z.enum(['celsius', 'fahrenheit']) }).strict();

// A chat case's messages as Responses input items (the SDKs' own mapping).
function itemsOf(messages) {
  const items = [];
  for (const m of messages) {
    if (m.role === 'tool') {
      items.push({ type: 'function_call_output', call_id: m.tool_call_id, output: m.content });
      continue;
    }
    if (m.reasoning_content) {
      items.push({ type: 'reasoning', id: 'rs_1', summary: [], content: [{ type: 'reasoning_text', text: m.reasoning_content }] });
    }
    if (typeof m.content === 'string' && (m.content !== '' || !m.tool_calls)) {
      const part = m.role === 'assistant' ? 'output_text' : 'input_text';
      items.push({ type: 'message', role: m.role, content: [{ type: part, text: m.content }] });
    }
    for (const c of m.tool_calls ?? []) {
      items.push({ type: 'function_call', call_id: c.id, name: c.function.name, arguments: c.function.arguments });
    }
  }
  return items;
}
const flatTools = (tools) => tools?.map((t) => ({ type: 'function', ...t.function }));

// The rendered prompt equals the oracle's text: as many tokens as the
// completion of that text, and served from the prefix cache after it.
async function samePrompt(id, input, tools) {
  const c = await post(qwen, '/v1/completions', { prompt: rendered(id), max_tokens: 1 });
  assertEq(c.status, 200, c.text);
  const r = await post(qwen, '/v1/responses', { input, tools, max_output_tokens: 1 });
  assertEq(r.status, 200, `${id}: ${r.text.slice(0, 300)}`);
  assertEq(r.json.usage.input_tokens, c.json.usage.prompt_tokens, `${id}: input tokens`);
  assert(r.json.usage.input_tokens_details.cached_tokens >= c.json.usage.prompt_tokens - 16, `${id}: same text (cache)`);
}

// Streams a request, checking the event order, and rebuilds the output.
async function streamed(client, body) {
  const stream = await client.responses.create({ ...body, stream: true });
  const events = [];
  for await (const ev of stream) events.push(ev);
  events.forEach((ev, i) => assertEq(ev.sequence_number, i, `event ${i} (${ev.type}) numbered`));
  assertEq(events[0].type, 'response.created', 'first event');
  assertEq(events[0].response.status, 'in_progress', 'created: in progress');
  const last = events.at(-1);
  assert(['response.completed', 'response.incomplete'].includes(last.type), `last event ${last.type}`);
  const out = [];
  for (const ev of events) {
    if (ev.type === 'response.output_item.added') {
      assertEq(ev.output_index, out.length, 'items open in order');
      out.push({ ...ev.item, text: '', args: '' });
    } else if (ev.type === 'response.output_text.delta' || ev.type === 'response.reasoning_text.delta') {
      out[ev.output_index].text += ev.delta;
    } else if (ev.type === 'response.function_call_arguments.delta') {
      out[ev.output_index].args += ev.delta;
    } else if (ev.type === 'response.output_item.done') {
      const it = ev.item, o = out[ev.output_index];
      if (it.type === 'function_call') assertEq(it.arguments, o.args, 'arguments = deltas');
      else assertEq(it.content[0].text, o.text, `${it.type} text = deltas`);
      assertEq(JSON.stringify(last.response.output[ev.output_index]), JSON.stringify(it), 'final output = items done');
    }
  }
  assertEq(last.response.output.length, out.length, 'every item closed');
  return last.response;
}

const user = 'What is the weather in Paris?';

const failed = await runTests([
  ['the same prompt as the chat endpoint and transformers', async () => {
    // (the cases whose calls carry arguments as a string: the Responses API has no other form)
    for (const id of ['c02_system_user', 'c03_multi_turn', 'c07b_tool_roundtrip_args_string', 'c10_reasoning_content']) {
      await samePrompt(id, itemsOf(cases[id].messages), flatTools(cases[id].tools));
    }
    // a string input and instructions: the system message they stand for
    const sys = cases.c02_system_user.messages;
    const c = await post(qwen, '/v1/completions', { prompt: rendered('c02_system_user'), max_tokens: 1 });
    const r = await post(qwen, '/v1/responses', { instructions: sys[0].content, input: sys[1].content, max_output_tokens: 1 });
    assertEq(r.json.usage.input_tokens, c.json.usage.prompt_tokens, 'instructions + string input');
    assertEq(r.json.instructions, sys[0].content, 'instructions echoed');
  }],
  ['greedy text equals the chat endpoint, whole and streamed', async () => {
    const client = clientOf(qwen);
    const chat = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hello there' }],
      max_tokens: 12, temperature: 0 });
    const r = await client.responses.create({ model: MODEL, input: 'Hello there', max_output_tokens: 12, temperature: 0 });
    assertEq(r.object, 'response', 'object');
    assert(/^resp_[0-9a-f]{24}$/.test(r.id), `id ${r.id}`);
    assertEq(r.output_text, chat.choices[0].message.content, 'output_text = chat content');
    assertEq(r.usage.input_tokens, chat.usage.prompt_tokens, 'input tokens');
    assertEq(r.usage.output_tokens, chat.usage.completion_tokens, 'output tokens');
    assertEq(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens, 'total');
    const cut = chat.choices[0].finish_reason === 'length';
    assertEq(r.status, cut ? 'incomplete' : 'completed', 'status');
    if (cut) assertEq(r.incomplete_details.reason, 'max_output_tokens', 'why incomplete');
    const s = await streamed(client, { model: MODEL, input: 'Hello there', max_output_tokens: 12, temperature: 0 });
    assertEq(s.output[0].content[0].text, r.output_text, 'streamed = whole');
    assertEq(s.status, r.status, 'streamed status');
    // the SDK's stream helper rebuilds the same response from the events
    const helper = client.responses.stream({ model: MODEL, input: 'Hello there', max_output_tokens: 12, temperature: 0 });
    const fin = await helper.finalResponse(); /* (the helper sets no output_text) */
    assertEq(fin.output[0].content[0].text, r.output_text, 'responses.stream() final text');
  }],
  ['function tools: valid calls, whole and streamed, then a round trip', async () => {
    const client = clientOf(qwen);
    const body = { model: MODEL, input: user, tools: [WEATHER], tool_choice: 'required', max_output_tokens: 300,
      temperature: 0, parallel_tool_calls: false, chat_template_kwargs: { enable_thinking: false } };
    const r = await client.responses.create(body);
    const calls = r.output.filter((o) => o.type === 'function_call');
    assertEq(calls.length, 1, `one call: ${JSON.stringify(r.output)}`);
    assertEq(calls[0].name, 'get_weather', 'name');
    weatherArgs.parse(JSON.parse(calls[0].arguments));
    assert(/^fc_/.test(calls[0].id) && /^call_/.test(calls[0].call_id), 'ids');
    assertEq(r.status, 'completed', 'status');
    const s = await streamed(client, body);
    assertEq(JSON.stringify(s.output.map((o) => [o.type, o.name, o.arguments])),
      JSON.stringify(r.output.map((o) => [o.type, o.name, o.arguments])), 'streamed = whole');
    // the result goes back as a function_call_output item
    const next = await client.responses.create({ model: MODEL, tools: [WEATHER], max_output_tokens: 8,
      input: [{ role: 'user', content: user }, calls[0], { type: 'function_call_output', call_id: calls[0].call_id, output: '{"temp": 21}' }] });
    assert(['completed', 'incomplete'].includes(next.status), 'answered');
    const chat = await post(qwen, '/v1/chat/completions', { tools: [{ type: 'function', function: { ...WEATHER, type: undefined } }],
      max_tokens: 1, messages: [{ role: 'user', content: user },
        { role: 'assistant', content: '', tool_calls: [{ id: calls[0].call_id, type: 'function', function: { name: 'get_weather', arguments: calls[0].arguments } }] },
        { role: 'tool', tool_call_id: calls[0].call_id, content: '{"temp": 21}' }] });
    assertEq(chat.status, 200, chat.text);
    assertEq(next.usage.input_tokens, chat.json.usage.prompt_tokens, 'same prompt as the chat round trip');
  }],
  ['a named function', async () => {
    const time = { type: 'function', name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string', enum: ['UTC'] } }, required: ['zone'] } };
    const r = await clientOf(qwen).responses.create({ model: MODEL, input: user, tools: [WEATHER, time], max_output_tokens: 200,
      tool_choice: { type: 'function', name: 'get_time' }, parallel_tool_calls: false, seed: 4 });
    const calls = r.output.filter((o) => o.type === 'function_call');
    assertEq(calls.length, 1, 'one call');
    assertEq(calls[0].name, 'get_time', 'the named function');
    assertEq(JSON.parse(calls[0].arguments).zone, 'UTC', 'arguments');
  }],
  ['text.format json_schema: output that validates', async () => {
    const schema = { type: 'object', properties: { city: { type: 'string', maxLength: 10 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
      required: ['city', 'days'], additionalProperties: false };
    const r = await clientOf(qwen).responses.create({ model: MODEL, input: 'Give a city', max_output_tokens: 80, seed: 2,
      text: { format: { type: 'json_schema', name: 'trip', schema, strict: true } } });
    assertEq(r.status, 'completed', JSON.stringify(r.output));
    z.object({ city: z.string().max(10), days: z.number().int().min(1).max(7) }).strict().parse(JSON.parse(r.output_text));
    assertEq(r.text.format.name, 'trip', 'format echoed');
  }],
  ['reasoning: DeepSeek R1 think block as a reasoning item', async () => {
    const body = { model: MODEL, input: 'Tell me a story.', max_output_tokens: 24, temperature: 0 };
    const chat = await post(r1, '/v1/chat/completions', { messages: [{ role: 'user', content: body.input }], max_tokens: 24, temperature: 0 });
    const m = chat.json.choices[0].message;
    const r = await clientOf(r1).responses.create(body);
    const rs = r.output.find((o) => o.type === 'reasoning');
    if (m.reasoning_content) {
      assertEq(rs.content[0].type, 'reasoning_text', 'reasoning part');
      assertEq(rs.content[0].text, m.reasoning_content, 'reasoning = chat reasoning_content');
      const rt = r.usage.output_tokens_details.reasoning_tokens;
      if (!m.content) assertEq(rt, r.usage.output_tokens, 'all the output is reasoning: every token counted');
      else assert(rt > 0 && rt < r.usage.output_tokens, `reasoning tokens ${rt} of ${r.usage.output_tokens}`);
    } else {
      assertEq(rs, undefined, 'no reasoning item');
    }
    assertEq(r.output_text, m.content ?? '', 'text = chat content');
    const s = await streamed(clientOf(r1), body);
    assertEq(JSON.stringify(s.output.map((o) => [o.type, o.content?.[0]?.text])), JSON.stringify(r.output.map((o) => [o.type, o.content?.[0]?.text])),
      'streamed = whole');
  }],
  ['logprobs through include, as the chat endpoint gives them', async () => {
    const r = await post(qwen, '/v1/responses', { input: 'Hello there', max_output_tokens: 5, temperature: 0,
      include: ['message.output_text.logprobs'], top_logprobs: 2 });
    const chat = await post(qwen, '/v1/chat/completions', { messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 5,
      temperature: 0, logprobs: true, top_logprobs: 2 });
    const lps = r.json.output[0].content[0].logprobs;
    assertEq(JSON.stringify(lps), JSON.stringify(chat.json.choices[0].logprobs.content), 'logprobs = chat logprobs');
    assertEq(lps.map((t) => t.token).join(''), r.json.output[0].content[0].text, 'tokens spell the text');
  }],
  ['LangChain ChatOpenAI in Responses mode: text and a tool call', async () => {
    const llm = new ChatOpenAI({ model: MODEL, apiKey: 'none', useResponsesApi: true, temperature: 0, maxTokens: 200,
      configuration: { baseURL: `${qwen.url}/v1` }, maxRetries: 0 });
    const msg = await llm.invoke('Hello there');
    assert(typeof msg.text === 'string' && msg.text.length > 0, `text: ${JSON.stringify(msg.content)}`);
    const tool = { type: 'function', function: { name: 'get_weather', description: WEATHER.description, parameters: WEATHER.parameters } };
    const withTool = llm.bindTools([tool], { tool_choice: 'get_weather', parallel_tool_calls: false });
    const t = await withTool.invoke(user);
    assertEq(t.tool_calls.length, 1, `one call: ${JSON.stringify(t.tool_calls)}`);
    weatherArgs.parse(t.tool_calls[0].args);
  }],
  ['OpenAI Agents SDK: an agent calls a tool, gets its result, answers (whole and streamed)', async () => {
    setTracingDisabled(true);
    setDefaultOpenAIClient(clientOf(qwen));
    setOpenAIAPI('responses');
    const cities = [];
    const getWeather = tool({ name: 'get_weather', description: 'Get the weather for a city.',
      parameters: z.object({ city: z.string().max(12) }),
      execute: async ({ city }) => { cities.push(city); return `Sunny in ${city}`; } });
    // tool_choice required for the first turn (the SDK resets it after a call);
    // the answer ends at a stop string: the SDK's streamed runs need
    // response.completed, which a max_output_tokens cut does not send (OpenAI
    // sends response.incomplete there too)
    const agent = new Agent({ name: 'weather', instructions: 'Answer with the weather.', model: MODEL, tools: [getWeather],
      modelSettings: { toolChoice: 'required', maxTokens: 200, temperature: 0, parallelToolCalls: false,
        providerData: { stop: ['.'] } } });
    const whole = await run(agent, user, { maxTurns: 4 });
    assertEq(JSON.stringify(whole.newItems.map((i) => i.type)),
      JSON.stringify(['tool_call_item', 'tool_call_output_item', 'message_output_item']), 'call, result, answer');
    assertEq(cities.length, 1, 'the tool ran once');
    assert(typeof whole.finalOutput === 'string' && whole.finalOutput.length > 0, 'an answer');
    const streamed = await run(agent, user, { maxTurns: 4, stream: true });
    let text = '';
    for await (const t of streamed.toTextStream()) text += t;
    await streamed.completed;
    assertEq(text, whole.finalOutput, 'streamed answer = whole (greedy)');
    assertEq(cities[1], cities[0], 'same call');
  }],
  ['previous_response_id continues a kept response; retrieve and delete', async () => {
    const client = clientOf(qwen);
    const hello = [{ role: 'user', content: 'Hello there' }];
    const first = await client.responses.create({ model: MODEL, input: 'Hello there', instructions: 'Be brief.',
      max_output_tokens: 8, temperature: 0 });
    assertEq(first.store, true, 'kept by default');
    const next = await client.responses.create({ model: MODEL, previous_response_id: first.id, input: 'And then?',
      max_output_tokens: 1 });
    assertEq(next.previous_response_id, first.id, 'echoed');
    // the same prompt as the whole conversation sent to the chat endpoint
    // (without the first request's instructions: a continuation does not inherit them)
    const chat = await post(qwen, '/v1/chat/completions', { max_tokens: 1, messages: [...hello,
      { role: 'assistant', content: first.output_text }, { role: 'user', content: 'And then?' }] });
    assertEq(next.usage.input_tokens, chat.json.usage.prompt_tokens, 'continued prompt = the whole conversation');
    // a tool call continued with only its result
    const call = await client.responses.create({ model: MODEL, input: user, tools: [WEATHER], tool_choice: 'required',
      parallel_tool_calls: false, max_output_tokens: 300, temperature: 0, chat_template_kwargs: { enable_thinking: false } });
    const fc = call.output.find((o) => o.type === 'function_call');
    const after = await client.responses.create({ model: MODEL, previous_response_id: call.id, tools: [WEATHER], max_output_tokens: 1,
      input: [{ type: 'function_call_output', call_id: fc.call_id, output: '{"temp": 21}' }] });
    const whole = await client.responses.create({ model: MODEL, tools: [WEATHER], max_output_tokens: 1, store: false,
      input: [{ role: 'user', content: user }, fc, { type: 'function_call_output', call_id: fc.call_id, output: '{"temp": 21}' }] });
    assertEq(after.usage.input_tokens, whole.usage.input_tokens, 'continued = sent whole');
    // input items: as sent, each with an id; the SDK pages through them (limit 1)
    const listed = [];
    for await (const it of client.responses.inputItems.list(call.id, { order: 'asc', limit: 1 })) listed.push(it);
    assertEq(listed.length, 1, 'one input item');
    assertEq(listed[0].content[0].text, user, 'the string input as a user message');
    assert(/^msg_/.test(listed[0].id), `id ${listed[0].id}`);
    const items = [{ role: 'user', content: user }, fc, { type: 'function_call_output', call_id: fc.call_id, output: '{"temp": 21}' }];
    const many = await client.responses.create({ model: MODEL, tools: [WEATHER], max_output_tokens: 1, input: items });
    const asc = [];
    for await (const it of client.responses.inputItems.list(many.id, { order: 'asc', limit: 2 })) asc.push(it);
    assertEq(JSON.stringify(asc.map((i) => i.type ?? 'message')), JSON.stringify(['message', 'function_call', 'function_call_output']),
      'all three, in order, across pages');
    assertEq(asc[1].id, fc.id, 'an item keeps its id');
    const desc = await rawRequest(qwen.url, { method: 'GET', path: `/v1/responses/${many.id}/input_items` });
    assertEq(JSON.stringify(desc.json.data.map((i) => i.id)), JSON.stringify(asc.map((i) => i.id).reverse()), 'desc by default');
    assertEq((await rawRequest(qwen.url, { method: 'GET', path: `/v1/responses/${many.id}/input_items?limit=0` })).status, 400, 'limit 0');
    // GET and DELETE
    const got = await client.responses.retrieve(first.id);
    assertEq(JSON.stringify(got.output), JSON.stringify(first.output), 'retrieved output');
    assertEq(got.status, first.status, 'retrieved status');
    const del = await client.responses.delete(first.id).catch((e) => e);
    assert(!(del instanceof Error), `delete: ${del}`);
    assertEq((await rawRequest(qwen.url, { method: 'GET', path: `/v1/responses/${first.id}` })).status, 404, 'gone');
    const cont = await post(qwen, '/v1/responses', { previous_response_id: first.id, input: 'x' });
    assertEq(cont.status, 404, 'a deleted one cannot be continued');
    assertEq(cont.json.error.param, 'previous_response_id', 'param');
    // store: false keeps nothing
    assertEq(whole.store, false, 'store false echoed');
    assertEq((await rawRequest(qwen.url, { method: 'GET', path: `/v1/responses/${whole.id}` })).status, 404, 'not kept');
    // one tenant's responses are not another's
    const alice = new OpenAI({ baseURL: `${keyed.url}/v1`, apiKey: 'sk-alice', maxRetries: 0 });
    const a = await alice.responses.create({ model: MODEL, input: 'Hello there', max_output_tokens: 2 });
    const asBob = await rawRequest(keyed.url, { path: '/v1/responses', headers: { Authorization: 'Bearer sk-bob' },
      body: JSON.stringify({ previous_response_id: a.id, input: 'x', max_output_tokens: 1 }) });
    assertEq(asBob.status, 404, 'bob cannot continue alice\'s response');
    const getBob = await rawRequest(keyed.url, { method: 'GET', path: `/v1/responses/${a.id}`, headers: { Authorization: 'Bearer sk-bob' } });
    assertEq(getBob.status, 404, 'nor read it');
    assertEq((await alice.responses.retrieve(a.id)).id, a.id, 'alice can');
  }],
  ['a client that leaves mid-stream: the request is cancelled, its blocks come back', async () => {
    await leaveMidStream(qwen.url, () => clientOf(qwen).responses.create({ model: MODEL, input: 'Hello there', max_output_tokens: 1500,
      temperature: 0, ignore_eos: true, stream: true }),
      (ev) => ev.type === 'response.output_text.delta');
  }],
  ['what kvllm does not do is a 400 naming the field', async () => {
    const bad = async (body, param) => {
      const r = await post(qwen, '/v1/responses', { input: 'hi', ...body });
      assertEq(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
      assertEq(r.json.error.param, param, `${JSON.stringify(body)}: ${r.text}`);
    };
    await bad({ conversation: 'conv_1' }, 'conversation');
    await bad({ background: true }, 'background');
    await bad({ truncation: 'auto' }, 'truncation');
    await bad({ frobnicate: 1 }, 'frobnicate');
    await bad({ tools: [{ type: 'web_search' }] }, 'tools');
    await bad({ tool_choice: { type: 'function' } }, 'tool_choice');
    await bad({ include: ['file_search_call.results'] }, 'include');
    await bad({ text: { verbosity: 'low' } }, 'text');
    assertEq((await post(qwen, '/v1/responses', { input: 'hi', max_output_tokens: 1, text: { verbosity: 'medium' } })).status, 200,
      'verbosity medium: the default');
    await bad({ reasoning: { effort: 'extreme' } }, 'reasoning.effort');
    await bad({ max_output_tokens: 0 }, 'max_output_tokens');
    await bad({ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png' }] }] }, 'input');
    await bad({ input: [{ type: 'item_reference', id: 'msg_1' }] }, 'input');
    await bad({ input: [{ type: 'function_call_output', output: 'x' }] }, 'input');
    await bad({ input: 7 }, 'input');
    await bad({ input: [{ role: 'user', content: 'hi', name: 'bob' }] }, 'input');
    await bad({ input: [{ role: 'user', content: [{ type: 'input_text', text: 'hi', detail: 'high' }] }] }, 'input');
    await bad({ text: { format: { type: 'json_schema', name: 'x', schema: { type: 'bogus' } } } }, 'text.format.schema');
    const r = await post(qwen, '/v1/responses', { model: 'gpt-4o', input: 'hi' });
    assertEq(r.status, 404, 'another model');
    // the SDK raises the error
    let raised = null;
    try {
      await clientOf(qwen).responses.create({ model: MODEL, input: 'hi', background: true });
    } catch (e) {
      raised = e;
    }
    assertEq(raised?.status, 400, 'the SDK raises a 400');
  }],
]);

const stopFailed = await stopAll(servers);
fs.rmSync(keyDir, { recursive: true, force: true });
process.exit(failed || stopFailed ? 1 : 0);
