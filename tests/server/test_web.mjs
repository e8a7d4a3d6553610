// The built-in web pages in a real browser (Debian's chromium driven by
// playwright-core): the chat page streams a reply, /kv draws one cell per
// block of every pool, shows cached blocks and a prefix hit after two requests
// with a common prefix and a preemption under a tiny pool; the rendering is
// also checked on fixed data (tests/data/kv_state_sample.json and a generated
// 8,192-block state) against counts taken from the JSON itself. Screenshots go
// to BUILD/test-output/web/.
// usage: node test_web.mjs BUILD/kvllm REPO_ROOT
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { startServer, rawRequest, assert, assertEq, runTests, sleep } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const CHROMIUM = process.env.KVLLM_CHROMIUM || '/usr/bin/chromium';
if (!existsSync(CHROMIUM)) {
  console.log(`FAIL: no browser at ${CHROMIUM}: the web page tests need Debian's chromium ` +
              `(make deps installs it; or apt-get install chromium)`);
  process.exit(1);
}
let chromium;
try {
  ({ chromium } = await import('playwright-core'));
} catch (e) {
  console.log(`FAIL: the playwright-core npm package is missing (npm ci in tests/server): ${e.message}`);
  process.exit(1);
}

const MODEL = 'models/stories260K.gguf';
const KEY = 'web-key-1';
const OUT = path.join(path.dirname(path.resolve(bin)), 'test-output', 'web');
mkdirSync(OUT, { recursive: true });
const auth = { Authorization: `Bearer ${KEY}` };
// About 90 tokens: five full blocks of 16 for the second request to find.
const STORY = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park with ' +
  'her friends. One day, she saw a big red ball near the tree. She ran to the ball and picked it up. Her mom said ' +
  'that it was time to go home, so Lily went home and had a nap with her cat.';

const server = await startServer(bin, ['-m', MODEL, '-c', '512', '--api-key', KEY, '--kv-blocks', '256'],
                                 { cwd: root, name: 'web' });
// A pool of 12 blocks of 16 tokens: three 60-token requests cannot all fit.
const tiny = await startServer(bin, ['-m', MODEL, '-c', '192', '--kv-blocks', '12', '--max-seqs', '4'],
                               { cwd: root, name: 'web-tiny' });
const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });

async function state(url, headers = auth) {
  const r = await rawRequest(url, { method: 'GET', path: '/v1/kv/state', headers });
  assert(r.status === 200, `/v1/kv/state: ${r.status} ${r.text.slice(0, 200)}`);
  return r.json;
}

// Counts of each state letter, taken from the JSON (not from the page).
function letterCounts(pool) {
  const c = { free: 0, used: 0, shared: 0, cached: 0 };
  for (const ch of pool.states) c[{ f: 'free', u: 'used', s: 'shared', c: 'cached' }[ch]]++;
  return c;
}

async function openKv(url, key) {
  const page = await context.newPage();
  if (key) page.on('dialog', (d) => d.accept(key));
  await page.goto(`${url}/kv`);
  await page.waitForFunction(() => window.kvRenders >= 1, null, { timeout: 10000 });
  return page;
}

async function completion(url, prompt, extra = {}, headers = auth) {
  const r = await rawRequest(url, { headers, body: JSON.stringify({ prompt, max_tokens: 8, temperature: 0, ...extra }) });
  assert(r.status === 200, `completion: ${r.status} ${r.text.slice(0, 200)}`);
  return r.json;
}

