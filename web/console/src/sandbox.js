// One sandbox's page, in two tabs: the overview (#/sandboxes/ID): its
// terminal (a PTY process over the tty WebSocket), files, processes, the
// commands run so far, open ports, and memory over time; and the Code tab
// (#/sandboxes/ID/code, code.js): cells run in its code interpreter. A
// tab starts when first shown and stays (hidden) while the page is open,
// so switching keeps the terminal's shell and the cells run.
import { html } from 'htm/preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import { api, request, apiURL, getKey, enc, ApiError } from './api.js';
import { useStore } from './store.js';
import { age, ttlLeft, mib, bytes, when, useNow, StateBadge, MemBar, confirm, form, notify, notifyError } from './ui.js';
import { SandboxActions } from './actions.js';
import { CodeTab } from './code.js';

const sbPath = (id) => 'v1/sandboxes/' + enc(id);

// usePoll calls f now and every ms while the page is visible; f gets an
// AbortSignal. Returns [value, error, reload].
export function usePoll(f, ms, deps) {
  const [state, set] = useState({ v: undefined, err: null });
  const [n, bump] = useState(0);
  useEffect(() => {
    const ctl = new AbortController();
    let t;
    const run = async () => {
      if (document.visibilityState === 'visible') {
        try {
          const v = await f(ctl.signal);
          if (!ctl.signal.aborted) set({ v, err: null });
        } catch (e) {
          if (!ctl.signal.aborted && e.name !== 'AbortError') set((s) => ({ v: s.v, err: e }));
        }
      }
      if (!ctl.signal.aborted && ms) t = setTimeout(run, ms);
    };
    run();
    return () => {
      ctl.abort();
      clearTimeout(t);
    };
  }, [...deps, n]);
  return [state.v, state.err, () => bump((x) => x + 1)];
}

