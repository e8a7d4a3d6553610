// llama-server's resumable streams (its web UI reattaches to an answer after a
// page reload): a streamed request with X-Conversation-Id runs to its end
// after its client leaves, and GET /v1/stream/ID?from=N replays the bytes
// (then the live ones) to whoever asks; POST /v1/streams/lookup lists the
// named conversations' sessions ("ID" or "ID::MODEL"); DELETE /v1/stream/ID
// cancels one. Checked: the replay is byte for byte what the first client got
// and ends as a plain stream of the same greedy request does; a reader
// attached mid-generation gets the rest live; from=N is the suffix; DELETE and
// a second request on the same conversation cancel (finish "abort");
// sessions are per tenant; bad ids, offsets and bodies are 400s, unknown
// sessions 404; a request not streamed keeps none; SIGTERM drains.
// usage: node test_streams.mjs BUILD/kvllm REPO_ROOT
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, rawRequest, metrics, waitMetrics, assert, assertEq, runTests, stopAll } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const MODEL = ['-m', 'models/stories260K.gguf', '-c', '4096'];
const srv = await startServer(bin, [...MODEL, '--cors', '*'], { cwd: root, name: 'streams' });
const dir = mkdtempSync(join(tmpdir(), 'kvllm-streams-'));
const keyFile = join(dir, 'keys.txt');
writeFileSync(keyFile, 'key-alice alice\nkey-bob bob\n');
const keyed = await startServer(bin, [...MODEL, '--api-key-file', keyFile], { cwd: root, name: 'tenants' });
const ALICE = { Authorization: 'Bearer key-alice' }, BOB = { Authorization: 'Bearer key-bob' };

const BODY = { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 1500, temperature: 0, ignore_eos: true, stream: true };
const post = (s, path, body, headers = {}) => rawRequest(s.url, { path, headers, body: JSON.stringify(body) });
const get = (s, path, headers = {}) => rawRequest(s.url, { method: 'GET', path, headers });
const del = (s, path, headers = {}) => rawRequest(s.url, { method: 'DELETE', path, headers });
const lookup = async (s, ids, headers = {}) => {
  const r = await post(s, '/v1/streams/lookup', { conversation_ids: ids }, headers);
  assertEq(r.status, 200, `lookup: ${r.text}`);
  return r.json;
};
// A streamed request left after its first `keep` bytes: what it got.
const leaveAfter = (s, path, body, headers, keep = 1500) => new Promise((resolve, reject) => {
  const u = new URL(path, s.url);
  let got = Buffer.alloc(0);
  const req = fetch(u, { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body: JSON.stringify(body) })
    .then(async (res) => {
      if (res.status !== 200) return resolve({ status: res.status, text: await res.text() });
      const rd = res.body.getReader();
      while (got.length < keep) {
        const { value, done } = await rd.read();
        if (done) break;
        got = Buffer.concat([got, Buffer.from(value)]);
      }
      await rd.cancel(); // leaves: the connection closes
      resolve({ status: 200, bytes: got });
    }, reject);
  return req;
});
// A GET of a stream read as it comes: returned once its first bytes are in (the
// reader is attached to the session, not still on its way), done at its end.
const attach = async (s, path) => {
  const res = await fetch(new URL(path, s.url));
  const rd = res.body.getReader();
  const chunks = [];
  const first = await rd.read();
  if (first.value) chunks.push(Buffer.from(first.value));
  const done = (async () => {
    let error = null;
    try {
      for (;;) {
        const { value, done: end } = await rd.read();
        if (end) break;
        chunks.push(Buffer.from(value));
      }
    } catch (e) {
      error = e; // a connection cut by the server's end
    }
    return { status: res.status, text: Buffer.concat(chunks).toString(), error };
  })();
  return { status: res.status, done };
};
// The generated text of an SSE completion stream, and whether it ended with [DONE].
const sseText = (text) => {
  let out = '', done = false, finish = null;
  for (const ev of text.split('\n\n')) {
    if (ev === 'data: [DONE]') done = true;
    else if (ev.startsWith('data: {')) {
      const j = JSON.parse(ev.slice(6));
      out += j.choices?.[0]?.text ?? j.choices?.[0]?.delta?.content ?? '';
      finish = j.choices?.[0]?.finish_reason ?? finish;
    }
  }
  return { out, done, finish };
};
const finishes = async (s, reason, headers) =>
  [...(await metrics(s.url, headers && 'key-alice')).entries()]
    .filter(([k]) => k.startsWith('kvllm:request_success_total{') && k.includes(`"${reason}"`))
    .reduce((a, [, v]) => a + v, 0);
