// Volumes: the list of the key's volumes (#/volumes: size and use, what
// mounts each, create, delete) and one volume's page (#/volumes/NAME: its
// facts and its files, browsed, uploaded and downloaded through the
// volume's files routes, which take the sandbox files routes' requests).
import { html } from 'htm/preact';
import { api, enc, ApiError } from './api.js';
import { mib, bytes, when, confirm, form, notify, notifyError } from './ui.js';
import { usePoll, Files } from './sandbox.js';

const volPath = (name) => 'v1/volumes/' + enc(name);

// Use is a volume's used bytes against its size, as a bar.
function Use({ v }) {
  const total = v.size_mib * (1 << 20);
  const pct = total ? Math.min(100, (100 * v.used_bytes) / total) : 0;
  const label = `${bytes(v.used_bytes)} of ${mib(v.size_mib)}`;
  return html`<span class="meter" role="img" aria-label=${label}>
    <span class="meter-track"><span class=${'meter-fill' + (pct > 85 ? ' hot' : '')} style=${{ width: pct + '%' }}></span></span>
    <span class="meter-label">${label}</span>
  </span>`;
}

// Mounts links the sandboxes that mount a volume.
function Mounts({ ids }) {
  if (!ids || ids.length === 0) return html`<span class="muted">none</span>`;
  return ids.map((id, i) => html`${i > 0 && ', '}<a class="mono" href=${'#/sandboxes/' + id}>${id}</a>`);
}

// remove asks, then deletes the volume (forced when sandboxes mount it and
// the user says so). Resolves true when it is gone.
async function remove(v) {
  const mounted = v.mounted_by && v.mounted_by.length > 0;
  const ok = await confirm({
    title: `Delete volume ${v.name}?`,
    body: mounted
      ? html`<p>Its files are deleted. <strong>${v.mounted_by.length} sandbox${v.mounted_by.length > 1 ? 'es' : ''} mount it</strong>
          (<span class="mono">${v.mounted_by.join(', ')}</span>): they will see its files vanish.</p>`
      : 'Its files are deleted.',
    action: mounted ? 'Delete anyway' : 'Delete volume',
    danger: true,
  });
  if (!ok) return false;
  try {
    await api(volPath(v.name) + (mounted ? '?force=true' : ''), { method: 'DELETE' });
    notify('Deleted volume ' + v.name);
    return true;
  } catch (e) {
    notifyError('Delete failed', e);
    return false;
  }
}

export function VolumesPage() {
  const [r, err, reload] = usePoll((signal) => api('v1/volumes', { signal }), 5000, []);
  const vols = (r && r.volumes) || [];
  const create = async () => {
    const v = await form({
      title: 'Create a volume',
      intro: 'A volume is a directory tree that outlives sandboxes: mount it when you create one (panda create --volume NAME:/PATH).',
      fields: [
        { name: 'name', label: 'Name', required: true, placeholder: 'data', help: 'a-z, 0-9, . _ - (up to 63), unique among your volumes' },
        { name: 'size_mib', label: 'Size (MiB)', type: 'number', value: 1024, min: 1 },
      ],
      action: 'Create volume',
    });
    if (!v) return;
    try {
      const vol = await api('v1/volumes', { method: 'POST', json: { name: v.name.trim(), size_mib: Number(v.size_mib) || 1024 } });
      notify('Created volume ' + vol.name);
      reload();
    } catch (e) {
      notifyError('Create refused', e);
    }
  };
  return html`<div class="page" data-testid="volumes-page">
    <div class="toolbar">
      <h1>Volumes</h1>
      <button class="primary" onClick=${create} data-testid="volume-create">New volume…</button>
    </div>
    ${err && html`<p class="note note-error" role="alert">${err instanceof ApiError && err.unrouted ? 'This server has no volumes.' : err.message}</p>`}
    <table class="table" data-testid="volumes">
      <thead><tr><th>Name</th><th>Used</th><th>Mounted by</th><th class="hide-narrow">Branched from</th><th class="hide-narrow">Created</th><th><span class="sr-only">Actions</span></th></tr></thead>
      <tbody>
        ${vols.map(
          (v) => html`<tr key=${v.id} data-testid=${'volume-' + v.name}>
            <td><a href=${'#/volumes/' + enc(v.name)}><strong>${v.name}</strong></a></td>
            <td><${Use} v=${v} /></td>
            <td><${Mounts} ids=${v.mounted_by} /></td>
            <td class="hide-narrow">${v.parent ? html`<a href=${'#/volumes/' + enc(v.parent)}>${v.parent}</a>` : html`<span class="muted">–</span>`}</td>
            <td class="hide-narrow muted">${when(v.created_at)}</td>
            <td class="row-actions">
              <button class="small danger" onClick=${async () => (await remove(v)) && reload()} aria-label=${'Delete ' + v.name}>Delete</button>
            </td>
          </tr>`,
        )}
        ${r && vols.length === 0 && html`<tr><td colspan="6" class="muted">No volumes yet.</td></tr>`}
      </tbody>
    </table>
  </div>`;
}

