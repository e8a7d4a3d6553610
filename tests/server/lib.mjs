// Helpers for the server tests: start/stop `kvllm serve`, raw HTTP, /metrics
// parsing, and a tiny sequential test runner (node:test's output differs
// between Node 18 and 20; this keeps the log the same everywhere).
import { spawn } from 'node:child_process';
import http from 'node:http';
import net from 'node:net';
import { readFileSync } from 'node:fs';
import { File } from 'node:buffer';

if (typeof globalThis.File === 'undefined') globalThis.File = File; // Node 18

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts the server on a free port (--port 0; the port is read from the log).
// env: variables added to the server's environment.
export async function startServer(bin, args, { cwd, name = 'server', env } = {}) {
  const proc = spawn(bin, ['serve', '--port', '0', ...args],
    { cwd, stdio: ['ignore', 'ignore', 'pipe'], env: env ? { ...process.env, ...env } : undefined });
  let log = '', scheme = 'http', prefix = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name}: no 'listening' line after 60 s:\n${log}`)), 60000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on (https?):\/\/[^:]+:(\d+)(\/\S*)?/);
      if (m) {
        clearTimeout(timer);
        scheme = m[1];
        prefix = m[3] || ''; // --api-prefix
        resolve(Number(m[2]));
      }
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited with ${code}:\n${log}`));
    });
  });
  const url = `${scheme}://127.0.0.1:${port}${prefix}`;
  // (HTTPS: fetch would refuse the tests' self-signed certificate; the server
  // listens once the line is printed)
  for (let i = 0; scheme === 'http' && i < 100; i++) {
    try {
      if ((await fetch(`${url}/health`)).status === 200) break;
    } catch {}
    await sleep(100);
  }
  const server = { url, port, proc, log: () => log };
  server.stop = async () => {
    if (proc.exitCode !== null) return proc.exitCode;
    const done = new Promise((r) => proc.on('exit', (code, sig) => r(code ?? sig)));
    proc.kill('SIGTERM');
    const t = setTimeout(() => proc.kill('SIGKILL'), 10000);
    const code = await done;
    clearTimeout(t);
    return code;
  };
  return server;
}

// A request with full control over the body bytes (Buffer or string).
// settle: resolve with { error } on a dropped connection instead of rejecting;
// onRequest(req) sees the request before its body is sent (e.g. to abort it);
// agent: false for a connection of its own.
export function rawRequest(url, { method = 'POST', path = '/v1/completions', headers = {}, body,
  settle = false, onRequest, agent } = {}) {
  return new Promise((resolve, reject) => {
    const fail = settle ? (e) => resolve({ error: e }) : reject;
    const u = new URL(path, url);
    const req = http.request(
      { host: u.hostname, port: u.port, path: u.pathname + u.search, method, agent,
        headers: { 'Content-Type': 'application/json', ...headers } },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let json = null;
          try { json = JSON.parse(text); } catch {}
          resolve({ status: res.statusCode, headers: res.headers, text, json });
        });
        res.on('error', fail);
        // a connection cut mid-response emits 'close' without 'end': settle, never hang
        res.on('close', () => { if (!res.complete) fail(new Error('the response was cut before its end')); });
      },
    );
    req.on('error', fail);
    if (onRequest) onRequest(req);
    if (body !== undefined) req.write(body);
    req.end();
  });
}

// Prometheus text -> Map of "name{labels}" and bare "name" (summed over labels) -> value.
// key: the API key, for a server started with one (/metrics then needs it).
export async function metrics(url, key) {
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  const res = await fetch(`${url}/metrics`, { headers });
  if (res.status !== 200) throw new Error(`/metrics: status ${res.status}`);
  const text = await res.text();
  const m = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const sp = line.lastIndexOf(' ');
    const series = line.slice(0, sp), value = Number(line.slice(sp + 1));
    m.set(series, value);
    const bare = series.replace(/\{.*\}$/, '');
    if (!series.includes('le="')) m.set(bare, (m.get(bare) ?? 0) + value);
  }
  m.text = text;
  return m;
}

// Polls until pred(metrics) holds; returns the last metrics.
export async function waitMetrics(url, pred, timeoutMs = 10000, key) {
  const end = Date.now() + timeoutMs;
  let m;
  do {
    m = await metrics(url, key);
    if (pred(m)) return m;
    await sleep(100);
  } while (Date.now() < end);
  return m;
}

