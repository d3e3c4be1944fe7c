// PandaStack's web console: sign in with an API key, then the fork tree,
// sandbox pages, volumes, hosts, templates and keys, all through the public REST
// API with that key. Routes are in the URL's fragment (#/sandboxes/ID).
import { html, render } from 'htm/preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import { api, getKey, setKey, setUnauthorizedHandler, ApiError } from './api.js';
import { start, useStore } from './store.js';
import { Notes, Dialogs, clearNotes, confirm, notify, notifyError } from './ui.js';
import { TreePage } from './tree.js';
import { SandboxPage } from './sandbox.js';
import { HostsPage, TemplatesPage, KeysPage } from './admin.js';
import { VolumesPage, VolumePage } from './volumes.js';

const Logo = () => html`<svg class="logo" viewBox="0 0 32 32" width="26" height="26" aria-hidden="true">
  <circle cx="16" cy="17" r="12" fill="#fff" /><circle cx="7" cy="7" r="5" fill="#1b1f24" /><circle cx="25" cy="7" r="5" fill="#1b1f24" />
  <ellipse cx="11.5" cy="16" rx="3.2" ry="4" fill="#1b1f24" /><ellipse cx="20.5" cy="16" rx="3.2" ry="4" fill="#1b1f24" />
  <circle cx="12" cy="16" r="1.2" fill="#fff" /><circle cx="20" cy="16" r="1.2" fill="#fff" /><ellipse cx="16" cy="22.5" rx="2.2" ry="1.5" fill="#1b1f24" />
</svg>`;

// decode is decodeURIComponent, or s itself when it is no valid encoding
// (a hand-typed URL).
function decode(s) {
  try {
    return decodeURIComponent(s);
  } catch (_) {
    return s;
  }
}

function useHash() {
  const [h, set] = useState(location.hash);
  useEffect(() => {
    const f = () => set(location.hash);
    addEventListener('hashchange', f);
    return () => removeEventListener('hashchange', f);
  }, []);
  return h;
}

// checkKey signs in with key: any authenticated request tells a valid
// key; GET /v1/keys tells an admin key (403 for others).
async function checkKey(key) {
  await api('v1/hosts', { key });
  try {
    await api('v1/keys', { key });
    return { admin: true };
  } catch (e) {
    if (e instanceof ApiError && e.status === 403) return { admin: false };
    throw e;
  }
}

function SignIn({ onSignedIn, message }) {
  const [key, setK] = useState('');
  const [err, setErr] = useState(message || '');
  const [busy, setBusy] = useState(false);
  const submit = async (e) => {
    e.preventDefault();
    const k = key.trim();
    if (!k) {
      setErr('Enter an API key.');
      return;
    }
    setBusy(true);
    setErr('');
    try {
      const who = await checkKey(k);
      onSignedIn(k, who);
    } catch (e) {
      setErr(e.status === 401 ? 'That API key is not valid: ' + e.message + '.' : e.message);
    } finally {
      setBusy(false);
    }
  };
  return html`<main class="signin" id="main">
    <form onSubmit=${submit} data-testid="signin">
      <h1><${Logo} /> PandaStack</h1>
      <p>Sign in with an API key. The console shows what that key may see, through the REST API.</p>
      ${err && html`<p class="note note-error" role="alert" data-testid="signin-error">${err}</p>`}
      <div class="field">
        <label for="key">API key</label>
        <input id="key" name="key" type="password" autocomplete="off" spellcheck="false" value=${key}
          onInput=${(e) => setK(e.currentTarget.value)} placeholder="panda_…" autofocus data-testid="key" />
        <small>Kept in this tab only (session storage), never in a cookie. The admin key of <code>panda up</code> is in <code>DATA_DIR/admin.key</code>.</small>
      </div>
      <button type="submit" class="primary" disabled=${busy} data-testid="signin-submit">${busy ? 'Signing in…' : 'Sign in'}</button>
    </form>
  </main>`;
}

function Conn() {
  const st = useStore();
  const text = { connecting: 'Connecting…', live: 'Live', reconnecting: 'Reconnecting…', polling: 'Refreshing every few seconds' }[st.conn];
  return html`<span class=${'conn conn-' + st.conn} data-testid="conn" data-conn=${st.conn} role="status"
    title=${st.lastError || 'The event stream of the API'}>${text}</span>`;
}

