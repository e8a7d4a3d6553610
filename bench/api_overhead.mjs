// What the API shapes cost: the same greedy generation through
// /v1/chat/completions, /v1/responses and /v1/messages (both translated onto
// the chat path), whole and streamed, requests taking turns so that the
// machine's minute affects all alike. On a tiny model the engine's own time
// is small, so the differences are the translation's.
//
//   node bench/api_overhead.mjs [BUILD/kvllm] [MODEL] [ROUNDS] [MAX_TOKENS]
//   node bench/api_overhead.mjs build/kvllm models/stories260K.gguf 40 128
//
// Prints per endpoint and mode the median and p90 wall time of a request and
// its output tokens. Needs node (fetch) and tests/server's lib.mjs.
import { startServer } from '../tests/server/lib.mjs';

const [bin = 'build/kvllm', model = 'models/stories260K.gguf', roundsArg = '40', maxArg = '128'] =
  process.argv.slice(2);
const rounds = Number(roundsArg), maxTokens = Number(maxArg);
const s = await startServer(bin, ['-m', model, '-c', '2048', '--chat-template', 'chatml'], { cwd: process.cwd() });
const prompt = 'Once upon a time there was a little robot who';
const bodies = {
  chat: { messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens, temperature: 0, ignore_eos: true },
  responses: { input: prompt, max_output_tokens: maxTokens, temperature: 0, ignore_eos: true, store: false },
  messages: { messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens, temperature: 0, ignore_eos: true },
};
const paths = { chat: '/v1/chat/completions', responses: '/v1/responses', messages: '/v1/messages' };

async function once(api, stream) {
  const t0 = performance.now();
  const r = await fetch(`${s.url}${paths[api]}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...bodies[api], stream }),
  });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`${api}: ${r.status} ${text.slice(0, 200)}`);
  return { ms: performance.now() - t0, bytes: text.length };
}

const times = {};
for (let i = 0; i < rounds + 2; i++)
  for (const api of Object.keys(paths))
    for (const stream of [false, true]) {
      const t = await once(api, stream);
      if (i < 2) continue; /* warm-up */
      (times[`${api}${stream ? ' stream' : ''}`] ??= []).push(t);
    }
await s.stop();
const q = (a, p) => a[Math.min(a.length - 1, Math.floor(p * a.length))];
console.log(`${model}, ${maxTokens} tokens a request, ${rounds} rounds, requests taking turns`);
for (const [k, v] of Object.entries(times)) {
  const ms = v.map((x) => x.ms).sort((a, b) => a - b);
  console.log(`${k.padEnd(18)} median ${q(ms, 0.5).toFixed(2).padStart(7)} ms  p90 ${q(ms, 0.9).toFixed(2).padStart(7)} ms  ` +
    `${(v[0].bytes / 1024).toFixed(1)} KiB answer`);
}
