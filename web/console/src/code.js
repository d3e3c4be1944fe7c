// The Code tab of a sandbox's page (#/sandboxes/ID/code): cells run in
// the sandbox's code interpreter through the REST API (POST
// /v1/sandboxes/ID/code answers a stream of NDJSON events), in a context
// picked from the sandbox's code contexts (GET …/code/contexts), with the
// cells run so far below the editor, newest first.
//
// Everything a cell outputs comes from the guest, and guests are hostile:
// output is shown as text; images as <img> with a data: URL (SVG too: an
// SVG shown as an image runs no script and loads nothing); HTML only in
// an iframe with sandbox="" (no script, an opaque origin) through srcdoc,
// which also inherits the console's Content-Security-Policy. Nothing a
// guest sends becomes markup of the console's own document, which holds
// the API key. Sizes are bounded here too: the cells kept, the text kept
// per cell, the results per cell.
import { html } from 'htm/preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import { api, request, ndjson, enc, ApiError } from './api.js';
import { confirm, form, notifyError } from './ui.js';

const sbPath = (id) => 'v1/sandboxes/' + enc(id);

// The languages of the code interpreter, with the labels they get here.
const LANGUAGES = [
  ['python', 'Python'],
  ['javascript', 'JavaScript'],
  ['bash', 'Bash'],
];
const langLabel = (l) => (LANGUAGES.find(([v]) => v === l) || [l, l])[1];

// What the console keeps: cells in the history (the oldest go first), the
// characters of stdout and stderr shown per cell, results per cell, and
// the size of one image (characters of base64).
const MAX_CELLS = 50;
const MAX_TEXT = 1 << 20;
const MAX_RESULTS = 64;
const MAX_IMAGE = 32 << 20;
// At most this many cells in flight at once: each holds a connection, and
// a browser opens few to one server.
const MAX_RUNNING = 3;

// The MIME types a result is shown as, in the order the first present one
// is picked: the richest first.
const FORMATS = [
  ['image/png', 'PNG'],
  ['image/jpeg', 'JPEG'],
  ['image/svg+xml', 'SVG'],
  ['text/html', 'HTML'],
  ['text/markdown', 'Markdown'],
  ['text/latex', 'LaTeX'],
  ['application/json', 'JSON'],
  ['text/plain', 'Text'],
  ['application/pdf', 'PDF'],
  ['application/javascript', 'JavaScript'],
];
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

// A picker value names what a cell runs in: "lang:python" is the default
// context of a language (the request names the language), "ctx:ID" a
// context by id.
const defaultOf = (lang) => 'lang:' + lang;

// target is the request's part that names the context of picker value sel.
function target(sel) {
  return sel.startsWith('lang:') ? { language: sel.slice(5) } : { context_id: sel.slice(4) };
}

// ctxLabel names a context for people: language, working directory and
// the start of its id.
function ctxLabel(c) {
  return `${langLabel(c.language)} · ${c.cwd} · ${c.id.length > 10 ? c.id.slice(0, 8) + '…' : c.id}`;
}

// str is v if it is a string, else "" (guest JSON is not trusted to have
// the types it should).
const str = (v) => (typeof v === 'string' ? v : '');