export function VolumePage({ name }) {
  const [v, err, reload] = usePoll((signal) => api(volPath(name), { signal }), 5000, [name]);
  if (err && err instanceof ApiError && err.status === 404) {
    return html`<div class="page" data-testid="not-found">
      <h1>Volume not found</h1>
      <p class="error-text">No volume <span class="mono">${name}</span> for this key.</p>
      <p><a class="button" href="#/volumes">Back to the volumes</a></p>
    </div>`;
  }
  if (!v) return html`<div class="page">${err ? html`<p class="error-text" role="alert">${err.message}</p>` : html`<p class="empty">Loading ${name}…</p>`}</div>`;
  const promote = async () => {
    const ok = await confirm({
      title: `Promote ${v.name} into ${v.parent}?`,
      body: `The files of ${v.parent} are replaced by this branch's, and ${v.name} is deleted.`,
      action: 'Promote',
      danger: true,
    });
    if (!ok) return;
    try {
      const p = await api(volPath(v.name) + '/promote', { method: 'POST' });
      notify(`Promoted ${v.name} into ${p.name}`);
      location.hash = '#/volumes/' + enc(p.name);
    } catch (e) {
      notifyError('Promote failed', e);
    }
  };
  const resize = async () => {
    const f = await form({
      title: `Grow ${v.name}`,
      fields: [{ name: 'size_mib', label: 'New size (MiB)', type: 'number', value: v.size_mib, min: v.size_mib }],
      action: 'Resize',
    });
    if (!f) return;
    try {
      await api(volPath(v.name), { method: 'PATCH', json: { size_mib: Number(f.size_mib) } });
      reload();
    } catch (e) {
      notifyError('Resize refused', e);
    }
  };
  return html`<div class="page" data-testid="volume-page" data-name=${v.name}>
    <div class="toolbar">
      <h1><a href="#/volumes" class="crumb">Volumes</a> / <span class="mono">${v.name}</span></h1>
      <div class="actions">
        ${v.parent && html`<button onClick=${promote} data-testid="volume-promote">Promote into ${v.parent}…</button>`}
        <button onClick=${resize} data-testid="volume-resize">Resize…</button>
        <button class="danger" onClick=${async () => (await remove(v)) && (location.hash = '#/volumes')} data-testid="volume-delete">Delete…</button>
      </div>
    </div>
    <dl class="facts">
      <div><dt>Id</dt><dd class="mono">${v.id}</dd></div>
      <div><dt>Used</dt><dd><${Use} v=${v} /></dd></div>
      <div><dt>Mounted by</dt><dd data-testid="mounted-by"><${Mounts} ids=${v.mounted_by} /></dd></div>
      ${v.parent && html`<div><dt>Branched from</dt><dd><a href=${'#/volumes/' + enc(v.parent)}>${v.parent}</a></dd></div>`}
      <div><dt>Created</dt><dd>${when(v.created_at)}</dd></div>
    </dl>
    <section class="card card-files" aria-labelledby="h-files">
      <h2 id="h-files">Files</h2>
      <${Files} base=${volPath(v.id)} start="/" />
    </section>
  </div>`;
}
