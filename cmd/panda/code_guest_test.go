package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// The guest code server of the code-interpreter template
// (internal/hostagent/template/codeinterp), driven with its own protocol
// (E2B's code-interpreter protocol) through the port proxy, as E2B's SDK
// reaches it: one sandbox, many assertions, so that the test binary bakes
// and restores as little as it can under TCG.

// codeGuest speaks the guest protocol to one sandbox's code server through
// /v1/sandboxes/{id}/ports/49999 with the admin key.
type codeGuest struct {
	w  *secWorld
	id string
}

// codeLine is one line of an /execute stream.
type codeLine map[string]any

func (l codeLine) typ() string { return l.str("type") }

func (l codeLine) str(k string) string {
	s, _ := l[k].(string)
	return s
}

// codeRun is what one /execute answered.
type codeRun struct {
	Status int
	Text   string // the body of an answer that is not a stream
	Lines  []codeLine
}

// stdout is the cell's stdout, joined.
func (r codeRun) stdout() string { return r.joined("stdout") }
func (r codeRun) stderr() string { return r.joined("stderr") }

func (r codeRun) joined(typ string) string {
	var b strings.Builder
	for _, l := range r.Lines {
		if l.typ() == typ {
			b.WriteString(l.str("text"))
		}
	}
	return b.String()
}

// main is the main result's text ("" if none).
func (r codeRun) main() string {
	for _, l := range r.Lines {
		if l.typ() == "result" && l["is_main_result"] == true {
			return l.str("text")
		}
	}
	return ""
}

// err is the cell's error line (nil if none).
func (r codeRun) err() codeLine {
	for _, l := range r.Lines {
		if l.typ() == "error" {
			return l
		}
	}
	return nil
}

// ended reports whether the stream ended with end_of_execution.
func (r codeRun) ended() bool {
	return len(r.Lines) > 0 && r.Lines[len(r.Lines)-1].typ() == "end_of_execution"
}

func (r codeRun) String() string {
	if r.Status != http.StatusOK {
		return fmt.Sprintf("%d %q", r.Status, r.Text)
	}
	b, _ := json.Marshal(r.Lines)
	if len(b) > 4000 {
		b = append(b[:4000], "…"...)
	}
	return string(b)
}

func (g codeGuest) url(path string) string {
	return fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d%s", g.w.URL(), g.id, templates.CodeInterpreterPort, path)
}

// request sends a request to the code server and returns its status and
// body.
func (g codeGuest) request(t *testing.T, ctx context.Context, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		j, _ := json.Marshal(body)
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, g.url(path), r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+g.w.AdminKey())
	resp, err := g.w.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b
}

// exec posts a cell and reads its stream to the end; each line is given
// to onLine (may be nil) as it comes. A transport error ends the run: it
// is returned with what was read.
func (g codeGuest) exec(ctx context.Context, req map[string]any, onLine func(codeLine)) (codeRun, error) {
	j, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, "POST", g.url("/execute"), bytes.NewReader(j))
	if err != nil {
		return codeRun{}, err
	}
	hr.Header.Set("Authorization", "Bearer "+g.w.AdminKey())
	hr.Header.Set("Content-Type", "application/json")
	resp, err := g.w.hc.Do(hr)
	if err != nil {
		return codeRun{}, err
	}
	defer resp.Body.Close()
	run := codeRun{Status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		run.Text = strings.TrimSpace(string(b))
		return run, nil
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		return run, fmt.Errorf("Content-Type %q, want application/x-ndjson", ct)
	}
	br := bufio.NewReaderSize(resp.Body, 1<<16)
	for {
		b, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(b)) > 0 {
			var l codeLine
			if jerr := json.Unmarshal(b, &l); jerr != nil {
				return run, fmt.Errorf("a line that is not JSON: %q: %v", b, jerr)
			}
			run.Lines = append(run.Lines, l)
			if onLine != nil {
				onLine(l)
			}
		}
		if errors.Is(err, io.EOF) {
			return run, nil
		}
		if err != nil {
			return run, err
		}
	}
}

