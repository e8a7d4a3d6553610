// Connections and framing: a flood of slow clients (per-address limit, global
// limit, request deadline) while /health and a completion keep working;
// authentication and size checks before any body is read; request smuggling
// (duplicate Content-Length, Transfer-Encoding with Content-Length); strict
// JSON bodies (trailing data, \u0000) and the full 64-bit seed range.
// usage: node test_connections.mjs BUILD/kvllm REPO_ROOT
import {
  startServer, rawRequest, rawSocket, rawExchange, metrics, rssKiB, assert, assertEq, runTests, sleep,
} from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const MODEL = 'models/stories260K.gguf';
const KEY = 'conn-test-key';
const auth = { Authorization: `Bearer ${KEY}` };

// A slow client: opens a connection from `from` and trickles a request's
// headers one byte every `everyMs`, never finishing them.
function slowClient(port, from, everyMs) {
  const c = rawSocket(port, { localAddress: from });
  const line = 'GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ' + 'a'.repeat(4000);
  let i = 0;
  c.connected.then(() => {
    c.timer = setInterval(() => { if (i < line.length) c.write(line[i++]); }, everyMs);
  });
  c.closed.then(() => clearInterval(c.timer));
  return c;
}

function percentile(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
}

// GET /health on a new connection each time (a pooled keep-alive connection
// would not show whether a new client gets in), from 127.0.0.1.
async function timedHealth(port) {
  const t0 = performance.now();
  const c = await rawExchange(port, 'GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  const m = c.text().match(/\r\nRetry-After: (\d+)\r\n/i);
  return { status: c.status(), ms: performance.now() - t0, retryAfter: m ? m[1] : null };
}

// Open connections now, not counting the one that asks.
async function openConnections(port) {
  const c = await rawExchange(port, 'GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  const m = c.text().match(/kvllm:http_connections_open\{[^}]*\} (\d+)/);
  assert(m, `http_connections_open in /metrics: ${c.text().slice(0, 200)}`);
  return Number(m[1]) - 1;
}

let failed = 0;

// ---------------------------------------------------------------- flood --
{
  const server = await startServer(bin, ['-m', MODEL, '-c', '256', '--max-connections-per-ip', '64',
    '--request-timeout', '4'], { cwd: root, name: 'flood' });
  failed += await runTests([
    ['1000 slow clients from one address: 64 held, the rest 503 + Retry-After; /health and completions unaffected', async () => {
      const N = 1000;
      const clients = [];
      for (let i = 0; i < N; i++) clients.push(slowClient(server.port, '127.0.0.2', 1000));
      await Promise.all(clients.map((c) => Promise.race([c.connected, sleep(5000)])));
      await sleep(500);
      // /health and a completion from another address, while the flood holds
      const lat = [];
      for (let i = 0; i < 40; i++) {
        const h = await timedHealth(server.port);
        assertEq(h.status, 200, `/health during the flood (#${i})`);
        lat.push(h.ms);
      }
      const comp = await rawRequest(server.url, { body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 8 }) });
      assertEq(comp.status, 200, 'a completion during the flood');
      const refused = clients.filter((c) => c.status() === 503);
      const held = clients.filter((c) => c.status() === 0); // admitted, never answered
      console.log(`  flood: ${N} slow clients -> ${refused.length} answered 503, ${held.length} held; ` +
        `/health p50 ${percentile(lat, 0.5).toFixed(1)} ms, p99 ${percentile(lat, 0.99).toFixed(1)} ms, ` +
        `max ${Math.max(...lat).toFixed(1)} ms`);
      assertEq(held.length, 64, 'connections admitted: the per-address limit');
      assertEq(refused.length, N - 64, 'the others get a 503');
      const r = refused[0].text();
      assert(/\r\nRetry-After: 1\r\n/i.test(r) && r.includes('"server_overloaded"'), `503 with Retry-After and a JSON error: ${r.slice(0, 300)}`);
      assert(clients.every((c) => c.status() === 503 || c.status() === 0), 'nothing else was answered');
      // the request deadline (4 s from accept) ends the held ones
      const t0 = Date.now();
      await Promise.race([Promise.all(held.map((c) => c.closed)), sleep(8000)]);
      const stillOpen = held.filter((c) => !c.ended).length;
      console.log(`  request deadline: held connections closed ${((Date.now() - t0) / 1000).toFixed(1)} s after the check`);
      assertEq(stillOpen, 0, 'slow connections closed at the request deadline');
      const m = await metrics(server.url);
      assert(m.get('kvllm:http_request_timeouts_total') >= 64, `timeouts counted (${m.get('kvllm:http_request_timeouts_total')})`);
      assert(m.get('kvllm:http_connections_refused_total') >= N - 64, 'refusals counted');
      for (const c of clients) c.destroy();
    }],
  ]);
  const code = await server.stop();
  if (code !== 0) { console.log(`flood server exit ${code}:\n${server.log()}`); failed++; }
}