// A client that leaves a stream after its third delta (isDelta(event)):
// afterwards the request counts as aborted, nothing runs and no KV block is used.
export async function leaveMidStream(url, openStream, isDelta) {
  const idle = (m) => m.get('kvllm:num_requests_running') === 0 && m.get('kvllm:kv_blocks_used') === 0;
  const aborts = (m) => [...m.entries()].find(([k]) => k.startsWith('kvllm:request_success_total{') && k.includes('"abort"'))[1];
  const before = aborts(await waitMetrics(url, idle));
  let deltas = 0;
  for await (const ev of await openStream()) {
    if (isDelta(ev) && ++deltas === 3) break; /* leaves: the SDK aborts */
  }
  const m = await waitMetrics(url, (x) => idle(x) && aborts(x) === before + 1);
  assert(idle(m), `running ${m.get('kvllm:num_requests_running')}, blocks ${m.get('kvllm:kv_blocks_used')}`);
  assertEq(aborts(m), before + 1, 'cancelled (finished_reason abort), not finished');
}

export function assert(cond, msg) {
  if (!cond) throw new Error(`assertion failed: ${msg}`);
}

export function assertEq(a, b, msg) {
  const ja = JSON.stringify(a), jb = JSON.stringify(b);
  if (ja !== jb) throw new Error(`${msg}: ${ja.slice(0, 300)} != ${jb.slice(0, 300)}`);
}

// Runs the tests in order, prints one line each, returns the failure count.
// Stops every server; how many did not exit with 0 (their logs printed).
export async function stopAll(servers) {
  let bad = 0;
  for (const s of servers) {
    const code = await s.stop();
    if (code !== 0) {
      console.log(`server exit code ${code}; log:\n${s.log()}`);
      bad++;
    }
  }
  return bad;
}

export async function runTests(tests) {
  let failed = 0;
  for (const [name, fn] of tests) {
    const t0 = Date.now();
    try {
      await fn();
      console.log(`ok    ${name} (${Date.now() - t0} ms)`);
    } catch (e) {
      failed++;
      console.log(`FAIL  ${name}: ${e.stack || e}`);
    }
  }
  console.log(failed ? `${failed} of ${tests.length} failed` : `all ${tests.length} passed`);
  return failed;
}

// Token ids of a completion, from logprobs with return_tokens_as_token_ids.
export function completionIds(choice) {
  return choice.logprobs.tokens.map((t) => Number(t.slice('token_id:'.length)));
}

// A raw TCP client (node:net) for what an HTTP library would not send:
// trickled headers, duplicate framing headers, requests abandoned mid-body.
// .text() is everything received so far; .closed resolves when the server
// closes (or resets) the connection.
export function rawSocket(port, { localAddress } = {}) {
  const sock = net.connect({ host: '127.0.0.1', port, localAddress });
  const chunks = [];
  const conn = { sock, error: null, ended: false };
  // settles on a refused connection too (conn.error then says why): a test
  // awaiting it must not hang with nothing reported
  conn.connected = new Promise((resolve) => { sock.once('connect', resolve); sock.once('error', resolve); });
  sock.on('data', (d) => chunks.push(d));
  sock.on('error', (e) => { conn.error = e; });
  conn.closed = new Promise((resolve) => sock.once('close', () => { conn.ended = true; resolve(); }));
  conn.text = () => Buffer.concat(chunks).toString('latin1');
  conn.status = () => { const m = conn.text().match(/^HTTP\/1\.[01] (\d{3})/); return m ? Number(m[1]) : 0; };
  conn.write = (s) => { if (!sock.destroyed) sock.write(s); };
  conn.destroy = () => sock.destroy();
  return conn;
}

// Sends a request and waits for the server to answer and close (or for ms).
export async function rawExchange(port, data, { ms = 5000, localAddress } = {}) {
  const c = rawSocket(port, { localAddress });
  await c.connected;
  c.write(data);
  await Promise.race([c.closed, sleep(ms)]);
  c.destroy();
  return c;
}

// Resident memory of a process in KiB (Linux /proc).
export function rssKiB(pid) {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/);
  return m ? Number(m[1]) : 0;
}
