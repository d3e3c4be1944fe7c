// The fork tree: template → sandbox → forks → forks of forks, snapshots
// under the sandbox they were taken of and sandboxes created from a
// snapshot under it. Built from the store on every change; rendered as a
// flat list of visible rows (collapsed subtrees are not rendered at all,
// and at most ROW_LIMIT rows are), keyboard-navigable as an ARIA tree.
import { html } from 'htm/preact';
import { useMemo, useRef, useState, useEffect } from 'preact/hooks';
import { useStore } from './store.js';
import { age, ttlLeft, mib, bytes, when, useNow, StateBadge, MemBar } from './ui.js';
import { SandboxActions, create, deleteSnapshot } from './actions.js';

const ROW_LIMIT = 400;

function byCreated(a, b) {
  return (a.created || '').localeCompare(b.created || '') || a.key.localeCompare(b.key);
}

// buildTree returns the root nodes (one per template). A node is {key,
// kind, id, item, parentKey, parentID, children, total:{pss, full, n}}.
export function buildTree(sandboxes, snapshots) {
  const nodes = new Map();
  const roots = [];
  const group = (name) => {
    const key = 'tpl:' + name;
    let n = nodes.get(key);
    if (!n) {
      n = { key, kind: 'template', id: name, item: { name }, children: [], parentKey: null, parentID: '' };
      nodes.set(key, n);
      roots.push(n);
    }
    return n;
  };
  for (const sb of sandboxes.values()) {
    nodes.set('sb:' + sb.id, { key: 'sb:' + sb.id, kind: 'sandbox', id: sb.id, item: sb, created: sb.created_at, children: [] });
  }
  for (const s of snapshots.values()) {
    nodes.set('snap:' + s.id, { key: 'snap:' + s.id, kind: 'snapshot', id: s.id, item: s, created: s.created_at, children: [] });
  }
  for (const sb of sandboxes.values()) {
    const n = nodes.get('sb:' + sb.id);
    let parent;
    if (sb.parent_id && sandboxes.has(sb.parent_id)) parent = nodes.get('sb:' + sb.parent_id);
    else if (sb.snapshot_id && snapshots.has(sb.snapshot_id)) parent = nodes.get('snap:' + sb.snapshot_id);
    else parent = group(sb.template || '?');
    n.parentKey = parent.key;
    n.parentID = parent.kind === 'template' ? '' : parent.id;
    n.orphanOf = sb.parent_id && !sandboxes.has(sb.parent_id) ? sb.parent_id : '';
    parent.children.push(n);
  }
  for (const s of snapshots.values()) {
    const n = nodes.get('snap:' + s.id);
    const parent = sandboxes.has(s.sandbox_id) ? nodes.get('sb:' + s.sandbox_id) : group(s.template || '?');
    n.parentKey = parent.key;
    n.parentID = parent.kind === 'template' ? '' : parent.id;
    parent.children.push(n);
  }
  const total = (n) => {
    const t = { pss: 0, full: 0, n: 0 };
    if (n.kind === 'sandbox') {
      t.n = 1;
      const m = n.item.memory;
      if (m) {
        t.pss = m.pss_mib;
        t.full = m.private_mib + m.shared_mib;
      }
    }
    n.children.sort(byCreated);
    for (const c of n.children) {
      const ct = total(c);
      t.pss += ct.pss;
      t.full += ct.full;
      t.n += ct.n;
    }
    n.total = t;
    return t;
  };
  roots.sort((a, b) => a.id.localeCompare(b.id));
  roots.forEach(total);
  return { roots, nodes };
}

function matches(n, q) {
  if (n.kind === 'template') return n.id.toLowerCase().includes(q);
  const it = n.item;
  if (n.id.includes(q) || (it.name || '').toLowerCase().includes(q) || (it.state || '').includes(q)) return true;
  for (const [k, v] of Object.entries(it.metadata || {})) {
    if (`${k}=${v}`.toLowerCase().includes(q)) return true;
  }
  return false;
}

