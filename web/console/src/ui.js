// Shared pieces of the console's views: formatting, the clock that makes
// ages and TTLs tick, notifications, and modal dialogs (native <dialog>,
// so focus stays inside and Escape closes them).
import { html } from 'htm/preact';
import { useEffect, useRef, useState } from 'preact/hooks';

// ---- formatting

export function mib(v) {
  if (v == null || isNaN(v)) return '–';
  if (v >= 10240) return (v / 1024).toFixed(1) + ' GiB';
  if (v >= 100) return Math.round(v) + ' MiB';
  return v.toFixed(1) + ' MiB';
}

export function duration(sec) {
  if (sec == null) return '–';
  sec = Math.max(0, Math.floor(sec));
  if (sec < 60) return sec + 's';
  if (sec < 3600) return Math.floor(sec / 60) + 'm ' + String(sec % 60).padStart(2, '0') + 's';
  if (sec < 86400) return Math.floor(sec / 3600) + 'h ' + String(Math.floor((sec % 3600) / 60)).padStart(2, '0') + 'm';
  return Math.floor(sec / 86400) + 'd ' + Math.floor((sec % 86400) / 3600) + 'h';
}

export function age(iso, now) {
  return iso ? duration((now - Date.parse(iso)) / 1000) : '–';
}

// ttlLeft is what is left of a sandbox's TTL, or a word for why none runs.
export function ttlLeft(sb, now) {
  if (!sb.expires_at) return sb.state === 'paused' ? 'no expiry (paused)' : '–';
  const left = (Date.parse(sb.expires_at) - now) / 1000;
  return left <= 0 ? 'expiring' : duration(left);
}

export function bytes(n) {
  if (n == null) return '–';
  if (n < 1024) return n + ' B';
  if (n < 1 << 20) return (n / 1024).toFixed(1) + ' KiB';
  if (n < 1 << 30) return (n / (1 << 20)).toFixed(1) + ' MiB';
  return (n / (1 << 30)).toFixed(2) + ' GiB';
}

export function when(iso) {
  if (!iso) return '–';
  const d = new Date(iso);
  return d.toLocaleString();
}

// ---- the clock

const tickers = new Set();
setInterval(() => {
  const now = Date.now();
  for (const f of tickers) f(now);
}, 1000);

// useNow re-renders the component every second with the time.
export function useNow() {
  const [now, set] = useState(Date.now());
  useEffect(() => {
    tickers.add(set);
    return () => tickers.delete(set);
  }, []);
  return now;
}

// ---- notifications

let notes = [];
let noteID = 0;
const noteSubs = new Set();

// notify shows a message for a while (errors until dismissed).
export function notify(text, kind = 'info') {
  const id = ++noteID;
  notes = [...notes, { id, text, kind }];
  noteSubs.forEach((f) => f(notes));
  if (kind !== 'error') setTimeout(() => dismiss(id), 6000);
  return id;
}

export function notifyError(prefix, e) {
  notify(prefix + ': ' + (e && e.message ? e.message : String(e)), 'error');
}

export function dismiss(id) {
  notes = notes.filter((n) => n.id !== id);
  noteSubs.forEach((f) => f(notes));
}

export function clearNotes() {
  notes = [];
  noteSubs.forEach((f) => f(notes));
}

export function Notes() {
  const [list, set] = useState(notes);
  useEffect(() => {
    noteSubs.add(set);
    return () => noteSubs.delete(set);
  }, []);
  return html`<div class="notes" aria-live="polite">
    ${list.map(
      (n) => html`<div class=${'note note-' + n.kind} role=${n.kind === 'error' ? 'alert' : 'status'} data-testid="note" key=${n.id}>
        <span>${n.text}</span>
        <button class="icon" aria-label="Dismiss message" onClick=${() => dismiss(n.id)}>×</button>
      </div>`,
    )}
  </div>`;
}

// ---- dialogs

let showDialog = () => {};

// Dialogs is the one place where dialogs are rendered (in App).
export function Dialogs() {
  const [d, setD] = useState(null);
  showDialog = setD;
  const ref = useRef();
  useEffect(() => {
    const el = ref.current;
    if (d && el && !el.open) el.showModal();
    if (!d && el && el.open) el.close();
  }, [d]);
  if (!d) return html`<dialog ref=${ref}></dialog>`;
  const close = (v) => {
    setD(null);
    d.resolve(v);
  };
  return html`<dialog ref=${ref} class="dialog" aria-labelledby="dialog-title" data-testid="dialog"
      onCancel=${(e) => { e.preventDefault(); close(null); }}>
    ${d.render(close)}
  </dialog>`;
}

