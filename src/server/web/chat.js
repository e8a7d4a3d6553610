// The chat page: /v1/chat/completions with stream: true, one message at a time.
'use strict';
const $ = (id) => document.getElementById(id);
let history = [];   // {role, content}
let busy = null;    // AbortController of the running request
window.chatDone = 0; // replies finished (for tests)

async function loadModel() {
  const r = await apiFetch('v1/models');
  if (r.ok) $('model').textContent = (await r.json()).data[0].id;
}

function params() {
  const p = { temperature: Number($('temperature').value), top_p: Number($('top_p').value),
              max_tokens: Number($('max_tokens').value) };
  if ($('seed').value !== '') p.seed = Number($('seed').value);
  const stop = $('stop').value.split('\n').filter((s) => s.length);
  if (stop.length) p.stop = stop;
  return p;
}

function addMsg(role, text) {
  const d = el('div', { class: 'msg ' + role }, el('div', { class: 'text', text }));
  $('log').append(d);
  d.scrollIntoView({ block: 'end' });
  return d;
}

function statsLine(u, t0, tFirst, tEnd) {
  const parts = [];
  if (u) {
    const cached = u.prompt_tokens_details ? u.prompt_tokens_details.cached_tokens : 0;
    parts.push(`prompt ${u.prompt_tokens} tokens (${cached} from the prefix cache)`,
               `completion ${u.completion_tokens}`);
    if (u.kv_lower_bound_bytes != null)
      parts.push(`KV ${fmtBytes(u.kv_lower_bound_bytes)} needed / ${fmtBytes(u.kv_allocated_bytes)} allocated`);
  }
  if (tFirst) parts.push(`TTFT ${(tFirst - t0).toFixed(0)} ms`); // performance.now() is in ms
  if (u && tFirst && tEnd > tFirst && u.completion_tokens > 1)
    parts.push(`${((u.completion_tokens - 1) / ((tEnd - tFirst) / 1000)).toFixed(1)} tokens/s`);
  return parts.join(' · ');
}

async function send() {
  const text = $('input').value;
  if (!text.trim() || busy) return;
  $('input').value = '';
  history.push({ role: 'user', content: text });
  addMsg('user', text);
  const box = addMsg('assistant', '');
  const out = box.querySelector('.text');
  const messages = [];
  if ($('system').value.trim()) messages.push({ role: 'system', content: $('system').value });
  messages.push(...history);
  const body = Object.assign({ messages, stream: true, stream_options: { include_usage: true } }, params());
  busy = new AbortController();
  $('send').disabled = true; $('stopgen').disabled = false; $('status').textContent = 'generating…';
  const t0 = performance.now();
  let tFirst = 0, usage = null, reply = '', err = null;
  try {
    const res = await apiFetch('v1/chat/completions', { method: 'POST', signal: busy.signal,
      headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
    if (!res.ok) {
      const j = await res.json().catch(() => null);
      throw new Error(`${res.status}: ${j && j.error ? j.error.message : res.statusText}`);
    }
    const reader = res.body.getReader(), dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        for (const line of ev.split('\n')) {
          if (!line.startsWith('data: ')) continue;
          const data = line.slice(6);
          if (data === '[DONE]') continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message);
          if (j.usage) usage = j.usage;
          const d = j.choices && j.choices[0] && j.choices[0].delta;
          if (d && d.content) {
            if (!tFirst) tFirst = performance.now();
            reply += d.content;
            out.textContent = reply;
          }
        }
      }
    }
  } catch (e) {
    err = e;
  }
  const tEnd = performance.now();
  history.push({ role: 'assistant', content: reply });
  box.append(el('div', { class: 'stats', text: err ? 'error: ' + err.message : statsLine(usage, t0, tFirst, tEnd) }));
  busy = null;
  $('send').disabled = false; $('stopgen').disabled = true; $('status').textContent = '';
  window.chatDone++;
}

$('send').onclick = send;
$('stopgen').onclick = () => busy && busy.abort();
$('clear').onclick = () => { history = []; $('log').textContent = ''; };
$('setkey').onclick = (e) => { e.preventDefault(); askKey('API key:'); loadModel(); };
$('input').addEventListener('keydown', (e) => { if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); send(); } });
loadModel();
