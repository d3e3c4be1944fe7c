package rest_test

// The code interpreter's handlers (code.go) against a scripted code server:
// what the host does with a guest that answers well, badly or not at all.
// The guest is a hand-written HTTP server the test host's DialGuest
// connects to (a fake of the guest, as hostileguest is of the guest
// agent); the router, the SQLite catalog, the Plane and the port proxy's
// transport are the real ones. The real code server is tested in
// cmd/panda (code_rest_test.go).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/testing/hosttest"
)

// codeHost is the in-memory host with a code server in every running
// sandbox: guest (nil: nothing listens, ECONNREFUSED).
type codeHost struct {
	*hosttest.Host
	guest   http.Handler
	dialErr error // if set, what every dial fails with

	mu    sync.Mutex
	dials []string // "id:port"
	srv   *httptest.Server
}

func (h *codeHost) DialGuest(ctx context.Context, id string, port int) (net.Conn, error) {
	if info, ok := h.Sandbox(id); !ok || info.State != lifecycle.Running {
		return nil, host.ErrNotFound
	}
	h.mu.Lock()
	h.dials = append(h.dials, fmt.Sprintf("%s:%d", id, port))
	h.mu.Unlock()
	if h.dialErr != nil {
		return nil, h.dialErr
	}
	if h.guest == nil {
		return nil, fmt.Errorf("dial %s:%d: %w", id, port, syscall.ECONNREFUSED)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", h.srv.Listener.Addr().String())
}

func (h *codeHost) dialed() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.dials...)
}

// codeWorld is an API server over a codeHost with two keys, each with one
// running sandbox.
type codeWorld struct {
	url         string
	host        *codeHost
	key, other  string // secrets
	sb, otherSB string
}

