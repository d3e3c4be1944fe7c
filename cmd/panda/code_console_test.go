package main

// The web console's Code tab (web/console/src/code.js) in Chromium,
// against the code interpreter's shared world (code_world_test.go): the
// browser runs in the world's network namespace, as the console's
// security tests do (security_browser_test.go), and signs in with the
// admin key.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// cellWait is how long a test waits for one cell: guests run under TCG
// here, and a context's first cell may start its interpreter.
const cellWait = 3 * time.Minute

// TestCodeConsole runs cells from the Code tab of a code-interpreter
// sandbox's page: state that persists between cells, stdout and the main
// result of one cell, a matplotlib figure as a PNG image, a DataFrame as
// HTML in a sandboxed frame, an exception with its traceback, a bash
// context made from the tab, an interrupt, a dead interpreter and its
// restart. Guest HTML and SVG with scripts in them run none in the
// console's document (which holds the key). A sandbox without a code
// interpreter shows why.
func TestCodeConsole(t *testing.T) {
	w := codeWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	sb := w.codeSandbox(t, ctx, "")
	plain := w.sandbox(t, ctx, w.AdminKey())

	b := newBrowserIn(t, 19*time.Minute, w.env.Host.Path)
	url := w.URL() + "/"
	b.signInAs(url, w.AdminKey())

	// The tab, from the sandbox's page.
	b.run("open the sandbox's page", chromedp.Navigate(url+"#/sandboxes/"+sb.ID))
	b.run("open the Code tab", chromedp.WaitVisible(chromedp.CSS(`[data-testid=tab-code]`)), chromedp.Click(chromedp.CSS(`[data-testid=tab-code]`)))
	b.wait("the Code tab", `location.hash.endsWith('/code') && !!document.querySelector('[data-testid=code-editor]') &&
		document.querySelector('[data-testid=tab-code]').getAttribute('aria-current') === 'page' && document.querySelector('[data-testid=overview]')?.hidden !== false`, 30*time.Second)
	b.wait("the contexts listed", `(document.querySelector('[data-testid=code-context]')?.options.length || 0) >= 3`, cellWait)
	codeTabCells(t, b)

	// A sandbox without a code interpreter: the API's reason.
	b.run("open the plain sandbox's Code tab", chromedp.Navigate(url+"#/sandboxes/"+plain.ID+"/code"))
	b.wait("no code interpreter", `(document.querySelector('[data-testid=code-unavailable]')?.textContent || '').includes('has no code interpreter')`, cellWait)
}

