// Fleet and admin pages: hosts (capacity and load), templates (their
// versions, builds and build logs), API keys (admin keys only).
import { html } from 'htm/preact';
import { useEffect, useState } from 'preact/hooks';
import { api, request, ndjson, enc, ApiError } from './api.js';
import { mib, bytes, when, confirm, form, show, notify, notifyError } from './ui.js';
import { create } from './actions.js';

function useLoad(f, deps, every = 0) {
  const [s, set] = useState({ v: null, err: null });
  const [n, bump] = useState(0);
  useEffect(() => {
    let live = true;
    let t;
    const run = () =>
      f().then(
        (v) => live && set({ v, err: null }),
        (err) => live && set((s) => ({ v: s.v, err })),
      ).finally(() => {
        if (live && every) t = setTimeout(run, every);
      });
    run();
    return () => {
      live = false;
      clearTimeout(t);
    };
  }, [...deps, n]);
  return [s.v, s.err, () => bump((x) => x + 1)];
}

function Forbidden({ err }) {
  if (!err) return null;
  if (err instanceof ApiError && err.status === 403) {
    return html`<p class="note note-error" role="alert" data-testid="forbidden">This page needs an admin key: ${err.message}</p>`;
  }
  return html`<p class="note note-error" role="alert">${err.message}</p>`;
}

function Meter({ used, total, label }) {
  const pct = total ? Math.min(100, (100 * used) / total) : 0;
  return html`<span class="meter" role="img" aria-label=${label}>
    <span class="meter-track"><span class=${'meter-fill' + (pct > 85 ? ' hot' : '')} style=${{ width: pct + '%' }}></span></span>
    <span class="meter-label">${label}</span>
  </span>`;
}

export function HostsPage() {
  const [r, err] = useLoad(() => api('v1/hosts'), [], 5000);
  const hosts = (r && r.hosts) || [];
  return html`<div class="page">
    <div class="toolbar"><h1>Hosts</h1></div>
    <${Forbidden} err=${err} />
    <table class="table" data-testid="hosts">
      <thead><tr><th>Host</th><th>State</th><th class="num">Sandboxes</th><th>Memory given to guests</th><th>Host memory in use by sandboxes</th><th class="hide-narrow">Disk free</th></tr></thead>
      <tbody>
        ${hosts.map(
          (h) => html`<tr key=${h.id}>
            <td><strong>${h.id}</strong> <span class="muted">${h.accel} · ${h.vcpus} vCPU</span></td>
            <td><span class=${'badge state-' + h.state}>${h.state}</span></td>
            <td class="num">${h.sandboxes}</td>
            <td><${Meter} used=${h.memory_allocated_mib} total=${h.memory_mib}
              label=${`${mib(h.memory_allocated_mib)} of ${mib(h.memory_mib)}`} /></td>
            <td><${Meter} used=${h.sandboxes_pss_mib} total=${h.memory_mib}
              label=${`${mib(h.sandboxes_pss_mib)} PSS (${mib(h.sandboxes_private_mib)} private), ${mib(h.memory_available_mib)} available`} /></td>
            <td class="hide-narrow">${h.disk_mib ? `${mib(h.disk_free_mib)} of ${mib(h.disk_mib)}` : '–'}</td>
          </tr>`,
        )}
      </tbody>
    </table>
    <p class="muted">Guest memory given is what sandboxes were promised; in use (PSS) is what they really cost the host, with shared pages counted once.</p>
  </div>`;
}

// BuildLog follows GET /v1/templates/builds/{id}/logs.
function BuildLog({ id, onDone }) {
  const [lines, setLines] = useState([]);
  const [status, setStatus] = useState(null);
  const [err, setErr] = useState(null);
  useEffect(() => {
    const ctl = new AbortController();
    setLines([]);
    setStatus(null);
    setErr(null);
    (async () => {
      try {
        const res = await request('v1/templates/builds/' + enc(id) + '/logs', { signal: ctl.signal });
        await ndjson(res, (m) => {
          if (m.line != null) setLines((l) => [...l, m.line]);
          else if (m.status) setStatus(m);
        });
        onDone && onDone();
      } catch (e) {
        if (e.name !== 'AbortError') setErr(e);
      }
    })();
    return () => ctl.abort();
  }, [id]);
  return html`<div class="card">
    <h2>Build <span class="mono">${id}</span> ${status && html`<span class=${'badge ' + (status.status === 'succeeded' ? 'state-ok' : 'state-bad')}>${status.status}</span>`}</h2>
    ${err && html`<p class="error-text" role="alert">${err.message}</p>`}
    <pre class="log" data-testid="build-log" tabindex="0" aria-label="Build log">${lines.join('\n') || 'waiting for the build…'}</pre>
    ${status && status.error && html`<p class="error-text">${status.error}</p>`}
  </div>`;
}

