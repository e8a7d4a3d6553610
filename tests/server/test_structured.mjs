// Structured output through the official OpenAI client on random-weight
// models at temperature 1: whatever the weights, every output must parse and
// validate. JSON Schema outputs are checked by an independent validator,
// Python's jsonschema (Debian's python3-jsonschema), regex outputs by
// JavaScript's RegExp, GBNF outputs by an equivalent RegExp; and every bad
// constraint is a 400 that names its field.
// usage: node test_structured.mjs BUILD/kvllm REPO_ROOT
import OpenAI from 'openai';
import { execFileSync } from 'node:child_process';
import { startServer, rawRequest, metrics, waitMetrics, assert, assertEq, runTests } from './lib.mjs';

const [bin, root] = process.argv.slice(2);

try {
  execFileSync('python3', ['-c', 'import jsonschema'], { stdio: 'ignore' });
} catch {
  console.log('SKIP: python3 with jsonschema is not installed (make deps installs python3-jsonschema)');
  process.exit(77);
}

// Validates [{schema, instance}] with jsonschema's validator for the schema's
// draft (2020-12 by default) and its format checker; returns the error messages.
function validateAll(cases) {
  const py = `
import json, sys, jsonschema
out = []
for c in json.load(sys.stdin):
    cls = jsonschema.validators.validator_for(c["schema"], default=jsonschema.Draft202012Validator)
    cls.check_schema(c["schema"])
    v = cls(c["schema"], format_checker=cls.FORMAT_CHECKER)
    out.append([e.message for e in v.iter_errors(c["instance"])])
print(json.dumps(out))
`;
  return JSON.parse(execFileSync('python3', ['-c', py], { input: JSON.stringify(cases) }).toString());
}

const SCHEMAS = {
  person: {
    type: 'object',
    properties: { name: { type: 'string', minLength: 1, maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 150 },
      nickname: { type: ['string', 'null'], maxLength: 6 } },
    required: ['name', 'age'], additionalProperties: false,
  },
  nested: {
    type: 'object',
    properties: {
      address: { type: 'object', properties: { street: { type: 'string', maxLength: 16 }, zip: { type: 'string', pattern: '^[0-9]{5}$' } },
        required: ['street', 'zip'], additionalProperties: false },
      verified: { type: 'boolean' },
    },
    required: ['address', 'verified'], additionalProperties: false,
  },
  colors: { type: 'array', items: { enum: ['red', 'green', 'blue'] }, minItems: 1, maxItems: 4 },
  numbers: {
    type: 'object',
    properties: { x: { type: 'number' }, n: { type: 'integer', minimum: -5, maximum: 5 }, big: { type: 'integer', exclusiveMinimum: 1000 },
      ratio: { type: 'number', minimum: 0 } },
    required: ['x', 'n', 'big', 'ratio'], additionalProperties: false,
  },
  union: { anyOf: [{ type: 'integer' }, { type: 'string', maxLength: 5 }, { type: 'null' }, { type: 'array', items: { type: 'boolean' }, maxItems: 2 }] },
  tree: {
    $defs: {
      node: { type: 'object', properties: { v: { type: 'integer', minimum: -9, maximum: 9 }, kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 1 } },
        required: ['v', 'kids'], additionalProperties: false },
    },
    $ref: '#/$defs/node',
  },
  codes: {
    type: 'object',
    properties: { code: { type: 'string', pattern: '^[A-Z]{3}-\\d{2,4}$' }, day: { type: 'string', format: 'date' },
      id: { type: 'string', format: 'uuid' }, at: { type: 'string', format: 'date-time' }, mail: { type: 'string', format: 'email' },
      ip: { type: 'string', format: 'ipv4' } },
    required: ['code', 'day', 'id', 'at', 'mail', 'ip'], additionalProperties: false,
  },
  tuple: { type: 'array', prefixItems: [{ type: 'string', maxLength: 3 }, { type: 'integer' }, { enum: [true, 'x'] }], items: false, minItems: 2 },
  tagged: {
    type: 'object',
    properties: { kind: { const: 'event' }, level: { enum: [1, 2, 3, 'high', null] }, note: { type: 'string', maxLength: 4 } },
    required: ['kind', 'level'], additionalProperties: false,
  },
  merged: {
    allOf: [
      { type: 'object', properties: { a: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['a'] },
      { type: 'object', properties: { b: { enum: ['x', 'y'] } }, required: ['b'] },
    ],
  },
  definitions: {
    definitions: { flag: { type: 'boolean' } },
    type: 'object', properties: { on: { $ref: '#/definitions/flag' }, off: { $ref: '#/definitions/flag' } }, required: ['on'],
    additionalProperties: false,
  },
};
const SEEDS = [1, 2, 3];

