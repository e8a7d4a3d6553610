// Tenants: --api-key-file maps keys to tenants, each with its own prefix-cache
// namespace: one tenant's cached prompt never shows in another's
// cached_tokens, in the hit counters or in the time to first token; keys
// naming the same tenant share; --prefix-cache-shared opts out; /metrics
// follows the keys unless --metrics-public and names no tenant.
// usage: node test_tenants.mjs BUILD/kvllm REPO_ROOT
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, rawRequest, metrics, assert, assertEq, runTests } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const MODEL = 'models/stories260K.gguf';
const dir = mkdtempSync(join(tmpdir(), 'kvllm-tenants-'));
const keyFile = join(dir, 'keys.txt');
writeFileSync(keyFile, [
  '# key            tenant',
  'key-alice-1      alice',
  'key-bob          bob',
  '',
  'key-alice-2      alice',
  'key-carol',
].join('\n') + '\n');

// A prompt of several blocks, new to the server each run.
const prompt = (tag) => `${tag} ${Date.now() % 100000} Once upon a time, there was a little girl named Lily. `
  + 'She loved to play outside in the sun with her friends. One day, she saw a big red ball in the park.';

function ask(url, key, body) {
  return rawRequest(url, { headers: { Authorization: `Bearer ${key}` },
    body: JSON.stringify({ max_tokens: 2, temperature: 0, ...body }) });
}
const cached = (r) => r.json.usage.prompt_tokens_details.cached_tokens;

let failed = 0;
const server = await startServer(bin, ['-m', MODEL, '-c', '512', '--api-key-file', keyFile], { cwd: root, name: 'tenants' });
const hits = async () => (await metrics(server.url, 'key-carol')).get('kvllm:prefix_cache_hits_total');

failed += await runTests([
  ['every key in the file works; others get 401', async () => {
    for (const k of ['key-alice-1', 'key-alice-2', 'key-bob', 'key-carol'])
      assertEq((await ask(server.url, k, { prompt: 'Once' })).status, 200, k);
    for (const k of ['key-dave', 'alice', '#', 'key-alice-1 alice', ''])
      assertEq((await ask(server.url, k, { prompt: 'Once' })).status, 401, `'${k}'`);
  }],

  ['tenant B never sees tenant A\'s cached prompt: cached_tokens 0 and no hits counted', async () => {
    const p = prompt('iso');
    const a1 = await ask(server.url, 'key-alice-1', { prompt: p });
    const a2 = await ask(server.url, 'key-alice-1', { prompt: p });
    assertEq(cached(a1), 0, 'alice, first time');
    assert(cached(a2) > 0, `alice again: cached (${cached(a2)})`);
    const h0 = await hits();
    const b = await ask(server.url, 'key-bob', { prompt: p });
    assertEq(cached(b), 0, 'bob sending alice\'s prompt');
    assertEq(await hits(), h0, 'bob\'s request counted no hit');
    assertEq(b.json.choices[0].text, a1.json.choices[0].text, 'same output all the same');
    const c = await ask(server.url, 'key-carol', { prompt: p });
    assertEq(cached(c), 0, 'carol (a tenant without a name) neither');
    const a3 = await ask(server.url, 'key-alice-2', { prompt: p });
    assertEq(cached(a3), cached(a2), 'alice\'s second key shares alice\'s cache');
    const b2 = await ask(server.url, 'key-bob', { prompt: p });
    assert(cached(b2) > 0, 'bob\'s own second request hits his own cache');
  }],

  ['cache_salt stays inside the tenant: the same salt does not join two tenants', async () => {
    const p = prompt('salt');
    await ask(server.url, 'key-alice-1', { prompt: p, cache_salt: 'shared-salt' });
    const b = await ask(server.url, 'key-bob', { prompt: p, cache_salt: 'shared-salt' });
    assertEq(cached(b), 0, 'bob with alice\'s salt');
    const a = await ask(server.url, 'key-alice-2', { prompt: p, cache_salt: 'shared-salt' });
    assert(cached(a) > 0, 'alice with her salt');
    const a0 = await ask(server.url, 'key-alice-2', { prompt: p });
    assertEq(cached(a0), 0, 'alice without the salt: another namespace');
  }],

  ['/metrics: 401 without a key, no tenant name or key in it', async () => {
    assertEq((await fetch(`${server.url}/metrics`)).status, 401, 'no key');
    const m = await metrics(server.url, 'key-bob');
    for (const secret of ['alice', 'bob', 'carol', 'key-'])
      assert(!m.text.includes(secret), `/metrics mentions '${secret}'`);
  }],
]);
let code = await server.stop();
if (code !== 0) { console.log(`server exit ${code}:\n${server.log()}`); failed++; }

const shared = await startServer(bin, ['-m', MODEL, '-c', '512', '--api-key-file', keyFile, '--prefix-cache-shared',
  '--metrics-public'], { cwd: root, name: 'shared' });
failed += await runTests([
  ['--prefix-cache-shared: tenants share the cache; --metrics-public: /metrics without a key', async () => {
    const p = prompt('shared');
    await ask(shared.url, 'key-alice-1', { prompt: p });
    const b = await ask(shared.url, 'key-bob', { prompt: p });
    assert(cached(b) > 0, `bob hits alice's blocks when sharing (${cached(b)})`);
    assertEq((await fetch(`${shared.url}/metrics`)).status, 200, '/metrics public');
    assertEq((await ask(shared.url, 'nope', { prompt: 'x' })).status, 401, 'keys still required on /v1');
  }],
]);
code = await shared.stop();
if (code !== 0) { console.log(`server exit ${code}:\n${shared.log()}`); failed++; }

// a bad key file stops the server at start with a message
for (const [what, text] of [['a key listed twice', 'k1 a\nk1 b\n'], ['three fields', 'k1 a extra\n'], ['no keys', '# none\n']]) {
  writeFileSync(keyFile, text);
  let msg = '';
  try {
    await startServer(bin, ['-m', MODEL, '-c', '64', '--api-key-file', keyFile], { cwd: root, name: what });
    msg = 'started';
  } catch (e) {
    msg = String(e.message);
  }
  const ok = /exited with 1/.test(msg) && /api-key|API key|keys\.txt/.test(msg);
  console.log(`${ok ? 'ok   ' : 'FAIL '} key file with ${what} is refused at start`);
  if (!ok) { console.log(msg); failed++; }
}
// --api-key with several keys, comma-separated (llama-server's form): each works, each a tenant
const listed = await startServer(bin, ['-m', MODEL, '-c', '512', '--api-key', 'key-one, key-two'],
  { cwd: root, name: 'key-list' });
failed += await runTests([
  ['--api-key k1,k2: both keys work, the list itself does not; each its own tenant', async () => {
    const p = prompt('list');
    const a = await ask(listed.url, 'key-one', { prompt: p });
    assertEq(a.status, 200, `key-one: ${a.text.slice(0, 200)}`);
    const b = await ask(listed.url, 'key-two', { prompt: p });
    assertEq(b.status, 200, `key-two: ${b.text.slice(0, 200)}`);
    assertEq(cached(b), 0, 'key-two does not hit key-one\'s prompt');
    assert(cached(await ask(listed.url, 'key-one', { prompt: p })) > 0, 'key-one hits its own');
    assertEq((await ask(listed.url, 'key-one, key-two', { prompt: p })).status, 401, 'the list is not a key');
  }],
]);
const listCode = await listed.stop();
if (listCode !== 0) { console.log(`server exit ${listCode}:\n${listed.log()}`); failed++; }
rmSync(dir, { recursive: true, force: true });
process.exit(failed ? 1 : 0);