// CodeTab is the tab's whole content, for sandbox id; running says
// whether the sandbox runs (a paused one keeps its history here, but runs
// nothing).
export function CodeTab({ id, running }) {
  const [contexts, setContexts] = useState(null); // [{id, language, cwd, state}]
  const [listErr, setListErr] = useState(null);
  const [defaults, setDefaults] = useState({}); // language → the id of its default context (a cell's end tells it)
  const [sel, setSel] = useState(defaultOf('python'));
  const [code, setCode] = useState('');
  const [, setVersion] = useState(0);
  const cells = useRef([]); // newest first; cells are changed in place, then render() re-renders
  const seq = useRef(0);
  const escaped = useRef(false);
  const flush = useRef(null);
  const live = useRef(true);
  const [said, say] = useState(''); // what a screen reader is told when a cell ends

  // render re-renders soon: a stream of small outputs renders at most 25
  // times a second.
  const render = (now) => {
    if (!live.current) return;
    if (now) {
      clearTimeout(flush.current);
      flush.current = null;
      setVersion((v) => v + 1);
      return;
    }
    if (flush.current) return;
    flush.current = setTimeout(() => {
      flush.current = null;
      if (live.current) setVersion((v) => v + 1);
    }, 40);
  };

  const load = async () => {
    try {
      const r = await api(sbPath(id) + '/code/contexts');
      if (!live.current) return;
      const list = Array.isArray(r && r.contexts) ? r.contexts.filter((c) => c && typeof c.id === 'string' && typeof c.language === 'string') : [];
      setContexts(list);
      setListErr(null);
      // PandaStack's code server names its default contexts
      // default-LANGUAGE: taken as such until a cell's end says otherwise
      // (the API has no field for it; a wrong guess only mislabels).
      const named = {};
      for (const c of list) if (c.id === 'default-' + c.language) named[c.language] = c.id;
      setDefaults((d) => ({ ...named, ...d }));
    } catch (e) {
      if (live.current) setListErr(e);
    }
  };

  useEffect(() => {
    live.current = true;
    if (running) load();
    return () => {
      // Leaving the page closes the cells' requests, which interrupts
      // them in the sandbox.
      live.current = false;
      clearTimeout(flush.current);
      for (const c of cells.current) if (c.ctl) c.ctl.abort();
    };
  }, [id, running]);

  const byID = new Map((contexts || []).map((c) => [c.id, c]));
  const known = new Set(Object.values(defaults));
  // The context a picker value stands for, when known.
  const contextOf = (s) => (s.startsWith('ctx:') ? byID.get(s.slice(4)) : byID.get(defaults[s.slice(5)]));
  const current = contextOf(sel);
  const inFlight = cells.current.filter((c) => c.state === 'running');

  // run sends the editor's code to the picked context, and follows its
  // stream into a new cell.
  const run = async () => {
    if (!code.trim() || inFlight.length >= MAX_RUNNING) return;
    const t = target(sel);
    const cell = {
      seq: ++seq.current,
      code,
      target: t,
      label: t.language ? langLabel(t.language) + ' (default)' : ctxLabel(contextOf(sel) || { id: t.context_id, language: '?', cwd: '?' }),
      state: 'running',
      outputs: [],
      text: 0,
      results: 0,
      ctl: new AbortController(),
    };
    cells.current = [cell, ...cells.current];
    for (const old of cells.current.splice(MAX_CELLS)) if (old.ctl) old.ctl.abort();
    render(true);
    try {
      const res = await request(sbPath(id) + '/code', { method: 'POST', json: { code, ...t }, signal: cell.ctl.signal });
      await ndjson(res, (ev) => {
        apply(cell, ev);
        render();
      });
      if (cell.state === 'running') {
        cell.state = 'cut';
        cell.problem = cell.problem || 'The stream ended before the cell did: the connection to the sandbox broke.';
      }
    } catch (e) {
      if (e.name === 'AbortError') {
        cell.state = 'stopped';
        cell.problem = 'Stopped: the console closed its request, which interrupts the cell (or takes it out of the queue).';
      } else {
        cell.state = 'failed';
        cell.problem = e instanceof ApiError ? e.message : 'The stream could not be read: ' + e.message;
        if (e instanceof ApiError && [501, 502].includes(e.status)) setListErr(e);
      }
    }
    cell.ctl = null;
    if (live.current) {
      const err = cell.outputs.find((o) => o.kind === 'error');
      say(`Cell ${cell.seq}: ${STATES[cell.state]}${err ? ', ' + err.name : ''}`);
    }
    // A cell whose interpreter died offers to restart it: the context
    // its end named, else the one it was sent to.
    if (cell.dead && !cell.contextId) cell.contextId = t.context_id || defaults[t.language];
    if (t.language && cell.contextId && live.current) setDefaults((d) => (d[t.language] === cell.contextId ? d : { ...d, [t.language]: cell.contextId }));
    render(true);
    if (live.current) load();
  };

  // placeOf is the context cell runs in, as a picker value: by id when
  // known (a default context's, from its name or a cell's end).
  const placeOf = (cell) => {
    const t = cell.target;
    if (t.context_id) return 'ctx:' + t.context_id;
    return defaults[t.language] ? 'ctx:' + defaults[t.language] : defaultOf(t.language);
  };

  // interrupt stops cell: through the API when it is the cell its context
  // runs and the context is known (its KeyboardInterrupt then arrives in
  // its stream; python's default context is the API's default); by
  // closing its request otherwise (a cell waiting behind another leaves
  // the queue; a default context not known yet by id).
  const interrupt = async (cell) => {
    if (cell.state !== 'running') return;
    const where = placeOf(cell);
    const first = cells.current.filter((c) => c.state === 'running' && placeOf(c) === where).reduce((a, c) => (a && a.seq < c.seq ? a : c), null);
    const cid = where.startsWith('ctx:') ? where.slice(4) : '';
    if (first !== cell || (!cid && where !== defaultOf('python'))) {
      if (cell.ctl) cell.ctl.abort();
      return;
    }
    try {
      await api(sbPath(id) + '/code/interrupt', { method: 'POST', json: cid ? { context_id: cid } : {} });
    } catch (e) {
      notifyError('Interrupt failed', e);
    }
  };

  // The main Interrupt button: the oldest cell in flight in the picked
  // context (the one it runs; the others wait behind it).
  const interruptPicked = () => {
    const where = placeOf({ target: target(sel) });
    const first = inFlight.filter((c) => placeOf(c) === where).reduce((a, c) => (a && a.seq < c.seq ? a : c), null);
    if (first) interrupt(first);
  };

  const newContext = async () => {
    const lang = current ? current.language : sel.startsWith('lang:') ? sel.slice(5) : 'python';
    const v = await form({
      title: 'New code context',
      intro: 'A context is an interpreter of its own: its variables, imports and working directory are apart from every other context\'s.',
      fields: [
        { name: 'language', label: 'Language', type: 'select', value: lang, options: LANGUAGES.map(([value, label]) => ({ value, label })) },
        { name: 'cwd', label: 'Working directory', value: '/home/user', required: true, help: 'A directory that exists in the sandbox' },
      ],
      action: 'Create',
    });
    if (!v) return;
    try {
      const c = await api(sbPath(id) + '/code/contexts', { method: 'POST', json: { language: v.language, cwd: v.cwd } });
      setContexts((cs) => [...(cs || []).filter((x) => x.id !== c.id), c]);
      setSel('ctx:' + c.id);
      load();
    } catch (e) {
      notifyError('Cannot create the context', e);
    }
  };

  // restart starts context cid afresh (same id, language and directory).
  const restart = async (cid) => {
    const c = byID.get(cid);
    const ok = await confirm({
      title: 'Restart this context?',
      body: html`<p>${c ? ctxLabel(c) : cid}</p><p>A fresh interpreter replaces it: its variables, imports and running cell are gone.</p>`,
      action: 'Restart',
    });
    if (!ok) return;
    try {
      await api(sbPath(id) + '/code/contexts/' + enc(cid) + '/restart', { method: 'POST' });
      load();
    } catch (e) {
      notifyError('Restart failed', e);
    }
  };

  const remove = async (cid) => {
    const c = byID.get(cid);
    const ok = await confirm({
      title: 'Remove this context?',
      body: html`<p>${c ? ctxLabel(c) : cid}</p><p>Its interpreter ends, with what it holds.</p>`,
      action: 'Remove',
      danger: true,
    });
    if (!ok) return;
    try {
      await api(sbPath(id) + '/code/contexts/' + enc(cid), { method: 'DELETE' });
      setSel(defaultOf(c ? c.language : 'python'));
      load();
    } catch (e) {
      notifyError('Remove failed', e);
    }
  };

  // Keys in the editor: Ctrl/Cmd+Enter runs; Tab indents, unless Escape
  // came just before it (then it moves on, as everywhere: the editor
  // never traps the keyboard).
  const onKeyDown = (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      run();
      return;
    }
    if (e.key === 'Escape') {
      escaped.current = true;
      return;
    }
    if (e.key === 'Tab' && !e.shiftKey && !escaped.current && !e.ctrlKey && !e.altKey && !e.metaKey) {
      e.preventDefault();
      const ta = e.currentTarget;
      // execCommand keeps the editor's undo history; setRangeText where
      // it is gone.
      if (!document.execCommand('insertText', false, '    ')) {
        ta.setRangeText('    ', ta.selectionStart, ta.selectionEnd, 'end');
        setCode(ta.value);
      }
    }
    escaped.current = false;
  };

  if (!running) {
    return html`<div data-testid="code-tab">
      <p class="note note-info">This sandbox is not running: its code interpreter runs nothing until it is resumed.</p>
      <${History} cells=${cells.current} />
    </div>`;
  }
  if (listErr && [409, 501, 502].includes(listErr.status)) {
    return html`<div data-testid="code-tab">
      <div class="note note-info code-unavailable" data-testid="code-unavailable" role="status">
        <p><strong>${listErr.status === 502 ? 'No code interpreter' : 'The code interpreter is not available'}</strong></p>
        <p>${listErr.message}</p>
        ${listErr.status === 502 &&
        html`<p class="muted">Sandboxes created from the <code>code-interpreter</code> template run one
          (<code>panda create --template code-interpreter</code>, or <b>New sandbox…</b> on the fork tree).</p>`}
        <button onClick=${() => { setListErr(null); load(); }}>Try again</button>
      </div>
      <${History} cells=${cells.current} />
    </div>`;
  }

  const created = (contexts || []).filter((c) => !known.has(c.id));
  const selCID = current ? current.id : sel.startsWith('ctx:') ? sel.slice(4) : '';
  const pickedInFlight = inFlight.some((c) => placeOf(c) === placeOf({ target: target(sel) }));
  return html`<div data-testid="code-tab">
    <div class="code-bar">
      <label for="code-context">Context</label>
      <select id="code-context" data-testid="code-context" value=${sel} onChange=${(e) => setSel(e.currentTarget.value)}>
        <optgroup label="Default contexts">
          ${LANGUAGES.map(([l, label]) => html`<option value=${defaultOf(l)}>${label}</option>`)}
        </optgroup>
        ${created.length > 0 &&
        html`<optgroup label="Contexts">
          ${created.map((c) => html`<option value=${'ctx:' + c.id} key=${c.id}>${ctxLabel(c)}</option>`)}
        </optgroup>`}
      </select>
      ${current
        ? html`<span class=${'badge state-' + current.state} data-testid="code-context-state" title=${'Context ' + current.id}>${current.state}</span>`
        : html`<span class="muted" data-testid="code-context-state">${sel.startsWith('lang:') ? 'the language\'s default context' : ''}</span>`}
      <span class="code-bar-actions">
        <button onClick=${newContext} data-testid="new-context">New context…</button>
        <button onClick=${() => restart(selCID)} disabled=${!selCID} data-testid="restart-context"
          title=${selCID ? 'A fresh interpreter, same id' : 'Run a cell in it first: then the console knows which context it is'}>Restart…</button>
        ${sel.startsWith('ctx:') && html`<button class="danger" onClick=${() => remove(selCID)} data-testid="remove-context">Remove…</button>`}
        <button onClick=${load} data-testid="reload-contexts">Refresh</button>
      </span>
    </div>
    ${current && current.state === 'dead' &&
    html`<p class="note note-error context-dead" role="alert" data-testid="context-dead">This context's interpreter died: restart it to run cells again.
      <button onClick=${() => restart(current.id)}>Restart</button></p>`}
    ${listErr && html`<p class="error-text" role="alert">Cannot list the contexts: ${listErr.message}</p>`}
    <label for="code-editor" class="sr-only">Code</label>
    <textarea id="code-editor" class="code-editor" data-testid="code-editor" rows="8" spellcheck="false" autocomplete="off"
      autocapitalize="off" value=${code} placeholder=${'print("hello")'} onInput=${(e) => setCode(e.currentTarget.value)} onKeyDown=${onKeyDown}
      aria-describedby="code-help"></textarea>
    <div class="code-run">
      <button class="primary" onClick=${run} disabled=${!code.trim() || inFlight.length >= MAX_RUNNING} data-testid="code-run">Run</button>
      <button onClick=${interruptPicked} disabled=${!pickedInFlight} data-testid="code-interrupt">Interrupt</button>
      <span class="muted" id="code-help">Ctrl+Enter (⌘+Enter) runs. Tab indents; Escape, then Tab, moves on.
        ${inFlight.length >= MAX_RUNNING && ` ${MAX_RUNNING} cells are in flight: wait for one to end.`}</span>
      ${cells.current.length > 0 && html`<button class="small code-clear" onClick=${() => {
        cells.current = cells.current.filter((c) => c.state === 'running');
        render(true);
      }}>Clear finished</button>`}
    </div>
    <p class="sr-only" role="status">${said}</p>
    <${History} cells=${cells.current} onInterrupt=${interrupt} onRestart=${restart} onEdit=${(c) => {
      setCode(c.code);
      document.getElementById('code-editor').focus();
    }} />
  </div>`;
}