function startModel(model, name) {
  return startServer(bin, ['-m', model, '-c', '1024'], { cwd: root, name });
}
const tiny = await startModel('tests/data/llama-2-tiny-random.gguf', 'tiny');
const stories = await startModel('models/stories260K.gguf', 'stories');
const clientOf = (s) => new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
const tinyClient = clientOf(tiny), storiesClient = clientOf(stories);
const TINY = 'llama-2-tiny-random', STORIES = 'stories260K';

// Every output must have ended by itself (the grammar's end), parse, and validate.
async function checkSchemaOutputs(results) {
  const cases = [];
  for (const { name, text, finish, schema } of results) {
    assertEq(finish, 'stop', `${name}: finish_reason (output ${JSON.stringify(text).slice(0, 300)})`);
    let v;
    try {
      v = JSON.parse(text);
    } catch (e) {
      throw new Error(`${name}: output is not JSON: ${JSON.stringify(text)}`);
    }
    cases.push({ name, schema, instance: v, text });
  }
  const errs = validateAll(cases.map(({ schema, instance }) => ({ schema, instance })));
  errs.forEach((e, i) => assert(e.length === 0, `${cases[i].name}: ${JSON.stringify(cases[i].text)} does not validate: ${e.join('; ')}`));
  // date-time is not checked by jsonschema without extra packages: check it here
  for (const c of cases)
    if (c.instance && typeof c.instance.at === 'string')
      assert(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/.test(c.instance.at) && !isNaN(Date.parse(c.instance.at)),
        `${c.name}: date-time ${c.instance.at}`);
  return cases;
}