// mustExec is exec that fails the test on a transport error or a stream
// that did not end with end_of_execution.
func (g codeGuest) mustExec(t *testing.T, ctx context.Context, req map[string]any) codeRun {
	t.Helper()
	r, err := g.exec(ctx, req, nil)
	if err != nil {
		t.Fatalf("execute %v: %v (read: %v)", req, err, r)
	}
	if r.Status == http.StatusOK && !r.ended() {
		t.Fatalf("execute %v: the stream did not end with end_of_execution: %v", req, r)
	}
	return r
}

// contexts lists the code server's contexts by id.
func (g codeGuest) contexts(t *testing.T, ctx context.Context) map[string]map[string]any {
	t.Helper()
	code, b := g.request(t, ctx, "GET", "/contexts", nil)
	if code != http.StatusOK {
		t.Fatalf("GET /contexts: %d %s", code, b)
	}
	var list []map[string]any
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatalf("GET /contexts: %q: %v", b, err)
	}
	out := map[string]map[string]any{}
	for _, c := range list {
		id, _ := c["id"].(string)
		out[id] = c
	}
	return out
}

// waitBusy waits until context id runs a cell.
func (g codeGuest) waitBusy(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	testkit.WaitFor(t, 2*time.Minute, "context "+id+" busy", func() bool {
		return g.contexts(t, ctx)[id]["state"] == "busy"
	})
}