// apply adds one event of a cell's stream to it. Events are checked, not
// trusted: a field of the wrong type counts as absent.
function apply(cell, ev) {
  if (!ev || typeof ev !== 'object') return;
  switch (ev.type) {
    case 'stdout':
    case 'stderr':
      addText(cell, ev.type, str(ev.text));
      break;
    case 'result': {
      if (cell.results >= MAX_RESULTS) {
        if (cell.results++ === MAX_RESULTS) addText(cell, 'stderr', `[the console shows the first ${MAX_RESULTS} results of a cell]\n`);
        return;
      }
      const data = ev.data && typeof ev.data === 'object' && !Array.isArray(ev.data) ? ev.data : {};
      cell.results++;
      cell.outputs.push({ kind: 'result', data, main: ev.is_main_result === true });
      break;
    }
    case 'error':
      cell.outputs.push({ kind: 'error', name: str(ev.name) || 'Error', value: str(ev.value), traceback: str(ev.traceback) });
      if (ev.name === 'KernelDied') cell.dead = true;
      if (ev.name === 'GuestError') cell.broken = true;
      break;
    case 'end':
      if (Number.isSafeInteger(ev.execution_count)) cell.count = ev.execution_count;
      if (typeof ev.context_id === 'string') cell.contextId = ev.context_id;
      if (typeof ev.duration_ms === 'number') cell.ms = ev.duration_ms;
      cell.truncated = ev.truncated === true;
      cell.state = cell.outputs.some((o) => o.kind === 'error') ? 'error' : 'done';
      break;
  }
}

