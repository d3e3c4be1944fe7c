package main

// The code interpreter through PandaStack's own REST API, the Go SDK and
// `panda run`, against real code-interpreter sandboxes (codeWorld): one
// sandbox carries most of the assertions, in order, to keep the number of
// guests small.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// pngMagic starts every PNG file.
var pngMagic = []byte("\x89PNG\r\n\x1a\n")

// codeEvent is an event of the code stream as a test reads it.
type codeEvent map[string]any

func (e codeEvent) typ() string { s, _ := e["type"].(string); return s }
func (e codeEvent) str(k string) string {
	s, _ := e[k].(string)
	return s
}
func (e codeEvent) data() map[string]any { d, _ := e["data"].(map[string]any); return d }

// codeStream is a cell's stream being read: its events arrive on events,
// which is closed at the stream's end.
type codeStream struct {
	status int
	body   []byte // of an error answer
	events chan codeEvent
	bytes  int64 // of stdout and stderr text, once events is closed
}

// postCode sends a cell to sandbox id's code interpreter as key (over
// hc, the world's namespace) and returns its stream as it arrives: the
// answer's headers mean the cell reached the code server (it answers
// when the cell arrives, before it waits for the cells before it).
func postCode(t *testing.T, ctx context.Context, hc *http.Client, base, key, id string, body map[string]any) *codeStream {
	t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/sandboxes/"+id+"/code", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST code: %v", err)
	}
	cs := &codeStream{status: resp.StatusCode, events: make(chan codeEvent, 1024)}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		cs.body, _ = readAllLimit(resp.Body, 1<<20)
		close(cs.events)
		return cs
	}
	go func() {
		defer resp.Body.Close()
		defer close(cs.events)
		br := bufio.NewReaderSize(resp.Body, 1<<20)
		for {
			line, err := br.ReadBytes('\n')
			if len(bytes.TrimSpace(line)) > 0 {
				var ev codeEvent
				if json.Unmarshal(line, &ev) != nil {
					ev = codeEvent{"type": "undecodable", "line": string(line)}
				}
				if t := ev.typ(); t == "stdout" || t == "stderr" {
					cs.bytes += int64(len(ev.str("text")))
					if len(ev.str("text")) > 4096 {
						ev["text"] = ev.str("text")[:4096] // the test keeps little of big output
					}
				}
				select {
				case cs.events <- ev:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	return cs
}

// all reads the rest of the stream.
func (cs *codeStream) all() []codeEvent {
	var evs []codeEvent
	for ev := range cs.events {
		evs = append(evs, ev)
	}
	return evs
}

func readAllLimit(r interface{ Read([]byte) (int, error) }, n int) ([]byte, error) {
	var b bytes.Buffer
	_, err := b.ReadFrom(&limited{r: r, n: n})
	return b.Bytes(), err
}

type limited struct {
	r interface{ Read([]byte) (int, error) }
	n int
}

func (l *limited) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errors.New("answer too long")
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	k, err := l.r.Read(p)
	l.n -= k
	return k, err
}

// cell runs body to its end and returns its events; it fails the test on
// an HTTP error.
func (w *secWorld) cell(t *testing.T, ctx context.Context, key, id string, body map[string]any) []codeEvent {
	t.Helper()
	cs := postCode(t, ctx, w.hc, w.URL(), key, id, body)
	if cs.status != http.StatusOK {
		t.Fatalf("POST code %v: %d %s", body, cs.status, cs.body)
	}
	return cs.all()
}

// types lists the events' types.
func types(evs []codeEvent) string {
	var s []string
	for _, ev := range evs {
		s = append(s, ev.typ())
	}
	return strings.Join(s, " ")
}

// stdoutOf joins the events' stdout.
func stdoutOf(evs []codeEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.typ() == "stdout" {
			b.WriteString(ev.str("text"))
		}
	}
	return b.String()
}

// mainText is the main result's text/plain.
func mainText(evs []codeEvent) string {
	for _, ev := range evs {
		if ev.typ() == "result" && ev["is_main_result"] == true {
			s, _ := ev.data()["text/plain"].(string)
			return s
		}
	}
	return ""
}

// errorOf is the stream's error event, nil if none.
func errorOf(evs []codeEvent) codeEvent {
	for _, ev := range evs {
		if ev.typ() == "error" {
			return ev
		}
	}
	return nil
}

// endOf is the stream's end event (its last), nil if it has none.
func endOf(evs []codeEvent) codeEvent {
	if len(evs) == 0 || evs[len(evs)-1].typ() != "end" {
		return nil
	}
	return evs[len(evs)-1]
}

// wantCell checks a cell's main result and that it ended without error.
func wantCell(t *testing.T, what string, evs []codeEvent, main string) {
	t.Helper()
	if e := errorOf(evs); e != nil {
		t.Errorf("%s: error %s: %s\n%s", what, e.str("name"), e.str("value"), e.str("traceback"))
	}
	if endOf(evs) == nil {
		t.Errorf("%s: no end event: %v", what, evs)
	}
	if got := mainText(evs); got != main {
		t.Errorf("%s: main result %q, want %q (events %s)", what, got, main, types(evs))
	}
}

// TestCodeREST drives one code-interpreter sandbox through the REST API:
// a python cell's stream (stdout, a PNG display, the main result), an
// exception, other languages, contexts (state and cwd of their own,
// restart, delete), interrupt, the timeout, 100 MiB of output capped,
// the interpreter dying, cells queued in one context, the errors before a
// stream, the Go SDK and `panda run`.
func TestCodeREST(t *testing.T) {
	w := codeWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	sb := w.codeSandbox(t, ctx, w.Alice)
	if err := sb.SetTTL(ctx, 3600); err != nil { // the subtests take longer than its ten minutes under TCG
		t.Fatal(err)
	}
	id := sb.ID
	defaultPython := "" // python's default context, as the first cell's end names it
	cell := func(t *testing.T, body map[string]any) []codeEvent {
		t.Helper()
		return w.cell(t, ctx, w.Alice, id, body)
	}

	t.Run("python stream", func(t *testing.T) {
		evs := cell(t, map[string]any{"code": "print('hello')\n" +
			"import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.show()\n6 * 7"})
		var kinds []string
		var png []byte
		for _, ev := range evs {
			switch ev.typ() {
			case "result":
				d := ev.data()
				if s, ok := d["image/png"].(string); ok {
					var err error
					if png, err = base64.StdEncoding.DecodeString(strings.NewReplacer("\n", "", "\r", "").Replace(s)); err != nil {
						t.Errorf("image/png is not base64: %v", err)
					}
					if ev["is_main_result"] != false {
						t.Errorf("the figure's display is_main_result %v, want false", ev["is_main_result"])
					}
					kinds = append(kinds, "png")
					continue
				}
				kinds = append(kinds, "result")
			default:
				kinds = append(kinds, ev.typ())
			}
		}
		if got, want := strings.Join(kinds, " "), "stdout png result end"; got != want {
			t.Errorf("events %s, want %s: %v", got, want, evs)
		}
		if !bytes.HasPrefix(png, pngMagic) {
			t.Errorf("the display's PNG starts %q, want a PNG", png[:min(len(png), 8)])
		}
		if got := stdoutOf(evs); got != "hello\n" {
			t.Errorf("stdout %q, want hello", got)
		}
		wantCell(t, "6 * 7", evs, "42")
		end := endOf(evs)
		if end == nil || end["execution_count"].(float64) < 1 || end.str("context_id") == "" || end["truncated"] != false {
			t.Fatalf("end %v: want an execution count, the context, not truncated", end)
		}
		defaultPython = end.str("context_id")

		evs = cell(t, map[string]any{"code": "1 / 0"})
		e := errorOf(evs)
		if e == nil || e.str("name") != "ZeroDivisionError" || e.str("value") != "division by zero" ||
			!strings.Contains(e.str("traceback"), "ZeroDivisionError") || strings.Contains(e.str("traceback"), "\x1b[") {
			t.Errorf("1/0: error %v, want ZeroDivisionError with a plain traceback", e)
		}
		if endOf(evs) == nil {
			t.Errorf("1/0: no end after the error: %s", types(evs))
		}
		evs = cell(t, map[string]any{"code": "def f(:\n  pass"})
		if e := errorOf(evs); e == nil || e.str("name") != "SyntaxError" {
			t.Errorf("a syntax error: %v, want a SyntaxError event", e)
		}
		wantCell(t, "javascript", cell(t, map[string]any{"code": "let a = 5; a * 2", "language": "js"}), "10")
		if got := stdoutOf(cell(t, map[string]any{"code": "echo $((2 + 3)); echo $X", "language": "bash", "env": map[string]string{"X": "only-here"}})); got != "5\nonly-here\n" {
			t.Errorf("bash: stdout %q, want 5 and the env", got)
		}
		if got := stdoutOf(cell(t, map[string]any{"code": "echo \"[$X]\"", "language": "bash"})); got != "[]\n" {
			t.Errorf("bash: env of the cell before leaked: %q", got)
		}
	})

	t.Run("contexts", func(t *testing.T) {
		// One python context of the test's (each one warms numpy, pandas
		// and matplotlib up: slow under TCG), the defaults, one of node.
		c1, err := sb.CreateCodeContext(ctx, pandastack.CodeContextOptions{Cwd: "/tmp"})
		if err != nil {
			t.Fatal(err)
		}
		js, err := sb.CreateCodeContext(ctx, pandastack.CodeContextOptions{Language: "node"})
		if err != nil {
			t.Fatal(err)
		}
		if c1.Language != "python" || c1.Cwd != "/tmp" || c1.State != "idle" || js.Language != "javascript" || js.Cwd != "/home/user" || c1.ID == js.ID {
			t.Errorf("contexts %+v %+v", c1, js)
		}
		cell(t, map[string]any{"code": "x = 'one'", "context_id": c1.ID})
		cell(t, map[string]any{"code": "x = 'two'", "language": "python"})
		wantCell(t, "x in c1", cell(t, map[string]any{"code": "import os; (x, os.getcwd())", "context_id": c1.ID}), "('one', '/tmp')")
		wantCell(t, "x in the default", cell(t, map[string]any{"code": "import os; (x, os.getcwd())"}), "('two', '/home/user')")
		wantCell(t, "javascript", cell(t, map[string]any{"code": "typeof x", "context_id": js.ID}), "'undefined'")
		list, err := sb.ListCodeContexts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		langs, ids := map[string]int{}, map[string]bool{}
		for _, c := range list {
			langs[c.Language]++
			ids[c.ID] = true
		}
		if !ids[c1.ID] || !ids[js.ID] || langs["python"] < 2 || langs["javascript"] < 2 || langs["bash"] < 1 {
			t.Errorf("list %+v: want both contexts and the defaults of every language", list)
		}

		// The interpreter dies: the context is dead until restarted, and
		// the restart starts it afresh where it was.
		evs := cell(t, map[string]any{"code": "import os; os._exit(1)", "context_id": c1.ID})
		if e := errorOf(evs); e == nil || e.str("name") != "KernelDied" || endOf(evs) == nil {
			t.Errorf("os._exit: %v, want KernelDied and end", evs)
		}
		if list, err = sb.ListCodeContexts(ctx); err != nil {
			t.Fatal(err)
		}
		for _, l := range list {
			if l.ID == c1.ID && l.State != "dead" {
				t.Errorf("the context after os._exit: %s, want dead", l.State)
			}
		}
		if e := errorOf(cell(t, map[string]any{"code": "1", "context_id": c1.ID})); e == nil || e.str("name") != "KernelDied" {
			t.Errorf("a cell in the dead context: %v, want KernelDied", e)
		}
		r, err := sb.RestartCodeContext(ctx, c1.ID)
		if err != nil || r.ID != c1.ID || r.Cwd != "/tmp" || r.State != "idle" {
			t.Errorf("restart: %+v, %v", r, err)
		}
		if e := errorOf(cell(t, map[string]any{"code": "x", "context_id": c1.ID})); e == nil || e.str("name") != "NameError" {
			t.Errorf("x after the restart: %v, want a NameError", e)
		}
		wantCell(t, "after the restart", cell(t, map[string]any{"code": "import os; os.getcwd()", "context_id": c1.ID}), "'/tmp'")

		for _, c := range []pandastack.CodeContext{js, c1} {
			if err := sb.RemoveCodeContext(ctx, c.ID); err != nil {
				t.Fatal(err)
			}
			cs := postCode(t, ctx, w.hc, w.URL(), w.Alice, id, map[string]any{"code": "1", "context_id": c.ID})
			if cs.status != http.StatusNotFound || !strings.Contains(string(cs.body), "context "+c.ID+" not found") {
				t.Errorf("a cell in a removed context: %d %s, want 404", cs.status, cs.body)
			}
			if err := sb.RemoveCodeContext(ctx, c.ID); !errors.Is(err, pandastack.ErrNotFound) {
				t.Errorf("remove twice: %v, want ErrNotFound", err)
			}
		}
	})

	t.Run("interrupt and timeout", func(t *testing.T) {
		// Python's default context (one warm interpreter less to wait for).
		sleeper := map[string]any{"code": "import time\nprint('started', flush=True)\ntime.sleep(600)"}
		cell(t, map[string]any{"code": "kept = 7"})
		cs := postCode(t, ctx, w.hc, w.URL(), w.Alice, id, sleeper)
		if ev := <-cs.events; ev.str("text") != "started\n" {
			t.Fatalf("first event %v, want started", ev)
		}
		if ok, err := sb.InterruptCode(ctx, defaultPython); err != nil || !ok {
			t.Errorf("interrupt %s: %v, %v; want true", defaultPython, ok, err)
		}
		evs := cs.all()
		if e := errorOf(evs); e == nil || e.str("name") != "KeyboardInterrupt" || endOf(evs) == nil {
			t.Errorf("the interrupted cell: %v", evs)
		}
		if ok, err := sb.InterruptCode(ctx, defaultPython); err != nil || ok {
			t.Errorf("interrupt an idle context: %v, %v; want false", ok, err)
		}
		cs = postCode(t, ctx, w.hc, w.URL(), w.Alice, id, sleeper)
		if ev := <-cs.events; ev.str("text") != "started\n" {
			t.Fatalf("first event %v, want started", ev)
		}
		if ok, err := sb.InterruptCode(ctx, ""); err != nil || !ok {
			t.Errorf("interrupt python's default context: %v, %v; want true", ok, err)
		}
		if e := errorOf(cs.all()); e == nil || e.str("name") != "KeyboardInterrupt" {
			t.Errorf("the default context's interrupted cell: %v", e)
		}

		evs = cell(t, map[string]any{"code": "import time; time.sleep(600)", "timeout_seconds": 3})
		if e := errorOf(evs); e == nil || e.str("name") != "TimeoutError" || endOf(evs) == nil {
			t.Errorf("past its timeout: %v", evs)
		}
		wantCell(t, "state after an interrupt and a timeout", cell(t, map[string]any{"code": "kept"}), "7")

		// The client leaving interrupts its cell: the next one runs.
		lctx, leave := context.WithCancel(ctx)
		cs = postCode(t, lctx, w.hc, w.URL(), w.Alice, id, sleeper)
		if ev := <-cs.events; ev.str("text") != "started\n" {
			t.Fatalf("first event %v, want started", ev)
		}
		leave()
		cs.all()
		wantCell(t, "after the client left", cell(t, map[string]any{"code": "kept + 1", "timeout_seconds": 120}), "8")
	})

	t.Run("output cap", func(t *testing.T) {
		// 100 MiB written as fast as Python can, never flushed: the
		// kernel's stream buffer stays bounded (a 512 MiB sandbox),
		// the answer is capped with one marker, the cell ends.
		cs := postCode(t, ctx, w.hc, w.URL(), w.Alice, id, map[string]any{
			"code": "import sys\nfor i in range(100):\n    sys.stdout.write('x' * (1 << 20))\n'done'"})
		if cs.status != http.StatusOK {
			t.Fatalf("%d %s", cs.status, cs.body)
		}
		evs := cs.all()
		markers := 0
		for _, ev := range evs {
			if ev.typ() == "stderr" && strings.HasPrefix(ev.str("text"), "[output truncated") {
				markers++
			}
		}
		end := endOf(evs)
		// The server's MaxExecOutputBytes (16 MiB), and one marker.
		if markers != 1 || end == nil || end["truncated"] != true || cs.bytes > 16<<20+4096 || cs.bytes < 16<<20 {
			t.Errorf("100 MiB of output: %d bytes, %d markers, end %v; want 16 MiB, one marker, truncated", cs.bytes, markers, end)
		}
		if got := mainText(evs); got != "'done'" {
			t.Errorf("the capped cell's result %q, want 'done'", got)
		}
		wantCell(t, "the cell after", cell(t, map[string]any{"code": "print('fine'); 1"}), "1")
	})

	t.Run("cells queue in order", func(t *testing.T) {
		cell(t, map[string]any{"code": "import time\nseen = []"})
		run := func(name string, secs int) *codeStream {
			code := fmt.Sprintf("print('%s', flush=True); seen.append('%s+'); time.sleep(%d); seen.append('%s-')", name, name, secs, name)
			return postCode(t, ctx, w.hc, w.URL(), w.Alice, id, map[string]any{"code": code})
		}
		// a runs (its first output says so) when b and c are sent: they
		// wait for it, then run one at a time, in the order they were
		// sent. A cell's answer comes once the code server has queued it
		// (postCode returns with the headers), so b is queued before c
		// is sent.
		a := run("a", 2)
		// Its output may come as one event or as "a" then "\n" (print
		// writes the text and its end apart, and the kernel may send
		// each in a stream message of its own).
		for out := ""; out != "a\n"; {
			ev := <-a.events
			if ev.typ() != "stdout" || !strings.HasPrefix("a\n", out+ev.str("text")) {
				t.Fatalf("a's output so far %q, then event %v; want a's output, a\\n", out, ev)
			}
			out += ev.str("text")
		}
		streams := []*codeStream{a, run("b", 1), run("c", 1)}
		for i, cs := range streams {
			if evs := cs.all(); endOf(evs) == nil || errorOf(evs) != nil {
				t.Errorf("cell %d: %v", i, evs)
			}
		}
		evs := cell(t, map[string]any{"code": "''.join(seen)"})
		if got := mainText(evs); got != "'a+a-b+b-c+c-'" {
			t.Errorf("the cells ran as %s, want a, b, c, one at a time", got)
		}
	})

	t.Run("errors", func(t *testing.T) {
		for _, tt := range []struct {
			name, key, path string
			body            map[string]any
			status          int
			msg             string
		}{
			{"unknown language", w.Alice, "/code", map[string]any{"code": "1", "language": "cobol"}, 400, `unknown language \"cobol\": python, javascript, bash`},
			{"both", w.Alice, "/code", map[string]any{"code": "1", "language": "python", "context_id": "x"}, 400, "not both"},
			{"unknown context", w.Alice, "/code", map[string]any{"code": "1", "context_id": "nosuch"}, 404, "context nosuch not found"},
			{"bad timeout", w.Alice, "/code", map[string]any{"code": "1", "timeout_seconds": 0}, 422, "timeout_seconds"},
			{"another key's sandbox", w.Bob, "/code", map[string]any{"code": "1"}, 404, "not found"},
			{"another key's contexts", w.Bob, "/code/contexts", map[string]any{}, 404, "not found"},
			{"another key's interrupt", w.Bob, "/code/interrupt", map[string]any{}, 404, "not found"},
			{"context, no such cwd", w.Alice, "/code/contexts", map[string]any{"cwd": "/nonexistent"}, 400, "not an existing directory"},
		} {
			code, b := w.mustDo(t, ctx, tt.key, "POST", "/v1/sandboxes/"+id+tt.path, tt.body, nil)
			if code != tt.status || !strings.Contains(string(b), tt.msg) {
				t.Errorf("%s: %d %s, want %d with %q", tt.name, code, b, tt.status, tt.msg)
			}
		}
		tiny := w.sandbox(t, ctx, w.Alice)
		code, b := w.mustDo(t, ctx, w.Alice, "POST", "/v1/sandboxes/"+tiny.ID+"/code", map[string]any{"code": "1"}, nil)
		if want := "sandbox " + tiny.ID + " has no code interpreter: create it from the code-interpreter template"; code != 502 || !strings.Contains(string(b), want) || !strings.Contains(string(b), "guest_error") {
			t.Errorf("a tiny sandbox: %d %s, want 502 guest_error %q", code, b, want)
		}
	})

	t.Run("go sdk", func(t *testing.T) {
		var order []string
		ex, err := sb.RunCode(ctx, "print('a')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()\nprint('b')\n'end'", pandastack.RunCodeOptions{
			Timeout:  2 * time.Minute,
			OnStdout: func(s string) { order = append(order, "out:"+s) },
			OnStderr: func(s string) { order = append(order, "err:"+s) },
			OnResult: func(r pandastack.Result) {
				if len(r.PNG) > 0 {
					order = append(order, "png")
				} else {
					order = append(order, "result:"+r.Text)
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(order, "|"); got != "out:a\n|png|out:b\n|result:'end'" {
			t.Errorf("callbacks in order %q", got)
		}
		if len(ex.Results) != 2 || !bytes.HasPrefix(ex.Results[0].PNG, pngMagic) || ex.Text() != "'end'" || ex.Error != nil || ex.ExecutionCount < 1 {
			t.Errorf("execution %+v", ex)
		}
		ex, err = sb.RunCode(ctx, "raise ValueError('no')", pandastack.RunCodeOptions{})
		if err != nil || ex.Error == nil || ex.Error.Name != "ValueError" || ex.Error.Value != "no" {
			t.Errorf("an exception: %+v, %v", ex, err)
		}
		_, err = sb.RunCode(ctx, "1", pandastack.RunCodeOptions{ContextID: "nosuch"})
		if !errors.Is(err, pandastack.ErrNotFound) {
			t.Errorf("an unknown context: %v, want ErrNotFound", err)
		}
	})

	t.Run("panda run", func(t *testing.T) {
		bin, err := pandatest.Binary()
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		run := func(args ...string) (string, string, error) {
			cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + w.env.Host.Path, "--", bin, "run", id}, args...)...)
			cmd.Env = append(os.Environ(), "PANDASTACK_API_URL="+w.URL(), "PANDASTACK_API_KEY="+w.Alice)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			return stdout.String(), stderr.String(), err
		}
		stdout, stderr, err := run("--images-dir", dir, "-c", "import matplotlib.pyplot as plt\nprint('hi')\nplt.plot([3, 1]); plt.show()\n2 ** 10")
		if err != nil {
			t.Fatalf("panda run: %v\n%s", err, stderr)
		}
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if len(lines) != 3 || lines[0] != "hi" || lines[1] != "1024" || !strings.HasPrefix(lines[2], dir+"/cell-") || !strings.HasSuffix(lines[2], "-1.png") {
			t.Fatalf("panda run printed %q, want hi, 1024 and the image's path", stdout)
		}
		if b, err := os.ReadFile(lines[2]); err != nil || !bytes.HasPrefix(b, pngMagic) {
			t.Errorf("the saved image %s: %v, want a PNG", lines[2], err)
		}
		_, stderr, err = run("-c", "1 / 0")
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stderr, "Traceback") || !strings.Contains(stderr, "ZeroDivisionError: division by zero") {
			t.Errorf("panda run of 1/0: %v, stderr %q; want exit 1 and the traceback", err, stderr)
		}
	})
}

// TestCodeRESTSplit: a cell runs through `panda server`'s API on a
// sandbox of `panda agent` (networking on, in namespaces of the test):
// the control plane reaches the code interpreter over the host API's
// DialGuest.
func TestCodeRESTSplit(t *testing.T) {
	e2e(t)
	env, err := nettest.Build()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	prefix := "p" + strings.TrimPrefix(env.Prefix, "nt")
	agentDir, serverDir := newDataDir(t), newDataDir(t)
	aopts := agentOptions(agentDir, "", "--network", "on", "--network-prefix", prefix, "--dns-upstream", nettest.DNSAddr.String())
	aopts.NetNS = env.Host.Path
	ag := start(t, "agent", aopts)
	sopts := serverOptions(serverDir, ag.URL(),
		"--agent-token-file", filepath.Join(agentDir, "agent.token"), "--agent-ca-file", filepath.Join(agentDir, "agent-ca.pem"))
	sopts.NetNS = env.Host.Path
	sv := start(t, "server", sopts)
	hc, err := sv.HTTPClient()
	if err != nil {
		t.Fatal(err)
	}
	c, err := pandastack.NewClient(pandastack.Options{APIURL: sv.URL(), APIKey: sv.AdminKey(), HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	sb, err := c.Create(ctx, pandastack.CreateOptions{Template: codeTemplate, MemoryMiB: codeMemoryMiB, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("create a %s sandbox on the agent: %v", codeTemplate, err)
	}
	t.Cleanup(func() {
		kctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := sb.Kill(kctx); err != nil {
			t.Errorf("kill %s: %v", sb.ID, err)
		}
	})
	var out strings.Builder
	ex, err := sb.RunCode(ctx, "import socket\nprint(socket.gethostname())\n[i * i for i in range(4)]", pandastack.RunCodeOptions{
		OnStdout: func(s string) { out.WriteString(s) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if ex.Text() != "[0, 1, 4, 9]" || out.String() == "" || ex.Error != nil {
		t.Errorf("a cell through the server: %+v, stdout %q", ex, out.String())
	}
}
