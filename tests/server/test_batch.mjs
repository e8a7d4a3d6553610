// Batch invariance through the server: 32 concurrent greedy requests return
// exactly the token ids each returns alone, also when the KV pool is so small
// that sequences must be preempted and recomputed (and /metrics counts it).
// usage: node test_batch.mjs BUILD/kvllm REPO_ROOT
import OpenAI from 'openai';
import { startServer, waitMetrics, metrics, assert, assertEq, runTests, completionIds } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const MODEL = 'tests/data/golden/models/llama-gqa-bpe-q8_0.gguf';
const N = 32, MAX_TOKENS = 40;

// Prompts of different lengths (token ids, so nothing depends on the tokenizer).
const prompts = Array.from({ length: N }, (_, i) =>
  Array.from({ length: 4 + (i * 7) % 29 }, (_, k) => 1 + ((i * 131 + k * 17) % 4000)));

function clientFor(server) {
  return new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
}

async function generate(client, prompt) {
  const r = await client.completions.create({ model: 'llama-gqa-bpe-q8_0', prompt, max_tokens: MAX_TOKENS,
    temperature: 0, ignore_eos: true, logprobs: 0, return_tokens_as_token_ids: true });
  const ids = completionIds(r.choices[0]);
  assertEq(ids.length, MAX_TOKENS, 'tokens generated');
  return ids;
}

// No prefix cache here: the concurrent run must compute every prompt again, batched.
const big = await startServer(bin, ['-m', MODEL, '-c', '512', '--no-prefix-cache'], { cwd: root, name: 'batch' });
const alone = [];
let failed = await runTests([
  ['32 concurrent greedy requests = each alone', async () => {
    const client = clientFor(big);
    for (const p of prompts) alone.push(await generate(client, p));
    const together = await Promise.all(prompts.map((p) => generate(client, p)));
    for (let i = 0; i < N; i++) assertEq(together[i], alone[i], `request ${i} (prompt ${prompts[i].length} tokens)`);
    const m = await metrics(big.url);
    assertEq(m.get('kvllm:num_preemptions_total'), 0, 'no preemption with the default pool');
  }],
]);
await big.stop();

// 24 blocks of 16 tokens: one request needs up to 5, 32 at once need ~140.
const tiny = await startServer(bin, ['-m', MODEL, '-c', '512', '--kv-blocks', '24', '--block-size', '16'],
  { cwd: root, name: 'preempt' });
failed += await runTests([
  ['with preemption (tiny pool) the ids are still the same', async () => {
    assert(alone.length === N, 'reference ids from the previous test');
    const client = clientFor(tiny);
    const together = await Promise.all(prompts.map((p) => generate(client, p)));
    for (let i = 0; i < N; i++) assertEq(together[i], alone[i], `request ${i} after preemption`);
    const m = await waitMetrics(tiny.url, (x) => x.get('kvllm:num_requests_running') === 0);
    assert(m.get('kvllm:num_preemptions_total') > 0, `preemptions counted (${m.get('kvllm:num_preemptions_total')})`);
    assertEq(m.get('kvllm:kv_blocks_used'), 0, 'every block returned');
  }],
]);
const code = await tiny.stop();
if (code !== 0) {
  console.log(`server exit code ${code}; log:\n${tiny.log()}`);
  failed++;
}
process.exit(failed ? 1 : 0);
