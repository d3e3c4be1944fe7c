// The console's live state: the key's sandboxes and snapshots, kept from
// the event stream (GET /v1/events) and a periodic re-list (which also
// refreshes memory figures, which events do not carry). Views subscribe
// with useStore and re-render on every change.
import { useEffect, useState } from 'preact/hooks';
import { api, request, ndjson, ApiError } from './api.js';

export const store = {
  sandboxes: new Map(), // id → sandbox JSON (not stopped)
  snapshots: new Map(), // id → snapshot JSON
  loaded: false,
  // conn: the event stream: 'connecting', 'live', 'reconnecting', or
  // 'polling' (the server has no event stream: re-lists only).
  conn: 'connecting',
  // streamless: the server answered that it has no event stream.
  streamless: false,
  lastError: '',
  version: 0,
};

const subs = new Set();

export function changed() {
  store.version++;
  for (const f of subs) f(store.version);
}

export function useStore() {
  const [, set] = useState(0);
  useEffect(() => {
    subs.add(set);
    return () => subs.delete(set);
  }, []);
  return store;
}

function putSandbox(sb) {
  if (sb.state === 'stopped') {
    store.sandboxes.delete(sb.id);
    return;
  }
  const old = store.sandboxes.get(sb.id);
  // Events carry no live memory: keep the last figures while running.
  if (!sb.memory && old && old.memory && sb.state === 'running') sb = { ...sb, memory: old.memory };
  store.sandboxes.set(sb.id, sb);
}

// relist replaces the state with the API's lists.
export async function relist() {
  const [sbs, snaps] = await Promise.all([api('v1/sandboxes'), api('v1/snapshots')]);
  store.sandboxes = new Map();
  for (const sb of sbs.sandboxes || []) putSandbox(sb);
  store.snapshots = new Map((snaps.snapshots || []).map((s) => [s.id, s]));
  store.loaded = true;
  store.lastError = '';
  changed();
}

// applyEvent applies one line of the event stream.
function applyEvent(ev) {
  switch (ev.type) {
    case 'sandbox':
      if (ev.sandbox) putSandbox(ev.sandbox);
      break;
    case 'sandbox_deleted':
      store.sandboxes.delete(ev.id);
      break;
    case 'snapshot':
      if (ev.snapshot) store.snapshots.set(ev.id, ev.snapshot);
      break;
    case 'snapshot_deleted':
      store.snapshots.delete(ev.id);
      break;
    default:
      return;
  }
  changed();
}

// A sandbox the console itself just created or changed is shown at once,
// before its event arrives.
export function noteSandbox(sb) {
  putSandbox(sb);
  changed();
}

export function forgetSandbox(id) {
  store.sandboxes.delete(id);
  changed();
}

export function noteSnapshot(s) {
  store.snapshots.set(s.id, s);
  changed();
}

export function forgetSnapshot(id) {
  store.snapshots.delete(id);
  changed();
}

function setConn(c, err = '') {
  if (store.conn !== c || store.lastError !== err) {
    store.conn = c;
    store.lastError = err;
    changed();
  }
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => {
      clearTimeout(t);
      resolve();
    });
  });

// PING_TIMEOUT: the server pings every 15 s; a stream silent for longer
// is dead (a proxy or a network that dropped it without a close).
const PING_TIMEOUT = 40000;
const RELIST_EVERY = 4000;

// start follows the event stream and re-lists periodically until signal
// aborts. A 401 ends it (the app signs out: api.js). On any drop it
// reconnects with backoff and lists again: the stream's hello comes first,
// so a list made after it misses nothing.
export function start(signal) {
  store.sandboxes = new Map();
  store.snapshots = new Map();
  store.loaded = false;
  store.conn = 'connecting';
  store.streamless = false;
  followEvents(signal);
  pollLists(signal);
}

async function followEvents(signal) {
  let backoff = 500;
  while (!signal.aborted) {
    const ctl = new AbortController();
    const abort = () => ctl.abort();
    signal.addEventListener('abort', abort);
    let watchdog;
    const arm = () => {
      clearTimeout(watchdog);
      watchdog = setTimeout(() => ctl.abort(), PING_TIMEOUT);
    };
    try {
      arm();
      const res = await request('v1/events', { signal: ctl.signal });
      await ndjson(res, (ev) => {
        arm();
        if (ev.type === 'hello') {
          relist().then(
            () => {
              backoff = 500;
              setConn('live');
            },
            (e) => setConn('reconnecting', e.message),
          );
          return;
        }
        if (ev.type === 'overflow') {
          // The server dropped events: re-list on the next connection.
          ctl.abort();
          return;
        }
        applyEvent(ev);
      });
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) return;
      if (e instanceof ApiError && e.unrouted) {
        store.streamless = true;
        setConn('polling');
        return;
      }
      if (!signal.aborted && e instanceof ApiError) store.lastError = e.message;
    } finally {
      clearTimeout(watchdog);
      signal.removeEventListener('abort', abort);
    }
    if (signal.aborted) return;
    setConn('reconnecting', store.lastError);
    await sleep(backoff, signal);
    backoff = Math.min(backoff * 2, 8000);
  }
}

async function pollLists(signal) {
  while (!signal.aborted) {
    if (document.visibilityState === 'visible' || !store.loaded) {
      try {
        await relist();
        if (store.streamless) setConn('polling');
      } catch (e) {
        if (e instanceof ApiError && e.status === 401) return;
        if (!signal.aborted) setConn('reconnecting', e.message);
      }
    }
    await sleep(RELIST_EVERY, signal);
  }
}