function open(render) {
  return new Promise((resolve) => showDialog({ render, resolve }));
}

// confirm asks a yes/no question; destructive ones have a red button.
export function confirm({ title, body, action = 'OK', danger = false }) {
  return open(
    (close) => html`<form method="dialog" onSubmit=${(e) => { e.preventDefault(); close(true); }}>
      <h2 id="dialog-title">${title}</h2>
      <div class="dialog-body">${body}</div>
      <div class="dialog-actions">
        <button type="button" onClick=${() => close(false)} data-testid="cancel">Cancel</button>
        <button type="submit" class=${danger ? 'danger' : 'primary'} data-testid="confirm" autofocus>${action}</button>
      </div>
    </form>`,
  );
}

// form asks for values: fields are {name, label, type, value, min, max,
// options, placeholder, help}. Resolves to an object of values, or null.
export function form({ title, fields, action = 'OK', intro }) {
  return open((close) => {
    const submit = (e) => {
      e.preventDefault();
      const fd = new FormData(e.currentTarget);
      const out = {};
      for (const f of fields) out[f.name] = f.type === 'checkbox' ? fd.get(f.name) === 'on' : fd.get(f.name);
      close(out);
    };
    return html`<form onSubmit=${submit}>
      <h2 id="dialog-title">${title}</h2>
      ${intro && html`<p class="dialog-body">${intro}</p>`}
      ${fields.map((f, i) => field(f, i === 0))}
      <div class="dialog-actions">
        <button type="button" onClick=${() => close(null)}>Cancel</button>
        <button type="submit" class="primary" data-testid="submit">${action}</button>
      </div>
    </form>`;
  });
}

function field(f, first) {
  const id = 'f-' + f.name;
  let input;
  if (f.type === 'select') {
    input = html`<select id=${id} name=${f.name} autofocus=${first}>
      ${f.options.map((o) => html`<option value=${o.value} selected=${o.value === f.value}>${o.label}</option>`)}
    </select>`;
  } else if (f.type === 'textarea') {
    input = html`<textarea id=${id} name=${f.name} rows="4" placeholder=${f.placeholder || ''} autofocus=${first}>${f.value || ''}</textarea>`;
  } else if (f.type === 'checkbox') {
    return html`<label class="check"><input type="checkbox" id=${id} name=${f.name} checked=${!!f.value} /> ${f.label}</label>`;
  } else {
    input = html`<input id=${id} name=${f.name} type=${f.type || 'text'} value=${f.value ?? ''} min=${f.min} max=${f.max}
      placeholder=${f.placeholder || ''} required=${!!f.required} autofocus=${first} autocomplete="off" />`;
  }
  return html`<div class="field"><label for=${id}>${f.label}</label>${input}${f.help && html`<small>${f.help}</small>`}</div>`;
}

// show displays content with a Close button (e.g. a new key's secret).
export function show({ title, body }) {
  return open(
    (close) => html`<div>
      <h2 id="dialog-title">${title}</h2>
      <div class="dialog-body">${body}</div>
      <div class="dialog-actions"><button class="primary" onClick=${() => close(true)} autofocus>Close</button></div>
    </div>`,
  );
}

// ---- small components

export function StateBadge({ state }) {
  return html`<span class=${'badge state-' + state} data-testid="state">${state}</span>`;
}

// MemBar draws a sandbox's memory: private (its own pages) and shared
// (pages it maps from its template or parent), against its guest size.
export function MemBar({ sb, id }) {
  const m = sb.memory;
  if (!m) {
    return html`<span class="membar membar-none" data-testid=${'mem-' + id} title="no memory figures (not running)">
      <span class="membar-label">${sb.state === 'paused' ? 'on disk' : '–'}</span></span>`;
  }
  const size = Math.max(sb.memory_mib || 1, m.private_mib + m.shared_mib);
  const p = (100 * m.private_mib) / size;
  const s = (100 * m.shared_mib) / size;
  const label = `${mib(m.private_mib)} private, ${mib(m.shared_mib)} shared of ${mib(sb.memory_mib)}`;
  return html`<span class="membar" data-testid=${'mem-' + id} data-private=${m.private_mib} data-shared=${m.shared_mib}
      role="img" aria-label=${'Memory: ' + label} title=${label}>
    <span class="membar-track">
      <span class="membar-private" style=${{ width: p + '%' }}></span>
      <span class="membar-shared" style=${{ width: s + '%' }}></span>
    </span>
    <span class="membar-label">${mib(m.private_mib)} <span class="muted">+ ${mib(m.shared_mib)}</span></span>
  </span>`;
}