const failed = await runTests([
  ['pages are served without a key, the state only with one', async () => {
    for (const p of ['/', '/kv', '/web/kv.js', '/web/style.css']) {
      const r = await fetch(server.url + p);
      assert(r.status === 200, `${p}: ${r.status}`);
    }
    assert((await fetch(server.url + '/')).headers.get('content-type').startsWith('text/html'), 'html type');
    assert((await fetch(server.url + '/web/nope.js')).status === 404, 'unknown asset: 404');
    assert((await fetch(server.url + '/v1/kv/state')).status === 401, 'state without a key: 401');
    const bad = await fetch(`${server.url}/v1/kv/state?since=x1`, { headers: auth });
    assert(bad.status === 400 && (await bad.json()).error.param === 'since', `bad since: ${bad.status}`);
    const s = await state(server.url);
    assertEq(s.pools.length, s.n_groups, 'one pool per KV group');
    const p = s.pools[0];
    assertEq(p.n_blocks, 256, 'pool size as --kv-blocks says');
    assertEq([p.states.length, p.refcount.length, p.lru_rank.length], [256, 256, 256], 'per-block arrays');
    assertEq(s.metrics.blocks_total, 256, 'metrics agree');
  }],

  ['the chat page asks for the key and streams a reply', async () => {
    const page = await context.newPage();
    page.on('dialog', (d) => d.accept(KEY));
    await page.goto(server.url + '/');
    await page.fill('#system', 'You are a storyteller.');
    await page.fill('#max_tokens', '24');
    await page.fill('#seed', '7');
    await page.fill('#input', 'Tell me about Lily.');
    await page.click('#send');
    await page.waitForFunction(() => window.chatDone >= 1, null, { timeout: 20000 });
    const reply = await page.textContent('#log .assistant .text');
    const stats = await page.textContent('#log .assistant .stats');
    assert(reply.length > 0, 'a reply was shown');
    assert(/prompt \d+ tokens \(\d+ from the prefix cache\)/.test(stats) && /TTFT/.test(stats) && /KV .* allocated/.test(stats),
           `per-message figures: ${stats}`);
    assertEq(await page.evaluate(() => localStorage.getItem('kvllm_api_key')), KEY, 'key kept');
    await page.screenshot({ path: path.join(OUT, 'chat.png'), fullPage: true });
    await page.close();
  }],

  ['/kv: one cell per block, cached cells and a prefix hit after a common prefix', async () => {
    await completion(server.url, STORY);
    await completion(server.url, STORY + ' The end.');
    const s = await state(server.url);
    const want = letterCounts(s.pools[0]);
    assert(want.cached > 0, `cached blocks after two requests: ${JSON.stringify(want)}`);
    const page = await openKv(server.url, KEY);
    await page.waitForSelector('#events [data-kind="prefix_hit"]', { timeout: 5000 });
    const cv = await page.$('#pools canvas');
    assertEq(Number(await cv.getAttribute('data-blocks')), s.pools[0].n_blocks, 'cells = blocks');
    const counts = await page.evaluate(() => window.kvCounts[0]);
    assertEq(counts.free + counts.used + counts.shared + counts.cached, 256, 'every block drawn once');
    assert(counts.cached > 0, `cached cells drawn: ${JSON.stringify(counts)}`);
    const tree = await page.textContent('#tree');
    assert(/tokens 0\.\.\d+/.test(tree), `prefix tree shows the shared prefix: ${tree.slice(0, 200)}`);
    await page.screenshot({ path: path.join(OUT, 'kv.png'), fullPage: true });
    await page.close();
  }],

  ['/kv shows a preemption under a tiny pool', async () => {
    // 8 requests of ~170 tokens (11 of the 12 blocks each) at 4 seats: any two that
    // overlap cannot both finish, so one is preempted (3 short ones could miss each other)
    const reqs = [0, 1, 2, 3, 4, 5, 6, 7].map((i) => completion(tiny.url, `${STORY.slice(0, 60)} ${i}`,
                                                             { max_tokens: 150, ignore_eos: true }, {}));
    await Promise.all(reqs);
    const s = await state(tiny.url, {});
    assert(s.metrics.preemptions > 0, `preemptions: ${s.metrics.preemptions}`);
    const page = await openKv(tiny.url);
    await page.waitForSelector('#events [data-kind="preempt"]', { timeout: 5000 });
    assertEq(Number(await (await page.$('#pools canvas')).getAttribute('data-blocks')), 12, 'cells = blocks');
    await page.screenshot({ path: path.join(OUT, 'kv-preempt.png'), fullPage: true });
    await page.close();
  }],

  ['rendering of a recorded state: cells per colour as its JSON says', async () => {
    const rec = JSON.parse(readFileSync(path.join(root, 'tests/data/kv_state_sample.json'), 'utf8'));
    const page = await context.newPage();
    await page.goto(`${tiny.url}/kv?static=1`);
    await page.evaluate((st) => window.kvRender(st), rec);
    const counts = await page.evaluate(() => window.kvCounts);
    assertEq(counts, rec.pools.map(letterCounts), 'cells per colour');
    assert(counts[0].shared > 0 && counts[0].cached > 0 && counts[0].used > 0, 'the recording has every state');
    assertEq(await page.$$eval('#seqs tr', (r) => r.length - 1), rec.sequences.length, 'a row per sequence');
    await page.screenshot({ path: path.join(OUT, 'kv-recorded.png'), fullPage: true });
    await page.close();
  }],

  ['rendering of 8,192 blocks', async () => {
    const n = 8192, letters = 'fusc';
    let states = '';
    for (let i = 0; i < n; i++) states += letters[(i * 7 + (i >> 5)) % 4];
    let rank = 0;
    const st = {
      time: 1, block_size: 16, n_groups: 1, prefix_cache: true, max_seqs: 64,
      metrics: { running: 0, waiting: 0, preemptions: 0, generation_tokens: 0, blocks_used: 0, blocks_cached: 0,
                 blocks_free: 0, ttft_seconds: { bounds: [1], counts: [0, 0] }, tpot_seconds: { bounds: [1], counts: [0, 0] } },
      pools: [{ group: 0, window: 0, n_blocks: n, block_bytes: 4096, free: 0, used: 0, shared: 0, cached: 0, evicted_total: 0,
                states, refcount: [...states].map((c) => (c === 's' ? 2 : c === 'u' ? 1 : 0)),
                lru_rank: [...states].map((c) => (c === 'c' ? rank++ : -1)) }],
      sequences: [], prefix_tree: { enabled: true, lookups: 0, hits: 0, misses: 0, query_tokens: 0, hit_tokens: 0, nodes: [] },
      last_event: 0, events: [],
    };
    const page = await context.newPage();
    await page.goto(`${tiny.url}/kv?static=1`);
    await page.evaluate((s) => window.kvRender(s), st);
    assertEq(await page.evaluate(() => window.kvCounts[0]), letterCounts(st.pools[0]), 'cells per colour');
    assertEq(await page.$$eval('#pools canvas', (c) => c.length), 1, 'one canvas, not a node per block');
    await page.close();
  }],

  ['under --api-prefix /llm: the chat page at /llm/ streams a reply, /llm/kv renders', async () => {
    const pre = await startServer(bin, ['-m', MODEL, '-c', '256', '--api-prefix', '/llm'], { cwd: root, name: 'prefix' });
    try {
      const page = await context.newPage();
      const outside = [];
      page.on('request', (r) => { if (!/^\/llm(\/|$)/.test(new URL(r.url()).pathname)) outside.push(r.url()); });
      await page.goto(pre.url); // the prefix alone: redirected to /llm/
      assertEq(new URL(page.url()).pathname, '/llm/', 'redirected to the root page');
      await page.fill('#max_tokens', '8');
      await page.fill('#input', 'Tell me about Lily.');
      await page.click('#send');
      await page.waitForFunction(() => window.chatDone >= 1, null, { timeout: 20000 });
      assert((await page.textContent('#log .assistant .text')).length > 0, 'a reply was shown');
      await page.close();
      const kv = await openKv(pre.url, null);
      await kv.close();
      assertEq(outside, [], 'every request the pages made stayed under the prefix');
    } finally {
      await pre.stop();
    }
  }],
]);

await browser.close();
await server.stop();
await tiny.stop();
process.exit(failed ? 1 : 0);
