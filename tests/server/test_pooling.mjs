// Pooled outputs checked against llama-server itself.
// Embeddings (tests/data/llama_server/embeddings.json): /v1/embeddings,
// llama-server's /embedding and /embeddings shapes, embd_normalize, EOS added
// where the vocabulary asks (as Qwen3-Embedding files do), last and mean
// pooling, on the qwen3-f32 golden made an embedding model; /completion's
// text prompts get that EOS too. Reranking (POST /rerank, /reranking,
// /v1/rerank, /v1/reranking, /v2/rerank; tests/data/llama_server/rerank.json):
// the same golden made a Qwen3-Reranker the way llama.cpp's converter makes
// one (classifier head = the LM head's "yes" and "no" rows, rank pooling, the
// converter's rerank template; and a file without the template, whose prompt
// llama-server lays out itself). The same edits are made here (gguf_edit.py)
// and every recorded request replayed: the same token counts, the same
// order, values within 1e-4. Then what kvllm adds or refuses.
// usage: node test_pooling.mjs BUILD/kvllm REPO_ROOT
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { startServer, rawRequest, assert, assertEq, runTests, stopAll } from './lib.mjs';

const [bin, root] = process.argv.slice(2);
const fixture = JSON.parse(readFileSync(path.join(root, 'tests/data/llama_server/rerank.json'), 'utf8'));
const embFixture = JSON.parse(readFileSync(path.join(root, 'tests/data/llama_server/embeddings.json'), 'utf8'));
const base = path.join(root, 'tests/data/golden/models/qwen3-f32.gguf');
const dir = mkdtempSync(path.join(tmpdir(), 'kvllm-rerank-'));
const files = {};
for (const [name, edits] of [...Object.entries(fixture.models), ...Object.entries(embFixture.models)]) {
  files[name] = path.join(dir, `${name}.gguf`);
  execFileSync('python3', [path.join(root, 'tests/server/gguf_edit.py'), base, files[name], ...edits]);
}
// "my-reranker": the model name one recorded request sends (llama-server echoes any)
const servers = {};
for (const name of Object.keys(files))
  servers[name] = await startServer(bin, ['-m', files[name], '-c', '512', '--kv-type', 'f32',
    '--served-model-name', 'my-reranker', ...(name === 'rerank' ? ['--reranking'] : [])],
  { cwd: root, name });
const plain = await startServer(bin, ['-m', base, '-c', '512', '--kv-type', 'f32'], { cwd: root, name: 'qwen3' });

const post = (srv, p, body) => rawRequest(srv.url, { path: p, body: JSON.stringify(body) });
const results = (json) => (Array.isArray(json) ? json : json.results);
const scoreOf = (e) => e.relevance_score ?? e.score;

// One row a pooled input, whichever shape the answer has.
const embRows = (json) => (Array.isArray(json) ? json.map((e) => e.embedding[0]) : json.data.map((d) => d.embedding));