export function TemplatesPage({ admin }) {
  const [r, err, reload] = useLoad(() => api('v1/templates'), []);
  const [build, setBuild] = useState('');
  const [lookup, setLookup] = useState('');
  const startBuild = async () => {
    const v = await form({
      title: 'Build a template',
      intro: 'From a container image in a registry, or from a Dockerfile (FROM an image, base or tiny).',
      fields: [
        { name: 'name', label: 'Name', required: true, placeholder: 'myapp' },
        { name: 'from_image', label: 'Image (or leave empty and give a Dockerfile)', placeholder: 'registry.example.com/myapp:1.0' },
        { name: 'dockerfile', label: 'Dockerfile', type: 'textarea', placeholder: 'FROM tiny\nRUN echo hi > /hello' },
      ],
      action: 'Start build',
    });
    if (!v) return;
    const body = { name: v.name };
    if (v.from_image) body.from_image = v.from_image;
    if (v.dockerfile) body.dockerfile = v.dockerfile;
    try {
      const b = await api('v1/templates', { method: 'POST', json: body });
      setBuild(b.build_id);
      notify('Build ' + b.build_id + ' started');
    } catch (e) {
      notifyError('Build refused', e);
    }
  };
  const del = async (t) => {
    const ok = await confirm({ title: `Delete template ${t.name}?`, body: 'Every version and every baked shape of it is removed.', action: 'Delete template', danger: true });
    if (!ok) return;
    try {
      await api('v1/templates/' + enc(t.name), { method: 'DELETE' });
      reload();
    } catch (e) {
      notifyError('Delete failed', e);
    }
  };
  const [br, berr] = useLoad(() => api('v1/templates/builds'), [build], 5000);
  const builds = (br && br.builds) || [];
  const tpls = (r && r.templates) || [];
  return html`<div class="page">
    <div class="toolbar">
      <h1>Templates</h1>
      <div class="toolbar-actions">
        <button class="primary" onClick=${startBuild}>Build a template…</button>
        <button onClick=${reload}>Refresh</button>
      </div>
    </div>
    <${Forbidden} err=${err} />
    <table class="table" data-testid="templates">
      <thead><tr><th>Name</th><th>Shape</th><th>State</th><th class="hide-narrow">Source</th><th class="hide-narrow">Baked</th><th><span class="sr-only">Actions</span></th></tr></thead>
      <tbody>
        ${tpls.map(
          (t) => html`<tr key=${t.name + t.memory_mib + t.vcpus}>
            <td><strong>${t.name}</strong>${t.version && html` <span class="muted">v${t.version}${(t.versions || []).some((v) => v.version === t.version && v.published) ? ' · published' : ''}</span>`}</td>
            <td>${t.memory_mib} MiB, ${t.vcpus} vCPU</td>
            <td><span class=${'badge state-' + t.state}>${t.state}</span>${t.stale_reason && html` <span class="muted">${t.stale_reason}</span>`}</td>
            <td class="hide-narrow mono clip" title=${t.from_image || ''}>${t.from_image || 'built in'}${t.disk_bytes ? html` <span class="muted">(${bytes(t.disk_bytes)})</span>` : ''}</td>
            <td class="hide-narrow muted">${t.baked_at ? when(t.baked_at) + (t.bake_ms ? ` in ${(t.bake_ms / 1000).toFixed(1)} s` : '') : '–'}</td>
            <td class="row-actions">
              <button class="small" onClick=${() => create({ template: t.name })}>New sandbox…</button>
              ${t.from_image && html`<button class="small danger" onClick=${() => del(t)}>Delete…</button>`}
            </td>
          </tr>`,
        )}
      </tbody>
    </table>
    <h2>Builds</h2>
    ${berr && !(berr instanceof ApiError && berr.status === 501) && html`<p class="error-text" role="alert">${berr.message}</p>`}
    ${berr && berr instanceof ApiError && berr.status === 501 && html`<p class="muted">This server does not build templates from images.</p>`}
    <table class="table" data-testid="builds">
      <thead><tr><th>Template</th><th>Status</th><th class="hide-narrow">From</th><th class="hide-narrow">Started</th><th><span class="sr-only">Actions</span></th></tr></thead>
      <tbody>
        ${builds.map(
          (b) => html`<tr key=${b.build_id} data-build=${b.build_id}>
            <td><strong>${b.name}</strong>${b.version ? html` <span class="muted">v${b.version}</span>` : ''}</td>
            <td><span class=${'badge ' + (b.status === 'succeeded' ? 'state-ok' : b.status === 'failed' ? 'state-bad' : 'state-running')}>${b.status}</span>${b.error && html` <span class="muted">${b.error}</span>`}</td>
            <td class="hide-narrow mono clip" title=${b.from_image || ''}>${b.from_image || 'Dockerfile'}</td>
            <td class="hide-narrow muted">${when(b.created_at)}</td>
            <td class="row-actions"><button class="small" onClick=${() => setBuild(b.build_id)} aria-label=${'Show the log of build ' + b.build_id}>Log</button></td>
          </tr>`,
        )}
        ${br && builds.length === 0 && html`<tr><td colspan="5" class="muted">No builds in the last hour.</td></tr>`}
      </tbody>
    </table>
    <form class="inline-form" onSubmit=${(e) => { e.preventDefault(); if (lookup.trim()) setBuild(lookup.trim()); }}>
      <label for="build-id">Follow a build by id</label>
      <input id="build-id" value=${lookup} onInput=${(e) => setLookup(e.currentTarget.value)} placeholder="build id" />
      <button type="submit">Show log</button>
    </form>
    ${build && html`<${BuildLog} id=${build} onDone=${reload} />`}
    ${!admin && html`<p class="muted">Baking and publishing templates need an admin key.</p>`}
  </div>`;
}