// addText appends stdout or stderr text to cell, merged with the output
// before it when that is of the same stream, up to MAX_TEXT characters.
function addText(cell, kind, text) {
  if (!text) return;
  const room = MAX_TEXT - cell.text;
  if (room <= 0) return;
  if (text.length > room) {
    text = text.slice(0, room) + `\n[the console shows the first ${MAX_TEXT >> 20} MiB of a cell's output]\n`;
    cell.text = MAX_TEXT;
  } else {
    cell.text += text.length;
  }
  const last = cell.outputs[cell.outputs.length - 1];
  if (last && last.kind === kind) last.text += text;
  else cell.outputs.push({ kind, text });
}

// History is the cells run so far, newest first.
function History({ cells, onInterrupt, onRestart, onEdit }) {
  if (cells.length === 0) return html`<p class="muted code-empty">No cells yet: results appear here as they stream.</p>`;
  return html`<div class="cells" data-testid="cells">
    ${cells.map((c) => html`<${Cell} key=${c.seq} cell=${c} onInterrupt=${onInterrupt} onRestart=${onRestart} onEdit=${onEdit} />`)}
  </div>`;
}

const STATES = {
  running: 'running',
  done: 'done',
  error: 'error',
  cut: 'cut off',
  failed: 'failed',
  stopped: 'stopped',
};

