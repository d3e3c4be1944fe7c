// What a user can do to sandboxes and snapshots, each through the REST
// API; destructive ones ask first. Errors become messages, never a blank
// page. Each returns a promise that settles when the request has.
import { html } from 'htm/preact';
import { api, enc } from './api.js';
import { confirm, form, notify, notifyError, dismiss } from './ui.js';
import { noteSandbox, forgetSandbox, noteSnapshot, forgetSnapshot, store } from './store.js';

const sbPath = (id) => 'v1/sandboxes/' + enc(id);

export async function fork(sb) {
  const v = await form({
    title: 'Fork ' + sb.id,
    intro: 'Live copies of the running sandbox: memory, disk and processes as they are now, shared copy-on-write.',
    fields: [{ name: 'count', label: 'Number of children', type: 'number', value: 1, min: 1, max: 64, required: true }],
    action: 'Fork',
  });
  if (!v) return;
  try {
    const r = await api(sbPath(sb.id) + '/fork', { method: 'POST', json: { count: Number(v.count) } });
    let ok = 0;
    for (const c of r.children || []) {
      if (c.sandbox) {
        ok++;
        noteSandbox(c.sandbox);
      } else if (c.error) notify('A child failed: ' + c.error.message, 'error');
    }
    notify(`Forked ${sb.id} into ${ok} (parent paused ${Math.round(r.parent_paused_ms || 0)} ms)`);
  } catch (e) {
    notifyError('Fork failed', e);
  }
}

export async function snapshot(sb) {
  const v = await form({
    title: 'Snapshot ' + sb.id,
    intro: 'Saves the sandbox as it is now; it keeps running. Sandboxes can be created from the snapshot later.',
    fields: [{ name: 'name', label: 'Name (optional)', placeholder: 'after-setup' }],
    action: 'Take snapshot',
  });
  if (!v) return;
  try {
    const s = await api(sbPath(sb.id) + '/snapshots', { method: 'POST', json: v.name ? { name: v.name } : {} });
    noteSnapshot(s);
    notify('Snapshot ' + s.id + ' taken');
  } catch (e) {
    notifyError('Snapshot failed', e);
  }
}

export async function pause(sb) {
  try {
    noteSandbox(await api(sbPath(sb.id) + '/pause', { method: 'POST' }));
    notify(sb.id + ' paused');
  } catch (e) {
    notifyError('Pause failed', e);
  }
}

export async function resume(sb) {
  try {
    noteSandbox(await api(sbPath(sb.id) + '/resume', { method: 'POST' }));
    notify(sb.id + ' resumed');
  } catch (e) {
    notifyError('Resume failed', e);
  }
}

export async function extendTTL(sb) {
  const v = await form({
    title: 'Set the TTL of ' + sb.id,
    intro: 'The sandbox will expire this long from now.',
    fields: [{ name: 'minutes', label: 'Minutes from now', type: 'number', value: 30, min: 1, max: 1440, required: true }],
    action: 'Set TTL',
  });
  if (!v) return;
  try {
    noteSandbox(await api(sbPath(sb.id) + '/ttl', { method: 'PUT', json: { ttl_seconds: Math.round(Number(v.minutes) * 60) } }));
    notify(`${sb.id} now expires in ${v.minutes} min`);
  } catch (e) {
    notifyError('Setting the TTL failed', e);
  }
}

export async function kill(sb) {
  const children = [...store.sandboxes.values()].filter((c) => c.parent_id === sb.id).length;
  const ok = await confirm({
    title: 'Kill ' + sb.id + '?',
    body: html`<p>The sandbox stops now and its memory and disk are freed. This cannot be undone.</p>
      ${children > 0 && html`<p>Its ${children} fork(s) keep running on their own.</p>`}`,
    action: 'Kill sandbox',
    danger: true,
  });
  if (!ok) return false;
  try {
    await api(sbPath(sb.id), { method: 'DELETE' });
    forgetSandbox(sb.id);
    notify(sb.id + ' killed');
    return true;
  } catch (e) {
    notifyError('Kill failed', e);
    return false;
  }
}

export async function deleteSnapshot(s) {
  const ok = await confirm({
    title: 'Delete snapshot ' + s.id + '?',
    body: html`<p>Its saved memory and disk are removed. Sandboxes already created from it keep running.</p>`,
    action: 'Delete snapshot',
    danger: true,
  });
  if (!ok) return;
  try {
    await api('v1/snapshots/' + enc(s.id), { method: 'DELETE' });
    forgetSnapshot(s.id);
    notify('Snapshot ' + s.id + ' deleted');
  } catch (e) {
    notifyError('Delete failed', e);
  }
}

