// Vertex AI's prediction protocol, as llama-server serves it with
// AIP_MODE=PREDICTION: the port from AIP_HTTP_PORT, POST AIP_PREDICT_ROUTE
// (/predict) with {"instances": [...]}, each run as the route its
// "@requestFormat" names (a path or llama-server's camelCase alias), never
// streamed, answered as {"predictions": [...]} in order with an error object
// for an instance that fails; AIP_HEALTH_ROUTE another /health. Checked: each
// prediction equals the same request's answer on its own route (greedy), the
// errors of bad instances and bodies, the key rule, a refused route name.
// usage: node test_predict.mjs BUILD/kvllm REPO_ROOT
import { spawnSync } from 'node:child_process';
import net from 'node:net';
import { startServer, rawRequest, metrics, waitMetrics, assert, assertEq, runTests, stopAll, sleep } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const freePort = () => new Promise((resolve) => {
  const srv = net.createServer().listen(0, '127.0.0.1', () => {
    const { port } = srv.address();
    srv.close(() => resolve(port));
  });
});
const MODEL = ['-m', 'tests/data/golden/models/qwen3-f32.gguf', '-c', '512'];
const port = await freePort();
const gcp = await startServer(bin, MODEL, { cwd: root, name: 'vertex',
  env: { AIP_MODE: 'PREDICTION', AIP_HTTP_PORT: String(port), AIP_HEALTH_ROUTE: 'healthz' } });
const keyPort = await freePort();
const keyed = await startServer(bin, [...MODEL, '--api-key', 'k1'], { cwd: root, name: 'vertex-keyed',
  env: { AIP_MODE: 'PREDICTION', AIP_HTTP_PORT: String(keyPort), AIP_PREDICT_ROUTE: 'v1/endpoints/e1:predict' } });
const post = (s, path, body, headers = {}) => rawRequest(s.url, { path, headers, body: JSON.stringify(body) });
const predict = async (instances, s = gcp, path = '/predict', headers = {}) => {
  const r = await post(s, path, { instances }, headers);
  assertEq(r.status, 200, `predict: ${r.text.slice(0, 300)}`);
  return r.json.predictions;
};
const CHAT = { messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 8, temperature: 0 };
const COMPL = { prompt: 'Once upon a time', max_tokens: 8, temperature: 0 };
const LLAMA = { prompt: 'Once upon a time', n_predict: 8, temperature: 0 };

