// The live KV view: polls /v1/kv/state once a second and draws every pool's
// blocks on a canvas (one cell per block: fine with 8,192 blocks), the
// sequences, the prefix tree, the event log and charts of the last minutes.
// ?static=1 stops polling; window.kvRender(state) draws a given state (tests).
'use strict';
const $ = (id) => document.getElementById(id);
const HISTORY_S = 300;
let lastEvent = 0, history = [], current = null, paused = false;
window.kvCounts = null; // per pool: {free, used, shared, cached} as drawn

const hue = (id) => (id * 137.508) % 360;
function cellColour(st, id, rank, nCached) {
  switch (st) {
    case 'f': return '#e4e4e0';
    case 's': return '#d2332f';
    case 'c': { // pale = evicted soon, deep = recently released
      const x = nCached > 1 ? rank / (nCached - 1) : 1;
      return `hsl(216, 63%, ${Math.round(78 - 40 * x)}%)`;
    }
    default: return `hsl(${hue(id || 0)}, 60%, 50%)`;
  }
}

// block -> [{seq, index}] for one group, from the sequences' tables.
function owners(state, g) {
  const m = new Map();
  for (const s of state.sequences) {
    const t = s.blocks[g] || [];
    t.forEach((b, i) => { if (b >= 0) { if (!m.has(b)) m.set(b, []); m.get(b).push({ seq: s.id, index: i }); } });
  }
  return m;
}

function drawPool(state, g, host) {
  const p = state.pools[g];
  let wrap = host.children[g];
  if (!wrap) {
    wrap = el('div', {}, el('div', { class: 'muted' }), el('canvas'));
    host.append(wrap);
    const cv = wrap.querySelector('canvas');
    cv.addEventListener('mousemove', (e) => hover(e, cv));
    cv.addEventListener('mouseleave', () => { $('tip').style.display = 'none'; });
  }
  const cv = wrap.querySelector('canvas');
  const W = Math.max(300, host.clientWidth - 4);
  const n = p.n_blocks;
  let cell = Math.floor(Math.sqrt((W * 420) / n));
  cell = Math.max(4, Math.min(24, cell));
  const cols = Math.floor(W / cell), rows = Math.ceil(n / cols);
  const dpr = window.devicePixelRatio || 1;
  if (cv.width !== W * dpr || cv.height !== rows * cell * dpr) {
    cv.width = W * dpr; cv.height = rows * cell * dpr;
    cv.style.width = W + 'px'; cv.style.height = rows * cell + 'px';
  }
  const ctx = cv.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, W, rows * cell);
  const own = owners(state, g);
  const counts = { free: 0, used: 0, shared: 0, cached: 0 };
  const gap = cell >= 6 ? 1 : 0;
  ctx.font = `${Math.max(7, cell - 6)}px sans-serif`;
  ctx.textAlign = 'center'; ctx.textBaseline = 'middle';
  for (let b = 0; b < n; b++) {
    const st = p.states[b];
    counts[{ f: 'free', u: 'used', s: 'shared', c: 'cached' }[st]]++;
    const o = own.get(b);
    ctx.fillStyle = cellColour(st, o ? o[0].seq : 0, p.lru_rank[b], p.cached);
    const x = (b % cols) * cell, y = Math.floor(b / cols) * cell;
    ctx.fillRect(x, y, cell - gap, cell - gap);
    if (st === 'c' && cell >= 16) {
      ctx.fillStyle = '#fff';
      ctx.fillText(String(p.lru_rank[b]), x + cell / 2, y + cell / 2);
    }
  }
  cv.kv = { g, cell, cols, n, own };
  cv.dataset.counts = JSON.stringify(counts);
  cv.dataset.blocks = String(n);
  cv.dataset.group = String(g);
  const rule = p.window ? ` (sliding window ${p.window})` : p.chunk ? ` (chunks of ${p.chunk})` : ' (full attention)';
  wrap.firstChild.textContent = `group ${g}${rule}: ` +
    `${n} blocks of ${fmtBytes(p.block_bytes)} · used ${p.used} (shared ${p.shared}) · cached ${p.cached} · ` +
    `free ${p.free} · evicted so far ${p.evicted_total}`;
  return counts;
}