// codeTabCells runs TestCodeConsole's cells in the Code tab open in b,
// python's default context picked.
func codeTabCells(t *testing.T, b *browser) {
	t.Helper()
	title := eval[string](b, `document.title`)
	// Typed, run with Ctrl+Enter; then the state it left.
	b.run("type x = 21", chromedp.Focus(chromedp.CSS(`[data-testid=code-editor]`)), typeKeys("x = 21"),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierCtrl)))
	first := b.cellDone(1)
	if got := eval[string](b, first.js+`.dataset.state`); got != "done" {
		t.Errorf("x = 21: cell state %q, want done", got)
	}
	c := b.runCell("print(x*2); x*2")
	if got := b.cellText(c, "cell-stdout"); got != "42\n" {
		t.Errorf("print(x*2): stdout %q, want \"42\\n\"", got)
	}
	if got := b.cellText(c, "result-text"); got != "42" {
		t.Errorf("x*2: result %q, want 42", got)
	}
	// Execution counts: [N], one more for each cell of the context.
	var n1, n2 int
	if _, err := fmt.Sscanf(b.cellText(first, "cell-count"), "[%d]", &n1); err != nil {
		t.Errorf("the first cell's execution count: %v", err)
	}
	if _, err := fmt.Sscanf(b.cellText(c, "cell-count"), "[%d]", &n2); err != nil || n2 != n1+1 {
		t.Errorf("execution counts [%d] then [%d] (%v), want one more", n1, n2, err)
	}

	// A figure: an <img> with a PNG data URL, decoded.
	c = b.runCell("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()")
	b.wait("the figure decoded", c.js+`.querySelector('img[data-testid=result-image]')?.naturalWidth > 0`, 30*time.Second)
	if src := eval[string](b, c.js+`.querySelector('img[data-testid=result-image]').src`); !strings.HasPrefix(src, "data:image/png;base64,iVBORw0KGgo") {
		t.Errorf("the figure's src starts %.40q, want a PNG data URL", src)
	}

	// A DataFrame: its HTML in a frame with sandbox="", its text a click
	// away.
	c = b.runCell("import pandas as pd\npd.DataFrame({'n': [1, 2, 3], 'square': [1, 4, 9]})")
	b.wait("the table's frame loaded", c.js+`.querySelector('iframe[data-testid=result-html][data-loaded=true]')?.getAttribute('sandbox') === ''`, 30*time.Second)
	b.screenshot("console-code")
	b.run("show it as text", chromedp.Click(chromedp.CSS(c.css+` [data-testid=result-format][title="text/plain"]`)))
	b.wait("the table as text", `/square\s*\n0\s+1\s+1/.test(`+c.js+`.querySelector('[data-testid=result-text]')?.textContent || '')`, 10*time.Second)

	// An exception: its name, value and traceback.
	c = b.runCell("1/0")
	if got := b.cellText(c, "error-name"); got != "ZeroDivisionError" {
		t.Errorf("1/0: error %q, want ZeroDivisionError", got)
	}
	if got := b.cellText(c, "error-value"); got != "division by zero" {
		t.Errorf("1/0: error value %q, want \"division by zero\"", got)
	}
	if got := eval[string](b, c.js+`.querySelector('.traceback')?.textContent || ''`); !strings.Contains(got, "ZeroDivisionError") {
		t.Errorf("1/0: traceback %q, want one naming ZeroDivisionError", got)
	}

	// Guest HTML and SVG with scripts: shown, none of them run in the
	// console. A frame's scripts (and its image's error handler) would
	// have run before its load event, which data-loaded records.
	c = b.runCell(`from IPython.display import HTML, SVG, display
display(HTML("<p id='from-the-guest'>framed</p><script>parent.document.title = 'pwned'; window.top.x = 1;</script><img src='data:,x' onerror='parent.document.title = 1'>"))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="60" height="40"><script>parent.document.title = "pwned"</script><circle cx="20" cy="20" r="15" fill="teal"/></svg>'))`)
	b.wait("the frame loaded and the SVG decoded", c.js+`.querySelector('iframe[data-testid=result-html][data-loaded=true]') &&
		`+c.js+`.querySelector('img[data-testid=result-image]')?.naturalWidth === 60`, 30*time.Second)
	state := eval[map[string]any](b, `({title: document.title, x: typeof window.x, inDoc: !!document.getElementById('from-the-guest'),
		sandbox: `+c.js+`.querySelector('iframe[data-testid=result-html]').getAttribute('sandbox'),
		svg: `+c.js+`.querySelector('img[data-testid=result-image]').src.slice(0, 26),
		inline: document.querySelectorAll('svg script, script:not([src])').length})`)
	if state["title"] != title || state["x"] != "undefined" {
		t.Errorf("a guest's script ran in the console: title %q (was %q), window.x %v", state["title"], title, state["x"])
	}
	if state["inDoc"] != false || state["inline"] != float64(0) {
		t.Errorf("guest markup is in the console's document: %v", state)
	}
	if state["sandbox"] != "" || state["svg"] != "data:image/svg+xml;charset" {
		t.Errorf("the HTML frame's sandbox %q, the SVG's src %q: want \"\" and a data URL", state["sandbox"], state["svg"])
	}

	// A bash context made from the tab, in a directory of its own.
	b.run("open the new context dialog", chromedp.Click(chromedp.CSS(`[data-testid=new-context]`)), chromedp.WaitVisible(chromedp.CSS(`#f-language`)))
	b.input(`#f-language`, "bash")
	b.input(`#f-cwd`, "/tmp")
	b.run("create it", chromedp.Click(chromedp.CSS(`[data-testid=submit]`)))
	b.wait("the bash context picked", `(() => { const s = document.querySelector('[data-testid=code-context]');
		return s.value.startsWith('ctx:') && s.selectedOptions[0].textContent.startsWith('Bash · /tmp'); })()`, cellWait)
	c = b.runCell("echo hi; pwd")
	if got := b.cellText(c, "cell-stdout"); got != "hi\n/tmp\n" {
		t.Errorf("echo hi; pwd in the bash context: stdout %q, want \"hi\\n/tmp\\n\"", got)
	}

	// Back in python's default context: an endless cell, interrupted.
	b.pick("lang:python")
	c = b.startCell("import time\nprint('sleeping', flush=True)\ntime.sleep(600)")
	b.wait("the cell sleeping", `(`+c.js+`.querySelector('[data-testid=cell-stdout]')?.textContent || '') === 'sleeping\n'`, cellWait)
	b.run("interrupt it", chromedp.Click(chromedp.CSS(`[data-testid=code-interrupt]`)))
	b.cellDone(c.seq)
	if got := b.cellText(c, "error-name"); got != "KeyboardInterrupt" {
		t.Errorf("the interrupted cell: error %q, want KeyboardInterrupt", got)
	}

	// The interpreter dies: the cell says so, with a restart; after it, a
	// fresh interpreter (x is gone).
	c = b.runCell("import os; os._exit(1)")
	if got := b.cellText(c, "error-name"); got != "KernelDied" {
		t.Errorf("os._exit(1): error %q, want KernelDied", got)
	}
	b.wait("the picker's context dead", `document.querySelector('[data-testid=code-context-state]')?.textContent === 'dead' && !!document.querySelector('[data-testid=context-dead]')`, 30*time.Second)
	b.run("restart the context", chromedp.Click(chromedp.CSS(c.css+` [data-testid=cell-restart]`)))
	b.wait("the question", `!!document.querySelector('[data-testid=dialog] [data-testid=confirm]')`, 10*time.Second)
	b.run("confirm", chromedp.Click(chromedp.CSS(`[data-testid=dialog] [data-testid=confirm]`)))
	b.wait("the context alive", `['idle', 'busy'].includes(document.querySelector('[data-testid=code-context-state]')?.textContent)`, cellWait)
	c = b.runCell("print('back'); x")
	if got, name := b.cellText(c, "cell-stdout"), b.cellText(c, "error-name"); got != "back\n" || name != "NameError" {
		t.Errorf("after the restart: stdout %q, error %q, want \"back\\n\" and NameError", got, name)
	}
}