export function SandboxPage({ id, tab = 'overview' }) {
  const st = useStore();
  const [opened, setOpened] = useState({ [tab]: true });
  useEffect(() => setOpened((o) => (o[tab] ? o : { ...o, [tab]: true })), [tab]);
  const now = useNow();
  const [info, setInfo] = useState(null);
  const [missing, setMissing] = useState(null);
  const [samples, setSamples] = useState([]);

  // The sandbox itself, and a memory sample, every 3 s.
  useEffect(() => {
    setInfo(null);
    setMissing(null);
    setSamples([]);
    const ctl = new AbortController();
    let t;
    const load = async () => {
      try {
        const sb = await api(sbPath(id), { signal: ctl.signal });
        if (ctl.signal.aborted) return;
        setInfo(sb);
        setMissing(null);
        if (sb.memory) setSamples((s) => [...s.slice(-119), { t: Date.now(), ...sb.memory }]);
      } catch (e) {
        if (ctl.signal.aborted || e.name === 'AbortError') return;
        if (e instanceof ApiError && e.status === 404) setMissing(e.message);
        else notifyError('Cannot read ' + id, e);
      }
      if (!ctl.signal.aborted) t = setTimeout(load, 3000);
    };
    load();
    return () => {
      ctl.abort();
      clearTimeout(t);
    };
  }, [id]);

  // Events about this sandbox (state changes) show at once.
  const live = st.sandboxes.get(id);
  const sb = info && live && live.state !== info.state ? { ...info, ...live, memory: info.memory } : info;

  if (missing) {
    return html`<div class="page" data-testid="not-found">
      <h1>Sandbox not found</h1>
      <p class="error-text">No sandbox <span class="mono">${id}</span> for this key: it was never created, belongs to another key, or is gone (stopped sandboxes are kept for an hour).</p>
      <p class="muted">${missing}</p>
      <p><a class="button" href="#/">Back to the fork tree</a></p>
    </div>`;
  }
  if (!sb) return html`<div class="page"><p class="empty">Loading ${id}…</p></div>`;
  const running = sb.state === 'running';
  return html`<div class="page page-sandbox" data-testid="sandbox-page" data-id=${id}>
    <div class="toolbar">
      <h1><a href="#/" class="crumb">Fork tree</a> / Sandbox <span class="mono">${id}</span></h1>
      <${SandboxActions} sb=${sb} onKilled=${() => (location.hash = '#/')} />
    </div>
    <dl class="facts">
      <div><dt>State</dt><dd><${StateBadge} state=${sb.state} />${sb.stop_reason && html` <span class="muted">(${sb.stop_reason})</span>`}</dd></div>
      <div><dt>Template</dt><dd>${sb.template}</dd></div>
      ${sb.parent_id && html`<div><dt>Forked from</dt><dd><a class="mono" href=${'#/sandboxes/' + sb.parent_id}>${sb.parent_id}</a></dd></div>`}
      ${sb.snapshot_id && html`<div><dt>Snapshot</dt><dd class="mono">${sb.snapshot_id}</dd></div>`}
      <div><dt>Age</dt><dd>${age(sb.created_at, now)}</dd></div>
      <div><dt>TTL left</dt><dd>${ttlLeft(sb, now)}</dd></div>
      <div><dt>Memory</dt><dd><${MemBar} sb=${sb} id=${id} /></dd></div>
      ${sb.volumes && sb.volumes.length > 0 && html`<div><dt>Volumes</dt><dd data-testid="mounts">${sb.volumes.map(
        (v, i) => html`${i > 0 && ', '}<a href=${'#/volumes/' + enc(v.name)} data-testid=${'mount-' + v.name}>${v.name}</a> at <span class="mono">${v.path}</span>${v.read_only && html` <span class="muted">(read-only)</span>`}`,
      )}</dd></div>`}
    </dl>
    ${sb.last_error && html`<p class="error-text" role="alert">${sb.last_error}</p>`}
    <nav class="tabs" aria-label="Views of the sandbox">
      <a href=${'#/sandboxes/' + id} aria-current=${tab === 'overview' ? 'page' : undefined} data-testid="tab-overview">Overview</a>
      <a href=${'#/sandboxes/' + id + '/code'} aria-current=${tab === 'code' ? 'page' : undefined} data-testid="tab-code">Code</a>
    </nav>
    ${(opened.overview || tab === 'overview') && html`<div hidden=${tab !== 'overview'} data-testid="overview">
      ${!running && html`<p class="note note-info">This sandbox is ${sb.state}: terminal, files and processes need it running.</p>`}
      <${Overview} id=${id} sb=${sb} running=${running} samples=${samples} />
    </div>`}
    ${(opened.code || tab === 'code') && html`<section hidden=${tab !== 'code'} class="card card-code" aria-labelledby="h-code">
      <h2 id="h-code" class="sr-only">Code</h2>
      <${CodeTab} id=${id} running=${running} />
    </section>`}
  </div>`;
}

// Overview is the overview tab's cards.
function Overview({ id, sb, running, samples }) {
  return html`<div class="grid">
    <section class="card card-term" aria-labelledby="h-term">
      <h2 id="h-term">Terminal</h2>
      ${running ? html`<${Term} id=${id} />` : html`<p class="muted">Not running.</p>`}
    </section>
    <section class="card" aria-labelledby="h-mem">
      <h2 id="h-mem">Memory over time</h2>
      <${MemChart} samples=${samples} size=${sb.memory_mib} />
    </section>
    <section class="card card-files" aria-labelledby="h-files">
      <h2 id="h-files">Files</h2>
      ${running ? html`<${Files} base=${sbPath(id)} />` : html`<p class="muted">Not running.</p>`}
    </section>
    <section class="card" aria-labelledby="h-ports">
      <h2 id="h-ports">Open ports</h2>
      ${running ? html`<${Ports} id=${id} />` : html`<p class="muted">Not running.</p>`}
    </section>
    <section class="card" aria-labelledby="h-procs">
      <h2 id="h-procs">Processes</h2>
      ${running ? html`<${Processes} id=${id} />` : html`<p class="muted">Not running.</p>`}
    </section>
    <section class="card" aria-labelledby="h-cmds">
      <h2 id="h-cmds">Commands run</h2>
      <${Commands} id=${id} />
    </section>
  </div>`;
}