// visibleRows flattens the tree: collapsed nodes hide their subtrees; a
// search shows the matching nodes and their ancestors, expanded.
function visibleRows(roots, collapsed, q) {
  const rows = [];
  let keep = null;
  if (q) {
    keep = new Set();
    const mark = (n, path) => {
      let any = matches(n, q);
      for (const c of n.children) any = mark(c, path) || any;
      if (any) keep.add(n.key);
      return any;
    };
    roots.forEach((r) => mark(r));
  }
  const walk = (n, depth) => {
    if (keep && !keep.has(n.key)) return;
    const open = keep ? true : !collapsed.has(n.key);
    rows.push({ n, depth, open, hit: keep ? matches(n, q) : false });
    if (open) for (const c of n.children) walk(c, depth + 1);
  };
  roots.forEach((r) => walk(r, 1));
  return rows;
}

function Savings({ t }) {
  if (!t.full) return html`<span class="muted">no running sandboxes</span>`;
  const x = t.full / Math.max(t.pss, 0.1);
  return html`<span data-testid="savings" title="PSS counts each shared page once, split among the sandboxes that map it; full copies would each hold all of their pages"><strong>${mib(t.pss)}</strong> in use (PSS) vs <strong>${mib(t.full)}</strong> as full copies${x >= 1.05 ? html` — <strong>${x.toFixed(1)}×</strong> less` : ''}</span>`;
}

function label(n) {
  if (n.kind === 'template') return html`<span class="kind kind-template">template</span> <span class="name">${n.id}</span>`;
  if (n.kind === 'snapshot') {
    return html`<span class="kind kind-snapshot">snapshot</span> <span class="mono">${n.id}</span>${n.item.name && html` <span class="muted">${n.item.name}</span>`}`;
  }
  const sb = n.item;
  const kind = sb.parent_id ? 'fork' : sb.snapshot_id ? 'restored' : 'sandbox';
  return html`<span class=${'kind kind-' + kind}>${kind}</span> <a class="mono" href=${'#/sandboxes/' + n.id} tabindex="-1">${n.id}</a>`;
}

function Row({ r, now, selected, focused, onSelect, onToggle }) {
  const n = r.n;
  const it = n.item;
  const has = n.children.length > 0;
  return html`<div role="treeitem" aria-level=${r.depth} aria-expanded=${has ? String(r.open) : undefined}
      aria-selected=${String(selected)} tabindex=${focused ? 0 : -1} id=${'row-' + n.key.replace(':', '-')}
      class=${'row row-' + n.kind + (selected ? ' selected' : '') + (r.hit ? ' hit' : '')}
      data-testid="node" data-id=${n.id} data-kind=${n.kind} data-parent=${n.parentID || ''} data-state=${it.state || ''}
      style=${{ '--depth': r.depth - 1 }} onClick=${() => onSelect(n)}>
    <span class="cell cell-name">
      ${has
        ? html`<button class="toggle" tabindex="-1" aria-hidden="true" onClick=${(e) => { e.stopPropagation(); onToggle(n); }}>${r.open ? '▾' : '▸'}</button>`
        : html`<span class="toggle-space"></span>`}
      ${label(n)}
      ${!r.open && has && html` <span class="muted count">+${n.children.length}</span>`}
    </span>
    ${n.kind === 'sandbox'
      ? html`<span class="cell cell-state"><${StateBadge} state=${it.state} /></span>
          <span class="cell cell-age" title=${'created ' + when(it.created_at)}>${age(it.created_at, now)}</span>
          <span class="cell cell-ttl" data-testid="ttl" title="TTL left">${ttlLeft(it, now)}</span>
          <span class="cell cell-mem"><${MemBar} sb=${it} id=${n.id} /></span>`
      : n.kind === 'snapshot'
        ? html`<span class="cell cell-state"><span class="badge state-snapshot">${it.stored || 'saved'}</span></span>
            <span class="cell cell-age">${age(it.created_at, now)}</span>
            <span class="cell cell-ttl"></span>
            <span class="cell cell-mem muted">${bytes(it.size_bytes)} on disk</span>`
        : html`<span class="cell cell-sum"><span class="muted">${n.total.n} sandbox${n.total.n === 1 ? '' : 'es'} ·</span> <${Savings} t=${n.total} /></span>`}
  </div>`;
}