function parseMetadata(text) {
  const out = {};
  for (const line of (text || '').split(/[\n,]/)) {
    const t = line.trim();
    if (!t) continue;
    const i = t.indexOf('=');
    if (i <= 0) throw new Error(`metadata "${t}": write key=value`);
    out[t.slice(0, i).trim()] = t.slice(i + 1).trim();
  }
  return out;
}

// parseVolumes parses "name:/path[:ro]" entries, separated by commas or
// lines, into the API's volumes of a create.
export function parseVolumes(text) {
  const out = [];
  for (const line of (text || '').split(/[\n,]/)) {
    const t = line.trim();
    if (!t) continue;
    const m = t.match(/^([^:\s]+):(\/[^:]*)(?::(ro|rw))?$/);
    if (!m) throw new Error(`volume "${t}": write name:/path or name:/path:ro`);
    out.push(m[3] === 'ro' ? { name: m[1], path: m[2], read_only: true } : { name: m[1], path: m[2] });
  }
  return out;
}

// create asks for a template (or takes from, a snapshot) and creates a
// sandbox. Returns it, or null.
export async function create(from = {}) {
  let templates = [];
  try {
    const r = await api('v1/templates');
    const seen = new Set();
    for (const t of r.templates || []) {
      if (!seen.has(t.name)) {
        seen.add(t.name);
        templates.push(t.name);
      }
    }
  } catch (e) {
    notifyError('Cannot list templates', e);
  }
  const fields = [];
  if (from.snapshot) {
    fields.push({ name: 'source', type: 'select', label: 'Snapshot', value: 'snap:' + from.snapshot.id,
      options: [{ value: 'snap:' + from.snapshot.id, label: `snapshot ${from.snapshot.name || from.snapshot.id}` }] });
  } else {
    const options = [{ value: '', label: 'server default' }, ...templates.map((t) => ({ value: 'tpl:' + t, label: 'template ' + t }))];
    for (const s of store.snapshots.values()) options.push({ value: 'snap:' + s.id, label: `snapshot ${s.name || s.id}` });
    fields.push({ name: 'source', type: 'select', label: 'From', value: from.template ? 'tpl:' + from.template : '', options });
  }
  fields.push({ name: 'ttl', label: 'TTL (minutes)', type: 'number', value: 30, min: 1, max: 1440, required: true });
  fields.push({ name: 'metadata', label: 'Metadata (optional)', placeholder: 'owner=me, task=42', help: 'key=value pairs, separated by commas' });
  fields.push({ name: 'volumes', label: 'Volumes (optional)', placeholder: 'data:/mnt/data, refs:/mnt/refs:ro', help: 'volume:/path pairs (:ro for read-only), separated by commas' });
  const v = await form({ title: 'New sandbox', fields, action: 'Create' });
  if (!v) return null;
  try {
    const body = { ttl_seconds: Math.round(Number(v.ttl) * 60), metadata: parseMetadata(v.metadata) };
    const volumes = parseVolumes(v.volumes);
    if (volumes.length) body.volumes = volumes;
    if (v.source.startsWith('tpl:')) body.template = v.source.slice(4);
    if (v.source.startsWith('snap:')) body.snapshot_id = v.source.slice(5);
    const note = notify('Creating a sandbox…');
    let sb;
    try {
      sb = await api('v1/sandboxes', { method: 'POST', json: body });
    } finally {
      dismiss(note);
    }
    noteSandbox(sb);
    notify('Created ' + sb.id);
    return sb;
  } catch (e) {
    notifyError('Create failed', e);
    return null;
  }
}

// SandboxActions are the buttons for one sandbox, by its state.
export function SandboxActions({ sb, onKilled }) {
  const running = sb.state === 'running';
  const paused = sb.state === 'paused';
  return html`<div class="actions" role="group" aria-label=${'Actions on ' + sb.id}>
    <button onClick=${() => fork(sb)} disabled=${!running} data-testid="act-fork">Fork…</button>
    <button onClick=${() => snapshot(sb)} disabled=${!running} data-testid="act-snapshot">Snapshot…</button>
    ${paused
      ? html`<button onClick=${() => resume(sb)} data-testid="act-resume">Resume</button>`
      : html`<button onClick=${() => pause(sb)} disabled=${!running} data-testid="act-pause">Pause</button>`}
    <button onClick=${() => extendTTL(sb)} disabled=${!running} data-testid="act-ttl">TTL…</button>
    <button class="danger" onClick=${async () => { if ((await kill(sb)) && onKilled) onKilled(); }} data-testid="act-kill">Kill…</button>
  </div>`;
}