// ---- terminal

// The shell: bash as a login shell where the sandbox has it (base), else
// sh (tiny, busybox).
const SHELL = 'if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi';

function Term({ id }) {
  const box = useRef();
  const [status, setStatus] = useState('starting');
  const [gen, setGen] = useState(0);
  useEffect(() => {
    const term = new Terminal({
      cursorBlink: true,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
      fontSize: 14,
      theme: { background: '#1d232a', foreground: '#e6edf3', cursor: '#8bd5ff' },
      scrollback: 5000,
    });
    // Shift+Tab leaves the terminal (keyboard users are never trapped in
    // it); every other key, Tab included, goes to the shell.
    term.attachCustomKeyEventHandler((e) => !(e.key === 'Tab' && e.shiftKey));
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(box.current);
    try {
      fit.fit();
    } catch (_) {}
    let ws = null;
    let pid = null;
    let closed = false;
    const enc8 = new TextEncoder();
    // Fitted while shown only: in a hidden tab its box has no size.
    const ro = new ResizeObserver(() => {
      if (!box.current || !box.current.offsetParent) return;
      try {
        fit.fit();
      } catch (_) {}
    });
    ro.observe(box.current);
    term.onResize(({ rows, cols }) => {
      if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', rows, cols }));
    });
    term.onData((d) => {
      if (ws && ws.readyState === WebSocket.OPEN) ws.send(enc8.encode(d));
    });
    (async () => {
      try {
        setStatus('starting');
        const p = await api(sbPath(id) + '/processes', { method: 'POST', json: { cmd: SHELL, pty: { rows: term.rows, cols: term.cols } } });
        pid = p.pid;
        if (closed) {
          api(sbPath(id) + '/processes/' + pid, { method: 'DELETE' }).catch(() => {});
          return;
        }
        const u = new URL(apiURL(sbPath(id) + '/processes/' + pid + '/tty'));
        u.protocol = u.protocol === 'https:' ? 'wss:' : 'ws:';
        ws = new WebSocket(u, ['pandastack.v1', 'bearer.' + getKey()]);
        ws.binaryType = 'arraybuffer';
        ws.onopen = () => {
          setStatus('connected');
          ws.send(JSON.stringify({ type: 'resize', rows: term.rows, cols: term.cols }));
          term.focus();
        };
        ws.onmessage = (ev) => {
          if (typeof ev.data !== 'string') {
            term.write(new Uint8Array(ev.data));
            return;
          }
          const m = JSON.parse(ev.data);
          if (m.type === 'exit') {
            term.write(`\r\n\x1b[2m[the shell exited${m.signal ? ' on ' + m.signal : ' with status ' + m.exit_code}]\x1b[0m\r\n`);
            setStatus('exited');
          } else if (m.type === 'error') {
            term.write(`\r\n\x1b[31m[${m.error.message}]\x1b[0m\r\n`);
          }
        };
        ws.onclose = () => {
          if (!closed) setStatus((s) => (s === 'exited' ? s : 'disconnected'));
        };
      } catch (e) {
        setStatus('failed');
        term.write(`\x1b[31mCannot start a shell: ${e.message}\x1b[0m\r\n`);
      }
    })();
    return () => {
      closed = true;
      ro.disconnect();
      if (ws) ws.close();
      // The shell would run on after the page: end it.
      if (pid != null) api(sbPath(id) + '/processes/' + pid, { method: 'DELETE' }).catch(() => {});
      term.dispose();
    };
  }, [id, gen]);
  return html`<div>
    <div class="term-bar">
      <span class="muted" data-testid="term-status">${status === 'connected' ? 'Connected: a login shell (PTY) in the sandbox' : status}</span>
      ${(status === 'exited' || status === 'disconnected' || status === 'failed') &&
      html`<button onClick=${() => setGen(gen + 1)}>New shell</button>`}
    </div>
    <div class="term" ref=${box} data-testid="terminal" aria-label="Terminal"></div>
  </div>`;
}

// ---- files

