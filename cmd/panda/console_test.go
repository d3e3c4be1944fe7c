package main

// The web console (internal/controlplane/console, web/console) in a real browser:
// Debian's headless chromium, driven over the DevTools protocol by
// chromedp, against a real `panda up` with real guests. Every wait is on a
// condition of the page (chromedp.Poll with a deadline), never a sleep.
//
// Screenshots of the fork tree and of a sandbox's page are written to
// $PANDA_TEST_ARTIFACTS (default: a directory of the test's own, removed
// after it; the test logs where); docs/img has copies.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// browser is a headless chromium of one test, and where its artifacts go.
type browser struct {
	t         *testing.T
	ctx       context.Context
	artifacts string
}

// newBrowser starts chromium with a fresh profile in a temporary directory.
// It is killed when the test ends (chromedp's cancel), and the test checks
// that no process of it is left.
func newBrowser(t *testing.T, timeout time.Duration) *browser {
	t.Helper()
	return startBrowser(t, timeout, chromiumPath(t))
}

// chromiumPath is where Debian's chromium is.
func chromiumPath(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("the browser tests need Debian's chromium (make setup installs it): ", err)
	}
	return bin
}

// startBrowser is newBrowser with the chromium to run: bin, a program
// that takes chromium's arguments.
func startBrowser(t *testing.T, timeout time.Duration, bin string) *browser {
	t.Helper()
	profile := t.TempDir()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.UserDataDir(profile),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true), // root on the test machines
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.WindowSize(1280, 900),
	}
	ctx, cancelTimeout := context.WithTimeout(context.Background(), timeout)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		// Close the browser gracefully first, so that it ends its helper
		// processes itself, then make sure (the allocator kills it).
		if err := chromedp.Cancel(bctx); err != nil {
			t.Logf("close chromium: %v", err)
		}
		cancelBrowser()
		cancelAlloc()
		cancelTimeout()
		// Its helper processes follow it; none may outlive the test.
		deadline := time.Now().Add(10 * time.Second)
		for {
			left := testkit.Procs(profile)
			if len(left) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("chromium processes left behind: %v", left)
				for _, pid := range left {
					if p, err := os.FindProcess(pid); err == nil {
						p.Kill()
					}
				}
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	dir := os.Getenv("PANDA_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &browser{t: t, ctx: bctx, artifacts: dir}
}

func (b *browser) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		b.fail(what, err)
	}
}

// fail ends the test with a screenshot of the page as it was.
func (b *browser) fail(what string, err error) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	if png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot()); err == nil {
		name := filepath.Join(b.artifacts, "console-failure.png")
		if os.WriteFile(name, png, 0o644) == nil {
			b.t.Logf("screenshot of the failure: %s", name)
		}
	}
	b.t.Fatalf("%s: %v", what, err)
}

// wait waits until the JavaScript expression is true. A page that
// navigates while the expression is polled (a sign-in by URL replaces the
// document) destroys the context the poll runs in; the poll then starts
// again in the new one, until the timeout.
func (b *browser) wait(what, expr string, timeout time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		_, err := chromedp.Run(b.ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(time.Until(deadline)), chromedp.WithPollingInterval(100*time.Millisecond)))
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "Cannot find context with specified id") || time.Now().After(deadline) {
			b.fail("wait for "+what, err)
		}
	}
}

// eval evaluates expr.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.fail("evaluate "+expr, err)
	}
	return v
}

// input sets the value of an input as typing would (an input event).
func (b *browser) input(sel, value string) {
	b.t.Helper()
	eval[bool](b, `(() => { const i = document.querySelector(`+js(sel)+`); i.value = `+js(value)+`;
		i.dispatchEvent(new Event('input', {bubbles: true})); return true; })()`)
}

// screenshot saves the whole page as NAME.png in the artifacts directory,
// without the messages of earlier steps.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	eval[bool](b, `(document.querySelectorAll('[data-testid=note] button').forEach(b => b.click()), true)`)
	b.wait("no messages", `!document.querySelector('[data-testid=note]')`, 5*time.Second)
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.fail("screenshot "+name, err)
	}
	path := filepath.Join(b.artifacts, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s", path)
}