function Detail({ n, now, onClose }) {
  if (!n) {
    return html`<aside class="detail" aria-label="Details"><p class="muted">Select a node to see its details and act on it
      (arrow keys move, Enter opens a sandbox's page).</p></aside>`;
  }
  const it = n.item;
  let body;
  if (n.kind === 'template') {
    body = html`<h2>Template ${n.id}</h2>
      <p>${n.total.n} running or paused sandbox${n.total.n === 1 ? '' : 'es'} below it.</p>
      <p><${Savings} t=${n.total} /></p>
      <div class="actions"><button class="primary" onClick=${() => create({ template: n.id.replace(/:\d+$/, '') })}>New sandbox from ${n.id}…</button></div>`;
  } else if (n.kind === 'snapshot') {
    body = html`<h2>Snapshot <span class="mono">${n.id}</span></h2>
      <dl class="kv">
        ${it.name && html`<dt>Name</dt><dd>${it.name}</dd>`}
        <dt>Taken of</dt><dd><a class="mono" href=${'#/sandboxes/' + it.sandbox_id}>${it.sandbox_id}</a></dd>
        <dt>Template</dt><dd>${it.template}</dd>
        <dt>Shape</dt><dd>${it.memory_mib} MiB, ${it.vcpus} vCPU</dd>
        <dt>Size</dt><dd>${bytes(it.size_bytes)}</dd>
        <dt>Stored</dt><dd>${it.stored || '–'}${it.store_error && html` <span class="error-text">(${it.store_error})</span>`}</dd>
        <dt>Taken</dt><dd>${when(it.created_at)} (${age(it.created_at, now)} ago)</dd>
      </dl>
      <div class="actions">
        <button class="primary" onClick=${() => create({ snapshot: it })}>New sandbox from it…</button>
        <button class="danger" onClick=${() => deleteSnapshot(it)} data-testid="act-delete-snapshot">Delete…</button>
      </div>`;
  } else {
    const m = it.memory;
    body = html`<h2>Sandbox <a class="mono" href=${'#/sandboxes/' + n.id}>${n.id}</a></h2>
      <dl class="kv">
        <dt>State</dt><dd><${StateBadge} state=${it.state} />${it.last_error && html` <span class="error-text">${it.last_error}</span>`}</dd>
        <dt>Template</dt><dd>${it.template} (${it.memory_mib} MiB, ${it.vcpus} vCPU)</dd>
        ${it.parent_id && html`<dt>Forked from</dt><dd><a class="mono" href=${'#/sandboxes/' + it.parent_id}>${it.parent_id}</a>${n.orphanOf && ' (gone)'}</dd>`}
        ${it.snapshot_id && html`<dt>From snapshot</dt><dd class="mono">${it.snapshot_id}</dd>`}
        <dt>Host</dt><dd>${it.host_id}</dd>
        <dt>Age</dt><dd>${age(it.created_at, now)}</dd>
        <dt>TTL left</dt><dd>${ttlLeft(it, now)}</dd>
        <dt>Memory</dt><dd>${m ? html`${mib(m.private_mib)} private, ${mib(m.shared_mib)} shared, ${mib(m.pss_mib)} PSS` : '–'}</dd>
        ${Object.keys(it.metadata || {}).length > 0 &&
        html`<dt>Metadata</dt><dd>${Object.entries(it.metadata).map(([k, v]) => html`<span class="tag">${k}=${v}</span> `)}</dd>`}
        ${n.children.length > 0 && html`<dt>Subtree</dt><dd><${Savings} t=${n.total} /></dd>`}
      </dl>
      <p><a class="button primary" href=${'#/sandboxes/' + n.id}>Open terminal and files</a></p>
      <${SandboxActions} sb=${it} onKilled=${onClose} />`;
  }
  return html`<aside class="detail" aria-label="Details" data-testid="detail">${body}</aside>`;
}