function joinPath(dir, name) {
  return (dir.endsWith('/') ? dir : dir + '/') + name;
}

// Files browses, uploads to and downloads from the files routes under base
// (a sandbox's, v1/sandboxes/ID, or a volume's, v1/volumes/NAME: they take
// the same requests), from the folder start.
export function Files({ base, start = '/root' }) {
  const [dir, setDir] = useState(start);
  const [input, setInput] = useState(start);
  const [busy, setBusy] = useState(false);
  const fileRef = useRef();
  const [list, err, reload] = usePoll((signal) => api(base + '/files/list?path=' + enc(dir), { signal }), 0, [base, dir]);
  const go = (d) => {
    setDir(d);
    setInput(d);
  };
  const up = () => go(dir.replace(/\/[^/]+\/?$/, '') || '/');
  const upload = async (e) => {
    const files = [...e.currentTarget.files];
    e.currentTarget.value = '';
    setBusy(true);
    for (const f of files) {
      try {
        await api(base + '/files?path=' + enc(joinPath(dir, f.name)), { method: 'PUT', body: f });
        notify('Uploaded ' + f.name);
      } catch (e) {
        notifyError('Upload of ' + f.name + ' failed', e);
      }
    }
    setBusy(false);
    reload();
  };
  const download = async (ent) => {
    try {
      const res = await request(base + '/files?path=' + enc(ent.path));
      const url = URL.createObjectURL(await res.blob());
      const a = document.createElement('a');
      a.href = url;
      a.download = ent.name;
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) {
      notifyError('Download failed', e);
    }
  };
  const mkdir = async () => {
    const v = await form({ title: 'New folder in ' + dir, fields: [{ name: 'name', label: 'Folder name', required: true }], action: 'Create' });
    if (!v || !v.name) return;
    try {
      await api(base + '/files/mkdir', { method: 'POST', json: { path: joinPath(dir, v.name) } });
      reload();
    } catch (e) {
      notifyError('Create folder failed', e);
    }
  };
  const remove = async (ent) => {
    const ok = await confirm({
      title: 'Delete ' + ent.path + '?',
      body: ent.is_dir ? 'The folder and everything in it are deleted.' : 'The file is deleted.',
      action: 'Delete',
      danger: true,
    });
    if (!ok) return;
    try {
      await api(base + '/files?path=' + enc(ent.path) + (ent.is_dir ? '&recursive=true' : ''), { method: 'DELETE' });
      reload();
    } catch (e) {
      notifyError('Delete failed', e);
    }
  };
  const entries = (list && list.entries) || [];
  return html`<div>
    <form class="pathbar" onSubmit=${(e) => { e.preventDefault(); go(input || '/'); }}>
      <button type="button" onClick=${up} aria-label="Parent folder" disabled=${dir === '/'}>↑</button>
      <label class="sr-only" for="path">Folder</label>
      <input id="path" value=${input} onInput=${(e) => setInput(e.currentTarget.value)} data-testid="path" />
      <button type="submit">Go</button>
    </form>
    <div class="file-actions">
      <label class="button">Upload…<input type="file" multiple class="sr-only" ref=${fileRef} onChange=${upload} data-testid="upload" /></label>
      <button onClick=${mkdir}>New folder…</button>
      <button onClick=${reload}>Refresh</button>
      ${busy && html`<span class="muted">uploading…</span>`}
    </div>
    ${err && html`<p class="error-text" role="alert">${err.message}</p>`}
    <table class="table files" data-testid="files">
      <thead><tr><th>Name</th><th class="num">Size</th><th class="hide-narrow">Modified</th><th><span class="sr-only">Actions</span></th></tr></thead>
      <tbody>
        ${entries.map(
          (ent) => html`<tr key=${ent.name} data-testid=${'file-' + ent.name}>
            <td>${ent.is_dir
              ? html`<button class="link" onClick=${() => go(ent.path)}>📁 ${ent.name}/</button>`
              : html`<span>${ent.name}</span>`}</td>
            <td class="num">${ent.is_dir ? '' : bytes(ent.size)}</td>
            <td class="hide-narrow muted">${when(ent.modified_at)}</td>
            <td class="row-actions">
              ${!ent.is_dir && html`<button class="small" onClick=${() => download(ent)} aria-label=${'Download ' + ent.name}>Download</button>`}
              <button class="small danger" onClick=${() => remove(ent)} aria-label=${'Delete ' + ent.name}>Delete</button>
            </td>
          </tr>`,
        )}
        ${list && entries.length === 0 && html`<tr><td colspan="4" class="muted">Empty folder.</td></tr>`}
      </tbody>
    </table>
  </div>`;
}