const tests = Object.entries({
  async 'embeddings: llama-server\'s answers replayed (shapes, token counts, normalisations, EOS)'() {
    let worst = 0;
    for (const c of embFixture.cases) {
      const r = await post(servers[c.model], c.path, c.body);
      const what = `${c.model} ${c.path} ${JSON.stringify(c.body).slice(0, 70)}`;
      assertEq(r.status, c.status, `${what}: status (${r.text.slice(0, 200)})`);
      if (c.path === '/tokenize') {
        assertEq(JSON.stringify(r.json), JSON.stringify(c.response), `${what}: ids (EOS added)`);
        continue;
      }
      if (c.path === '/completion') { /* a prompt tokenized with EOS, as llama's tokenize_mixed */
        for (const k of Object.keys(c.response))
          assertEq(JSON.stringify(r.json[k]), JSON.stringify(c.response[k]), `${what}: ${k}`);
        continue;
      }
      assertEq(Array.isArray(r.json), Array.isArray(c.response), `${what}: llama-server's array or OpenAI's object`);
      if (Array.isArray(c.response)) {
        r.json.forEach((e, i) => assertEq(Object.keys(e).sort().join(), Object.keys(c.response[i]).sort().join(), `${what}: keys`));
      } else {
        assertEq(JSON.stringify(r.json.usage), JSON.stringify(c.response.usage), `${what}: usage (token counts)`);
      }
      const got = embRows(r.json), want = embRows(c.response);
      assertEq(got.length, want.length, `${what}: rows`);
      got.forEach((row, i) => {
        const scale = Math.max(...want[i].map(Math.abs));
        assertEq(row.length, want[i].length, `${what}: width`);
        row.forEach((x, k) => { worst = Math.max(worst, Math.abs(x - want[i][k]) / scale); });
      });
    }
    assert(worst < 1e-4, `worst difference ${worst} of the row's largest value`);
  },

  async 'embeddings: what kvllm refuses'() {
    const refusals = [
      [{ input: 'a', content: 'b' }, 'content'],
      [{ content: 'a', encoding_format: 'base64' }, 'encoding_format'],
      [{ input: 'a', embd_normalize: -2 }, 'embd_normalize'],
      [{ input: 'a', embd_normalize: 'l2' }, 'embd_normalize'],
      [{ content: 7 }, 'content'],
    ];
    for (const [body, param] of refusals) {
      const r = await post(servers.embed, '/embedding', body);
      assertEq(r.status, 400, `${JSON.stringify(body)}: ${r.text.slice(0, 200)}`);
      assertEq(r.json.error.param, param, `${JSON.stringify(body)}: param`);
    }
  },

  async 'llama-server answers replayed: order, token counts, scores, shapes'() {
    let worst = 0;
    for (const c of fixture.cases) {
      const r = await post(servers[c.model], c.path, c.body);
      const what = `${c.model} ${c.path} ${JSON.stringify(c.body).slice(0, 80)}`;
      assertEq(r.status, c.status, `${what}: status (${r.text.slice(0, 200)})`);
      if (c.status !== 200) {
        assert(r.json.error.message.includes(c.body.query === undefined || typeof c.body.query !== 'string'
          ? 'query' : 'documents'), `${what}: ${r.json.error.message}`);
        continue;
      }
      assertEq(Array.isArray(r.json), Array.isArray(c.response), `${what}: TEI's array or Jina's object`);
      if (!Array.isArray(c.response)) {
        assertEq(Object.keys(r.json).sort().join(), Object.keys(c.response).sort().join(), `${what}: keys`);
        assertEq(JSON.stringify(r.json.usage), JSON.stringify(c.response.usage), `${what}: usage (prompt tokens)`);
        assertEq(r.json.object, 'list', `${what}: object`);
        if (c.body.model) assertEq(r.json.model, c.body.model, `${what}: model echoed`);
      }
      const got = results(r.json), want = results(c.response);
      assertEq(got.map((e) => e.index).join(), want.map((e) => e.index).join(), `${what}: order`);
      got.forEach((e, i) => {
        assertEq(Object.keys(e).sort().join(), Object.keys(want[i]).sort().join(), `${what}: result keys`);
        if ('text' in want[i]) assertEq(e.text, want[i].text, `${what}: text`);
        worst = Math.max(worst, Math.abs(scoreOf(e) - scoreOf(want[i])));
      });
    }
    assert(worst < 1e-4, `worst score difference ${worst}`);
  },

  async 'return_documents, documents as {text}, /v2/rerank'() {
    const docs = fixture.cases[0].body.documents;
    const a = await post(servers.rerank, '/v2/rerank', { query: 'Machine learning is', documents: docs, return_documents: true });
    assertEq(a.status, 200, a.text);
    const b = await post(servers.rerank, '/rerank', { query: 'Machine learning is', documents: docs.map((text) => ({ text })) });
    assertEq(b.status, 200, b.text);
    const want = results(fixture.cases[0].response);
    a.json.results.forEach((e, i) => {
      assertEq(e.index, want[i].index, 'order');
      assertEq(e.document.text, docs[e.index], 'the document returned');
      assertEq(e.relevance_score, b.json.results[i].relevance_score, 'strings and {text} score the same');
    });
  },

  async 'vLLM\'s Score API (/score, /v1/score): 1:1, 1:N and N:N pairs score as /rerank does'() {
    const q = 'Machine learning is', docs = fixture.cases[0].body.documents;
    const ranked = await post(servers.rerank, '/rerank', { query: q, documents: docs });
    const want = {};
    for (const e of ranked.json.results) want[e.index] = e.relevance_score;
    const one = await post(servers.rerank, '/v1/score', { model: 'my-reranker', text_1: q, text_2: docs });
    assertEq(one.status, 200, one.text.slice(0, 200));
    assertEq([one.json.object, one.json.model, one.json.data.length], ['list', 'my-reranker', docs.length], 'answer');
    assert(/^score-/.test(one.json.id) && one.json.usage.prompt_tokens === ranked.json.usage.prompt_tokens, 'id, usage');
    one.json.data.forEach((d, i) => {
      assertEq([d.index, d.object], [i, 'score'], 'pair order');
      assertEq(d.score, want[i], `1:N pair ${i}: the /rerank score`);
    });
    const pair = await post(servers.rerank, '/score', { text_1: q, text_2: docs[1] });
    assertEq(pair.json.data.map((d) => d.score), [want[1]], '1:1');
    const nn = await post(servers.rerank, '/score', { text_1: [q, 'Deep learning'], text_2: [docs[0], docs[2]] });
    const second = await post(servers.rerank, '/rerank', { query: 'Deep learning', documents: [docs[2]] });
    assertEq(nn.json.data.map((d) => d.score), [want[0], second.json.results[0].relevance_score], 'N:N, pair by pair');
    for (const [body, param] of [[{ text_1: [q, q], text_2: docs.slice(0, 3) }, 'text_2'], [{ text_2: docs }, 'text_1'],
      [{ text_1: q, text_2: [] }, 'text_2'], [{ text_1: q, text_2: [3] }, 'text_2'],
      [{ text_1: q, text_2: 'a', truncate_prompt_tokens: 4 }, 'truncate_prompt_tokens'], [{ text_1: q, text_2: 'a', queries: ['x'] }, 'queries'], [{ text_1: q, text_2: 'a', encoding_format: 'float' }, 'encoding_format']]) {
      const r = await post(servers.rerank, '/score', body);
      assertEq([r.status, r.json.error.param], [400, param], `${JSON.stringify(body).slice(0, 80)}: ${r.text.slice(0, 200)}`);
    }
    assertEq((await post(plain, '/score', { text_1: q, text_2: 'a' })).status, 501, 'no classifier head');
  },

  async 'bad requests and models that cannot rerank'() {
    const q = 'Machine learning is';
    const refusals = [
      [{ query: q, documents: ['a'], rerank_fields: ['x'] }, 'rerank_fields'],
      [{ query: q, documents: ['a'], top_n: -1 }, 'top_n'],
      [{ query: q, documents: ['a'], top_n: 1.5 }, 'top_n'],
      [{ query: q, documents: ['a'], return_documents: 'yes' }, 'return_documents'],
      [{ query: q, documents: ['a'], texts: ['b'] }, 'texts'],
      [{ query: q, documents: [{ text: 'a', title: 'b' }] }, 'documents'],
      [{ query: q, documents: ['word '.repeat(600)] }, 'documents'],
    ];
    for (const [body, param] of refusals) {
      const r = await post(servers.rerank, '/rerank', body);
      assertEq(r.status, 400, `${JSON.stringify(body).slice(0, 60)}: ${r.text.slice(0, 200)}`);
      assertEq(r.json.error.param, param, `${JSON.stringify(body).slice(0, 60)}: param`);
    }
    const unknown = await post(servers.rerank, '/rerank', { query: q, documents: ['a'], model: 'other' });
    assertEq(unknown.status, 404, 'an unknown model');
    // the plain golden model has no classifier head: /rerank says so, --reranking refuses it
    const r = await post(plain, '/v1/rerank', { query: q, documents: ['a'] });
    assertEq(r.status, 501, r.text);
    assert(r.json.error.message.includes('cls.output.weight'), r.json.error.message);
    const p = spawnSync(bin, ['serve', '--port', '0', '-m', base, '--reranking'], { cwd: root, encoding: 'utf8', timeout: 60000 });
    assert(p.status !== 0 && p.stderr.includes('--reranking') && p.stderr.includes('cls.output.weight'),
      `--reranking on a model without a head: status ${p.status}, ${p.stderr.slice(-300)}`);
  },
});

const failed = await runTests(tests);
const bad = await stopAll([...Object.values(servers), plain]);
rmSync(dir, { recursive: true, force: true });
process.exit(failed || bad ? 1 : 0);