function Cell({ cell, onInterrupt, onRestart, onEdit }) {
  const running = cell.state === 'running';
  const count = cell.count != null ? cell.count : running ? '*' : ' ';
  return html`<article class=${'cell cell-' + cell.state} data-testid="cell" data-seq=${cell.seq} data-state=${cell.state}
      aria-busy=${running ? 'true' : 'false'} aria-label=${'Cell ' + cell.seq}>
    <header class="cell-head">
      <span class="cell-count mono" data-testid="cell-count" title="Execution count">[${count}]</span>
      <span class="cell-ctx muted">${cell.label}</span>
      <span class=${'badge cell-state state-' + (running ? 'busy' : cell.state === 'done' ? 'ok' : 'bad')}>${STATES[cell.state]}</span>
      ${cell.ms != null && html`<span class="muted">${(cell.ms / 1000).toFixed(2)} s</span>`}
      <span class="cell-actions">
        ${running && onInterrupt && html`<button class="small" onClick=${() => onInterrupt(cell)} data-testid="cell-interrupt">Interrupt</button>`}
        ${onEdit && html`<button class="small" onClick=${() => onEdit(cell)} title="Put this cell's code in the editor">Edit</button>`}
      </span>
    </header>
    <pre class="cell-code" data-testid="cell-code">${cell.code}</pre>
    ${cell.outputs.map((o, i) => html`<${Output} key=${i} o=${o} count=${cell.count} />`)}
    ${cell.problem && html`<p class="error-text" role="alert" data-testid="cell-problem">${cell.problem}</p>`}
    ${cell.truncated && html`<p class="muted">The server cut this cell's output: it wrote more than it keeps.</p>`}
    ${cell.dead &&
    html`<p class="note note-error cell-dead" data-testid="cell-dead">The interpreter of this context died; its variables are gone.
      ${cell.contextId && onRestart && html`<button onClick=${() => onRestart(cell.contextId)} data-testid="cell-restart">Restart the context</button>`}</p>`}
  </article>`;
}

function Output({ o, count }) {
  switch (o.kind) {
    case 'stdout':
      return html`<pre class="out out-stdout" data-testid="cell-stdout">${o.text}</pre>`;
    case 'stderr':
      return html`<pre class="out out-stderr" data-testid="cell-stderr">${o.text}</pre>`;
    case 'error':
      return html`<div class="out out-error" data-testid="cell-error">
        <p><strong data-testid="error-name">${o.name}</strong>${o.value && ': '}<span data-testid="error-value">${o.value}</span></p>
        ${o.traceback && html`<pre class="traceback">${o.traceback}</pre>`}
      </div>`;
    case 'result':
      return html`<${Result} data=${o.data} main=${o.main} count=${count} />`;
  }
  return null;
}

// Result shows one result in the richest format it has, with a choice of
// the others.
function Result({ data, main, count }) {
  const formats = FORMATS.filter(([m]) => usable(m, data[m]));
  const [pick, setPick] = useState(null);
  const shown = formats.find(([m]) => m === pick) || formats[0];
  const other = Object.keys(data).filter((m) => !FORMATS.some(([f]) => f === m) && m !== 'application/vnd.pandastack.data+json');
  return html`<div class=${'out out-result' + (main ? ' main' : '')} data-testid="cell-result" data-mime=${shown ? shown[0] : ''}>
    ${(main || formats.length > 1) &&
    html`<div class="result-head">
      ${main && html`<span class="out-label mono" title="The cell's value">Out${count != null ? `[${count}]` : ''}</span>`}
      ${formats.length > 1 &&
      html`<span class="formats" role="group" aria-label="Show as">
        ${formats.map(([m, label]) => html`<button class="small" aria-pressed=${m === shown[0] ? 'true' : 'false'} onClick=${() => setPick(m)}
          data-testid="result-format" title=${m}>${label}</button>`)}
      </span>`}
    </div>`}
    ${shown ? html`<${Shown} mime=${shown[0]} value=${data[shown[0]]} alt=${str(data['text/plain'])} />` : html`<p class="muted">A result with no format the console shows.</p>`}
    ${other.length > 0 && html`<p class="muted small-print">Also as ${other.join(', ')} (not shown here).</p>`}
  </div>`;
}

// usable says whether value is a result's value of MIME type m that the
// console can show.
function usable(m, value) {
  if (value === undefined || value === null) return false;
  if (m === 'application/json') return true;
  if (typeof value !== 'string') return false;
  if (m === 'image/png' || m === 'image/jpeg' || m === 'application/pdf') return value.length <= MAX_IMAGE && BASE64.test(value.replace(/\s+/g, ''));
  return true;
}

function Shown({ mime, value, alt }) {
  switch (mime) {
    case 'image/png':
    case 'image/jpeg':
      return html`<img class="result-image" data-testid="result-image" alt=${alt || 'An image result'}
        src=${`data:${mime};base64,${value.replace(/\s+/g, '')}`} />`;
    case 'image/svg+xml':
      // As an image: scripts in it do not run, nothing it links loads.
      return html`<img class="result-image" data-testid="result-image" alt=${alt || 'An SVG result'}
        src=${'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(value)} />`;
    case 'text/html':
      return html`<${HTMLResult} value=${value} />`;
    case 'application/json':
      return html`<pre class="out" data-testid="result-text">${clip(JSON.stringify(value, null, 2))}</pre>`;
    case 'application/pdf':
      return html`<p><button class="small" onClick=${() => download(value, 'application/pdf', 'result.pdf')}>Download the PDF</button>
        <span class="muted"> (${Math.round((value.length * 3) / 4 / 1024)} KiB)</span></p>`;
  }
  return html`<pre class="out" data-testid="result-text">${clip(value)}</pre>`;
}