// ---- processes, commands, ports

function Processes({ id }) {
  const [list, err, reload] = usePoll((signal) => api(sbPath(id) + '/processes', { signal }), 5000, [id]);
  const kill = async (p) => {
    const ok = await confirm({ title: `End process ${p.pid}?`, body: html`<p class="mono">${p.cmd || (p.argv || []).join(' ')}</p><p>It is killed (SIGKILL) and forgotten.</p>`, action: 'End process', danger: true });
    if (!ok) return;
    try {
      await api(sbPath(id) + '/processes/' + p.pid, { method: 'DELETE' });
      reload();
    } catch (e) {
      notifyError('Ending the process failed', e);
    }
  };
  const procs = (list && list.processes) || [];
  return html`<div>
    ${err && html`<p class="error-text" role="alert">${err.message}</p>`}
    <table class="table" data-testid="processes">
      <thead><tr><th class="num">PID</th><th>Command</th><th>State</th><th><span class="sr-only">Actions</span></th></tr></thead>
      <tbody>
        ${procs.map(
          (p) => html`<tr key=${p.pid}>
            <td class="num">${p.pid}</td>
            <td class="mono clip" title=${p.cmd || (p.argv || []).join(' ')}>${p.pty ? '⌨ ' : ''}${p.cmd || (p.argv || []).join(' ')}</td>
            <td>${p.state}${p.exit_code != null && html` <span class="muted">(${p.exit_code})</span>`}</td>
            <td class="row-actions"><button class="small danger" onClick=${() => kill(p)}>${p.state === 'running' ? 'End' : 'Remove'}</button></td>
          </tr>`,
        )}
        ${list && procs.length === 0 && html`<tr><td colspan="4" class="muted">No background processes.</td></tr>`}
      </tbody>
    </table>
  </div>`;
}

function Commands({ id }) {
  const [list, err] = usePoll((signal) => api(sbPath(id) + '/commands', { signal }), 4000, [id]);
  if (err && err instanceof ApiError && err.unrouted) return html`<p class="muted">This server keeps no command history.</p>`;
  const cmds = ((list && list.commands) || []).slice().reverse();
  return html`<div>
    ${err && html`<p class="error-text" role="alert">${err.message}</p>`}
    <table class="table" data-testid="commands">
      <thead><tr><th>Command</th><th>Kind</th><th class="num">Exit</th><th class="num hide-narrow">Time</th></tr></thead>
      <tbody>
        ${cmds.map(
          (c, i) => html`<tr key=${i}>
            <td class="mono clip" title=${c.command}>${c.command}</td>
            <td>${c.kind}</td>
            <td class="num">${c.exit_code == null
              ? html`<span class="badge state-running">running</span>`
              : html`<span class=${'badge ' + (c.exit_code === 0 ? 'state-ok' : 'state-bad')}>${c.exit_code}</span>`}</td>
            <td class="num hide-narrow muted">${c.duration_ms != null ? (c.duration_ms / 1000).toFixed(2) + ' s' : ''}</td>
          </tr>`,
        )}
        ${list && cmds.length === 0 && html`<tr><td colspan="4" class="muted">No commands yet.</td></tr>`}
      </tbody>
    </table>
  </div>`;
}

