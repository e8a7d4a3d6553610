// HTTPS (llama-server's --ssl-key-file / --ssl-cert-file): the endpoints over
// TLS with the certificate verified against tests/data/tls/cert.pem (its name
// and address checked too), a stream, an API key sent only inside TLS, a
// plain-HTTP client on the TLS port turned away without harm, and the start-up
// refusals (one file alone, a missing file, a key that is not the
// certificate's, a certificate given as the key).
// usage: node test_tls.mjs BUILD/kvllm REPO_ROOT
import https from 'node:https';
import http from 'node:http';
import { readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { startServer, assert, assertEq, runTests, stopAll } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const MODEL = 'models/stories260K.gguf';
const TLS = 'tests/data/tls';
const ca = readFileSync(`${root}/${TLS}/cert.pem`);
const KEY = 'tls-test-key';

// One HTTPS request verified against the tests' certificate: { status, body }.
function request(port, { method = 'GET', path = '/health', body, headers = {}, host = '127.0.0.1' } = {}) {
  return new Promise((resolve, reject) => {
    const req = https.request({
      host, port, method, path, ca, servername: host === '127.0.0.1' ? undefined : host,
      headers: { ...(body ? { 'Content-Type': 'application/json' } : {}), ...headers }, agent: false,
    }, (res) => {
      let data = '';
      res.on('data', (d) => { data += d; });
      res.on('end', () => resolve({ status: res.statusCode, body: data, headers: res.headers }));
    });
    req.on('error', reject);
    if (body) req.write(typeof body === 'string' ? body : JSON.stringify(body));
    req.end();
  });
}

// `kvllm serve` with these flags must exit non-zero before listening, saying `why`.
function refuses(flags, why) {
  const r = spawnSync(bin, ['serve', '-m', MODEL, '--port', '0', ...flags], { cwd: root, encoding: 'utf8', timeout: 60000 });
  assert(r.status !== 0 && r.status !== null, `exit status ${r.status} for ${flags.join(' ')}`);
  assert(r.stderr.includes(why), `'${why}' not in: ${r.stderr.slice(-400)}`);
  assert(!r.stderr.includes('listening on'), `listened: ${r.stderr.slice(-300)}`);
}

const server = await startServer(bin, ['-m', MODEL, '--api-key', KEY,
  '--ssl-key-file', `${TLS}/key.pem`, '--ssl-cert-file', `${TLS}/cert.pem`], { cwd: root, name: 'tls' });
const auth = { Authorization: `Bearer ${KEY}` };

const failed = await runTests([
  ['the listening line says https', async () => {
    assert(server.url.startsWith('https://'), server.url);
  }],
  ['/health over TLS, the certificate verified (address and name)', async () => {
    assertEq((await request(server.port)).status, 200, 'by address');
    assertEq((await request(server.port, { host: 'localhost' })).status, 200, 'by name');
  }],
  ['a certificate the client does not trust is refused by the client', async () => {
    const err = await new Promise((resolve) => {
      https.get({ host: '127.0.0.1', port: server.port, path: '/health', agent: false }, () => resolve(null))
        .on('error', resolve);
    });
    assert(err && /self.signed|certificate/i.test(String(err.code || err.message)), `no error: ${err}`);
  }],
  ['the API key inside TLS: without it 401, with it a completion', async () => {
    const body = { prompt: 'Once upon a time', max_tokens: 8, temperature: 0 };
    assertEq((await request(server.port, { method: 'POST', path: '/v1/completions', body })).status, 401);
    const r = await request(server.port, { method: 'POST', path: '/v1/completions', body, headers: auth });
    assertEq(r.status, 200, r.body);
    const j = JSON.parse(r.body);
    assertEq(j.usage.completion_tokens, 8, 'tokens');
    assert(j.choices[0].text.length > 0, 'text');
  }],
  ['a stream over TLS: the same text as the plain answer, then [DONE]', async () => {
    const body = { prompt: 'Once upon a time', max_tokens: 8, temperature: 0 };
    const plain = JSON.parse((await request(server.port, { method: 'POST', path: '/v1/completions', body, headers: auth })).body);
    const r = await request(server.port, {
      method: 'POST', path: '/v1/completions', body: { ...body, stream: true }, headers: auth,
    });
    assertEq(r.status, 200);
    assert(/text\/event-stream/.test(r.headers['content-type']), r.headers['content-type']);
    const events = r.body.split('\n\n').filter((e) => e.startsWith('data: '));
    assertEq(events.at(-1), 'data: [DONE]', 'last event');
    const text = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)).choices[0]?.text ?? '').join('');
    assertEq(text, plain.choices[0].text, 'streamed text');
  }],
  ['plain HTTP on the TLS port gets no answer, and HTTPS goes on', async () => {
    const got = await new Promise((resolve) => {
      const req = http.get({ host: '127.0.0.1', port: server.port, path: '/health', agent: false }, (res) => {
        res.resume();
        resolve(`status ${res.statusCode}`);
      });
      req.on('error', (e) => resolve(`error ${e.code || e.message}`));
      req.setTimeout(10000, () => { req.destroy(); resolve('timeout'); });
    });
    assert(!got.startsWith('status 200'), `plain HTTP answered: ${got}`);
    assertEq((await request(server.port)).status, 200, 'HTTPS after it');
  }],
  ['refused at start: one file alone', async () => {
    refuses(['--ssl-key-file', `${TLS}/key.pem`], 'both --ssl-key-file and --ssl-cert-file');
    refuses(['--ssl-cert-file', `${TLS}/cert.pem`], 'both --ssl-key-file and --ssl-cert-file');
  }],
  ['refused at start: a missing file, named', async () => {
    refuses(['--ssl-key-file', `${TLS}/nonexistent.pem`, '--ssl-cert-file', `${TLS}/cert.pem`], 'nonexistent.pem');
  }],
  ['refused at start: a key that is not the certificate\'s, a certificate as the key', async () => {
    refuses(['--ssl-key-file', `${TLS}/other-key.pem`, '--ssl-cert-file', `${TLS}/cert.pem`], 'cannot start the HTTPS server');
    refuses(['--ssl-key-file', `${TLS}/cert.pem`, '--ssl-cert-file', `${TLS}/cert.pem`], 'cannot start the HTTPS server');
  }],
]);

const bad = await stopAll([server]);
process.exit(failed || bad ? 1 : 0);
