// The client SDKs agents and apps use, against kvllm serve: LangChain
// (@langchain/openai bindTools + a tool round trip, withStructuredOutput with a
// JSON schema), the Vercel AI SDK (@ai-sdk/openai-compatible: generateText with
// tools, generateObject) and the OpenAI client's own stream() accumulator for tool
// calls. The model is stories260K (a tiny story model) with Qwen2.5's chat
// template: its answers are only valid because decoding is constrained
// (tool_choice required, response_format json_schema), and each SDK parses and
// validates them itself (zod schemas), so every case fails if the server's
// shapes or the constraint are wrong.
// usage: node test_sdks.mjs BUILD/kvllm REPO_ROOT
import OpenAI from 'openai';
import { z } from 'zod';
import { ChatOpenAI } from '@langchain/openai';
import { tool as lcTool } from '@langchain/core/tools';
import { HumanMessage } from '@langchain/core/messages';
import { generateText, generateObject, tool as aiTool, stepCountIs } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { startServer, assert, assertEq, runTests } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const server = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '2048',
  '--chat-template-file', `${root}/tests/data/chat-templates/Qwen-Qwen2.5-7B-Instruct.jinja`], { cwd: root, name: 'sdks' });
const baseURL = `${server.url}/v1`;
const MODEL = 'stories260K';

const weatherSchema = z.object({ city: z.string().max(12), unit: z.enum(['celsius', 'fahrenheit']) });
const personSchema = z.object({
  name: z.string().max(16),
  age: z.number().int().min(0).max(120),
  pets: z.array(z.enum(['cat', 'dog', 'fish'])).max(3),
});

const lc = new ChatOpenAI({ model: MODEL, apiKey: 'none', configuration: { baseURL }, maxRetries: 0, maxTokens: 300, temperature: 0.7 });
const provider = createOpenAICompatible({ name: 'kvllm', baseURL, apiKey: 'none', supportsStructuredOutputs: true });

const failed = await runTests([
  ['LangChain bindTools: a tool call, then the tool result back', async () => {
    let ran = 0;
    const weather = lcTool(async ({ city, unit }) => { ran++; return `21 degrees ${unit} in ${city}`; },
      { name: 'get_weather', description: 'Current weather of a city.', schema: weatherSchema });
    const human = new HumanMessage('What is the weather in Paris?');
    const ai = await lc.bindTools([weather], { tool_choice: 'required' }).invoke([human]);
    assert(ai.tool_calls.length >= 1, `tool calls: ${JSON.stringify(ai)}`);
    const call = ai.tool_calls[0];
    assertEq(call.name, 'get_weather', 'name');
    weatherSchema.parse(call.args);
    assert(call.id.startsWith('call_'), `id ${call.id}`);
    const toolMsg = await weather.invoke(call); // a ToolMessage answering the call id
    assertEq(ran, 1, 'the tool ran');
    const answer = await lc.bindTools([weather]).invoke([human, ai, toolMsg]);
    assertEq(answer._getType(), 'ai', 'an answer after the tool result');
  }],
  ['LangChain withStructuredOutput (json_schema)', async () => {
    const structured = lc.withStructuredOutput(personSchema, { name: 'person', method: 'jsonSchema' });
    const person = await structured.invoke('Invent a person.');
    personSchema.parse(person);
  }],
  ['AI SDK generateText with tools (call, execute, result back)', async () => {
    const calls = [];
    const r = await generateText({
      model: provider(MODEL),
      prompt: 'What is the weather in Paris?',
      tools: {
        get_weather: aiTool({
          description: 'Current weather of a city.',
          inputSchema: weatherSchema,
          execute: async (input) => { calls.push(input); return { temperature: 21 }; },
        }),
      },
      toolChoice: 'required',
      prepareStep: ({ stepNumber }) => (stepNumber > 0 ? { toolChoice: 'none' } : undefined),
      stopWhen: stepCountIs(2),
      maxOutputTokens: 300,
      maxRetries: 0,
    });
    assert(calls.length >= 1, `the tool ran: ${JSON.stringify(r.steps[0]?.content)}`);
    calls.forEach((c) => weatherSchema.parse(c));
    assertEq(r.steps.length, 2, 'two steps: the call, then the answer');
    assertEq(r.steps[0].finishReason, 'tool-calls', 'first step finish');
    assert(r.steps[0].toolResults.length >= 1, 'a tool result');
  }],
  ['AI SDK generateObject', async () => {
    const r = await generateObject({ model: provider(MODEL), schema: personSchema, prompt: 'Invent a person.', maxOutputTokens: 300, maxRetries: 0 });
    personSchema.parse(r.object);
  }],
  ['OpenAI client: tool calls streamed and assembled by the SDK', async () => {
    const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0 });
    const stream = client.chat.completions.stream({
      model: MODEL, messages: [{ role: 'user', content: 'Weather in Paris?' }], max_tokens: 300, seed: 4,
      tools: [{ type: 'function', function: { name: 'get_weather', parameters: {
        type: 'object', properties: { city: { type: 'string', maxLength: 12 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
        required: ['city', 'unit'], additionalProperties: false } } }],
      tool_choice: 'required',
    });
    let deltas = 0;
    stream.on('chunk', (c) => { if (c.choices[0]?.delta?.tool_calls) deltas++; });
    const done = await stream.finalChatCompletion();
    const m = done.choices[0].message;
    assertEq(done.choices[0].finish_reason, 'tool_calls', 'finish');
    assert(deltas >= 2 * m.tool_calls.length, `tool-call deltas: ${deltas}`);
    for (const c of m.tool_calls) weatherSchema.parse(JSON.parse(c.function.arguments));
  }],
]);

const code = await server.stop();
if (code !== 0) console.log(`server exit code ${code}; log:\n${server.log()}`);
process.exit(failed || code !== 0 ? 1 : 0);