function hover(e, cv) {
  const k = cv.kv, st = current;
  if (!k || !st) return;
  const r = cv.getBoundingClientRect();
  const b = Math.floor((e.clientY - r.top) / k.cell) * k.cols + Math.floor((e.clientX - r.left) / k.cell);
  const tip = $('tip');
  if (b < 0 || b >= k.n || (e.clientX - r.left) >= k.cols * k.cell) { tip.style.display = 'none'; return; }
  const p = st.pools[k.g], bs = st.block_size, o = k.own.get(b) || [];
  const lines = [`block ${b} · ${{ f: 'free', u: 'used', s: 'shared', c: 'cached' }[p.states[b]]} · ref ${p.refcount[b]}`];
  if (p.lru_rank[b] >= 0) lines.push(`LRU rank ${p.lru_rank[b]} of ${p.cached} (0: evicted next)`);
  for (const x of o) lines.push(`seq ${x.seq}: tokens ${x.index * bs}..${(x.index + 1) * bs - 1}`);
  const node = k.g === 0 && st.prefix_tree.nodes.find((nd) => nd.block === b);
  if (node && !o.length) lines.push(`prefix tokens ${node.depth * bs}..${(node.depth + 1) * bs - 1}`);
  tip.textContent = lines.join('\n');
  tip.style.display = 'block';
  tip.style.left = e.clientX + 14 + 'px'; tip.style.top = e.clientY + 14 + 'px';
}

function drawSeqs(state) {
  const t = $('seqs');
  t.textContent = '';
  t.append(el('tr', {}, ...['id', 'state', 'prompt', 'generated', 'cached', 'KV lower bound', 'allocated', 'preempted', 'blocks']
    .map((h, i) => el('th', { class: i === 1 || i === 8 ? 'l' : '', text: h }))));
  for (const s of state.sequences) {
    const tables = s.blocks.map((tb) => tb.map((b) => (b < 0 ? '·' : b)).join(' ')).join(' | ');
    t.append(el('tr', {},
      el('td', { text: s.id, style: `color:hsl(${hue(s.id)},60%,40%);font-weight:bold` }),
      el('td', { class: 'l', text: s.phase }), el('td', { text: s.prompt_tokens }), el('td', { text: s.generated_tokens }),
      el('td', { text: s.cached_tokens }), el('td', { text: fmtBytes(s.kv.lower_bound_bytes) }),
      el('td', { text: fmtBytes(s.kv.allocated_bytes) }), el('td', { text: s.preemptions }),
      el('td', { class: 'l mono', text: tables.length > 160 ? tables.slice(0, 160) + '…' : tables })));
  }
}

// The tree with single-child chains folded into runs: "blocks a→b (k blocks)".
function drawTree(state) {
  const tr = state.prefix_tree, bs = state.block_size;
  $('treestats').textContent = tr.enabled
    ? `lookups ${tr.lookups} · hits ${tr.hits} · misses ${tr.misses} · tokens found ${tr.hit_tokens} of ${tr.query_tokens} looked up`
    : 'prefix caching is off for this model or server';
  const kids = new Map();
  for (const nd of tr.nodes) {
    if (!kids.has(nd.parent)) kids.set(nd.parent, []);
    kids.get(nd.parent).push(nd);
  }
  const lines = [];
  const walk = (nd, indent) => {
    if (lines.length > 300) return;
    let end = nd, len = 1;
    while ((kids.get(end.block) || []).length === 1 && kids.get(end.block)[0].seqs === nd.seqs) { end = kids.get(end.block)[0]; len++; }
    const who = nd.seqs > 0 ? `${nd.seqs} seq${nd.seqs > 1 ? 's' : ''}` : 'cached, unused';
    lines.push(`${'  '.repeat(indent)}└ tokens ${nd.depth * bs}..${(end.depth + 1) * bs - 1} (${len} block${len > 1 ? 's' : ''}` +
      `, ${nd.block}${len > 1 ? '→' + end.block : ''}): ${who}`);
    for (const c of kids.get(end.block) || []) walk(c, indent + 1);
  };
  for (const r of kids.get(-1) || []) walk(r, 0);
  $('tree').textContent = lines.join('\n') || '(empty)';
  $('tree').style.whiteSpace = 'pre';
}