function Ports({ id }) {
  const [list, err] = usePoll((signal) => api(sbPath(id) + '/ports', { signal }), 5000, [id]);
  const [signed, setSigned] = useState(null); // {port, url}: the last signed URL
  const open = async (p) => {
    // A browser cannot send the key with a link: a signed URL carries its
    // own credential (for an hour). What the port serves is untrusted: its
    // window gets no handle on this one (noopener) and no Referer. With
    // noopener, window.open answers null whether or not a popup blocker
    // stopped it (the request above may outlast the click's permission),
    // so the URL is also shown as a link.
    try {
      const r = await api(sbPath(id) + '/ports/' + p.port + '/url', { method: 'POST', json: { ttl_seconds: 3600 } });
      setSigned({ port: p.port, url: r.url });
      window.open(r.url, '_blank', 'noopener,noreferrer');
    } catch (e) {
      notifyError('Cannot open port ' + p.port, e);
    }
  };
  const ports = (list && list.ports) || [];
  return html`<div>
    ${err && html`<p class="error-text" role="alert">${err.message}</p>`}
    ${signed && html`<p class="muted port-link" data-testid="port-link">Port ${signed.port}, for an hour, without a key:
      <a href=${signed.url} target="_blank" rel="noopener noreferrer">${signed.url}</a></p>`}
    <ul class="ports" data-testid="ports">
      ${ports.map(
        (p) => html`<li key=${p.port + p.address}>
          <span class="mono">${p.address}:${p.port}</span>
          ${p.address.startsWith('127.') || p.address === '::1'
            ? html`<span class="muted">loopback only: not reachable through the proxy</span>`
            : html`<button class="small" onClick=${() => open(p)}>Open (signed URL)</button>`}
        </li>`,
      )}
      ${list && ports.length === 0 && html`<li class="muted">Nothing listens. Start a server on 0.0.0.0 and it shows here.</li>`}
    </ul>
  </div>`;
}

// ---- memory chart

function MemChart({ samples, size }) {
  const W = 480;
  const H = 140;
  const P = 28;
  if (samples.length < 2) return html`<p class="muted">Sampling every 3 s while this page is open…</p>`;
  const max = Math.max(1, ...samples.map((s) => s.private_mib + s.shared_mib)) * 1.1;
  const t0 = samples[0].t;
  const t1 = samples[samples.length - 1].t;
  const x = (t) => P + ((W - P - 6) * (t - t0)) / Math.max(1, t1 - t0);
  const y = (v) => H - 18 - ((H - 26) * v) / max;
  const line = (f) => samples.map((s) => `${x(s.t).toFixed(1)},${y(f(s)).toFixed(1)}`).join(' ');
  const last = samples[samples.length - 1];
  return html`<figure class="chart">
    <svg viewBox=${`0 0 ${W} ${H}`} role="img" aria-label=${`Memory over the last ${Math.round((t1 - t0) / 1000)} s: now ${mib(last.private_mib)} private, ${mib(last.shared_mib)} shared`}>
      <line x1=${P} x2=${W - 6} y1=${y(0)} y2=${y(0)} class="axis" />
      <line x1=${P} x2=${W - 6} y1=${y(max / 1.1)} y2=${y(max / 1.1)} class="grid-line" />
      <text x="2" y=${y(max / 1.1) + 4} class="tick">${Math.round(max / 1.1)}</text>
      <text x="2" y=${y(0) + 4} class="tick">0</text>
      <text x=${P} y=${H - 3} class="tick">${Math.round((t1 - t0) / 1000)} s ago</text>
      <text x=${W - 6} y=${H - 3} class="tick" text-anchor="end">now</text>
      <polyline points=${line((s) => s.private_mib + s.shared_mib)} class="line-rss" />
      <polyline points=${line((s) => s.pss_mib)} class="line-pss" />
      <polyline points=${line((s) => s.private_mib)} class="line-private" />
    </svg>
    <figcaption>
      <span class="key key-private"></span> private ${mib(last.private_mib)}
      <span class="key key-pss"></span> PSS ${mib(last.pss_mib)}
      <span class="key key-rss"></span> private + shared ${mib(last.private_mib + last.shared_mib)}
      <span class="muted">(MiB; guest ${size} MiB)</span>
    </figcaption>
  </figure>`;
}