const failed = await runTests([
  ['the port is AIP_HTTP_PORT; AIP_HEALTH_ROUTE answers as /health', async () => {
    assertEq(gcp.port, port, 'listening on AIP_HTTP_PORT');
    const h = await rawRequest(gcp.url, { method: 'GET', path: '/healthz' });
    assertEq([h.status, h.json], [200, { status: 'ok' }], '/healthz');
  }],
  ['each instance is the request its @requestFormat names, answered as on its own route', async () => {
    const p = await predict([
      { '@requestFormat': 'chatCompletions', ...CHAT },
      { '@requestFormat': 'completions', ...COMPL },
      { '@requestFormat': '/completion', ...LLAMA, stream: true },
      { '@requestFormat': 'tokenize', content: 'Hello world' },
      { '@requestFormat': 'applyTemplate', messages: CHAT.messages },
      { '@requestFormat': '/v1/chat/completions', ...CHAT, stream: true },
    ]);
    assertEq(p.length, 6, 'one prediction per instance');
    const chat = (await post(gcp, '/v1/chat/completions', CHAT)).json;
    assertEq(p[0].object, 'chat.completion', 'chatCompletions: a chat completion');
    assertEq(p[0].choices[0].message.content, chat.choices[0].message.content, 'the same text as /v1/chat/completions');
    const compl = (await post(gcp, '/v1/completions', COMPL)).json;
    assertEq([p[1].object, p[1].choices[0].text], ['text_completion', compl.choices[0].text], 'completions: /v1/completions\' answer');
    const llama = (await post(gcp, '/completion', LLAMA)).json;
    assertEq([p[2].content, p[2].stop], [llama.content, true], '/completion, stream true answered whole');
    assertEq(p[3], (await post(gcp, '/tokenize', { content: 'Hello world' })).json, 'tokenize');
    assertEq(p[4], (await post(gcp, '/apply-template', { messages: CHAT.messages })).json, 'applyTemplate');
    assertEq([p[5].object, p[5].choices[0].message.content], ['chat.completion', chat.choices[0].message.content], 'a path');
  }],
  ['bad instances get their own error; the others are answered', async () => {
    const p = await predict([
      5,
      { prompt: 'x' },
      { '@requestFormat': 'noSuchRoute' },
      { '@requestFormat': 'completions', ...COMPL, max_tokens: 'many' },
      { '@requestFormat': 'slots' },
      { '@requestFormat': 'completions', ...COMPL },
    ]);
    assert(/JSON object/.test(p[0].error.message), `not an object: ${JSON.stringify(p[0])}`);
    assert(/@requestFormat/.test(p[1].error.message), `no @requestFormat: ${JSON.stringify(p[1])}`);
    assert(/no handler registered for @requestFormat: noSuchRoute/.test(p[2].error.message), 'unknown format');
    assertEq([p[3].error.type, p[3].error.param], ['invalid_request_error', 'max_tokens'], 'the route\'s own 400');
    assert(/does not run inside/.test(p[4].error.message), `a route without a JSON body answer: ${JSON.stringify(p[4])}`);
    assertEq(p[5].object, 'text_completion', 'the good one is answered');
  }],
  ['bodies: no instances array, more than 128, not an object: 400; none: an empty list', async () => {
    for (const [body, why] of [[{ instances: 5 }, 'array field named instances'], [{}, 'array field named instances'],
      [[1], 'JSON object'], [{ instances: Array(129).fill({ '@requestFormat': 'health' }) }, 'maximum size of 128']]) {
      const r = await post(gcp, '/predict', body);
      assert(r.status === 400 && r.json.error.message.includes(why), `${JSON.stringify(body).slice(0, 40)}: ${r.status} ${r.text.slice(0, 200)}`);
    }
    assertEq(await predict([]), [], 'no instances');
    assertEq((await rawRequest(gcp.url, { path: '/predict', body: '{' })).status, 400, 'bad JSON');
  }],
  ['several generations side by side', async () => {
    const p = await predict(Array.from({ length: 6 }, (_, i) => ({ '@requestFormat': 'completions', ...COMPL, prompt: `Story ${i}:` })));
    assert(p.every((x) => x.object === 'text_completion' && x.usage.completion_tokens === 8), 'six answered');
  }],
  ['a client that leaves: its generations are cancelled', async () => {
    const aborts = async () => [...(await metrics(gcp.url)).entries()]
      .filter(([k]) => k.startsWith('kvllm:request_success_total{') && k.includes('"abort"')).reduce((a, [, v]) => a + v, 0);
    const before = await aborts();
    const body = JSON.stringify({ instances: [0, 1].map((i) => ({ '@requestFormat': 'completions', ...COMPL,
      prompt: `Long ${i}`, max_tokens: 480, ignore_eos: true })) });
    // leaves once both generations run (not before the server has read the request)
    const leave = async (req) => {
      for (let i = 0; i < 2000; i++) {
        if ((await metrics(gcp.url)).get('kvllm:num_requests_running') >= 2) break;
        await sleep(2);
      }
      req.destroy();
    };
    const r = await rawRequest(gcp.url, { path: '/predict', body, settle: true, onRequest: (req) => { leave(req); } });
    assert(r.error, 'left');
    const m = await waitMetrics(gcp.url, (x) => x.get('kvllm:num_requests_running') === 0);
    assertEq(m.get('kvllm:num_requests_running'), 0, 'nothing runs');
    assertEq(await aborts(), before + 2, 'both cancelled (finish abort)');
  }],
  ['AIP_PREDICT_ROUTE: its path; the key rule as on /v1', async () => {
    const path = '/v1/endpoints/e1:predict';
    assertEq((await post(keyed, path, { instances: [] })).status, 401, 'no key: 401');
    const p = await predict([{ '@requestFormat': 'tokenize', content: 'a' }], keyed, path, { Authorization: 'Bearer k1' });
    assert(Array.isArray(p[0].tokens), 'answered with the key');
    assertEq((await post(keyed, '/predict', { instances: [] }, { Authorization: 'Bearer k1' })).status, 404, '/predict is not it');
  }],
  ['AIP_PREDICT_ROUTE naming one of kvllm\'s routes: refused at start', async () => {
    const r = spawnSync(bin, ['serve', ...MODEL, '--port', '0'], { cwd: root, encoding: 'utf8', timeout: 60000,
      env: { ...process.env, AIP_MODE: 'PREDICTION', AIP_HTTP_PORT: '1', AIP_PREDICT_ROUTE: '/v1/models' } });
    assert(r.status !== 0 && /AIP_PREDICT_ROUTE=\/v1\/models/.test(r.stderr), `refused: ${r.stderr.slice(-300)}`);
  }],
]);
process.exit(failed || (await stopAll([gcp, keyed])) ? 1 : 0);