function addEvents(state) {
  const box = $('events');
  const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
  for (const e of state.events) {
    const last = box.lastElementChild;
    if (e.kind === 'evict' && last && last.dataset.kind === 'evict' && last.dataset.group === String(e.b)) {
      last.dataset.n = String(Number(last.dataset.n) + e.a); // one line for a run of evictions
      last.textContent = `#${e.seq} ${last.dataset.n} cached blocks evicted (group ${e.b})`;
      continue;
    }
    const what = {
      admit: `admitted: ${e.a} tokens to compute, ${e.b} from the prefix cache`,
      prefix_hit: `prefix hit: ${e.a} tokens (${e.b} blocks)`,
      preempt: `preempted: ${e.a} blocks given back, ${e.b} tokens to recompute`,
      evict: `${e.a} cached block${e.a > 1 ? 's' : ''} evicted (group ${e.b})`,
      window_release: `sliding window: ${e.a} block${e.a > 1 ? 's' : ''} released (group ${e.b})`,
      finish: `finished: ${e.a} tokens generated`,
    }[e.kind] || e.kind;
    const d = el('div', { class: 'ev ev-' + e.kind, text: `#${e.seq} ${e.request ? 'seq ' + e.request + ' ' : ''}${what}` });
    d.dataset.kind = e.kind;
    d.dataset.group = String(e.b);
    d.dataset.n = String(e.a);
    box.append(d);
  }
  while (box.children.length > 500) box.firstChild.remove();
  if (atEnd) box.scrollTop = box.scrollHeight;
}

// Percentile q of the observations between two cumulative histogram snapshots.
function pct(h1, h0, q) {
  const c = h1.counts.map((x, i) => x - (h0 ? h0.counts[i] : 0));
  const tot = c.reduce((a, b) => a + b, 0);
  if (!tot) return null;
  let acc = 0;
  for (let i = 0; i < c.length; i++) {
    if (acc + c[i] >= q * tot) {
      const lo = i ? h1.bounds[i - 1] : 0, hi = i < h1.bounds.length ? h1.bounds[i] : h1.bounds[i - 1];
      return lo + (hi - lo) * (c[i] ? (q * tot - acc) / c[i] : 0);
    }
    acc += c[i];
  }
  return null;
}

function record(state) {
  const m = state.metrics, now = state.time;
  const prev = history.length ? history[history.length - 1] : null;
  // (the metrics' blocks_free counts cached blocks too: they can be handed out)
  const old = history.find((h) => h.t >= now - 10) || prev; // percentiles over about 10 s
  const tokS = prev && now > prev.t ? (m.generation_tokens - prev.gen) / (now - prev.t) : 0;
  history.push({ t: now, gen: m.generation_tokens, used: m.blocks_used, cached: m.blocks_cached, free: m.blocks_free - m.blocks_cached,
    running: m.running, waiting: m.waiting, tokS, ttft: m.ttft_seconds, tpot: m.tpot_seconds,
    ttft50: pct(m.ttft_seconds, old && old.ttft, 0.5), ttft90: pct(m.ttft_seconds, old && old.ttft, 0.9),
    ttft99: pct(m.ttft_seconds, old && old.ttft, 0.99),
    tpot50: pct(m.tpot_seconds, old && old.tpot, 0.5), tpot90: pct(m.tpot_seconds, old && old.tpot, 0.9),
    tpot99: pct(m.tpot_seconds, old && old.tpot, 0.99) });
  while (history.length && history[0].t < now - HISTORY_S) history.shift();
}

