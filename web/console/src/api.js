// The REST API client of the console: every request carries the API key the
// user signed in with (kept in sessionStorage: this tab only, never a
// cookie). Paths are relative to the page, so a server behind a path
// prefix works unchanged.

const KEY = 'pandastack.key';

export function getKey() {
  return sessionStorage.getItem(KEY) || '';
}

export function setKey(k) {
  if (k) sessionStorage.setItem(KEY, k);
  else sessionStorage.removeItem(KEY);
}

export function apiURL(path) {
  return new URL(path.replace(/^\//, ''), document.baseURI).toString();
}

// ApiError is a failed request: the HTTP status and the API's error code
// and message (or what went wrong on the way).
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
  // unrouted: the server has no such endpoint (an older server).
  get unrouted() {
    return this.status === 404 && /^no such endpoint/.test(this.message);
  }
}

let onUnauthorized = () => {};

// setUnauthorizedHandler sets what happens when a request answers 401 (the
// key was revoked or is unknown): the app signs out with the message.
export function setUnauthorizedHandler(f) {
  onUnauthorized = f;
}

async function errorOf(res) {
  let code = 'http_' + res.status;
  let message = `${res.status} ${res.statusText}`;
  try {
    const j = await res.json();
    if (j && j.error) {
      code = j.error.code || code;
      message = j.error.message || message;
    }
  } catch (_) {
    // not JSON: keep the status line
  }
  return new ApiError(res.status, code, message);
}

// request sends one request and returns the Response (ok) or throws an
// ApiError. opts: method, json (a body to encode), body (raw), signal, key
// (another key than the stored one, for signing in).
export async function request(path, opts = {}) {
  const key = opts.key ?? getKey();
  const headers = { Authorization: 'Bearer ' + key };
  let body = opts.body;
  if (opts.json !== undefined) {
    body = JSON.stringify(opts.json);
    headers['Content-Type'] = 'application/json';
  }
  let res;
  try {
    res = await fetch(apiURL(path), { method: opts.method || 'GET', headers, body, signal: opts.signal, cache: 'no-store' });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'network', 'cannot reach the server: ' + e.message);
  }
  if (!res.ok) {
    const err = await errorOf(res);
    if (res.status === 401 && opts.key === undefined) onUnauthorized(err.message);
    throw err;
  }
  return res;
}

// api sends a request and returns its decoded JSON answer (null for 204).
export async function api(path, opts) {
  const res = await request(path, opts);
  if (res.status === 204) return null;
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

// ndjson reads a response body of newline-delimited JSON, calling f with
// each value, until the body ends (or the signal aborts the request).
export async function ndjson(res, f) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i).trim();
      buf = buf.slice(i + 1);
      if (line) f(JSON.parse(line));
    }
  }
  if (buf.trim()) f(JSON.parse(buf));
}

export const enc = encodeURIComponent;