export function TreePage() {
  const st = useStore();
  const now = useNow();
  const [q, setQ] = useState('');
  const [collapsed, setCollapsed] = useState(() => new Set());
  const [sel, setSel] = useState('');
  const [limit, setLimit] = useState(ROW_LIMIT);
  const treeRef = useRef();
  const { roots, nodes } = useMemo(() => buildTree(st.sandboxes, st.snapshots), [st.version]);
  const rows = useMemo(() => visibleRows(roots, collapsed, q.trim().toLowerCase()), [roots, collapsed, q]);
  const selected = nodes.get(sel) || null;
  let focusIdx = rows.findIndex((r) => r.n.key === sel);
  if (focusIdx < 0) focusIdx = 0;

  const all = { pss: 0, full: 0, n: 0 };
  for (const r of roots) {
    all.pss += r.total.pss;
    all.full += r.total.full;
    all.n += r.total.n;
  }

  const toggle = (n) => {
    const c = new Set(collapsed);
    if (c.has(n.key)) c.delete(n.key);
    else c.add(n.key);
    setCollapsed(c);
  };
  const focusRow = (i) => {
    const r = rows[Math.max(0, Math.min(rows.length - 1, i))];
    if (!r) return;
    setSel(r.n.key);
    requestAnimationFrame(() => document.getElementById('row-' + r.n.key.replace(':', '-'))?.focus());
  };
  const onKey = (e) => {
    const r = rows[focusIdx];
    switch (e.key) {
      case 'ArrowDown': focusRow(focusIdx + 1); break;
      case 'ArrowUp': focusRow(focusIdx - 1); break;
      case 'Home': focusRow(0); break;
      case 'End': focusRow(rows.length - 1); break;
      case 'ArrowRight':
        if (r && r.n.children.length && !r.open) toggle(r.n);
        else focusRow(focusIdx + 1);
        break;
      case 'ArrowLeft':
        if (r && r.n.children.length && r.open && !q) toggle(r.n);
        else if (r && r.n.parentKey) focusRow(rows.findIndex((x) => x.n.key === r.n.parentKey));
        break;
      case 'Enter':
        if (r && r.n.kind === 'sandbox') location.hash = '#/sandboxes/' + r.n.id;
        else if (r) setSel(r.n.key);
        break;
      default:
        return;
    }
    e.preventDefault();
  };
  const expandAll = () => setCollapsed(new Set());
  const collapseAll = () => setCollapsed(new Set([...nodes.values()].filter((n) => n.children.length && n.kind !== 'template').map((n) => n.key)));

  return html`<div class="page page-tree">
    <div class="toolbar">
      <h1>Fork tree</h1>
      <div class="summary" data-testid="summary">${all.n} sandbox${all.n === 1 ? '' : 'es'}, ${st.snapshots.size} snapshot${st.snapshots.size === 1 ? '' : 's'} · <${Savings} t=${all} /></div>
      <div class="legend" aria-hidden="true"><span><i class="l-private"></i>private: its own pages</span><span><i class="l-shared"></i>shared with its template or parent</span></div>
      <div class="toolbar-actions">
        <label class="sr-only" for="search">Search by id, name or metadata</label>
        <input id="search" type="search" placeholder="Search id, metadata (k=v)…" value=${q} onInput=${(e) => setQ(e.currentTarget.value)} data-testid="search" />
        <button onClick=${expandAll} disabled=${!!q}>Expand all</button>
        <button onClick=${collapseAll} disabled=${!!q}>Collapse</button>
        <button class="primary" onClick=${() => create()} data-testid="new-sandbox">New sandbox…</button>
      </div>
    </div>
    <div class="tree-layout">
      <div class="tree-wrap">
        <div class="row row-head" aria-hidden="true">
          <span class="cell cell-name">Node</span><span class="cell cell-state">State</span>
          <span class="cell cell-age">Age</span><span class="cell cell-ttl">TTL left</span><span class="cell cell-mem">Memory</span>
        </div>
        <div role="tree" aria-label="Sandboxes and snapshots" class="tree" ref=${treeRef} onKeyDown=${onKey} data-testid="tree">
          ${rows.slice(0, limit).map((r, i) => html`<${Row} key=${r.n.key} r=${r} now=${now} selected=${r.n.key === sel} focused=${i === focusIdx}
            onSelect=${(n) => setSel(n.key)} onToggle=${toggle} />`)}
        </div>
        ${rows.length > limit && html`<p><button onClick=${() => setLimit(limit + ROW_LIMIT)}>Show ${Math.min(ROW_LIMIT, rows.length - limit)} more of ${rows.length - limit}</button></p>`}
        ${!st.loaded && html`<p class="empty">Loading…</p>`}
        ${st.loaded && rows.length === 0 &&
        html`<p class="empty" data-testid="empty">${q ? 'Nothing matches “' + q + '”.' : 'No sandboxes yet. Create one with “New sandbox…”.'}</p>`}
      </div>
      <${Detail} n=${selected} now=${now} onClose=${() => setSel('')} />
    </div>
  </div>`;
}