const CHARTS = [
  { title: 'KV blocks', series: [['used', '#3a9d5d'], ['cached', '#2f6fd2'], ['free', '#aaa']] },
  { title: 'requests', series: [['running', '#3a9d5d'], ['waiting', '#d2332f']] },
  { title: 'tokens/s', series: [['tokS', '#7a4dd8']] },
  { title: 'TTFT s (p50 p90 p99)', series: [['ttft50', '#3a9d5d'], ['ttft90', '#e39a1f'], ['ttft99', '#d2332f']] },
  { title: 'TPOT s (p50 p90 p99)', series: [['tpot50', '#3a9d5d'], ['tpot90', '#e39a1f'], ['tpot99', '#d2332f']] },
];

function drawCharts() {
  const host = $('charts');
  if (!host.children.length) for (const c of CHARTS) host.append(el('canvas', { width: 300, height: 130 }));
  const tEnd = history.length ? history[history.length - 1].t : 0, tStart = tEnd - HISTORY_S;
  CHARTS.forEach((c, i) => {
    const cv = host.children[i], ctx = cv.getContext('2d'), W = cv.width, H = cv.height, top = 18, bot = H - 14;
    ctx.clearRect(0, 0, W, H);
    let max = 0;
    for (const h of history) for (const [k] of c.series) if (h[k] != null) max = Math.max(max, h[k]);
    max = max > 0 ? max * 1.1 : 1;
    ctx.fillStyle = '#333'; ctx.font = '11px sans-serif'; ctx.textAlign = 'left';
    ctx.fillText(`${c.title}  max ${max < 10 ? max.toFixed(3) : Math.round(max)}`, 4, 12);
    ctx.fillStyle = '#999'; ctx.fillText(`${HISTORY_S / 60} min`, 4, H - 3);
    for (const [k, col] of c.series) {
      ctx.strokeStyle = col; ctx.lineWidth = 1.5; ctx.beginPath();
      let started = false;
      for (const h of history) {
        if (h[k] == null) { started = false; continue; }
        const x = ((h.t - tStart) / HISTORY_S) * W, y = bot - (h[k] / max) * (bot - top);
        if (started) ctx.lineTo(x, y); else { ctx.moveTo(x, y); started = true; }
      }
      ctx.stroke();
    }
  });
}

function render(state) {
  current = state;
  const host = $('pools');
  window.kvCounts = state.pools.map((_, g) => drawPool(state, g, host));
  drawSeqs(state);
  drawTree(state);
  addEvents(state);
  lastEvent = state.last_event;
  record(state);
  drawCharts();
  const m = state.metrics, sum = (k) => state.pools.reduce((a, p) => a + p[k], 0);
  $('summary').textContent = `running ${m.running} · waiting ${m.waiting} · preemptions ${m.preemptions} · ` +
    `blocks ${sum('used')} used / ${sum('cached')} cached / ${sum('free')} free`;
  window.kvRenders = (window.kvRenders || 0) + 1;
}
window.kvRender = render;

async function poll() {
  if (paused) return;
  try {
    const r = await apiFetch(`v1/kv/state?since=${lastEvent}`);
    if (r.ok) render(await r.json());
    else $('summary').textContent = `/v1/kv/state: ${r.status}`;
  } catch (e) {
    $('summary').textContent = 'server unreachable';
  }
  setTimeout(poll, 1000);
}

$('setkey').onclick = (e) => { e.preventDefault(); askKey('API key:'); };
if (new URLSearchParams(location.search).get('static')) paused = true;
poll();