// newCodeWorld serves guest as every sandbox's code server (nil: none;
// noNet: the host has no sandbox networking at all).
func newCodeWorld(t *testing.T, guest http.Handler, noNet bool, grace time.Duration) *codeWorld {
	t.Helper()
	ctx := context.Background()
	cat, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "panda.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	ch := &codeHost{Host: hosttest.New(), guest: guest}
	if guest != nil {
		ch.srv = httptest.NewServer(guest)
		t.Cleanup(ch.srv.Close)
	}
	var h host.Host = ch
	if noNet {
		h = ch.Host
	}
	log := slog.New(slog.DiscardHandler)
	srv, _, err := newServer(rest.Config{Logger: log, MaxExecOutputBytes: 64}, controlplane.Config{Logger: log}, cat, h)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetCodeTimeoutGrace(grace)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	w := &codeWorld{url: hs.URL, host: ch}
	for i, who := range []*string{&w.key, &w.other} {
		k, secret, err := rest.NewKey(ctx, cat, fmt.Sprintf("k%d", i), false, 8, 8192)
		if err != nil {
			t.Fatal(err)
		}
		*who = secret
		id := fmt.Sprintf("codesb%014d", i)
		now := time.Now().UTC().Truncate(time.Second)
		sb := catalog.Sandbox{ID: id, KeyID: k.ID, Template: "code-interpreter", HostID: "local", State: string(lifecycle.Running),
			MemoryMiB: 512, VCPUs: 1, DiskMiB: 1024, Network: catalog.Network{Internet: true, AllowOut: []string{}, DenyOut: []string{}},
			Metadata: map[string]string{}, Env: map[string]string{}, TTLSeconds: 3600, OnExpire: "kill", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := cat.ReserveSandbox(ctx, sb, catalog.Limits{Sandboxes: -1, MemoryMiB: -1, VCPUs: -1, DiskMiB: -1}); err != nil {
			t.Fatal(err)
		}
		ch.Put(host.Info{ID: id, Template: sb.Template, MemoryMiB: 512, VCPUs: 1, State: lifecycle.Running, CreatedAt: now})
		if i == 0 {
			w.sb = id
		} else {
			w.otherSB = id
		}
	}
	return w
}

// do sends a request with key and returns the answer (closed by the test's
// end).
func (w *codeWorld) do(t *testing.T, ctx context.Context, key, method, path, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, w.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

// events reads a stream's events to its end.
func events(t *testing.T, res *http.Response) []map[string]any {
	t.Helper()
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/x-ndjson" {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("got %d %s %s, want a 200 stream", res.StatusCode, res.Header.Get("Content-Type"), b)
	}
	var evs []map[string]any
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// errorOf reads an error answer: status, code, message.
func errorOf(t *testing.T, res *http.Response) (int, string, string) {
	t.Helper()
	var eb struct {
		Error struct{ Code, Message string }
	}
	b, _ := io.ReadAll(res.Body)
	if err := json.Unmarshal(b, &eb); err != nil {
		t.Fatalf("answer %d %q is not an error body: %v", res.StatusCode, b, err)
	}
	return res.StatusCode, eb.Error.Code, eb.Error.Message
}

// guestLines answers /execute with lines, flushed one by one.
func guestLines(lines ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, l := range lines {
			io.WriteString(w, l+"\n")
			w.(http.Flusher).Flush()
		}
	}
}

// TestCodeHandlerStream: the guest's lines become the API's events; the
// guest is asked with the cell's timeout and env and without the
// caller's key; the cap cuts output with a marker.
func TestCodeHandlerStream(t *testing.T) {
	var got struct {
		sync.Mutex
		body map[string]any
		auth string
	}
	guest := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/execute" || r.Method != http.MethodPost {
			http.Error(w, "unexpected "+r.URL.Path, http.StatusTeapot)
			return
		}
		got.Lock()
		json.NewDecoder(r.Body).Decode(&got.body)
		got.auth = r.Header.Get("Authorization") + r.Header.Get("X-Api-Key")
		got.Unlock()
		guestLines(
			`{"type":"stdout","text":"hello\n","timestamp":1}`,
			`{"type":"result","is_main_result":false,"png":"iVBORw0KGgo="}`,
			`{"type":"stdout","text":"`+strings.Repeat("x", 100)+`"}`,
			`{"type":"stderr","text":"dropped"}`,
			`{"type":"result","is_main_result":true,"text":"2"}`,
			`{"type":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"tb"}`,
			`{"type":"number_of_executions","execution_count":7}`,
			`{"type":"end_of_execution","context_id":"py1","duration_ms":5}`,
			`{"type":"stdout","text":"after the end"}`,
		)(w, r)
	})
	w := newCodeWorld(t, guest, false, time.Minute)
	evs := events(t, w.do(t, t.Context(), w.key, "POST", "/v1/sandboxes/"+w.sb+"/code",
		`{"code":"print('hello')","language":"py","env":{"A":"1"},"timeout_seconds":9}`))
	var types []string
	for _, ev := range evs {
		types = append(types, ev["type"].(string))
	}
	if want := "stdout result stdout stderr result error end"; strings.Join(types, " ") != want {
		t.Fatalf("got events %s, want %s: %v", strings.Join(types, " "), want, evs)
	}
	if evs[1]["data"].(map[string]any)["image/png"] != "iVBORw0KGgo=" {
		t.Errorf("display event %v: want its PNG under image/png", evs[1])
	}
	if n := len(evs[2]["text"].(string)); n != 64-len("hello\n") {
		t.Errorf("stdout after the cap of 64 bytes: %d bytes, want %d", n, 64-len("hello\n"))
	}
	if m := evs[3]["text"].(string); !strings.HasPrefix(m, "[output truncated") {
		t.Errorf("after the cap: got stderr %q, want the marker", m)
	}
	end := evs[len(evs)-1]
	if end["execution_count"] != 7.0 || end["context_id"] != "py1" || end["duration_ms"] != 5.0 || end["truncated"] != true {
		t.Errorf("end: got %v", end)
	}
	got.Lock()
	defer got.Unlock()
	if got.body["language"] != "python" || got.body["timeout_ms"] != 9000.0 || got.body["code"] != "print('hello')" ||
		got.body["env_vars"].(map[string]any)["A"] != "1" {
		t.Errorf("the guest was asked %v", got.body)
	}
	if got.auth != "" {
		t.Errorf("the guest got credentials %q", got.auth)
	}
	if d := w.host.dialed(); len(d) == 0 || d[0] != w.sb+":49999" {
		t.Errorf("dialed %v, want %s:49999", d, w.sb)
	}
}