export function KeysPage() {
  const [r, err, reload] = useLoad(() => api('v1/keys'), []);
  const add = async () => {
    const v = await form({
      title: 'Create an API key',
      intro: 'Quotas of 0 mean the server\u2019s defaults.',
      fields: [
        { name: 'name', label: 'Name', required: true, placeholder: 'ci' },
        { name: 'admin', label: 'Admin key (can manage keys and templates)', type: 'checkbox' },
        { name: 'max_sandboxes', label: 'Max sandboxes', type: 'number', value: 0, min: 0 },
        { name: 'max_memory_mib', label: 'Max guest memory (MiB)', type: 'number', value: 0, min: 0 },
        { name: 'max_vcpus', label: 'Max vCPUs', type: 'number', value: 0, min: 0 },
        { name: 'max_disk_mib', label: 'Max disk (MiB)', type: 'number', value: 0, min: 0 },
      ],
      action: 'Create key',
    });
    if (!v) return;
    try {
      const k = await api('v1/keys', {
        method: 'POST',
        json: { name: v.name, admin: v.admin, max_sandboxes: +v.max_sandboxes || 0, max_memory_mib: +v.max_memory_mib || 0, max_vcpus: +v.max_vcpus || 0, max_disk_mib: +v.max_disk_mib || 0 },
      });
      reload();
      await show({
        title: 'Key ' + k.name + ' created',
        body: html`<p>Copy the secret now: it is shown only once (the server keeps a hash).</p>
          <input class="secret mono" readonly value=${k.key} data-testid="new-key" aria-label="The new key's secret" onFocus=${(e) => e.currentTarget.select()} />`,
      });
    } catch (e) {
      notifyError('Create key failed', e);
    }
  };
  const revoke = async (k) => {
    const ok = await confirm({
      title: `Revoke key ${k.name}?`,
      body: html`<p>Its requests answer 401 from now on and <strong>its sandboxes are killed</strong>. This cannot be undone.</p>`,
      action: 'Revoke key',
      danger: true,
    });
    if (!ok) return;
    try {
      await api('v1/keys/' + enc(k.id), { method: 'DELETE' });
      notify('Key ' + k.name + ' revoked');
      reload();
    } catch (e) {
      notifyError('Revoke failed', e);
    }
  };
  const q = (v, unit = '') => (v ? v + unit : 'default');
  const keys = (r && r.keys) || [];
  return html`<div class="page">
    <div class="toolbar">
      <h1>API keys</h1>
      <div class="toolbar-actions"><button class="primary" onClick=${add} data-testid="new-key-button">New key…</button></div>
    </div>
    <${Forbidden} err=${err} />
    <table class="table" data-testid="keys">
      <thead><tr><th>Name</th><th>Prefix</th><th>Quotas: sandboxes, memory, vCPUs, disk</th><th class="hide-narrow">Created</th><th><span class="sr-only">Actions</span></th></tr></thead>
      <tbody>
        ${keys.map(
          (k) => html`<tr key=${k.id} class=${k.revoked ? 'revoked' : ''}>
            <td><strong>${k.name}</strong> ${k.admin && html`<span class="badge state-admin">admin</span>`} ${k.revoked && html`<span class="badge state-stopped">revoked</span>`}</td>
            <td class="mono">${k.prefix}…</td>
            <td>${q(k.max_sandboxes)}, ${q(k.max_memory_mib, ' MiB')}, ${q(k.max_vcpus)}, ${q(k.max_disk_mib, ' MiB')}</td>
            <td class="hide-narrow muted">${when(k.created_at)}</td>
            <td class="row-actions">${!k.revoked && html`<button class="small danger" onClick=${() => revoke(k)}>Revoke…</button>`}</td>
          </tr>`,
        )}
      </tbody>
    </table>
  </div>`;
}