// --------------------------------------------------------- global limit --
{
  const server = await startServer(bin, ['-m', MODEL, '-c', '256', '--max-connections', '40',
    '--max-connections-per-ip', '0', '--request-timeout', '3'], { cwd: root, name: 'global' });
  failed += await runTests([
    ['global limit full: 503 + Retry-After (no reset) while all are young, then the oldest slow client is evicted for a newcomer', async () => {
      const before = await openConnections(server.port); // e.g. startServer's pooled /health probe
      // The server releases the /metrics connection's slot only after the client has read its
      // close; under TSan on a loaded machine that took long enough for the flood below to
      // find one slot still taken (22 refused, not 21). Give the release time to happen.
      await sleep(300);
      const clients = [];
      for (let i = 0; i < 60; i++) clients.push(slowClient(server.port, `127.0.0.${3 + (i % 10)}`, 500));
      await Promise.all(clients.map((c) => c.connected));
      await sleep(500);
      const refused = clients.filter((c) => c.status() === 503).length;
      assertEq(refused, 60 - (40 - before), `connections over --max-connections 40 (${before} open before)`);
      const h = await timedHealth(server.port);
      assertEq(h.status, 503, '/health while every slot is held by connections younger than 1 s');
      assertEq(h.retryAfter, '1', 'Retry-After');
      // once the slow ones have been receiving for a second, a newcomer evicts the oldest:
      // /health and a completion get through although every slot is held
      await sleep(1200);
      assertEq((await timedHealth(server.port)).status, 200, '/health evicts a slow client');
      const body = JSON.stringify({ prompt: 'Once upon', max_tokens: 4 });
      const done = await rawExchange(server.port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\n' +
        `Content-Type: application/json\r\nConnection: close\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
      assertEq(done.status(), 200, `a completion while the slots are held: ${done.text().slice(0, 200)}`);
      const m = await metrics(server.url);
      assert(m.get('kvllm:http_connections_evicted_total') >= 1,
        `evictions counted (${m.get('kvllm:http_connections_evicted_total')})`);
      // the rest end at their deadline, then /health answers again
      await Promise.race([Promise.all(clients.map((c) => c.closed)), sleep(6000)]);
      assertEq((await timedHealth(server.port)).status, 200, '/health after the deadline');
      for (const c of clients) c.destroy();
    }],
  ]);
  const code = await server.stop();
  if (code !== 0) { console.log(`global server exit ${code}:\n${server.log()}`); failed++; }
}

// ------------------------------------------------- framing, auth, JSON --
const server = await startServer(bin, ['-m', MODEL, '-c', '256', '--api-key', KEY, '--max-body', '1MiB'],
  { cwd: root, name: 'framing' });
const post = (headers, body = '') => `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${headers}\r\n${body}`;
const good = JSON.stringify({ prompt: 'Once', max_tokens: 2 });

failed += await runTests([
  ['keyless large bodies: refused from the headers, the body never stored; RSS stays flat', async () => {
    // a client that waits for 100 Continue gets the 401 before sending a byte of body
    const early = rawSocket(server.port);
    await early.connected;
    early.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\nExpect: 100-continue\r\n\r\n');
    await Promise.race([early.closed, sleep(3000)]);
    assertEq(early.status(), 401, 'answered at the header stage');
    assert(!early.text().includes('100 Continue'), 'no 100 Continue for a keyless request');
    // 40 keyless clients send all but the last 1000 bytes of a 900 kB body
    // and hold: a server that buffered before checking would hold 36 MB now
    const rss0 = rssKiB(server.proc.pid);
    const body = '{"prompt":"' + 'a'.repeat(900000 - 13) + '"}';
    const conns = [];
    for (let i = 0; i < 40; i++) {
      const c = rawSocket(server.port);
      await c.connected;
      c.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 900000\r\n\r\n');
      c.write(body.slice(0, -1000));
      conns.push(c);
    }
    await sleep(1000);
    const rss1 = rssKiB(server.proc.pid);
    for (const c of conns) c.write(body.slice(-1000));
    await Promise.race([Promise.all(conns.map((c) => c.closed)), sleep(5000)]);
    for (const c of conns) {
      assertEq(c.status(), 401, 'keyless request refused');
      assert(c.ended, 'and the connection closed');
    }
    console.log(`  RSS ${rss0} -> ${rss1} KiB while 40 keyless clients hold 899 kB bodies each`);
    assert(rss1 - rss0 < 8 * 1024, `RSS grew ${rss1 - rss0} KiB`);
  }],

  ['body over --max-body by Content-Length: 413 before reading it; /metrics needs the key', async () => {
    const c = await rawExchange(server.port, post(`Authorization: Bearer ${KEY}\r\nContent-Length: 2000000\r\n`));
    assertEq(c.status(), 413, 'Content-Length over the limit');
    assertEq((await fetch(`${server.url}/metrics`)).status, 401, '/metrics without a key');
    assertEq((await fetch(`${server.url}/metrics`, { headers: auth })).status, 200, '/metrics with the key');
    assertEq((await fetch(`${server.url}/health`)).status, 200, '/health without a key');
  }],

  ['smuggling: duplicate or conflicting Content-Length, Transfer-Encoding with Content-Length -> 400 and close', async () => {
    const a = `Authorization: Bearer ${KEY}\r\n`;
    const smuggled = 'GET /v1/models HTTP/1.1\r\nHost: x\r\n' + a + '\r\n';
    const CL2 = /more than one Content-Length header/, BOTH = /both Transfer-Encoding and Content-Length/,
      TE = /unsupported Transfer-Encoding/;
    const cases = [
      ['two equal Content-Length', CL2, post(`${a}Content-Length: ${good.length}\r\nContent-Length: ${good.length}\r\n`, good)],
      ['Content-Length and content-length', CL2, post(`${a}Content-Length: ${good.length}\r\ncontent-length: ${good.length}\r\n`, good)],
      ['conflicting Content-Length', CL2, post(`${a}Content-Length: ${good.length}\r\nContent-Length: ${good.length + smuggled.length}\r\n`, good + smuggled)],
      ['Transfer-Encoding + Content-Length', BOTH, post(`${a}Content-Length: ${good.length + 7}\r\nTransfer-Encoding: chunked\r\n`,
        `${good.length.toString(16)}\r\n${good}\r\n0\r\n\r\n` + smuggled)],
      ['Content-Length + Transfer-Encoding (other order)', BOTH, post(`${a}Transfer-Encoding: chunked\r\nContent-Length: 3\r\n`,
        `${good.length.toString(16)}\r\n${good}\r\n0\r\n\r\n`)],
      ['Transfer-Encoding: gzip, chunked', TE, post(`${a}Transfer-Encoding: gzip, chunked\r\n`, `${good.length.toString(16)}\r\n${good}\r\n0\r\n\r\n`)],
      ['two Transfer-Encoding headers', TE, post(`${a}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n`, `${good.length.toString(16)}\r\n${good}\r\n0\r\n\r\n`)],
    ];
    for (const [what, why, req] of cases) {
      const c = await rawExchange(server.port, req);
      assertEq(c.status(), 400, what);
      // refused for its framing, before the body (any other 400, e.g. from the
      // JSON of a body read some other way, means the framing got through)
      assert(why.test(c.text()), `${what}: refused for its framing: ${c.text().slice(-200)}`);
      assertEq((c.text().match(/HTTP\/1\.1 /g) || []).length, 1, `${what}: one response only (nothing smuggled)`);
      assert(c.ended, `${what}: connection closed`);
    }
    // the legitimate forms still work: one Content-Length, or chunked alone
    const ok1 = await rawExchange(server.port, post(`${a}Content-Length: ${good.length}\r\nConnection: close\r\n`, good));
    assertEq(ok1.status(), 200, 'one Content-Length');
    const ok2 = await rawExchange(server.port, post(`${a}Transfer-Encoding: chunked\r\nConnection: close\r\n`,
      `${good.length.toString(16)}\r\n${good}\r\n0\r\n\r\n`));
    assertEq(ok2.status(), 200, 'chunked alone');
  }],

  ['JSON: trailing data and \\u0000 -> 400; an escaped backslash before u0000 is text', async () => {
    const send = (body) => rawRequest(server.url, { headers: auth, body });
    for (const [what, body] of [
      ['trailing garbage', good + ' x'],
      ['a second value', good + good],
      ['trailing NUL byte', good + '\0'],
      ['\\u0000 in the prompt', '{"prompt":"Once\\u0000 upon","max_tokens":2}'],
      ['\\u0000 in a stop string', '{"prompt":"Once","max_tokens":2,"stop":["a\\u0000b"]}'],
      ['\\u0000 in a chat message', '{"messages":[{"role":"user","content":"hi\\u0000"}],"max_tokens":2}'],
    ]) {
      const path = what.includes('chat') ? '/v1/chat/completions' : '/v1/completions';
      const r = await rawRequest(server.url, { headers: auth, path, body });
      assertEq(r.status, 400, what);
      assert(r.json && r.json.error && /after the JSON value|NUL|not valid/.test(r.json.error.message), `${what}: ${r.text}`);
    }
    const ok = await send(good + ' \r\n\t ');
    assertEq(ok.status, 200, 'trailing whitespace is fine');
    const lit = await send('{"prompt":"Once \\\\u0000","max_tokens":2}');
    assertEq(lit.status, 200, 'an escaped backslash followed by u0000 is plain text');
  }],

  ['seed: 2^64-1 accepted and the same stream as -1 (two\'s complement); 2^64 refused', async () => {
    const ask = async (seed) => {
      const r = await rawRequest(server.url, { headers: auth,
        body: `{"prompt":"Once upon a time","max_tokens":24,"temperature":1.5,"seed":${seed}}` });
      assertEq(r.status, 200, `seed ${seed}: ${r.text.slice(0, 200)}`);
      return r.json.choices[0].text;
    };
    const max = await ask('18446744073709551615');
    assertEq(max, await ask('-1'), '2^64-1 and -1 are the same 64-bit seed');
    assertEq(await ask('18446744073709551614'), await ask('-2'), '2^64-2 and -2');
    assert(max !== await ask('18446744073709549568'), 'a seed 2047 below gives another stream');
    assert(await ask('9007199254740993') !== await ask('9007199254740992'), '2^53+1 and 2^53 differ (as doubles they are equal)');
    const big = await rawRequest(server.url, { headers: auth, body: '{"prompt":"x","max_tokens":1,"seed":18446744073709551616}' });
    assertEq(big.status, 400, '2^64 is out of range');
  }],
]);

const code = await server.stop();
if (code !== 0) { console.log(`framing server exit ${code}:\n${server.log()}`); failed++; }
process.exit(failed ? 1 : 0);