// typeKeys types s into the focused element as a person would: each key
// a keyDown carrying its text, then a keyUp. (chromedp's SendKeys sends a
// separate "char" event as well, which a page that handles keydown, as
// xterm.js does, receives as a second copy of the key.)
func typeKeys(s string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for _, r := range s {
			var down, up *input.DispatchKeyEventParams
			text := ""
			for _, ev := range kb.Encode(r) {
				switch ev.Type {
				case kb.KeyDown:
					down = ev
				case kb.KeyChar:
					text = ev.Text
				case kb.KeyUp:
					up = ev
				}
			}
			if r == '\r' {
				text = "\r"
			}
			down.Text, down.UnmodifiedText = text, text
			for _, ev := range []*input.DispatchKeyEventParams{down, up} {
				if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, *ev); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// js quotes s as a JavaScript string.
func js(s string) string { return strconv.Quote(s) }

// node is the selector of the tree's row for id.
func node(id string) string { return `[data-testid=node][data-id=` + js(id) + `]` }

// TestConsole signs in, creates a sandbox, forks it into 3 and checks the
// tree (4 nodes, parent links, memory bars), types in the terminal, uploads
// a file, kills a branch; then the bad cases: a wrong key, a killed and an
// unknown sandbox's page, the server going away and coming back on the
// same data directory (the event stream reconnects), a key revoked while
// signed in.
func TestConsole(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	addr, err := pandatest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	srv := start(t, "up", upOptions(dir, addr))
	admin := srv.client(t)
	ctx := ctxFor(t)
	b := newBrowser(t, 6*time.Minute)
	url := srv.URL() + "/"
	const long = 90 * time.Second // a create may bake the template first

	// A wrong key: an error on the sign-in form, not an empty page.
	b.run("open the console", chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(`[data-testid=key]`)))
	b.run("type a wrong key", chromedp.SendKeys(chromedp.CSS(`[data-testid=key]`), "panda_wrongkey"), chromedp.Click(chromedp.CSS(`[data-testid=signin-submit]`)))
	b.wait("the wrong key's error", `(document.querySelector('[data-testid=signin-error]')?.textContent || '').includes('not valid')`, 20*time.Second)

	// Sign in.
	b.input(`[data-testid=key]`, "")
	b.run("sign in", chromedp.SendKeys(chromedp.CSS(`[data-testid=key]`), srv.AdminKey()), chromedp.Click(chromedp.CSS(`[data-testid=signin-submit]`)))
	b.wait("the tree", `!!document.querySelector('[data-testid=tree]') && !!document.querySelector('[data-testid=empty]')`, 20*time.Second)
	stored := eval[bool](b, `sessionStorage.getItem('pandastack.key') === `+js(srv.AdminKey())+` && !document.cookie`)
	if !stored {
		t.Error("the key is not in sessionStorage alone")
	}

	// Create a sandbox (the server's default template, tiny).
	b.run("open the create dialog", chromedp.Click(chromedp.CSS(`[data-testid=new-sandbox]`)), chromedp.WaitVisible(chromedp.CSS(`[data-testid=submit]`)))
	b.input(`#f-metadata`, "owner=console-test")
	b.run("create", chromedp.Click(chromedp.CSS(`[data-testid=submit]`)))
	b.wait("the new sandbox in the tree", `!!document.querySelector('[data-testid=node][data-kind=sandbox][data-state=running]')`, long)
	parent := eval[string](b, `document.querySelector('[data-testid=node][data-kind=sandbox]').dataset.id`)

	// Fork it into 3 from its detail panel.
	b.run("select the sandbox", chromedp.Click(chromedp.CSS(node(parent)+` .cell-state`)), chromedp.WaitVisible(chromedp.CSS(`[data-testid=act-fork]`)))
	b.run("fork", chromedp.Click(chromedp.CSS(`[data-testid=act-fork]`)), chromedp.WaitVisible(chromedp.CSS(`#f-count`)))
	b.input(`#f-count`, "3")
	b.run("fork 3", chromedp.Click(chromedp.CSS(`[data-testid=submit]`)))
	// 4 nodes: the parent under its template, 3 children under it, each
	// with its memory drawn (private and shared figures).
	b.wait("4 sandboxes, 3 of them forks of the first, all with memory bars", `(() => {
		const rows = [...document.querySelectorAll('[data-testid=node][data-kind=sandbox]')];
		const p = `+js(parent)+`;
		if (rows.length !== 4) return false;
		const kids = rows.filter(r => r.dataset.parent === p);
		const root = rows.find(r => r.dataset.id === p);
		if (kids.length !== 3 || !root || root.dataset.parent !== '') return false;
		return rows.every(r => r.dataset.state === 'running' && document.querySelector('[data-testid=mem-' + r.dataset.id + '][data-private]'));
	})()`, long)
	children := eval[[]string](b, `[...document.querySelectorAll('[data-testid=node][data-parent=`+js(parent)+`]')].map(r => r.dataset.id)`)
	levels := eval[[]string](b, `[...document.querySelectorAll('[data-testid=node]')].map(r => r.dataset.kind + ':' + r.getAttribute('aria-level'))`)
	if got, want := strings.Join(levels, " "), "template:1 sandbox:2 sandbox:3 sandbox:3 sandbox:3"; got != want {
		t.Errorf("tree levels: got %s, want %s", got, want)
	}

	// Made through the API elsewhere, shown live: a fork of a fork, and a
	// snapshot under the sandbox it was taken of.
	sb, err := admin.Get(ctx, parent)
	if err != nil {
		t.Fatal(err)
	}
	child2, err := admin.Get(ctx, children[2])
	if err != nil {
		t.Fatal(err)
	}
	grand, err := child2.Fork(ctx, 1)
	if err != nil {
		t.Fatalf("fork a fork: %v", err)
	}
	snap, err := sb.Snapshot(ctx, "after-setup")
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	b.wait("the grandchild and the snapshot", `(() => {
		const g = document.querySelector(`+js(node(grand[0].ID))+`), s = document.querySelector(`+js(node(snap.ID))+`);
		return !!g && !!s && g.dataset.parent === `+js(children[2])+` && g.getAttribute('aria-level') === '4' &&
			s.dataset.parent === `+js(parent)+` && s.dataset.kind === 'snapshot' &&
			!!document.querySelector('[data-testid=mem-' + `+js(grand[0].ID)+` + '][data-private]');
	})()`, long)

	// A search keeps the matches and their ancestors: by metadata (the
	// children inherit it), by id.
	b.input(`[data-testid=search]`, "owner=console-test")
	b.wait("the search by metadata", `document.querySelectorAll('[data-testid=node]').length === 6 && document.querySelectorAll('.row.hit').length === 5`, 10*time.Second)
	b.input(`[data-testid=search]`, children[1][:8])
	b.wait("the search by id", `document.querySelectorAll('[data-testid=node]').length === 3 && document.querySelector('.row.hit')?.dataset.id === `+js(children[1]), 10*time.Second)
	b.input(`[data-testid=search]`, "")
	b.wait("the whole tree again", `document.querySelectorAll('[data-testid=node]').length === 7`, 10*time.Second)
	b.run("select the parent", chromedp.Click(chromedp.CSS(node(parent)+` .cell-state`)))
	b.wait("the savings", `!!document.querySelector('[data-testid=summary] [data-testid=savings]')`, 10*time.Second)
	b.screenshot("console-tree")

	// A narrow (phone-sized) viewport shows the same tree.
	b.run("a phone-sized viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2)))
	b.wait("the tree at 390 px", `document.querySelectorAll('[data-testid=node]').length === 7 && document.documentElement.scrollWidth <= 390`, 10*time.Second)
	b.screenshot("console-tree-narrow")
	b.run("back to 1280 px", chromedp.EmulateViewport(1280, 900))

	// The sandbox's page: the terminal answers, a file uploads.
	b.run("open the sandbox page", chromedp.Navigate(url+"#/sandboxes/"+parent))
	b.wait("the terminal", `(document.querySelector('[data-testid=term-status]')?.textContent || '').startsWith('Connected')`, 30*time.Second)
	b.wait("a prompt", `[...document.querySelectorAll('[data-testid=terminal] .xterm-rows > div')].some(d => /[#$] ?$/.test(d.textContent.replace(/\u00a0/g, ' ').trimEnd()))`, 30*time.Second)
	b.run("type echo hi", chromedp.Focus(chromedp.CSS(`[data-testid=terminal] .xterm-helper-textarea`)), typeKeys("echo hi\r"))
	b.wait("hi in the terminal", `[...document.querySelectorAll('[data-testid=terminal] .xterm-rows > div')].some(d => d.textContent.replace(/\u00a0/g, ' ').trim() === 'hi')`, 30*time.Second)

	upload := filepath.Join(t.TempDir(), "notes-from-console.txt")
	if err := os.WriteFile(upload, []byte("uploaded by the console test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b.wait("the file list", `!!document.querySelector('[data-testid=files] tbody tr')`, 30*time.Second)
	b.run("upload a file", chromedp.SetUploadFiles(chromedp.CSS(`[data-testid=upload]`), []string{upload}))
	b.wait("the uploaded file listed", `!!document.querySelector('[data-testid="file-notes-from-console.txt"]')`, 30*time.Second)
	if got := mustExec(t, ctx, sb, "cat /root/notes-from-console.txt"); got != "uploaded by the console test\n" {
		t.Errorf("the uploaded file holds %q", got)
	}
	// The cat above went through the API: the commands panel lists it
	// with its exit code; the terminal's shell is a PTY process.
	b.wait("the cat in the commands run", `[...document.querySelectorAll('[data-testid=commands] tbody tr')].some(r =>
		r.cells.length === 4 && r.cells[0].textContent === 'cat /root/notes-from-console.txt' && r.cells[1].textContent === 'exec' && r.cells[2].textContent.trim() === '0')`, 30*time.Second)
	b.wait("the shell among the processes", `[...document.querySelectorAll('[data-testid=processes] tbody tr')].some(r =>
		r.cells.length === 4 && r.cells[1].textContent.includes('/bin/sh -l') && r.cells[2].textContent.startsWith('running'))`, 30*time.Second)
	b.wait("the event stream live", `document.querySelector('[data-testid=conn]')?.dataset.conn === 'live'`, 10*time.Second)
	b.wait("a memory chart", `!!document.querySelector('.chart svg polyline')`, 30*time.Second)
	b.screenshot("console-sandbox")

	// Kill a branch: it leaves the tree.
	victim := children[0]
	b.run("back to the tree", chromedp.Navigate(url+"#/"), chromedp.WaitVisible(chromedp.CSS(node(victim))))
	b.run("select a child", chromedp.Click(chromedp.CSS(node(victim)+` .cell-state`)), chromedp.WaitVisible(chromedp.CSS(`[data-testid=act-kill]`)))
	b.run("kill it", chromedp.Click(chromedp.CSS(`[data-testid=act-kill]`)), chromedp.WaitVisible(chromedp.CSS(`[data-testid=confirm]`)),
		chromedp.Click(chromedp.CSS(`[data-testid=confirm]`)))
	b.wait("the killed child gone from the tree", `!document.querySelector(`+js(node(victim))+`) && document.querySelectorAll('[data-testid=node][data-kind=sandbox]').length === 4`, 30*time.Second)
	if got := mustGet(t, ctx, admin, victim).State; got != pandastack.StateStopped {
		t.Errorf("killed child %s: state %s, want stopped", victim, got)
	}

	// A killed sandbox's page says so; an unknown one's says not found.
	b.run("the killed sandbox's page", chromedp.Navigate(url+"#/sandboxes/"+victim))
	b.wait("stopped", `document.querySelector('[data-testid=sandbox-page] [data-testid=state]')?.textContent === 'stopped'`, 20*time.Second)
	b.run("an unknown sandbox's page", chromedp.Navigate(url+"#/sandboxes/nosuchsandbox0000000"))
	b.wait("not found", `(document.querySelector('[data-testid=not-found]')?.textContent || '').includes('not found')`, 20*time.Second)

	// The server goes away: the console says it is reconnecting; it comes
	// back on the same data directory and address: the console follows it
	// again (events, or lists) without a reload.
	b.run("back to the tree", chromedp.Navigate(url+"#/"))
	b.wait("the stream live", `['live', 'polling'].includes(document.querySelector('[data-testid=conn]')?.dataset.conn)`, 20*time.Second)
	before := eval[string](b, `document.querySelector('[data-testid=conn]').dataset.conn`)
	mustStop(t, srv)
	b.wait("reconnecting", `document.querySelector('[data-testid=conn]')?.dataset.conn === 'reconnecting'`, 30*time.Second)
	srv = start(t, "up again", upOptions(dir, addr))
	admin = srv.client(t)
	b.wait("following again", `document.querySelector('[data-testid=conn]')?.dataset.conn === `+js(before), 60*time.Second)
	fresh := mustCreate(t, ctx, admin)
	b.wait("the sandbox created after the restart", `!!document.querySelector(`+js(node(fresh.ID))+`)`, 30*time.Second)

	// The fleet and admin pages, as the admin.
	k, err := admin.CreateKey(ctx, "console-user", false, pandastack.Quotas{MaxSandboxes: 4})
	if err != nil {
		t.Fatal(err)
	}
	b.run("the hosts page", chromedp.Click(chromedp.CSS(`[data-testid=nav-hosts]`)))
	b.wait("the local host", `(document.querySelector('[data-testid=hosts] tbody')?.textContent || '').includes('local')`, 20*time.Second)
	b.screenshot("console-hosts")
	// A build that fails at once (nothing listens on port 1): listed with
	// its status, its log one click away.
	bad, err := admin.StartTemplateBuild(ctx, "console-app", "127.0.0.1:1/nope:1")
	if err != nil {
		t.Fatal(err)
	}
	b.run("the templates page", chromedp.Click(chromedp.CSS(`[data-testid=nav-templates]`)))
	b.wait("the tiny template", `(document.querySelector('[data-testid=templates] tbody')?.textContent || '').includes('tiny')`, 20*time.Second)
	row := `[data-testid=builds] tr[data-build=` + js(bad.ID) + `]`
	b.wait("the failed build listed", `(document.querySelector(`+js(row)+`)?.textContent || '').includes('failed')`, 30*time.Second)
	b.run("its log", chromedp.Click(chromedp.CSS(row+` button`)))
	b.wait("the build's log", `(document.querySelector('[data-testid=build-log]')?.textContent || '').includes('127.0.0.1:1/nope:1')`, 20*time.Second)
	b.run("the keys page", chromedp.Click(chromedp.CSS(`[data-testid=nav-keys]`)))
	b.wait("the new key listed", `(document.querySelector('[data-testid=keys] tbody')?.textContent || '').includes('console-user')`, 20*time.Second)
	b.screenshot("console-keys")

	// Another key, signed in through /#key=; revoked while signed in.
	b.run("sign out", chromedp.Click(chromedp.CSS(`[data-testid=signout]`)), chromedp.WaitVisible(chromedp.CSS(`[data-testid=key]`)))
	b.run("sign in by URL", chromedp.Navigate("about:blank"), chromedp.Navigate(url+"#key="+k.Key))
	b.wait("asked to sign in with the link's key", `!!document.querySelector('[data-testid=dialog] [data-testid=confirm]')`, 20*time.Second)
	b.run("sign in with it", chromedp.Click(chromedp.CSS(`[data-testid=dialog] [data-testid=confirm]`)))
	b.wait("signed in as the user", `!!document.querySelector('[data-testid=tree]') && location.hash === '#/' && !document.querySelector('[data-testid=nav-keys]')`, 20*time.Second)
	keyInURL := eval[bool](b, `location.href.includes(`+js(k.Key)+`)`)
	if keyInURL {
		t.Error("the key stayed in the URL")
	}
	b.run("the keys page as a user", chromedp.Navigate(url+"#/keys"))
	b.wait("403 shown", `!!document.querySelector('[data-testid=forbidden]')`, 20*time.Second)
	b.run("back to the tree", chromedp.Navigate(url+"#/"))
	if err := admin.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	b.wait("signed out with an error", `(document.querySelector('[data-testid=signin-error]')?.textContent || '').includes('revoked')`, 30*time.Second)
	gone := eval[bool](b, `sessionStorage.getItem('pandastack.key') === null`)
	if !gone {
		t.Error("the revoked key is still in sessionStorage")
	}
}