const idle = (m) => m.get('kvllm:num_requests_running') === 0;

const failed = await runTests([
  ['a client that leaves: the generation runs on; GET from=0 replays every byte, ending as a plain stream', async () => {
    const plain = await post(srv, '/v1/completions', BODY);
    const want = sseText(plain.text);
    assert(want.done && want.finish === 'length', `the plain stream ends with length and [DONE] (${want.finish})`);
    const lengthBefore = await finishes(srv, 'length'), abortBefore = await finishes(srv, 'abort');
    const first = await leaveAfter(srv, '/v1/completions', BODY, { 'X-Conversation-Id': 'conv-a::stories260K' });
    assertEq(first.status, 200, 'streamed');
    const live = await lookup(srv, ['conv-a']);
    assertEq(live.length, 1, 'the session is listed under its conversation id');
    assertEq(live[0].conversation_id, 'conv-a::stories260K', 'its full id');
    assert(live[0].total_bytes >= first.bytes.length, `total_bytes ${live[0].total_bytes} counts what was sent`);
    assert(live[0].started_at > 1.7e9 && live[0].completed_at === (live[0].is_done ? live[0].completed_at : 0),
      `started_at / completed_at: ${JSON.stringify(live[0])}`);
    const replay = await get(srv, '/v1/stream/conv-a%3A%3Astories260K?from=0');
    assertEq(replay.status, 200, replay.text.slice(0, 200));
    assert(replay.headers['content-type'].startsWith('text/event-stream'), 'an event stream');
    const bytes = Buffer.from(replay.text);
    assert(bytes.subarray(0, first.bytes.length).equals(first.bytes), 'the replay starts with what the first client got');
    const got = sseText(replay.text);
    assert(got.done && got.finish === 'length', `ran to its end (finish ${got.finish}, [DONE] ${got.done})`);
    assertEq(got.out, want.out, 'the same text as the plain stream');
    const m = await waitMetrics(srv.url, (x) => idle(x));
    assert(idle(m), 'nothing runs');
    assertEq(await finishes(srv, 'length'), lengthBefore + 1, 'finished by length, not cancelled');
    assertEq(await finishes(srv, 'abort'), abortBefore, 'no abort');
    const done = await lookup(srv, ['conv-a']);
    assert(done[0].is_done && done[0].completed_at >= done[0].started_at, `done: ${JSON.stringify(done[0])}`);
    assertEq(done[0].total_bytes, bytes.length, 'total_bytes = the bytes replayed');
    // from=N: the suffix; past the end of a finished session: nothing
    const tail = await get(srv, `/v1/stream/conv-a::stories260K?from=${bytes.length - 100}`);
    assertEq(tail.text, bytes.subarray(bytes.length - 100).toString(), 'from=N is the bytes from N on');
    const past = await get(srv, `/v1/stream/conv-a::stories260K?from=${bytes.length + 5}`);
    assertEq([past.status, past.text], [200, ''], 'from past the end of a finished stream: empty');
  }],
  ['a reader attached mid-generation gets the rest live; chat completions too', async () => {
    const body = { model: 'stories260K', messages: [{ role: 'user', content: 'Tell a story' }], max_tokens: 1500,
      temperature: 0, ignore_eos: true, stream: true };
    const first = await leaveAfter(srv, '/v1/chat/completions', body, { 'X-Conversation-Id': 'chat-b' }, 600);
    assertEq(first.status, 200, 'streamed');
    const now = await lookup(srv, ['chat-b']);
    const replay = await get(srv, `/v1/stream/chat-b?from=${first.bytes.length}`);
    const whole = await get(srv, '/v1/stream/chat-b');
    assert(now.length === 1 && !now[0].is_done, `still running when looked up (${JSON.stringify(now)}): the reader waited for live bytes`);
    assertEq(first.bytes.toString() + replay.text, whole.text, 'what was sent + the rest = the session');
    const got = sseText(whole.text);
    assert(got.done && got.finish === 'length', `ended (finish ${got.finish})`);
  }],
  ['DELETE cancels the generation (abort); readers end; the session is gone; DELETE again: 204', async () => {
    await waitMetrics(srv.url, idle);
    const abortBefore = await finishes(srv, 'abort');
    const first = await leaveAfter(srv, '/v1/completions', { ...BODY, max_tokens: 4000 }, { 'X-Conversation-Id': 'conv-del' }, 300);
    assertEq(first.status, 200, 'streamed');
    const reader = await attach(srv, '/v1/stream/conv-del');
    const d = await del(srv, '/v1/stream/conv-del');
    assertEq([d.status, d.text], [204, ''], 'DELETE');
    const r = await reader.done;
    assertEq([r.status, r.error], [200, null], 'the reader ended');
    assert(!sseText(r.text).done, 'without [DONE]: cut short');
    await waitMetrics(srv.url, (m) => idle(m));
    assertEq(await finishes(srv, 'abort'), abortBefore + 1, 'the generation was cancelled');
    assertEq((await get(srv, '/v1/stream/conv-del')).status, 404, 'gone');
    assertEq(await lookup(srv, ['conv-del']), [], 'not listed');
    assertEq((await del(srv, '/v1/stream/conv-del')).status, 204, 'idempotent');
  }],
  ['a new request on the same conversation cancels the running one', async () => {
    await waitMetrics(srv.url, idle);
    const abortBefore = await finishes(srv, 'abort');
    const a = await leaveAfter(srv, '/v1/completions', { ...BODY, max_tokens: 4000 }, { 'X-Conversation-Id': 'conv-r' }, 300);
    const b = await post(srv, '/v1/completions', { ...BODY, max_tokens: 20 }, { 'X-Conversation-Id': 'conv-r' });
    assertEq([a.status, b.status], [200, 200], 'both streamed');
    const got = sseText(b.text);
    assert(got.done && got.finish === 'length', 'the second ran to its end');
    await waitMetrics(srv.url, idle);
    assertEq(await finishes(srv, 'abort'), abortBefore + 1, 'the first was cancelled');
    const l = await lookup(srv, ['conv-r']);
    assert(l.length === 1 && l[0].is_done, `one session, the second's: ${JSON.stringify(l)}`);
    assertEq((await get(srv, '/v1/stream/conv-r')).text, b.text, 'the session holds the second answer');
  }],
  ['lookup matches the id and ID::MODEL only; bad bodies and ids are 400s; unknown sessions 404', async () => {
    await post(srv, '/v1/completions', { ...BODY, max_tokens: 2 }, { 'X-Conversation-Id': 'x1' });
    await post(srv, '/v1/completions', { ...BODY, max_tokens: 2 }, { 'X-Conversation-Id': 'x1::m2' });
    await post(srv, '/v1/completions', { ...BODY, max_tokens: 2 }, { 'X-Conversation-Id': 'x12' });
    assertEq((await lookup(srv, ['x1'])).map((e) => e.conversation_id).sort(), ['x1', 'x1::m2'], 'x1 and x1::m2, not x12');
    assertEq(await lookup(srv, [5, '', 'nothing']), [], 'non-strings and unknown ids: nothing');
    assertEq((await post(srv, '/v1/streams/lookup', {})).json, [], 'no ids: an empty list');
    assertEq((await rawRequest(srv.url, { path: '/v1/streams/lookup', body: '{' })).status, 400, 'bad JSON');
    assertEq((await post(srv, '/v1/streams/lookup', { conversation_ids: 'x1' })).status, 400, 'not an array');
    assertEq((await get(srv, '/v1/stream/x1?from=-1')).status, 400, 'a negative offset');
    assertEq((await get(srv, '/v1/stream/x1?from=1e3')).status, 400, 'not a byte count');
    const nf = await get(srv, '/v1/stream/never');
    assertEq([nf.status, nf.json?.error?.type], [404, 'not_found_error'], 'unknown');
    const long = await post(srv, '/v1/completions', { ...BODY, max_tokens: 2 }, { 'X-Conversation-Id': 'a'.repeat(1025) });
    assertEq(long.status, 400, `an id over 1024 bytes: ${long.text}`);
    const plain = await post(srv, '/v1/completions', { ...BODY, max_tokens: 2, stream: false }, { 'X-Conversation-Id': 'np' });
    assertEq(plain.status, 200, 'an answer not streamed');
    assertEq(await lookup(srv, ['np']), [], 'keeps no session (nothing is streamed)');
    const pre = await rawRequest(srv.url, { method: 'OPTIONS', path: '/v1/chat/completions',
      headers: { Origin: 'https://ui.example', 'Access-Control-Request-Method': 'POST' } });
    assert(/X-Conversation-Id/i.test(pre.headers['access-control-allow-headers'] || ''), 'CORS preflight allows the header');
  }],
  ['a session keeps its last 3-4 MiB: an offset already dropped is a 400, a later one the bytes from there', async () => {
    const body = { model: 'stories260K', messages: [{ role: 'user', content: 'Once' }], max_tokens: 3500,
      temperature: 0, ignore_eos: true, stream: true, logprobs: true, top_logprobs: 20 };
    const whole = await post(srv, '/v1/chat/completions', body, { 'X-Conversation-Id': 'big' });
    const bytes = Buffer.from(whole.text);
    assert(whole.status === 200 && bytes.length > 4.5e6 && sseText(whole.text).done, `a ${bytes.length}-byte stream, whole`);
    assertEq((await lookup(srv, ['big']))[0].total_bytes, bytes.length, 'total_bytes counts the dropped ones too');
    const lost = await get(srv, '/v1/stream/big?from=0');
    assert(lost.status === 400 && /offset lost/.test(lost.text), `from=0: 400 (${lost.status} ${lost.text.slice(0, 200)})`);
    const from = bytes.length - 3 * 1024 * 1024;
    const tail = await get(srv, `/v1/stream/big?from=${from}`);
    assert(tail.status === 200 && tail.text === bytes.subarray(from).toString(), 'the last 3 MiB, byte for byte');
  }],
  ['sessions are the tenant\'s own', async () => {
    const a = await leaveAfter(keyed, '/v1/completions', { ...BODY, max_tokens: 1500 }, { ...ALICE, 'X-Conversation-Id': 'mine' }, 300);
    assertEq(a.status, 200, 'alice streams');
    assertEq(await lookup(keyed, ['mine'], BOB), [], 'bob does not see it');
    assertEq((await get(keyed, '/v1/stream/mine', BOB)).status, 404, 'bob cannot read it');
    assertEq((await del(keyed, '/v1/stream/mine', BOB)).status, 204, 'bob\'s DELETE is a no-op');
    assertEq((await lookup(keyed, ['mine'], ALICE)).length, 1, 'alice sees it');
    assertEq((await get(keyed, '/v1/stream/mine')).status, 401, 'no key: 401');
    const r = await get(keyed, '/v1/stream/mine', ALICE);
    assert(sseText(r.text).done, 'alice reads it to its end: bob\'s DELETE cancelled nothing');
  }],
  ['SIGTERM with a session still generating for nobody: cancelled at the timeout, exits 0', async () => {
    const s = await startServer(bin, ['-m', 'models/stories260K.gguf', '-c', '32768', '--shutdown-timeout', '1'],
      { cwd: root, name: 'drain' });
    const a = await leaveAfter(s, '/v1/completions', { ...BODY, max_tokens: 32000 }, { 'X-Conversation-Id': 'bye' }, 300);
    assertEq(a.status, 200, 'streamed');
    const reader = await attach(s, '/v1/stream/bye');
    assertEq(await s.stop(), 0, `exit code (log:\n${s.log().slice(-600)})`);
    const r = await reader.done;
    assertEq(r.status, 200, 'the reader ended with the server');
    assert(/shutdown timeout/.test(s.log()), 'the drain waited for it, then cancelled it');
  }],
]);
rmSync(dir, { recursive: true, force: true });
process.exit(failed || (await stopAll([srv, keyed])) ? 1 : 0);