// TestCodeHandlerBrokenGuest: a stream cut before its end, a bad line and an
// overlong line each end the stream with a GuestError event.
func TestCodeHandlerBrokenGuest(t *testing.T) {
	for _, tt := range []struct {
		name  string
		guest http.HandlerFunc
		want  string
	}{
		{"cut", guestLines(`{"type":"stdout","text":"a"}`), "ended its stream before the cell's end"},
		{"not JSON", guestLines(`{"type":"stdout","text":"a"}`, `<html>`), "not a JSON object"},
		{"unknown type", guestLines(`{"type":"rm -rf"}`), "unknown type"},
		{"hijacked", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			c, _, _ := http.NewResponseController(w).Hijack()
			c.Close()
		}, "ended its stream"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newCodeWorld(t, tt.guest, false, time.Minute)
			evs := events(t, w.do(t, t.Context(), w.key, "POST", "/v1/sandboxes/"+w.sb+"/code", `{"code":"x"}`))
			last := evs[len(evs)-1]
			if last["type"] != "error" || last["name"] != "GuestError" || !strings.Contains(last["value"].(string), tt.want) {
				t.Errorf("last event %v, want a GuestError saying %q", last, tt.want)
			}
		})
	}
}

// TestCodeHandlerTimeout: a guest that lets a cell run past its timeout has
// it interrupted by the server (in the cell's context, before its
// connection closes) and the stream ends with TimeoutError.
func TestCodeHandlerTimeout(t *testing.T) {
	interrupted := make(chan string, 4)
	closed := make(chan struct{})
	guest := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/execute":
			guestLines(`{"type":"stdout","text":"working"}`)(w, r)
			<-r.Context().Done() // never ends by itself
			close(closed)
		case strings.HasSuffix(r.URL.Path, "/interrupt"):
			interrupted <- r.URL.Path
			io.WriteString(w, `{"interrupted":true}`)
		case r.URL.Path == "/contexts":
			io.WriteString(w, `[{"id":"default-javascript","language":"javascript","cwd":"/home/user","state":"idle"},`+
				`{"id":"other","language":"python","cwd":"/home/user","state":"idle"},`+
				`{"id":"default-python","language":"python","cwd":"/home/user","state":"busy"}]`)
		default:
			http.NotFound(w, r)
		}
	})
	w := newCodeWorld(t, guest, false, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, tt := range []struct{ body, context string }{
		{`{"code":"while True: pass","timeout_seconds":1,"context_id":"mine"}`, "mine"},
		{`{"code":"while True: pass","timeout_seconds":1}`, "default-python"},
	} {
		closed = make(chan struct{})
		evs := events(t, w.do(t, ctx, w.key, "POST", "/v1/sandboxes/"+w.sb+"/code", tt.body))
		last := evs[len(evs)-1]
		if last["type"] != "error" || last["name"] != "TimeoutError" {
			t.Errorf("last event %v, want a TimeoutError", last)
		}
		select {
		case p := <-interrupted:
			if p != "/contexts/"+tt.context+"/interrupt" {
				t.Errorf("interrupted %s, want context %s", p, tt.context)
			}
		case <-ctx.Done():
			t.Fatal("the server did not interrupt the cell")
		}
		select {
		case <-closed:
		case <-ctx.Done():
			t.Fatal("the server did not close the cell's connection")
		}
	}
}