const clip = (s) => (s.length > MAX_TEXT ? s.slice(0, MAX_TEXT) + '\n[the console shows the first 1 MiB]' : s);

// The style an HTML result's frame starts with (tables as pandas makes
// them); the result's own comes after it.
const FRAME_STYLE = '<!doctype html><meta charset="utf-8"><style>body{margin:.4rem;font:14px/1.4 system-ui,sans-serif;color:#1b1f24}' +
  'table{border-collapse:collapse}th,td{border:1px solid #d8dee4;padding:.2rem .5rem;text-align:right}th{background:#f6f7f9}</style>';

// HTMLResult shows guest HTML in a frame with sandbox="" (scripts,
// forms, popups, navigating the console: all off; an opaque origin),
// never in the console's document. Its height is a guess from the
// markup (a sandboxed frame cannot be measured), and it can be resized.
function HTMLResult({ value }) {
  const rows = (value.match(/<(tr|br|p|li|h[1-6]|div)\b/gi) || []).length;
  const rem = Math.min(26, Math.max(4, 1.5 + rows * 1.7));
  return html`<iframe class="result-html" data-testid="result-html" sandbox="" referrerpolicy="no-referrer" title="An HTML result (sandboxed)"
    srcdoc=${FRAME_STYLE + clip(value)} style=${{ height: rem + 'rem' }}
    onLoad=${(e) => (e.currentTarget.dataset.loaded = 'true')}></iframe>`;
}

// download saves base64 data as a file named name.
function download(b64, type, name) {
  const bin = atob(b64.replace(/\s+/g, ''));
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  const url = URL.createObjectURL(new Blob([bytes], { type }));
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}