// TestCodeGuest drives one code-interpreter sandbox's code server: its
// health and default contexts; Python state across cells, stdout, a PNG
// and a line chart from matplotlib, a DataFrame's data, an exception as an
// error line without colour codes, timeout_ms interrupting a busy loop
// with the context's state kept, env_vars for one cell only; JavaScript
// and bash contexts keeping state, interrupted by timeout_ms and by
// /interrupt; two cells of one context running in the order they came; a
// client leaving mid-cell, which interrupts it and leaves the context
// usable; contexts created, listed and removed; bad requests; a fork
// taken mid-cell, whose child drops its copy of the cell; and last a
// Python interpreter that dies (os._exit), reported as KernelDied until a
// restart brings it back warm.
func TestCodeGuest(t *testing.T) {
	w := codeWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	start := time.Now()
	sb := w.codeSandbox(t, ctx, "")
	t.Logf("created %s in %.1fs", sb.ID, time.Since(start).Seconds())
	if ts, err := w.client(t, w.AdminKey()).Templates(ctx); err == nil {
		for _, tp := range ts {
			if tp.Name == codeTemplate && tp.MemoryMiB == codeMemoryMiB {
				t.Logf("the template was baked in %.1fs", float64(tp.BakeMS)/1000)
			}
		}
	}
	g := codeGuest{w: w, id: sb.ID}

	t.Run("Health", func(t *testing.T) {
		code, b := g.request(t, ctx, "GET", "/health", nil)
		if code != http.StatusOK || !strings.Contains(string(b), `"ok"`) {
			t.Fatalf("GET /health: %d %s, want 200 ok", code, b)
		}
		if r := g.mustExec(t, ctx, map[string]any{"code": "free -m | sed -n 2p; ps -u user -o rss=,args= | sort -rn | head -4", "language": "bash"}); r.err() == nil {
			t.Logf("guest memory (MiB) and the largest processes (RSS KiB):\n%s", r.stdout())
		}
		cs := g.contexts(t, ctx)
		for _, lang := range []string{"python", "javascript", "bash"} {
			c, ok := cs["default-"+lang]
			if !ok || c["language"] != lang || c["cwd"] != "/home/user" || c["state"] != "idle" {
				t.Errorf("default %s context: %v; want it idle in /home/user (contexts: %v)", lang, c, cs)
			}
		}
	})

	t.Run("Python", func(t *testing.T) {
		t0 := time.Now()
		r := g.mustExec(t, ctx, map[string]any{"code": "x = 21\nprint('hello', x)"})
		t.Logf("first cell: %.0f ms", time.Since(t0).Seconds()*1000)
		if r.stdout() != "hello 21\n" || r.err() != nil {
			t.Errorf("print: %v, want stdout %q", r, "hello 21\n")
		}
		for _, l := range r.Lines {
			if (l.typ() == "stdout" || l.typ() == "stderr") && l["timestamp"] == nil {
				t.Errorf("%v: no timestamp", l)
			}
		}
		end := r.Lines[len(r.Lines)-1]
		if end.str("context_id") != "default-python" || end["duration_ms"] == nil {
			t.Errorf("end_of_execution %v: want context_id default-python and duration_ms", end)
		}
		r = g.mustExec(t, ctx, map[string]any{"code": "x * 2", "language": "python"})
		if r.main() != "42" {
			t.Errorf("x * 2 in the next cell: %v, want main result 42", r)
		}
		var count float64
		for _, l := range r.Lines {
			if l.typ() == "number_of_executions" {
				count, _ = l["execution_count"].(float64)
			}
		}
		if count < 2 {
			t.Errorf("number_of_executions %v, want at least 2: %v", count, r)
		}

		r = g.mustExec(t, ctx, map[string]any{"code": "import matplotlib.pyplot as plt\n" +
			"plt.plot([1, 2, 3], [4, 5, 6], label='up')\nplt.title('growth')\nplt.xlabel('time (s)')\nplt.show()"})
		var chart codeLine
		for _, l := range r.Lines {
			if l.typ() == "result" && l["chart"] != nil {
				chart = l
			}
		}
		if chart == nil {
			t.Fatalf("a matplotlib figure: no result with a chart: %v", r)
		}
		png, err := base64.StdEncoding.DecodeString(chart.str("png"))
		if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("the figure's png: %d bytes, %v; want a base64 PNG", len(png), err)
		}
		if chart["is_main_result"] != false {
			t.Errorf("a shown figure is_main_result %v, want false (display_data)", chart["is_main_result"])
		}
		c, _ := json.Marshal(chart["chart"])
		var lc struct {
			Type     string `json:"type"`
			Title    string `json:"title"`
			XLabel   string `json:"x_label"`
			XUnit    string `json:"x_unit"`
			XScale   string `json:"x_scale"`
			Elements []struct {
				Label  string       `json:"label"`
				Points [][2]float64 `json:"points"`
			} `json:"elements"`
		}
		if err := json.Unmarshal(c, &lc); err != nil {
			t.Errorf("chart %s: %v", c, err)
		}
		if lc.Type != "line" || lc.Title != "growth" || lc.XLabel != "time (s)" || lc.XUnit != "s" || lc.XScale != "linear" ||
			len(lc.Elements) != 1 || lc.Elements[0].Label != "up" || fmt.Sprint(lc.Elements[0].Points) != "[[1 4] [2 5] [3 6]]" {
			t.Errorf("chart %s: want a line chart 'growth', x 'time (s)' in s, linear, one line 'up' of (1,4) (2,5) (3,6)", c)
		}

		// The other chart types, one figure each.
		r = g.mustExec(t, ctx, map[string]any{"code": "fig, ax = plt.subplots(); ax.bar(['a', 'b'], [3, 4], label='n'); plt.show()\n" +
			"fig, ax = plt.subplots(); ax.pie([1, 3], labels=['p', 'q']); plt.show()\n" +
			"fig, ax = plt.subplots(); ax.boxplot([[1, 2, 3, 4, 50]]); plt.show()\n" +
			"fig, (a, b) = plt.subplots(1, 2); fig.suptitle('two'); a.scatter([1], [2]); b.plot([1, 2]); plt.show()"})
		var charts []string
		for _, l := range r.Lines {
			if l.typ() == "result" && l["chart"] != nil {
				b, _ := json.Marshal(l["chart"])
				charts = append(charts, string(b))
			}
		}
		for i, want := range []string{
			`"elements":[{"group":"n","label":"a","value":3},{"group":"n","label":"b","value":4}],`,
			`"elements":[{"angle":90,"label":"p","radius":1},{"angle":270,"label":"q","radius":1}],`,
			`"elements":[{"first_quartile":2,"label":"1","max":4,"median":3,"min":1,"outliers":[50],"third_quartile":4}],`,
			`"title":"two","type":"superchart"`,
		} {
			if i >= len(charts) || !strings.Contains(charts[i], want) {
				t.Errorf("chart %d: want one with %s; got %v", i, want, charts)
			}
		}
		if len(charts) == 4 && (!strings.Contains(charts[3], `"type":"scatter"`) || !strings.Contains(charts[3], `"type":"line"`)) {
			t.Errorf("superchart %s: want a scatter and a line chart", charts[3])
		}

		r = g.mustExec(t, ctx, map[string]any{"code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', None]})"})
		var data codeLine
		for _, l := range r.Lines {
			if l.typ() == "result" && l["is_main_result"] == true {
				data = l
			}
		}
		if d, _ := json.Marshal(data["data"]); string(d) != `{"a":[1,2],"b":["x",null]}` || !strings.Contains(data.str("html"), "<table") {
			t.Errorf("a DataFrame: data %s, html %d bytes; want its columns and an HTML table: %v", d, len(data.str("html")), r)
		}

		r = g.mustExec(t, ctx, map[string]any{"code": "def f():\n    return 1 / 0\nf()"})
		e := r.err()
		if e == nil || e.str("name") != "ZeroDivisionError" || e.str("value") != "division by zero" ||
			!strings.Contains(e.str("traceback"), "ZeroDivisionError") || strings.Contains(e.str("traceback"), "\x1b[") {
			t.Errorf("1 / 0: %v; want a ZeroDivisionError line with a traceback without colour codes", r)
		}

		r = g.mustExec(t, ctx, map[string]any{"code": "import os\nprint(os.environ.get('PANDA_CELL'))", "env_vars": map[string]string{"PANDA_CELL": "only here"}})
		if r.stdout() != "only here\n" {
			t.Errorf("env_vars: %v, want stdout %q", r, "only here\n")
		}
		r = g.mustExec(t, ctx, map[string]any{"code": "print(os.environ.get('PANDA_CELL'))"})
		if r.stdout() != "None\n" {
			t.Errorf("the next cell sees env_vars of the one before: %v", r)
		}

		r = g.mustExec(t, ctx, map[string]any{"code": "while True:\n    pass", "timeout_ms": 3000})
		if e := r.err(); e == nil || e.str("name") != "TimeoutError" {
			t.Errorf("while True with timeout_ms: %v, want a TimeoutError", r)
		}
		if r = g.mustExec(t, ctx, map[string]any{"code": "x"}); r.main() != "21" {
			t.Errorf("x after a timed out cell: %v, want 21 (the state kept)", r)
		}
	})

	t.Run("JavaScript", func(t *testing.T) {
		r := g.mustExec(t, ctx, map[string]any{"code": "let a = 40; const f = (n) => n + 2; console.log('a is', a); console.error('to stderr')", "language": "js"})
		if r.stdout() != "a is 40\n" || r.stderr() != "to stderr\n" || r.err() != nil {
			t.Errorf("console: %v", r)
		}
		if r = g.mustExec(t, ctx, map[string]any{"code": "f(a)", "language": "javascript"}); r.main() != "42" {
			t.Errorf("f(a) in the next cell: %v, want 42", r)
		}
		if r = g.mustExec(t, ctx, map[string]any{"code": "Promise.resolve({b: 1})", "language": "node"}); r.main() != "{ b: 1 }" {
			t.Errorf("a promise: %v, want its value { b: 1 }", r)
		}
		r = g.mustExec(t, ctx, map[string]any{"code": "null.x", "language": "js"})
		if e := r.err(); e == nil || e.str("name") != "TypeError" || !strings.Contains(e.str("traceback"), "TypeError") {
			t.Errorf("null.x: %v, want a TypeError", r)
		}
		r = g.mustExec(t, ctx, map[string]any{"code": "process.env.PANDA_CELL", "language": "js", "env_vars": map[string]string{"PANDA_CELL": "js"}})
		if r.main() != "'js'" {
			t.Errorf("env_vars: %v, want 'js'", r)
		}
		r = g.mustExec(t, ctx, map[string]any{"code": "while (true) {}", "language": "js", "timeout_ms": 3000})
		if e := r.err(); e == nil || e.str("name") != "TimeoutError" {
			t.Errorf("while (true) with timeout_ms: %v, want a TimeoutError", r)
		}
		r = g.mustExec(t, ctx, map[string]any{"code": "new Promise(() => {})", "language": "js", "timeout_ms": 3000})
		if e := r.err(); e == nil || e.str("name") != "TimeoutError" {
			t.Errorf("a promise that never settles, with timeout_ms: %v, want a TimeoutError", r)
		}
		if r = g.mustExec(t, ctx, map[string]any{"code": "a + (process.env.PANDA_CELL === undefined ? 1 : 0)", "language": "js"}); r.main() != "41" {
			t.Errorf("after the interrupts: %v, want 41 (a kept, env_vars gone)", r)
		}
	})

	t.Run("Bash", func(t *testing.T) {
		r := g.mustExec(t, ctx, map[string]any{"code": "X=5\nshout() { echo \"$1!\"; }\ncd /tmp\necho out; echo err >&2", "language": "bash"})
		if r.stdout() != "out\n" || r.stderr() != "err\n" || r.err() != nil {
			t.Errorf("echo: %v; want stdout and stderr apart", r)
		}
		if r = g.mustExec(t, ctx, map[string]any{"code": "shout $X; pwd", "language": "sh"}); r.stdout() != "5!\n/tmp\n" {
			t.Errorf("the next cell: %v, want the variable, function and cwd kept", r)
		}
		r = g.mustExec(t, ctx, map[string]any{"code": "false", "language": "bash"})
		if e := r.err(); e == nil || e.str("name") != "ExitError" || e.str("value") != "exit status 1" {
			t.Errorf("false: %v, want ExitError exit status 1", r)
		}
		r = g.mustExec(t, ctx, map[string]any{"code": "echo \"[$PANDA_CELL]\"", "language": "bash", "env_vars": map[string]string{"PANDA_CELL": "it's bash"}})
		if r.stdout() != "[it's bash]\n" {
			t.Errorf("env_vars: %v", r)
		}
		r = g.mustExec(t, ctx, map[string]any{"code": "echo start; sleep 600; echo never", "language": "bash", "timeout_ms": 3000})
		if e := r.err(); e == nil || e.str("name") != "TimeoutError" || strings.Contains(r.stdout(), "never") {
			t.Errorf("sleep 600 with timeout_ms: %v, want a TimeoutError and the rest of the cell not run", r)
		}
		r = g.mustExec(t, ctx, map[string]any{"code": "while :; do :; done", "language": "bash", "timeout_ms": 3000})
		if e := r.err(); e == nil || e.str("name") != "TimeoutError" {
			t.Errorf("a busy loop with timeout_ms: %v, want a TimeoutError", r)
		}

		// /interrupt stops the running cell with KeyboardInterrupt.
		done := make(chan codeRun, 1)
		go func() {
			r, _ := g.exec(ctx, map[string]any{"code": "sleep 600", "language": "bash"}, nil)
			done <- r
		}()
		g.waitBusy(t, ctx, "default-bash")
		code, b := g.request(t, ctx, "POST", "/contexts/default-bash/interrupt", nil)
		if code != http.StatusOK || !strings.Contains(string(b), `"interrupted": true`) {
			t.Errorf("POST interrupt: %d %s, want interrupted true", code, b)
		}
		if r := <-done; r.err() == nil || r.err().str("name") != "KeyboardInterrupt" || !r.ended() {
			t.Errorf("the interrupted cell: %v, want a KeyboardInterrupt", r)
		}
		code, b = g.request(t, ctx, "POST", "/contexts/default-bash/interrupt", nil)
		if code != http.StatusOK || !strings.Contains(string(b), `"interrupted": false`) {
			t.Errorf("POST interrupt of an idle context: %d %s, want interrupted false", code, b)
		}
		if r = g.mustExec(t, ctx, map[string]any{"code": "echo after $X $PANDA_CELL", "language": "bash"}); r.stdout() != "after 5\n" {
			t.Errorf("after the interrupts: %v, want %q", r, "after 5\n")
		}
	})

	t.Run("Order", func(t *testing.T) {
		g.mustExec(t, ctx, map[string]any{"code": "import time\norder = []"})
		first := make(chan codeRun, 1)
		go func() {
			r, _ := g.exec(ctx, map[string]any{"code": "time.sleep(3)\norder.append('first')"}, nil)
			first <- r
		}()
		g.waitBusy(t, ctx, "default-python")
		second := g.mustExec(t, ctx, map[string]any{"code": "order.append('second')\nlen(order)"})
		r1 := <-first
		if !r1.ended() || r1.err() != nil || second.main() != "2" {
			t.Errorf("two cells at once: first %v, second %v; want both to end, the second after the first", r1, second)
		}
		if r := g.mustExec(t, ctx, map[string]any{"code": "order"}); r.main() != "['first', 'second']" {
			t.Errorf("order: %v, want ['first', 'second']", r)
		}
	})

	t.Run("ClientLeaves", func(t *testing.T) {
		cctx, ccancel := context.WithCancel(ctx)
		var once sync.Once
		_, err := g.exec(cctx, map[string]any{"code": "y = 7\nprint('started', flush=True)\nimport time\ntime.sleep(600)\ny = 8"}, func(l codeLine) {
			if l.typ() == "stdout" && strings.Contains(l.str("text"), "started") {
				once.Do(ccancel)
			}
		})
		ccancel()
		if err == nil {
			t.Fatalf("the cell ended before its client left")
		}
		// The next cell waits for the one left behind to be interrupted.
		if r := g.mustExec(t, ctx, map[string]any{"code": "y"}); r.main() != "7" {
			t.Errorf("after the client left: %v, want 7 (interrupted before y = 8)", r)
		}
	})

	t.Run("Contexts", func(t *testing.T) {
		code, b := g.request(t, ctx, "POST", "/contexts", map[string]any{"language": "shell", "cwd": "/tmp"})
		var c struct{ ID, Language, Cwd, State string }
		if err := json.Unmarshal(b, &c); code != http.StatusOK || err != nil || c.Language != "bash" || c.Cwd != "/tmp" || c.State != "idle" || c.ID == "" {
			t.Fatalf("POST /contexts: %d %s, want a bash context in /tmp", code, b)
		}
		r := g.mustExec(t, ctx, map[string]any{"code": "pwd; echo ${X:-unset}", "context_id": c.ID})
		if r.stdout() != "/tmp\nunset\n" || r.Lines[len(r.Lines)-1].str("context_id") != c.ID {
			t.Errorf("a cell in the new context: %v, want its own state in /tmp", r)
		}
		if _, ok := g.contexts(t, ctx)[c.ID]; !ok {
			t.Errorf("GET /contexts does not list %s", c.ID)
		}
		if code, b := g.request(t, ctx, "DELETE", "/contexts/"+c.ID, nil); code != http.StatusNoContent {
			t.Errorf("DELETE: %d %s, want 204", code, b)
		}
		if code, _ := g.request(t, ctx, "DELETE", "/contexts/"+c.ID, nil); code != http.StatusNotFound {
			t.Errorf("DELETE again: %d, want 404", code)
		}
		for _, tc := range []struct {
			req    map[string]any
			status int
			text   string
		}{
			{map[string]any{"code": "1", "context_id": c.ID}, 404, "context " + c.ID + " not found"},
			{map[string]any{"code": "1", "language": "cobol"}, 400, `unknown language "cobol": python, javascript, bash`},
			{map[string]any{"code": "1", "language": "python", "context_id": "default-python"}, 400, "not both"},
			{map[string]any{"code": 1}, 400, "code"},
			{map[string]any{"code": "1", "env_vars": map[string]any{"A": 1}}, 400, "env_vars"},
		} {
			r := g.mustExec(t, ctx, tc.req)
			if r.Status != tc.status || !strings.Contains(r.Text, tc.text) {
				t.Errorf("execute %v: %d %q, want %d with %q", tc.req, r.Status, r.Text, tc.status, tc.text)
			}
		}
		if code, b := g.request(t, ctx, "POST", "/contexts", map[string]any{"language": "cobol"}); code != http.StatusBadRequest {
			t.Errorf("POST /contexts cobol: %d %s, want 400", code, b)
		}
		if code, b := g.request(t, ctx, "POST", "/contexts", map[string]any{"cwd": "/nonexistent"}); code != http.StatusBadRequest {
			t.Errorf("POST /contexts in a missing directory: %d %s, want 400", code, b)
		}
		for _, p := range []string{"/contexts/nope/restart", "/contexts/nope/interrupt"} {
			if code, _ := g.request(t, ctx, "POST", p, nil); code != http.StatusNotFound {
				t.Errorf("POST %s: %d, want 404", p, code)
			}
		}
	})

	// A fork taken while a cell runs: the child's copy of the cell is
	// interrupted at once (its /etc/machine-id is not the parent's, and
	// nobody listens to it there), so the child's context is free; the
	// parent's cell runs on until it is interrupted.
	t.Run("Fork", func(t *testing.T) {
		started := make(chan struct{})
		parent := make(chan codeRun, 1)
		go func() {
			var once sync.Once
			r, _ := g.exec(ctx, map[string]any{"code": "import time\nz = 1\nprint('forking', flush=True)\ntime.sleep(600)\nz = 2"}, func(l codeLine) {
				if strings.Contains(l.str("text"), "forking") {
					once.Do(func() { close(started) })
				}
			})
			parent <- r
		}()
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatal("the cell did not start")
		}
		kids, err := sb.Fork(ctx, 1)
		if err != nil {
			t.Fatalf("fork: %v", err)
		}
		child := kids[0]
		t.Cleanup(func() {
			kctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			child.Kill(kctx)
		})
		cg := codeGuest{w: w, id: child.ID}
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Minute)
		defer ccancel()
		if r, err := cg.exec(cctx, map[string]any{"code": "z"}, nil); err != nil || r.main() != "1" {
			t.Errorf("z in the child: %v, %v; want 1 (its copy of the cell interrupted)", r, err)
		}
		if st := g.contexts(t, ctx)["default-python"]["state"]; st != "busy" {
			t.Errorf("the parent's context: %v, want busy (its cell runs on)", st)
		}
		if code, b := g.request(t, ctx, "POST", "/contexts/default-python/interrupt", nil); code != http.StatusOK || !strings.Contains(string(b), "true") {
			t.Errorf("interrupt the parent's cell: %d %s", code, b)
		}
		if r := <-parent; r.err() == nil || r.err().str("name") != "KeyboardInterrupt" || !r.ended() {
			t.Errorf("the parent's cell: %v, want it interrupted by the request only", r)
		}
	})

	t.Run("KernelDied", func(t *testing.T) {
		r := g.mustExec(t, ctx, map[string]any{"code": "import os\nos._exit(1)"})
		if e := r.err(); e == nil || e.str("name") != "KernelDied" {
			t.Fatalf("os._exit(1): %v, want KernelDied", r)
		}
		if st := g.contexts(t, ctx)["default-python"]["state"]; st != "dead" {
			t.Errorf("state after os._exit: %v, want dead", st)
		}
		if r := g.mustExec(t, ctx, map[string]any{"code": "1"}); r.err() == nil || r.err().str("name") != "KernelDied" {
			t.Errorf("a cell in a dead context: %v, want KernelDied", r)
		}
		t0 := time.Now()
		code, b := g.request(t, ctx, "POST", "/contexts/default-python/restart", nil)
		t.Logf("restart (warm imports again): %.1fs", time.Since(t0).Seconds())
		if code != http.StatusOK || !strings.Contains(string(b), `"idle"`) {
			t.Fatalf("restart: %d %s, want the context idle", code, b)
		}
		r = g.mustExec(t, ctx, map[string]any{"code": "import sys\n'x' in globals(), 'pandas' in sys.modules"})
		if r.main() != "(False, True)" {
			t.Errorf("after the restart: %v, want a fresh interpreter with pandas imported", r)
		}
	})
}