// TestCodeHandlerClientLeaves: the client going away closes the guest's
// connection (the guest interrupts the cell).
func TestCodeHandlerClientLeaves(t *testing.T) {
	started := make(chan struct{})
	closed := make(chan struct{})
	guest := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		guestLines(`{"type":"stdout","text":"working"}`)(w, r)
		close(started)
		<-r.Context().Done()
		close(closed)
	})
	w := newCodeWorld(t, guest, false, time.Minute)
	ctx, cancel := context.WithCancel(t.Context())
	res := w.do(t, ctx, w.key, "POST", "/v1/sandboxes/"+w.sb+"/code", `{"code":"import time; time.sleep(1e6)"}`)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("got %d", res.StatusCode)
	}
	wait, stop := context.WithTimeout(t.Context(), time.Minute)
	defer stop()
	select {
	case <-started:
	case <-wait.Done():
		t.Fatal("the cell did not start")
	}
	cancel()
	select {
	case <-closed:
	case <-wait.Done():
		t.Fatal("the guest's connection stayed open after the client left")
	}
}

// TestCodeHandlerErrors: the answers before a stream, and the guest's
// answers to contexts, bounded and cleaned.
func TestCodeHandlerErrors(t *testing.T) {
	hostile := strings.Repeat("\x1b[2J\u2028evil", 200)
	guest := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/execute":
			var req struct{ Code string }
			json.NewDecoder(r.Body).Decode(&req)
			switch req.Code {
			case "400":
				http.Error(w, hostile, http.StatusBadRequest)
			case "404":
				http.Error(w, "context nosuch not found", http.StatusNotFound)
			default:
				http.Error(w, "boom", http.StatusInternalServerError)
			}
		case r.URL.Path == "/contexts" && r.Method == http.MethodGet:
			io.WriteString(w, `[{"id":"ok","language":"python","cwd":"/","state":"exploded"}]`)
		case r.URL.Path == "/contexts" && r.Method == http.MethodPost:
			io.WriteString(w, `{"id":"c1","language":"bash","cwd":"/tmp","state":"idle"}`)
		case r.URL.Path == "/contexts/c1" && r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case r.URL.Path == "/contexts/c1/restart":
			io.WriteString(w, `{"id":"../../x","language":"bash","cwd":"/tmp","state":"idle"}`)
		case strings.HasSuffix(r.URL.Path, "/interrupt"):
			io.WriteString(w, `{"interrupted":"yes"}`)
		default:
			http.Error(w, "context "+r.URL.Path+" not found", http.StatusNotFound)
		}
	})
	w := newCodeWorld(t, guest, false, time.Minute)
	code := "/v1/sandboxes/" + w.sb + "/code"
	for _, tt := range []struct {
		name, key, method, path, body string
		status                        int
		code, msg                     string
	}{
		{"another key's sandbox", w.other, "POST", code, `{"code":"1"}`, 404, "not_found", "not found"},
		{"another key's contexts", w.other, "GET", code + "/contexts", ``, 404, "not_found", "not found"},
		{"no code", w.key, "POST", code, `{}`, 422, "invalid", "code is required"},
		{"unknown field", w.key, "POST", code, `{"code":"1","kernel":"x"}`, 400, "bad_request", "kernel"},
		{"both", w.key, "POST", code, `{"code":"1","language":"python","context_id":"c1"}`, 400, "bad_request", "not both"},
		{"unknown language", w.key, "POST", code, `{"code":"1","language":"cobol"}`, 400, "bad_request", `unknown language "cobol": python, javascript, bash`},
		{"bad timeout", w.key, "POST", code, `{"code":"1","timeout_seconds":0}`, 422, "invalid", "timeout_seconds"},
		{"bad context id", w.key, "POST", code, `{"code":"1","context_id":"a/../b"}`, 422, "invalid", "not a context id"},
		{"guest 400, hostile", w.key, "POST", code, `{"code":"400"}`, 400, "bad_request", "evil"},
		{"guest 404", w.key, "POST", code, `{"code":"404"}`, 404, "not_found", "context nosuch not found"},
		{"guest 500", w.key, "POST", code, `{"code":"500"}`, 502, "guest_error", "answered 500: boom"},
		{"context in a path, invalid", w.key, "DELETE", code + "/contexts/a.b", ``, 404, "not_found", "not found"},
		{"context list, bad state", w.key, "GET", code + "/contexts", ``, 502, "guest_error", "unknown state"},
		{"restart, bad id", w.key, "POST", code + "/contexts/c1/restart", ``, 502, "guest_error", "invalid id"},
		{"interrupt, bad answer", w.key, "POST", code + "/interrupt", `{"context_id":"c1"}`, 502, "guest_error", "malformed JSON"},
		{"interrupt, bad context", w.key, "POST", code + "/interrupt", `{"context_id":"x y"}`, 422, "invalid", "not a context id"},
		{"context, relative cwd", w.key, "POST", code + "/contexts", `{"cwd":"tmp"}`, 422, "invalid", "must be absolute"},
		{"context, unknown language", w.key, "POST", code + "/contexts", `{"language":"cobol"}`, 400, "bad_request", "unknown language"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st, c, msg := errorOf(t, w.do(t, t.Context(), tt.key, tt.method, tt.path, tt.body))
			if st != tt.status || c != tt.code || !strings.Contains(msg, tt.msg) {
				t.Errorf("got %d %s %q, want %d %s with %q", st, c, msg, tt.status, tt.code, tt.msg)
			}
			if len(msg) > 1024 || strings.ContainsAny(msg, "\x1b\u2028") {
				t.Errorf("message of %d bytes %q: want it bounded and without control characters", len(msg), msg)
			}
		})
	}
	for _, d := range w.host.dialed() {
		if strings.HasPrefix(d, w.otherSB) {
			t.Errorf("another key's request reached sandbox %s", d)
		}
	}
	// What works.
	res := w.do(t, t.Context(), w.key, "POST", code+"/contexts", `{"language":"sh","cwd":"/tmp"}`)
	var c map[string]any
	json.NewDecoder(res.Body).Decode(&c)
	if res.StatusCode != http.StatusCreated || c["id"] != "c1" || c["language"] != "bash" || c["state"] != "idle" {
		t.Errorf("create context: got %d %v", res.StatusCode, c)
	}
	if res := w.do(t, t.Context(), w.key, "DELETE", code+"/contexts/c1", ``); res.StatusCode != http.StatusNoContent {
		t.Errorf("delete context: got %d, want 204", res.StatusCode)
	}
}