const tests = [
  ['json_schema on completions: every schema x seeds, tiny llama', async () => {
    const jobs = [];
    for (const [name, schema] of Object.entries(SCHEMAS))
      for (const seed of SEEDS)
        jobs.push(tinyClient.completions.create({
          model: TINY, prompt: 'Answer in JSON:', max_tokens: 600, temperature: 1, seed,
          response_format: { type: 'json_schema', json_schema: { name, schema, strict: true } },
        }).then((r) => ({ name: `${name}/seed ${seed}`, text: r.choices[0].text, finish: r.choices[0].finish_reason, schema })));
    const cases = await checkSchemaOutputs(await Promise.all(jobs));
    assertEq(cases.length, Object.keys(SCHEMAS).length * SEEDS.length, 'outputs');
    // temperature 1 with different seeds: not all outputs of a schema are the same
    const distinct = new Set(cases.filter((c) => c.name.startsWith('person/')).map((c) => c.text));
    assert(distinct.size > 1, 'seeds give different outputs');
  }],

  ['json_schema on chat (and the llama-server/vLLM spellings), stories260K', async () => {
    const jobs = [];
    const names = Object.keys(SCHEMAS);
    names.forEach((name, i) => {
      const schema = SCHEMAS[name];
      for (const seed of SEEDS) {
        const spelling = (i + seed) % 3;
        const extra = spelling === 0 ? { response_format: { type: 'json_schema', json_schema: { name, schema } } }
          : spelling === 1 ? { json_schema: schema } : { guided_json: JSON.stringify(schema) };
        jobs.push(storiesClient.chat.completions.create({
          model: STORIES, messages: [{ role: 'user', content: 'Give me JSON.' }], max_tokens: 800, temperature: 1, seed, ...extra,
        }).then((r) => ({ name: `${name}/seed ${seed}/spelling ${spelling}`, text: r.choices[0].message.content,
          finish: r.choices[0].finish_reason, schema })));
      }
    });
    await checkSchemaOutputs(await Promise.all(jobs));
  }],

  ['json_object: any JSON object; streamed the same', async () => {
    for (const seed of SEEDS) {
      const r = await tinyClient.chat.completions.create({
        model: TINY, messages: [{ role: 'user', content: 'JSON please' }], max_tokens: 800, temperature: 1, seed, top_k: 8,
        response_format: { type: 'json_object' },
      });
      const c = r.choices[0];
      // an unconstrained object may nest deeply: if it ran out of tokens, it is still a valid prefix
      if (c.finish_reason === 'stop') {
        const v = JSON.parse(c.message.content);
        assert(v && typeof v === 'object' && !Array.isArray(v), `an object: ${c.message.content}`);
      } else {
        assertEq(c.finish_reason, 'length', 'finish_reason');
        assert(c.message.content.startsWith('{'), `starts an object: ${c.message.content.slice(0, 50)}`);
      }
    }
    const stream = await tinyClient.completions.create({
      model: TINY, prompt: 'x', max_tokens: 600, temperature: 1, seed: 7, stream: true,
      response_format: { type: 'json_schema', json_schema: { name: 'p', schema: SCHEMAS.person } },
    });
    let text = '', finish = null;
    for await (const ch of stream) {
      text += ch.choices[0]?.text ?? '';
      finish = ch.choices[0]?.finish_reason ?? finish;
    }
    await checkSchemaOutputs([{ name: 'streamed person', text, finish, schema: SCHEMAS.person }]);
  }],

  ['guided_choice, guided_regex, GBNF grammar', async () => {
    const choices = ['yes', 'no', 'maybe not', 'ça va'];
    const regex = '(ab|cd)[0-9]{2,3}-[a-z]{1,8}x?';
    const gbnf = 'root ::= "[" item ("," item){0,3} "]"\nitem ::= [a-z]{1,4} | "\\"" [0-9]{1,6} "\\""  # words or quoted numbers\n';
    const gbnfRe = /^\[([a-z]{1,4}|"[0-9]{1,6}")(,([a-z]{1,4}|"[0-9]{1,6}")){0,3}\]$/;
    for (const seed of [1, 2, 3, 4, 5]) {
      const [a, b, c] = await Promise.all([
        tinyClient.completions.create({ model: TINY, prompt: 'Pick:', max_tokens: 40, temperature: 1, seed, guided_choice: choices }),
        tinyClient.completions.create({ model: TINY, prompt: 'Code:', max_tokens: 200, temperature: 1, seed, guided_regex: regex }),
        storiesClient.completions.create({ model: STORIES, prompt: 'List:', max_tokens: 200, temperature: 1, seed, grammar: gbnf }),
      ]);
      assert(choices.includes(a.choices[0].text), `guided_choice gave ${JSON.stringify(a.choices[0].text)}`);
      assertEq(a.choices[0].finish_reason, 'stop', 'choice finish');
      assert(new RegExp(`^(?:${regex})$`).test(b.choices[0].text), `guided_regex gave ${JSON.stringify(b.choices[0].text)}`);
      assertEq(b.choices[0].finish_reason, 'stop', 'regex finish');
      assert(gbnfRe.test(c.choices[0].text), `grammar gave ${JSON.stringify(c.choices[0].text)}`);
    }
    const g = await storiesClient.completions.create({ model: STORIES, prompt: 'x', max_tokens: 200, temperature: 1, seed: 9, guided_grammar: gbnf });
    assert(gbnfRe.test(g.choices[0].text), `guided_grammar gave ${JSON.stringify(g.choices[0].text)}`);
    // greedy decoding is constrained too, and a max_tokens cut still says length
    const greedy = await tinyClient.completions.create({ model: TINY, prompt: 'Pick:', max_tokens: 40, temperature: 0, guided_choice: choices });
    assert(choices.includes(greedy.choices[0].text), `greedy guided_choice gave ${greedy.choices[0].text}`);
    const cut = await tinyClient.completions.create({ model: TINY, prompt: 'x', max_tokens: 2, temperature: 1, seed: 3,
      grammar: 'root ::= "a"{10}' });
    assertEq(cut.choices[0].finish_reason, 'length', 'cut by max_tokens');
    assert(/^a+$/.test(cut.choices[0].text), `cut output ${cut.choices[0].text}`);
    // 5,000 choices or enum values: a tree by common prefix, within the
    // matcher's 4,096 parse stacks (one alternative each was a 400)
    const many = Array.from({ length: 5000 }, (_, i) => `item-${i * 7}`);
    for (const extra of [{ guided_choice: many }, { json_schema: { enum: many } }]) {
      const big = await tinyClient.completions.create({ model: TINY, prompt: 'Pick:', max_tokens: 40, temperature: 1, seed: 5, ...extra });
      const text = extra.json_schema ? JSON.parse(big.choices[0].text) : big.choices[0].text;
      assert(many.includes(text), `${Object.keys(extra)[0]} of 5,000 gave ${big.choices[0].text}`);
      assertEq(big.choices[0].finish_reason, 'stop', 'finish');
    }
    // a 100,000-character property name beside additional properties: the
    // translator recursed per character and the server died
    const long = { type: 'object', properties: { ['k'.repeat(100000)]: { type: 'integer' } }, additionalProperties: { type: 'string' } };
    const lr = await rawRequest(tiny.url, { body: JSON.stringify({ prompt: 'x', max_tokens: 3, json_schema: long }) });
    assertEq(lr.status, 200, lr.text.slice(0, 200));
    assert(lr.json.choices[0].text.startsWith('{'), lr.json.choices[0].text);
  }],

  ['n > 1 and logprobs under a grammar', async () => {
    const r = await tinyClient.completions.create({ model: TINY, prompt: 'Pick:', max_tokens: 30, temperature: 1, seed: 11, n: 4,
      logprobs: 1, guided_choice: ['alpha', 'beta'] });
    for (const c of r.choices) {
      assert(['alpha', 'beta'].includes(c.text), `choice ${c.index}: ${c.text}`);
      // reported logprobs are those of the unconstrained distribution: finite and <= 0
      for (const lp of c.logprobs.token_logprobs) assert(Number.isFinite(lp) && lp <= 0, `logprob ${lp}`);
    }
  }],

  ['400 for bad constraints, naming the field', async () => {
    const bad = [
      [{ grammar: 'root ::= undefined-rule' }, 'grammar', /undefined rule 'undefined-rule'/],
      [{ grammar: 'root ::= "a" |\n  "b" [z-a]' }, 'grammar', /line 2, column \d+: range end/],
      [{ guided_grammar: 'root ::= root "x"' }, 'guided_grammar', /left recursion/],
      // 100,000 nested groups overflowed the parser's stack: the server died
      [{ grammar: `root ::= ${'('.repeat(100000)}"a"${')'.repeat(100000)}` }, 'grammar', /groups nested more than 1024 deep/],
      [{ guided_regex: '(a)\\1' }, 'guided_regex', /backreferences/],
      [{ guided_regex: '(?<=a)b' }, 'guided_regex', /lookaround/],
      [{ json_schema: { type: 'string', format: 'uri' } }, 'json_schema', /format 'uri' is not supported/],
      [{ guided_json: '{"type": "object", ' }, 'guided_json', /not valid JSON/],
      [{ json_schema: { anyOf: [{ type: 'null' }, { type: 'null' }, { $ref: '#' }] } }, 'json_schema',
        /JSON schema at #\/anyOf\/2: recursion without consuming input: #\/anyOf\/2 -> #/],
      [{ guided_json: { type: 'object', properties: { a: { type: 'string', pattern: 'x\\by' } } } }, 'guided_json', /word boundaries/],
      [{ response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'array', uniqueItems: true } } } },
        'response_format.json_schema.schema', /uniqueItems/],
      [{ response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'object', patternProperties: { '^a': {} } } } } },
        'response_format.json_schema.schema', /unsupported JSON Schema keyword 'patternProperties'/],
      [{ response_format: { type: 'yaml' } }, 'response_format.type', /must be "text", "json_object" or "json_schema"/],
      [{ response_format: { type: 'json_schema' } }, 'response_format.json_schema', /must be an object/],
      [{ guided_choice: 'yes' }, 'guided_choice', /array of strings/],
      [{ guided_choice: [] }, 'guided_choice', /array of strings/],
      [{ grammar: 'root ::= "a"', guided_choice: ['a'] }, 'guided_choice', /'grammar' and 'guided_choice' both constrain/],
      [{ response_format: { type: 'json_object' }, json_schema: { type: 'integer' } }, 'json_schema', /both constrain/],
    ];
    for (const [extra, param, re] of bad) {
      for (const path of ['/v1/completions', '/v1/chat/completions']) {
        const body = path.includes('chat') ? { messages: [{ role: 'user', content: 'x' }], ...extra } : { prompt: 'x', ...extra };
        const r = await rawRequest(tiny.url, { path, body: JSON.stringify(body) });
        assertEq(r.status, 400, `${JSON.stringify(extra)} on ${path}: ${r.text.slice(0, 200)}`);
        assertEq(r.json.error.param, param, `param of ${JSON.stringify(extra)}`);
        assert(re.test(r.json.error.message), `message of ${JSON.stringify(extra)}: ${r.json.error.message}`);
      }
    }
    // response_format text is no constraint, and may come with another field
    const ok = await rawRequest(tiny.url, { body: JSON.stringify({ prompt: 'x', max_tokens: 20, response_format: { type: 'text' },
      guided_choice: ['ok'] }) });
    assertEq(ok.status, 200, ok.text);
    assertEq(ok.json.choices[0].text, 'ok', 'text + guided_choice');
  }],
  ['a grammar past the matcher\'s bounds: a 400 when compiled, else an error at the step (never a silent refusal)', async () => {
    // its start nests 5,000 rules entered without input: over the depth bound
    let chain = 'root ::= r0\n';
    for (let i = 0; i < 5000; i++) chain += `r${i} ::= r${i + 1}\n`;
    chain += 'r5000 ::= "z"\n';
    const c = await rawRequest(tiny.url, { body: JSON.stringify({ prompt: 'x', max_tokens: 4, grammar: chain }) });
    assertEq(c.status, 400, c.text.slice(0, 200));
    assertEq(c.json.error.param, 'grammar');
    assert(/nests more than 4096 rules/.test(c.json.error.message), c.json.error.message);
    // r owes one of two letters per character read: 3 * 2^n parse stacks after
    // n bytes, past 4,096 by the 11th byte whatever the model picks
    const amb = 'root ::= r\nr ::= [^\\x00] r [a-m] | [^\\x00] r [n-z]\n';
    const body = { prompt: 'x', max_tokens: 64, temperature: 0, grammar: amb };
    const r = await rawRequest(tiny.url, { body: JSON.stringify(body) });
    assertEq(r.status, 400, r.text.slice(0, 300));
    assert(/grammar too ambiguous: more than 4096 parse stacks/.test(r.json.error.message), r.json.error.message);
    const st = await rawRequest(tiny.url, { body: JSON.stringify({ ...body, stream: true }) });
    assertEq(st.status, 200);
    assert(st.text.includes('"finish_reason":"error"'), st.text.slice(-600));
    assert(/data: \{"error":\{"message":"grammar too ambiguous: more than 4096 parse stacks/.test(st.text), st.text.slice(-600));
    assert(st.text.trimEnd().endsWith('data: [DONE]'), st.text.slice(-200));
    // the server goes on: a plain request right after
    const ok = await rawRequest(tiny.url, { body: JSON.stringify({ prompt: 'x', max_tokens: 3, grammar: 'root ::= "abc"' }) });
    assertEq(ok.status, 200, ok.text);
  }],
  ['n > 1: a choice past the matcher\'s bounds cancels its siblings at the next step (400; streamed: error + abort)', async () => {
    // A choice whose first letter is a-m goes on with 24 letters, then r, past
    // 4,096 parse stacks by r's 12th byte (the 24 letters keep r out of reach
    // of the first steps' token masks, which look a whole token ahead: without
    // them every choice fails at once); one that starts with n-z enters f,
    // which never ends: left alone it would run to max_tokens. Which choices
    // go which way depends on the seed (temperature 1, seed + i per choice):
    // seeds are tried until a request has both kinds.
    const grammar = 'root ::= [a-m] [a-z]{24} r | [n-z] f\nr ::= [^\\x00] r [a-m] | [^\\x00] r [n-z]\nf ::= [a-z ] f\n';
    const N = 8, MAX = 300;
    const body = { prompt: 'x', n: N, max_tokens: MAX, temperature: 1, grammar };
    const count = (m, reason) => {
      for (const [k, v] of m) if (k.startsWith('kvllm:request_success_total{') && k.includes(`"${reason}"`)) return v;
      return 0;
    };
    const idle = (m) => m.get('kvllm:num_requests_running') === 0 && m.get('kvllm:num_requests_waiting') === 0;
    let streamed = false, answered = false;
    for (let seed = 1; seed <= 12 && !(streamed && answered); seed++) {
      const m0 = await waitMetrics(tiny.url, idle);
      if (!streamed) {
        const st = await rawRequest(tiny.url, { body: JSON.stringify({ ...body, seed, stream: true }) });
        assertEq(st.status, 200);
        const finish = new Array(N).fill(null), tokens = new Array(N).fill(0);
        let errorEvent = null;
        for (const line of st.text.split('\n')) {
          if (!line.startsWith('data: {')) continue;
          const ev = JSON.parse(line.slice(6));
          if (ev.error) errorEvent = ev.error;
          for (const c of ev.choices ?? []) {
            if (c.text) tokens[c.index]++;
            if (c.finish_reason) finish[c.index] = c.finish_reason;
          }
        }
        const failedN = finish.filter((f) => f === 'error').length;
        if (failedN > 0 && failedN < N) {
          streamed = true;
          console.log(`  seed ${seed}, streamed: finish ${finish.join(' ')}; tokens ${tokens.join(' ')}`);
          assert(/grammar too ambiguous: more than 4096 parse stacks/.test(errorEvent?.message), st.text.slice(-400));
          assert(st.text.trimEnd().endsWith('data: [DONE]'), st.text.slice(-200));
          const lastError = Math.max(...tokens.filter((_, i) => finish[i] === 'error'));
          finish.forEach((f, i) => {
            // a sibling ends as abort a step after the error (or by then ended
            // by itself: f never ends, so not here)
            if (f !== 'error') assertEq(f, 'abort', `choice ${i} (tokens ${tokens.join(' ')})`);
            assert(tokens[i] <= lastError + 2, `choice ${i}: ${tokens[i]} tokens, the failing ones ${lastError} at most`);
          });
        }
      } else {
        const r = await rawRequest(tiny.url, { body: JSON.stringify({ ...body, seed }) });
        const m1 = await waitMetrics(tiny.url, idle);
        const dAbort = count(m1, 'abort') - count(m0, 'abort'), dLength = count(m1, 'length') - count(m0, 'length');
        if (dAbort + dLength === 0) continue; // every choice failed: nothing to cancel
        answered = true;
        const gen = m1.get('kvllm:generation_tokens_total') - m0.get('kvllm:generation_tokens_total');
        console.log(`  seed ${seed}, non-streaming: ${dAbort} aborted, ${dLength} ran to max_tokens, ${gen} tokens in all`);
        assertEq(r.status, 400, r.text.slice(0, 300));
        assert(/grammar too ambiguous: more than 4096 parse stacks/.test(r.json.error.message), r.json.error.message);
        assertEq(dLength, 0, 'no sibling ran to max_tokens');
        assert(gen < MAX, `${gen} tokens generated for the request (one sibling left alone: ${MAX})`);
        const back = await waitMetrics(tiny.url, (m) => m.get('kvllm:kv_blocks_used') === m0.get('kvllm:kv_blocks_used'));
        assertEq(back.get('kvllm:kv_blocks_used'), m0.get('kvllm:kv_blocks_used'), 'KV blocks back in the pool');
      }
    }
    assert(streamed && answered, `no seed in 1..12 gave both kinds of choices (streamed ${streamed}, answered ${answered})`);
  }],
];

// The server's own grammar (llama-server's --json-schema, --grammar, --grammar-file): every
// request that constrains nothing itself and has no tools is held to it.
const schemaServer = await startServer(bin, ['-m', 'tests/data/llama-2-tiny-random.gguf', '-c', '1024',
  '--json-schema', JSON.stringify(SCHEMAS.person)], { cwd: root, name: 'server-schema' });
tests.push(['--json-schema / --grammar: the server\'s grammar for requests without their own', async () => {
  const results = [];
  for (const seed of SEEDS) {
    const r = await rawRequest(schemaServer.url, { body: JSON.stringify({ prompt: 'Hi', max_tokens: 200, temperature: 1, seed }) });
    assertEq(r.status, 200, r.text.slice(0, 200));
    results.push({ name: `server schema, seed ${seed}`, text: r.json.choices[0].text, finish: r.json.choices[0].finish_reason,
      schema: SCHEMAS.person });
    const c = await rawRequest(schemaServer.url, { path: '/v1/chat/completions', body: JSON.stringify({
      messages: [{ role: 'user', content: 'Hi' }], max_tokens: 200, temperature: 1, seed }) });
    results.push({ name: `server schema, chat, seed ${seed}`, text: c.json.choices[0].message.content,
      finish: c.json.choices[0].finish_reason, schema: SCHEMAS.person });
  }
  await checkSchemaOutputs(results);
  // a request's own constraint wins
  const own = await rawRequest(schemaServer.url, { body: JSON.stringify({ prompt: 'Hi', max_tokens: 20, grammar: 'root ::= "yes" | "no"' }) });
  assert(['yes', 'no'].includes(own.json.choices[0].text), `its own grammar: ${own.text.slice(0, 200)}`);
  // GBNF given on the command line, and refusals at start
  const yes = await startServer(bin, ['-m', 'tests/data/llama-2-tiny-random.gguf', '-c', '256', '--grammar',
    'root ::= "yes" | "no"'], { cwd: root, name: 'server-grammar' });
  try {
    const r = await rawRequest(yes.url, { body: JSON.stringify({ prompt: 'Hi', max_tokens: 20, temperature: 1 }) });
    assert(['yes', 'no'].includes(r.json.choices[0].text), `--grammar: ${r.text.slice(0, 200)}`);
  } finally {
    await yes.stop();
  }
  for (const [flags, why] of [[['--grammar', 'root ::= nowhere'], 'nowhere'], [['--json-schema', '{"type":'], 'json'],
    [['--grammar-file', '/nonexistent.gbnf'], 'nonexistent'], [['--grammar', 'root ::= "a"', '-j', '{}'], 'already']]) {
    const r = await startServer(bin, ['-m', 'tests/data/llama-2-tiny-random.gguf', ...flags], { cwd: root, name: 'bad' })
      .then((srv) => { srv.stop(); return 'started'; }, (e) => String(e.message));
    assert(r !== 'started' && r.toLowerCase().includes(why.toLowerCase()), `${flags.join(' ')}: refused at start naming why: ${r.slice(-300)}`);
  }
}]);

let failed = await runTests(tests);
const codes = [await tiny.stop(), await stories.stop(), await schemaServer.stop()];
if (codes.some((c) => c !== 0)) {
  console.log(`server exit codes ${codes}; logs:\n${tiny.log()}\n${stories.log()}`);
  failed++;
}
process.exit(failed ? 1 : 0);