// codeCell is a cell of the Code tab: its number (the console numbers
// them from 1 on each page), its CSS selector and a JavaScript expression
// for its element.
type codeCell struct {
	seq     int
	css, js string
}

func cellOf(seq int) codeCell {
	css := `[data-testid=cell][data-seq="` + fmt.Sprint(seq) + `"]`
	return codeCell{seq: seq, css: css, js: `document.querySelector(` + js(css) + `)`}
}

// startCell types code into the Code tab's editor (as typing would: an
// input event), runs it and returns its cell.
func (b *browser) startCell(code string) codeCell {
	b.t.Helper()
	seq := eval[int](b, `Math.max(0, ...[...document.querySelectorAll('[data-testid=cell]')].map(c => Number(c.dataset.seq))) + 1`)
	b.input(`[data-testid=code-editor]`, code)
	b.run("run "+code, chromedp.Click(chromedp.CSS(`[data-testid=code-run]`)))
	c := cellOf(seq)
	b.wait("cell "+fmt.Sprint(seq), `!!`+c.js, 10*time.Second)
	return c
}

// runCell runs code and waits until its cell ends.
func (b *browser) runCell(code string) codeCell {
	b.t.Helper()
	return b.cellDone(b.startCell(code).seq)
}

// cellDone waits until cell seq ends.
func (b *browser) cellDone(seq int) codeCell {
	b.t.Helper()
	c := cellOf(seq)
	b.wait(fmt.Sprintf("cell %d to end", seq), `!!`+c.js+` && `+c.js+`.dataset.state !== 'running'`, cellWait)
	return c
}

// cellText is the text of the first element of cell c whose data-testid
// is id ("" when there is none).
func (b *browser) cellText(c codeCell, id string) string {
	b.t.Helper()
	return eval[string](b, `(`+c.js+`.querySelector('[data-testid=`+id+`]')?.textContent || '')`)
}

// pick picks a context in the Code tab's picker, as a user does (a change
// event).
func (b *browser) pick(value string) {
	b.t.Helper()
	eval[bool](b, `(() => { const s = document.querySelector('[data-testid=code-context]'); s.value = `+js(value)+`;
		s.dispatchEvent(new Event('change', {bubbles: true})); return s.value === `+js(value)+`; })()`)
}