// TestCodeHandlerNoInterpreter: nothing listening on the port is 502 with
// what to do; a guest agent too old to carry connections (the host has no
// sandbox networking) 501, and so is a host that cannot dial guests.
func TestCodeHandlerNoInterpreter(t *testing.T) {
	w := newCodeWorld(t, nil, false, time.Minute)
	st, c, msg := errorOf(t, w.do(t, t.Context(), w.key, "POST", "/v1/sandboxes/"+w.sb+"/code", `{"code":"1"}`))
	if want := "sandbox " + w.sb + " has no code interpreter: create it from the code-interpreter template"; st != 502 || c != "guest_error" || msg != want {
		t.Errorf("got %d %s %q, want 502 guest_error %q", st, c, msg, want)
	}
	w = newCodeWorld(t, nil, true, time.Minute)
	for p, body := range map[string]string{"/code": `{"code":"1"}`, "/code/contexts": `{}`} {
		st, c, msg = errorOf(t, w.do(t, t.Context(), w.key, "POST", "/v1/sandboxes/"+w.sb+p, body))
		if st != 501 || c != "not_implemented" || !strings.Contains(msg, "cannot connect to ports in sandboxes") {
			t.Errorf("%s: got %d %s %q, want 501 not_implemented", p, st, c, msg)
		}
	}
	w = newCodeWorld(t, nil, false, time.Minute)
	w.host.dialErr = fmt.Errorf("dial through the guest agent: %w", errors.ErrUnsupported)
	st, c, msg = errorOf(t, w.do(t, t.Context(), w.key, "POST", "/v1/sandboxes/"+w.sb+"/code", `{"code":"1"}`))
	if st != 501 || c != "not_implemented" || !strings.Contains(msg, "recreate the sandbox") {
		t.Errorf("an old guest agent: got %d %s %q, want 501 not_implemented saying to recreate the sandbox", st, c, msg)
	}
}