function Shell({ admin, onSignOut }) {
  const hash = useHash();
  const path = hash.replace(/^#/, '') || '/';
  let page;
  let m;
  if (path === '/') page = html`<${TreePage} />`;
  else if ((m = path.match(/^\/sandboxes\/([a-z0-9]+)(?:\/(code))?$/))) page = html`<${SandboxPage} id=${m[1]} key=${m[1]} tab=${m[2] || 'overview'} />`;
  else if (path === '/volumes') page = html`<${VolumesPage} />`;
  else if ((m = path.match(/^\/volumes\/([^/]+)$/))) page = html`<${VolumePage} name=${decode(m[1])} key=${m[1]} />`;
  else if (path === '/hosts') page = html`<${HostsPage} />`;
  else if (path === '/templates') page = html`<${TemplatesPage} admin=${admin} />`;
  else if (path === '/keys') page = html`<${KeysPage} />`;
  else {
    page = html`<div class="page" data-testid="not-found"><h1>Page not found</h1><p>Nothing at <code>${path}</code>.</p>
      <p><a class="button" href="#/">Back to the fork tree</a></p></div>`;
  }
  const nav = [
    ['#/', 'Fork tree', path === '/' || path.startsWith('/sandboxes/')],
    ['#/volumes', 'Volumes', path.startsWith('/volumes')],
    ['#/hosts', 'Hosts', path === '/hosts'],
    ['#/templates', 'Templates', path === '/templates'],
  ];
  if (admin) nav.push(['#/keys', 'Keys', path === '/keys']);
  return html`<div class="app">
    <a class="skip" href="#main" onClick=${(e) => { e.preventDefault(); document.getElementById('main').focus(); }}>Skip to content</a>
    <header class="top">
      <a href="#/" class="brand"><${Logo} /> PandaStack</a>
      <nav aria-label="Pages">
        ${nav.map(([href, label, cur]) => html`<a href=${href} aria-current=${cur ? 'page' : undefined} data-testid=${'nav-' + label.toLowerCase().replace(' ', '-')}>${label}</a>`)}
      </nav>
      <div class="top-right">
        <${Conn} />
        <span class="muted who">${admin ? 'admin key' : 'key'}</span>
        <button onClick=${() => onSignOut('')} data-testid="signout">Sign out</button>
      </div>
    </header>
    <main id="main" tabindex="-1">${page}</main>
    <${Notes} />
  </div>`;
}

// hint shows a key as its prefix and last characters, enough to tell two
// apart without showing either.
const hint = (k) => (k.length > 12 ? k.slice(0, 6) + '…' + k.slice(-4) : '…');

function App() {
  const [session, setSession] = useState(null); // {key, admin, n}
  const [message, setMessage] = useState('');
  const [checking, setChecking] = useState(true);
  // linked: a key from a /#key= link while another key is signed in in
  // this tab, until the user says whether to switch.
  const [linked, setLinked] = useState('');
  const live = useRef(null); // the AbortController of the signed-in session

  const signIn = (key, who) => {
    if (live.current) live.current.abort();
    setKey(key);
    const ctl = new AbortController();
    live.current = ctl;
    start(ctl.signal);
    setMessage('');
    setSession((s) => ({ key, admin: who.admin, n: (s ? s.n : 0) + 1 }));
  };
  const signOut = (msg) => {
    setKey('');
    clearNotes();
    if (live.current) live.current.abort();
    live.current = null;
    setSession(null);
    setMessage(msg);
  };
  setUnauthorizedHandler((m) => signOut('Signed out: the server no longer accepts this API key (' + m + '). It may have been revoked.'));

  // tryKey signs in with key if it is valid, else shows why on the form.
  const tryKey = async (key) => {
    try {
      signIn(key, await checkKey(key));
      return true;
    } catch (e) {
      setKey('');
      setMessage(e.status === 401 ? 'That API key is not valid: ' + e.message + '.' : e.message);
      return false;
    }
  };

  useEffect(() => {
    // /#key=… signs in (for scripts); the key leaves the URL at once. A
    // link never signs in silently, neither replacing the key this tab is
    // signed in with nor in a new tab (a page could send you a link with
    // a key of its own, and what you did next would happen in its
    // sandboxes): the user is asked first (below).
    const current = getKey();
    let fromLink = '';
    const m = location.hash.match(/^#key=([^&]+)/);
    if (m) {
      try {
        fromLink = decodeURIComponent(m[1]);
      } catch (_) {
        fromLink = m[1];
      }
      history.replaceState(null, '', location.pathname + location.search + '#/');
    }
    (async () => {
      const signedIn = current && (await tryKey(current));
      if (fromLink && fromLink !== current) setLinked(fromLink);
      else if (!signedIn && fromLink) setLinked(fromLink);
      setChecking(false);
    })();
  }, []);

  // Asked once the page (and its dialogs) is shown.
  useEffect(() => {
    if (checking || !linked) return;
    (async () => {
      const key = linked;
      const current = getKey();
      const ok = await confirm({
        title: current ? 'Sign in with another API key?' : 'Sign in with the key of this link?',
        body: html`<p>The link you opened signs in with the key <span class="mono">${hint(key)}</span>${current
              ? html`; this tab is signed in with <span class="mono">${hint(current)}</span>`
              : ''}.</p>
          <p>Go on only if you made this link yourself: a page that sent you here could have put a key of its own in it,
            and what you then did in the console would happen in its sandboxes.</p>`,
        action: current ? 'Switch key' : 'Sign in',
      });
      setLinked('');
      if (!ok) {
        if (current) notify('Kept the API key you were signed in with.');
        return;
      }
      if (!current) {
        await tryKey(key);
        return;
      }
      try {
        signIn(key, await checkKey(key));
        notify('Signed in with the key of the link.');
      } catch (e) {
        notifyError('Cannot sign in with the key of the link', e);
      }
    })();
  }, [checking, linked]);

  if (checking) return html`<p class="empty">Signing in…</p>`;
  return html`${session
      ? html`<${Shell} key=${session.n} admin=${session.admin} onSignOut=${signOut} />`
      : html`<${SignIn} onSignedIn=${signIn} message=${message} />`}
    <${Dialogs} />`;
}

render(html`<${App} />`, document.getElementById('app'));
