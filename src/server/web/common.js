// Shared by the built-in pages: the API key (asked for on 401, kept in
// localStorage) and small formatters. No framework, no network but this server.
'use strict';
const KEY_NAME = 'kvllm_api_key';

function apiKey() { return localStorage.getItem(KEY_NAME) || ''; }

function askKey(msg) {
  const k = window.prompt(msg || 'This server needs an API key (Authorization: Bearer KEY):', apiKey());
  if (k === null) return false;
  localStorage.setItem(KEY_NAME, k.trim());
  return true;
}

// fetch with the key; on 401 asks for it once and retries.
async function apiFetch(path, opts = {}) {
  for (let attempt = 0; ; attempt++) {
    const headers = Object.assign({}, opts.headers || {});
    if (apiKey()) headers.Authorization = 'Bearer ' + apiKey();
    const res = await fetch(path, Object.assign({}, opts, { headers }));
    if (res.status !== 401 || attempt > 0 || !askKey()) return res;
  }
}

function fmtBytes(n) {
  if (n == null) return '-';
  const u = ['B', 'KiB', 'MiB', 'GiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + ' ' + u[i];
}

function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v; else if (k === 'text') e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}
