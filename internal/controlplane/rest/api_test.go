package rest_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/hostagent"
	"github.com/pandastack/pandastack/internal/hostagent/hostapi"
	"github.com/pandastack/pandastack/internal/hostagent/template/build"
	"github.com/pandastack/pandastack/internal/hostagent/vmm/qemu"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// env is one real server for the whole package: a host agent with real
// QEMU guests, a SQLite catalog in a temp file, and the API over HTTP.
type env struct {
	url   string
	admin string
	srv   *rest.Server
	cp    *controlplane.Plane // srv's
	host  *hostagent.Agent
	h     host.Host // what srv uses: host, or a hostclient.Client over it
	cat   *sqlite.Catalog
}

var e *env // set by world

// guestLimit is the test server's limit of guest requests in flight per
// sandbox.
const guestLimit = 8

// Port proxy settings of the test server: a small limit of proxied
// requests per sandbox, and a short wait for a guest's answer.
const (
	proxyLimit         = 4
	proxyHeaderTimeout = 2 * time.Second
)

// The shared world is made by world on first use; teardown undoes it
// after the tests, in reverse order.
var (
	worldOnce sync.Once
	worldErr  error
	teardown  []func()
)

func TestMain(m *testing.M) {
	code := m.Run()
	for i := len(teardown) - 1; i >= 0; i-- {
		teardown[i]()
	}
	os.Exit(code)
}

// world gates a test on guest VMs and root and returns the shared server,
// made on first use.
func world(t testing.TB) *env {
	t.Helper()
	testkit.VM(t)
	testkit.Root(t)
	worldOnce.Do(func() { worldErr = makeWorld() })
	if worldErr != nil {
		t.Fatalf("set up the test server: %v", worldErr)
	}
	return e
}

// makeWorld makes the shared server: a host agent (the tiny template
// baked), behind the host API when PANDA_TEST_HOST=remote, a SQLite
// catalog and the REST API over HTTP.
func makeWorld() error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "papi")
	if err != nil {
		return err
	}
	teardown = append(teardown, func() { os.RemoveAll(dir) })
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var cp *controlplane.Plane
	onExit := func(id string, err error) { cp.SandboxExited(id, err) }
	drv, err := qemu.New(qemu.Config{Logger: log})
	if err != nil {
		return fmt.Errorf("qemu driver: %w", err)
	}
	host, err := hostagent.Open(ctx, hostagent.Config{
		DataDir: dir, ImagesDir: testkit.Images(), Accel: "tcg", VolumeSize: 8 << 30, Driver: drv,
		DefaultTemplate: "tiny", DefaultMemoryMiB: 256,
		OnExit: func(id string, err error) { onExit(id, err) },
		// Guests have no network yet: their ports are test servers on
		// loopback (proxy_test.go).
		Dial:   guests.dial,
		Logger: log,
	})
	if err != nil {
		return fmt.Errorf("open host agent: %w", err)
	}
	teardown = append(teardown, func() { host.Close() })
	// PANDA_TEST_HOST=remote runs the suite with the agent behind the
	// host API (package hostapi), as panda server drives panda agent.
	h := hostagent.Local(host)
	if os.Getenv("PANDA_TEST_HOST") == "remote" {
		hsrv := hostapi.NewServer(host, "test-token", log)
		onExit = hsrv.SandboxExited
		hh := httptest.NewServer(hsrv)
		teardown = append(teardown, hh.Close)
		teardown = append(teardown, func() { hsrv.Close() })
		c, err := hostclient.Dial(hh.URL, "test-token", hostclient.WithLogger(log))
		if err != nil {
			return err
		}
		teardown = append(teardown, func() { c.Close() })
		h = c
		synced := make(chan struct{})
		watchCtx, stopWatch := context.WithCancel(ctx)
		watchDone := make(chan struct{})
		go func() {
			defer close(watchDone)
			var once sync.Once
			c.Watch(watchCtx, hostclient.Watcher{
				Connected: func(context.Context) error { once.Do(func() { close(synced) }); return nil },
				Exited:    func(id string, err error) { cp.SandboxExited(id, err) },
			})
		}()
		teardown = append(teardown, func() { stopWatch(); <-watchDone })
		select {
		case <-synced:
		case <-time.After(time.Minute):
			return errors.New("the host API's event stream never connected")
		}
	}
	cat, err := sqlite.Open(ctx, dir+"/panda.db")
	if err != nil {
		return fmt.Errorf("open catalog: %w", err)
	}
	teardown = append(teardown, func() { cat.Close() })
	// Template builds from "images" that are the tiny root filesystem
	// with a file of their own (template_vm_test.go).
	builds, err := build.New(build.Config{Store: host.Templates(), Convert: tinyWithVersionFile,
		Dir: filepath.Join(dir, "template-builds"), Logger: log})
	if err != nil {
		return err
	}
	teardown = append(teardown, func() { builds.Close() })
	srv, cp, err := newServer(rest.Config{
		MaxUploadBytes:             64 << 20,
		MaxGuestRequestsPerSandbox: guestLimit,
		MaxProxyRequestsPerSandbox: proxyLimit, ProxyHeaderTimeout: proxyHeaderTimeout,
		EventPing: 500 * time.Millisecond,
		OpenAPI:   []byte("openapi: 3.0.3\n"), Logger: log,
	}, controlplane.Config{Templates: builds, MaxSandboxesPerKey: 40, MaxMemoryMiBPerKey: 40 * 256}, cat, h)
	if err != nil {
		return err
	}
	_, secret, err := rest.NewKey(ctx, cat, "admin", true, 0, 0)
	if err != nil {
		return err
	}
	hs := httptest.NewServer(srv.Handler())
	teardown = append(teardown, hs.Close)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { cp.Run(runCtx); close(done) }()
	teardown = append(teardown, func() { stop(); <-done })
	// Bake the template once, outside any test's timing.
	if _, err := host.Templates().Get(ctx, host.TemplateParams("tiny", 256, 1), nil); err != nil {
		return fmt.Errorf("bake: %w", err)
	}
	e = &env{url: hs.URL, admin: secret, srv: srv, cp: cp, host: host, h: h, cat: cat}
	return nil
}

type resp struct {
	status int
	body   []byte
	header http.Header
}

func (r resp) json(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

func (r resp) code() string {
	var eb struct {
		Error struct{ Code, Message string }
	}
	json.Unmarshal(r.body, &eb)
	return eb.Error.Code
}

func do(t testing.TB, key, method, path string, body any) resp {
	t.Helper()
	return doAt(t, e.url, key, method, path, body)
}

// doAt is do on the API server at base.
func doAt(t testing.TB, base, key, method, path string, body any) resp {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	case io.Reader:
		rd = b
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, body: b, header: res.Header}
}

func expect(t testing.TB, r resp, status int, code string) {
	t.Helper()
	if r.status != status || (code != "" && r.code() != code) {
		t.Fatalf("got %d %s, want %d %s", r.status, r.body, status, code)
	}
}

type sandbox struct {
	ID         string            `json:"id"`
	State      string            `json:"state"`
	Template   string            `json:"template"`
	MemoryMiB  int               `json:"memory_mib"`
	ExpiresAt  *time.Time        `json:"expires_at"`
	Metadata   map[string]string `json:"metadata"`
	StopReason string            `json:"stop_reason"`
	NetworkOff bool              `json:"network_off"`
}

func newKey(t testing.TB, name string, quota map[string]int) string {
	t.Helper()
	body := map[string]any{"name": name}
	for k, v := range quota {
		body[k] = v
	}
	r := do(t, e.admin, "POST", "/v1/keys", body)
	expect(t, r, 201, "")
	var k struct{ Key string }
	r.json(t, &k)
	return k.Key
}

func create(t testing.TB, key string, body map[string]any) sandbox {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	r := do(t, key, "POST", "/v1/sandboxes", body)
	expect(t, r, 201, "")
	var sb sandbox
	r.json(t, &sb)
	t.Cleanup(func() { do(t, key, "DELETE", "/v1/sandboxes/"+sb.ID, nil) })
	return sb
}

type execRes struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	Signal   string `json:"signal"`
	TimedOut bool   `json:"timed_out"`
}

func run(t *testing.T, key, id string, body map[string]any) execRes {
	t.Helper()
	r := do(t, key, "POST", "/v1/sandboxes/"+id+"/exec", body)
	expect(t, r, 200, "")
	var x execRes
	r.json(t, &x)
	return x
}

func TestHealthOpenAPIMetrics(t *testing.T) {
	world(t)
	expect(t, do(t, "", "GET", "/healthz", nil), 200, "")
	r := do(t, "", "GET", "/v1/openapi.yaml", nil)
	if r.status != 200 || !strings.HasPrefix(string(r.body), "openapi:") {
		t.Errorf("openapi: got %d %q", r.status, r.body)
	}
	// Metrics describe every tenant: admin keys only.
	expect(t, do(t, "", "GET", "/metrics", nil), 401, "unauthorized")
	expect(t, do(t, newKey(t, "metrics-user", nil), "GET", "/metrics", nil), 403, "forbidden")
	r = do(t, e.admin, "GET", "/metrics", nil)
	for _, m := range []string{"panda_sandbox_create_seconds", "panda_exec_seconds", "panda_sandboxes_running", "panda_template_bakes_total"} {
		if !strings.Contains(string(r.body), m) {
			t.Errorf("metrics lack %s", m)
		}
	}
}

func TestAuth(t *testing.T) {
	world(t)
	expect(t, do(t, "", "GET", "/v1/sandboxes", nil), 401, "unauthorized")
	expect(t, do(t, "panda_nope", "GET", "/v1/sandboxes", nil), 401, "unauthorized")
	key := newKey(t, "revoked", nil)
	expect(t, do(t, key, "GET", "/v1/sandboxes", nil), 200, "")
	var keys struct {
		Keys []struct{ ID, Name string }
	}
	do(t, e.admin, "GET", "/v1/keys", nil).json(t, &keys)
	id := ""
	for _, k := range keys.Keys {
		if k.Name == "revoked" {
			id = k.ID
		}
	}
	expect(t, do(t, key, "GET", "/v1/keys", nil), 403, "forbidden")
	expect(t, do(t, key, "POST", "/v1/keys", map[string]any{"name": "x"}), 403, "forbidden")
	expect(t, do(t, e.admin, "DELETE", "/v1/keys/"+id, nil), 204, "")
	expect(t, do(t, key, "GET", "/v1/sandboxes", nil), 401, "unauthorized")
	expect(t, do(t, e.admin, "DELETE", "/v1/keys/nosuchkey", nil), 404, "not_found")
	expect(t, do(t, e.admin, "POST", "/v1/keys", `{"name":"a\u0000b"}`), 422, "invalid")
}

func TestCreateExecFilesKill(t *testing.T) {
	world(t)
	key := newKey(t, "basic", nil)
	sb := create(t, key, map[string]any{"metadata": map[string]string{"team": "a"}, "env": map[string]string{"GREETING": "hello"}})
	if sb.State != "running" || sb.Template != "tiny" || sb.MemoryMiB != 256 || sb.ExpiresAt == nil || sb.Metadata["team"] != "a" {
		t.Fatalf("created %+v", sb)
	}
	// The test host runs without sandbox networking (in process, or a
	// remote agent through the host API: from its info).
	if !sb.NetworkOff {
		t.Errorf("created %+v on a host without sandbox networking, want network_off", sb)
	}
	x := run(t, key, sb.ID, map[string]any{"cmd": "echo $GREETING; echo oops >&2; exit 3"})
	if x.ExitCode != 3 || x.Stdout != "hello\n" || x.Stderr != "oops\n" {
		t.Errorf("exec: got %+v", x)
	}
	x = run(t, key, sb.ID, map[string]any{"argv": []string{"pwd"}, "cwd": "/tmp", "env": map[string]string{"A": "1"}})
	if x.ExitCode != 0 || x.Stdout != "/tmp\n" {
		t.Errorf("argv exec: got %+v", x)
	}
	x = run(t, key, sb.ID, map[string]any{"cmd": "cat", "stdin": "fed\n"})
	if x.Stdout != "fed\n" {
		t.Errorf("stdin: got %+v", x)
	}
	x = run(t, key, sb.ID, map[string]any{"cmd": "sleep 30", "timeout_seconds": 0.5})
	if !x.TimedOut || x.Signal != "SIGKILL" {
		t.Errorf("timeout: got %+v", x)
	}
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"argv": []string{"/no/such/binary"}}), 404, "not_found")
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{}), 422, "invalid")
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "x", "argv": []string{"y"}}), 422, "invalid")
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "true", "cwd": "rel"}), 422, "invalid")
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "true", "timeout_seconds": -1}), 422, "invalid")

	// Users: tiny's /etc/passwd has only root; numeric ids need no entry.
	x = run(t, key, sb.ID, map[string]any{"cmd": "id -u; id -g; echo $HOME; pwd", "user": "1000:1000"})
	if x.ExitCode != 0 || x.Stdout != "1000\n1000\n/\n/\n" {
		t.Errorf("exec as 1000:1000: got %+v", x)
	}
	ghost := do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "true", "user": "ghost"})
	expect(t, ghost, 404, "not_found")
	if !strings.Contains(string(ghost.body), `\"ghost\"`) {
		t.Errorf("exec as an unknown user: %s, want a message naming ghost", ghost.body)
	}
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec/stream", map[string]any{"cmd": "true", "user": "ghost"}), 404, "not_found")
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "true", "user": "a b"}), 422, "invalid")

	// Files.
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	files := "/v1/sandboxes/" + sb.ID + "/files"
	r := do(t, key, "PUT", files+"?path=/work/deep/dir/blob.bin&mode=600", data)
	expect(t, r, 200, "")
	var fi struct {
		Size  int64
		Mode  uint32
		IsDir bool `json:"is_dir"`
	}
	r.json(t, &fi)
	if fi.Size != int64(len(data)) || fi.Mode != 0o600 {
		t.Errorf("uploaded file info %+v", fi)
	}
	r = do(t, key, "GET", files+"?path=/work/deep/dir/blob.bin", nil)
	if r.status != 200 || sha256.Sum256(r.body) != sha256.Sum256(data) || r.header.Get("X-Panda-File-Mode") != "384" {
		t.Errorf("download: status %d, %d bytes, mode %q", r.status, len(r.body), r.header.Get("X-Panda-File-Mode"))
	}
	expect(t, do(t, key, "POST", files+"/mkdir", map[string]any{"path": "/work/a/b"}), 200, "")
	expect(t, do(t, key, "POST", files+"/rename", map[string]any{"from": "/work/deep/dir/blob.bin", "to": "/work/a/b/moved.bin"}), 200, "")
	var list struct {
		Entries []struct{ Name string }
	}
	do(t, key, "GET", files+"/list?path=/work/a/b", nil).json(t, &list)
	if len(list.Entries) != 1 || list.Entries[0].Name != "moved.bin" {
		t.Errorf("list: got %+v", list)
	}
	do(t, key, "GET", files+"/stat?path=/work/a", nil).json(t, &fi)
	if !fi.IsDir {
		t.Errorf("stat of a directory: got %+v", fi)
	}
	expect(t, do(t, key, "DELETE", files+"?path=/work/a", nil), 409, "conflict")
	expect(t, do(t, key, "DELETE", files+"?path=/work/a&recursive=true", nil), 204, "")
	expect(t, do(t, key, "GET", files+"/stat?path=/work/a", nil), 404, "not_found")
	expect(t, do(t, key, "GET", files+"?path=/nope", nil), 404, "not_found")
	expect(t, do(t, key, "GET", files+"?path=relative", nil), 422, "invalid")
	expect(t, do(t, key, "GET", files+"?path=%2Fbad%ff", nil), 422, "invalid")
	expect(t, do(t, key, "GET", files+"?path=%2Fa%00b", nil), 422, "invalid")
	expect(t, do(t, key, "PUT", files+"?path=/x&mode=999", "x"), 422, "invalid")

	// Kill: then it is stopped and refuses work.
	expect(t, do(t, key, "DELETE", "/v1/sandboxes/"+sb.ID, nil), 204, "")
	var got sandbox
	do(t, key, "GET", "/v1/sandboxes/"+sb.ID, nil).json(t, &got)
	if got.State != "stopped" || got.StopReason != "killed" {
		t.Errorf("after kill: %+v", got)
	}
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "true"}), 409, "conflict")
	expect(t, do(t, key, "DELETE", "/v1/sandboxes/"+sb.ID, nil), 204, "")
	if _, err := e.host.Get(sb.ID); err == nil {
		t.Errorf("host still has killed sandbox %s", sb.ID)
	}
}

func TestExecStream(t *testing.T) {
	world(t)
	key := newKey(t, "stream", nil)
	sb := create(t, key, nil)
	body, _ := json.Marshal(map[string]any{"cmd": "echo one; read x; echo two >&2; echo ✓"})
	// The command waits for stdin, so "one" can only arrive while it runs.
	req, _ := http.NewRequest("POST", e.url+"/v1/sandboxes/"+sb.ID+"/exec/stream", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("got %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(res.Body)
	var events []map[string]any
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("bad line %q", sc.Text())
		}
		events = append(events, ev)
	}
	// stdin is not connected (no "stdin" field): read gets EOF at once.
	var stdout, stderr string
	for _, ev := range events {
		switch ev["type"] {
		case "stdout":
			stdout += ev["data"].(string)
		case "stderr":
			stderr += ev["data"].(string)
		}
	}
	if events[0]["type"] != "start" || events[len(events)-1]["type"] != "exit" || stdout != "one\n✓\n" || stderr != "two\n" {
		t.Errorf("events %v", events)
	}
}

func TestExecStreamIsLive(t *testing.T) {
	world(t)
	key := newKey(t, "live", nil)
	sb := create(t, key, nil)
	body, _ := json.Marshal(map[string]any{"cmd": "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second"})
	req, _ := http.NewRequest("POST", e.url+"/v1/sandboxes/"+sb.ID+"/exec/stream", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sawFirst := false
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"first`) {
			sawFirst = true
			break
		}
	}
	if !sawFirst {
		t.Fatal("never got the first line")
	}
	// The command is still blocked: release it through another request.
	x := run(t, key, sb.ID, map[string]any{"cmd": "touch /tmp/go"})
	if x.ExitCode != 0 {
		t.Fatal(x)
	}
	rest, _ := io.ReadAll(res.Body)
	if !strings.Contains(string(rest), `"second`) || !strings.Contains(string(rest), `"exit"`) {
		t.Errorf("after release: %s", rest)
	}
}

func TestMalformedRequests(t *testing.T) {
	world(t)
	key := newKey(t, "malformed", nil)
	for _, tc := range []struct {
		name, method, path string
		body               any
		status             int
		code               string
	}{
		{"not json", "POST", "/v1/sandboxes", "{nope", 400, "bad_request"},
		{"unknown field", "POST", "/v1/sandboxes", `{"templat":"tiny"}`, 400, "bad_request"},
		{"wrong type", "POST", "/v1/sandboxes", `{"ttl_seconds":"long"}`, 400, "bad_request"},
		{"trailing data", "POST", "/v1/sandboxes", `{} {}`, 400, "bad_request"},
		{"bad utf8", "POST", "/v1/sandboxes", []byte("{\"metadata\":{\"a\":\"\xff\"}}"), 400, "bad_request"},
		{"huge body", "POST", "/v1/sandboxes", `{"metadata":{"a":"` + strings.Repeat("x", 2<<20) + `"}}`, 413, "payload_too_large"},
		{"ttl too long", "POST", "/v1/sandboxes", `{"ttl_seconds":99999999}`, 422, "invalid"},
		{"ttl zero", "POST", "/v1/sandboxes", `{"ttl_seconds":0}`, 422, "invalid"},
		{"memory", "POST", "/v1/sandboxes", `{"memory_mib":1}`, 422, "invalid"},
		{"unknown template", "POST", "/v1/sandboxes", `{"template":"nosuch"}`, 404, "not_found"},
		{"bad template name", "POST", "/v1/sandboxes", `{"template":"../etc"}`, 422, "invalid"},
		{"unknown sandbox", "GET", "/v1/sandboxes/abc123", nil, 404, "not_found"},
		{"bad id", "GET", "/v1/sandboxes/ABC-1", nil, 404, "not_found"},
		{"bad state filter", "GET", "/v1/sandboxes?state=dancing", nil, 422, "invalid"},
		{"bad metadata filter", "GET", "/v1/sandboxes?metadata=nokv", nil, 422, "invalid"},
		{"unknown route", "GET", "/v1/nothing", nil, 404, "not_found"},
		{"ttl missing", "PUT", "/v1/sandboxes/abc/ttl", `{}`, 422, "invalid"},
		{"NUL in metadata", "POST", "/v1/sandboxes", `{"metadata":{"a":"x\u0000y"}}`, 422, "invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expect(t, do(t, key, tc.method, tc.path, tc.body), tc.status, tc.code)
		})
	}
}

func TestKeyIsolation(t *testing.T) {
	world(t)
	alice := newKey(t, "alice", nil)
	bob := newKey(t, "bob", nil)
	sb := create(t, alice, nil)
	path := "/v1/sandboxes/" + sb.ID
	expect(t, do(t, bob, "GET", path, nil), 404, "not_found")
	expect(t, do(t, bob, "POST", path+"/exec", map[string]any{"cmd": "true"}), 404, "not_found")
	expect(t, do(t, bob, "GET", path+"/files?path=/etc/hostname", nil), 404, "not_found")
	expect(t, do(t, bob, "PUT", path+"/ttl", map[string]any{"ttl_seconds": 10}), 404, "not_found")
	expect(t, do(t, bob, "DELETE", path, nil), 404, "not_found")
	var list struct{ Sandboxes []sandbox }
	do(t, bob, "GET", "/v1/sandboxes", nil).json(t, &list)
	if len(list.Sandboxes) != 0 {
		t.Errorf("bob sees %d sandboxes", len(list.Sandboxes))
	}
	// Alice's sandbox is untouched.
	if x := run(t, alice, sb.ID, map[string]any{"cmd": "echo ok"}); x.Stdout != "ok\n" {
		t.Errorf("alice's sandbox after bob's attempts: %+v", x)
	}
}

func TestListFilters(t *testing.T) {
	world(t)
	key := newKey(t, "lister", nil)
	a := create(t, key, map[string]any{"metadata": map[string]string{"run": "1", "role": "a"}})
	create(t, key, map[string]any{"metadata": map[string]string{"run": "1", "role": "b"}})
	var list struct{ Sandboxes []sandbox }
	do(t, key, "GET", "/v1/sandboxes?metadata=run%3D1&metadata=role%3Da", nil).json(t, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != a.ID {
		t.Errorf("metadata filter: got %+v", list.Sandboxes)
	}
	do(t, key, "GET", "/v1/sandboxes?metadata=run%3D1", nil).json(t, &list)
	if len(list.Sandboxes) != 2 {
		t.Errorf("got %d sandboxes, want 2", len(list.Sandboxes))
	}
	expect(t, do(t, key, "DELETE", "/v1/sandboxes/"+a.ID, nil), 204, "")
	do(t, key, "GET", "/v1/sandboxes?state=stopped", nil).json(t, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != a.ID {
		t.Errorf("stopped filter: got %+v", list.Sandboxes)
	}
}

func TestTTL(t *testing.T) {
	world(t)
	key := newKey(t, "ttl", nil)
	short := create(t, key, map[string]any{"ttl_seconds": 1})
	long := create(t, key, map[string]any{"ttl_seconds": 1})
	before := time.Now()
	r := do(t, key, "PUT", "/v1/sandboxes/"+long.ID+"/ttl", map[string]any{"ttl_seconds": 600})
	after := time.Now()
	expect(t, r, 200, "")
	var ext sandbox
	r.json(t, &ext)
	// 600 s from when the server took the request (a second either side
	// for the catalog's rounding).
	if ext.ExpiresAt == nil || ext.ExpiresAt.Before(before.Add(599*time.Second)) || ext.ExpiresAt.After(after.Add(601*time.Second)) {
		t.Errorf("extended expiry %v, want 600 s after the request (sent %v, answered %v)", ext.ExpiresAt, before, after)
	}
	// The short one stops, and says why: it expired (not how soon: the
	// expiry loop's pace is the server's, and timings are panda bench's).
	got := waitFor(t, key, short.ID, "stopped", func(x sandbox) bool { return x.State == "stopped" })
	if got.StopReason != "expired" {
		t.Fatalf("after its TTL: %+v, want stopped as expired", got)
	}
	if _, err := e.host.Get(short.ID); err == nil {
		t.Errorf("expired sandbox still on the host")
	}
	do(t, key, "GET", "/v1/sandboxes/"+long.ID, nil).json(t, &got)
	if got.State != "running" {
		t.Errorf("extended sandbox: %+v", got)
	}
	expect(t, do(t, key, "PUT", "/v1/sandboxes/"+short.ID+"/ttl", map[string]any{"ttl_seconds": 60}), 409, "conflict")
}

func TestQuota(t *testing.T) {
	world(t)
	key := newKey(t, "quota", map[string]int{"max_sandboxes": 1})
	create(t, key, nil)
	expect(t, do(t, key, "POST", "/v1/sandboxes", map[string]any{}), 429, "quota_exceeded")
	mem := newKey(t, "memquota", map[string]int{"max_memory_mib": 300})
	create(t, mem, nil)
	expect(t, do(t, mem, "POST", "/v1/sandboxes", map[string]any{}), 429, "quota_exceeded")
}

func TestConcurrentCreates(t *testing.T) {
	world(t)
	key := newKey(t, "burst", nil)
	const n = 20
	var wg sync.WaitGroup
	ids := make([]string, n)
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, _ := json.Marshal(map[string]any{})
			req, _ := http.NewRequest("POST", e.url+"/v1/sandboxes", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			if res.StatusCode != 201 {
				errs[i] = fmt.Errorf("status %d: %s", res.StatusCode, b)
				return
			}
			var sb sandbox
			json.Unmarshal(b, &sb)
			ids[i] = sb.ID
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, id := range ids {
			if id != "" {
				do(t, key, "DELETE", "/v1/sandboxes/"+id, nil)
			}
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("create %d: %v", i, err)
		}
	}
	for _, id := range ids {
		if id == "" {
			continue
		}
		if x := run(t, key, id, map[string]any{"cmd": "hostname"}); x.Stdout != id+"\n" {
			t.Errorf("sandbox %s: hostname %q", id, x.Stdout)
		}
	}
}

func TestTemplates(t *testing.T) {
	world(t)
	var list struct {
		Templates []struct{ Name, State string }
	}
	do(t, e.admin, "GET", "/v1/templates", nil).json(t, &list)
	found := false
	for _, tm := range list.Templates {
		if tm.Name == "tiny" && tm.State == "ready" {
			found = true
		}
	}
	if !found {
		t.Errorf("tiny is not ready in %+v", list)
	}
	key := newKey(t, "notadmin", nil)
	expect(t, do(t, key, "POST", "/v1/templates/tiny/bake", nil), 403, "forbidden")
	expect(t, do(t, e.admin, "POST", "/v1/templates/nosuch/bake", nil), 404, "not_found")
	r := do(t, e.admin, "POST", "/v1/templates/tiny/bake", map[string]any{"memory_mib": 192})
	lines := strings.Split(strings.TrimSpace(string(r.body)), "\n")
	var last struct {
		Type     string
		Template struct {
			Name      string
			MemoryMiB int `json:"memory_mib"`
		}
	}
	json.Unmarshal([]byte(lines[len(lines)-1]), &last)
	if r.status != 200 || len(lines) < 3 || last.Type != "done" || last.Template.MemoryMiB != 192 {
		t.Fatalf("bake: %d %s", r.status, r.body)
	}
	// The new shape is usable.
	sb := create(t, key, map[string]any{"memory_mib": 192})
	if sb.MemoryMiB != 192 {
		t.Errorf("got %d MiB", sb.MemoryMiB)
	}
}

func TestVMMCrashIsRecorded(t *testing.T) {
	world(t)
	key := newKey(t, "crash", nil)
	sb := create(t, key, nil)
	info, err := e.host.Get(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := os.FindProcess(info.PID)
	p.Kill()
	deadline := time.Now().Add(10 * time.Second)
	var got sandbox
	for time.Now().Before(deadline) {
		do(t, key, "GET", "/v1/sandboxes/"+sb.ID, nil).json(t, &got)
		if got.State == "stopped" {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling a condition, bounded by the deadline
	}
	if got.State != "stopped" || got.StopReason != "vmm_exited" {
		t.Errorf("after the VMM was killed: %+v", got)
	}
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "true"}), 409, "conflict")
}

func forkReq(t *testing.T, key, id string, count int) (resp, []map[string]any) {
	t.Helper()
	r := do(t, key, "POST", "/v1/sandboxes/"+id+"/fork", map[string]any{"count": count})
	var out struct {
		Children []map[string]any `json:"children"`
	}
	if r.status == 200 {
		r.json(t, &out)
		for _, c := range out.Children {
			if sb, ok := c["sandbox"].(map[string]any); ok {
				cid := sb["id"].(string)
				t.Cleanup(func() { do(t, key, "DELETE", "/v1/sandboxes/"+cid, nil) })
			}
		}
	}
	return r, out.Children
}

func TestForkSnapshotPauseAPI(t *testing.T) {
	world(t)
	key := newKey(t, "forker", nil)
	parent := create(t, key, map[string]any{"metadata": map[string]string{"exp": "1"}})
	run(t, key, parent.ID, map[string]any{"cmd": "echo parent > /root/f"})

	r, children := forkReq(t, key, parent.ID, 3)
	expect(t, r, 200, "")
	if len(children) != 3 {
		t.Fatalf("got %d children", len(children))
	}
	for _, c := range children {
		sb, ok := c["sandbox"].(map[string]any)
		if !ok {
			t.Fatalf("child failed: %v", c)
		}
		if sb["parent_id"] != parent.ID || sb["state"] != "running" {
			t.Errorf("child %v", sb)
		}
		if x := run(t, key, sb["id"].(string), map[string]any{"cmd": "cat /root/f; hostname"}); x.Stdout != "parent\n"+sb["id"].(string)+"\n" {
			t.Errorf("child sees %q", x.Stdout)
		}
	}
	// Errors: bad count, another key's sandbox, unknown sandbox.
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+parent.ID+"/fork", map[string]any{"count": 0}), 422, "invalid")
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+parent.ID+"/fork", map[string]any{"count": 65}), 422, "invalid")
	other := newKey(t, "other", nil)
	expect(t, do(t, other, "POST", "/v1/sandboxes/"+parent.ID+"/fork", map[string]any{}), 404, "not_found")
	expect(t, do(t, key, "POST", "/v1/sandboxes/nosuch1/fork", map[string]any{}), 404, "not_found")

	// Snapshot, then create from it; another key cannot see or use it.
	r = do(t, key, "POST", "/v1/sandboxes/"+parent.ID+"/snapshots", map[string]any{"name": "s1"})
	expect(t, r, 201, "")
	var snap struct {
		ID, Name  string
		SandboxID string `json:"sandbox_id"`
	}
	r.json(t, &snap)
	if snap.Name != "s1" || snap.SandboxID != parent.ID {
		t.Errorf("snapshot %+v", snap)
	}
	expect(t, do(t, other, "GET", "/v1/snapshots/"+snap.ID, nil), 404, "not_found")
	expect(t, do(t, other, "POST", "/v1/sandboxes", map[string]any{"snapshot_id": snap.ID}), 404, "not_found")
	var snaps struct{ Snapshots []struct{ ID string } }
	do(t, key, "GET", "/v1/snapshots", nil).json(t, &snaps)
	if len(snaps.Snapshots) != 1 || snaps.Snapshots[0].ID != snap.ID {
		t.Errorf("list snapshots %+v", snaps)
	}
	restored := create(t, key, map[string]any{"snapshot_id": snap.ID})
	if x := run(t, key, restored.ID, map[string]any{"cmd": "cat /root/f"}); x.Stdout != "parent\n" {
		t.Errorf("restored sees %q", x.Stdout)
	}
	expect(t, do(t, key, "DELETE", "/v1/snapshots/"+snap.ID, nil), 204, "")
	expect(t, do(t, key, "GET", "/v1/snapshots/"+snap.ID, nil), 404, "not_found")

	// Pause: exec and fork are conflicts; resume brings it back.
	r = do(t, key, "POST", "/v1/sandboxes/"+parent.ID+"/pause", nil)
	expect(t, r, 200, "")
	var got sandbox
	r.json(t, &got)
	if got.State != "paused" || got.ExpiresAt != nil {
		t.Errorf("paused: %+v", got)
	}
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+parent.ID+"/exec", map[string]any{"cmd": "true"}), 409, "conflict")
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+parent.ID+"/fork", map[string]any{}), 409, "conflict")
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+parent.ID+"/pause", nil), 409, "conflict")
	r = do(t, key, "POST", "/v1/sandboxes/"+parent.ID+"/resume", nil)
	expect(t, r, 200, "")
	r.json(t, &got)
	if got.State != "running" || got.ExpiresAt == nil {
		t.Errorf("resumed: %+v", got)
	}
	if x := run(t, key, parent.ID, map[string]any{"cmd": "cat /root/f"}); x.Stdout != "parent\n" {
		t.Errorf("after resume %q", x.Stdout)
	}
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+parent.ID+"/resume", nil), 409, "conflict")

	// A killed sandbox cannot be forked.
	expect(t, do(t, key, "DELETE", "/v1/sandboxes/"+restored.ID, nil), 204, "")
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+restored.ID+"/fork", map[string]any{}), 409, "conflict")

	// Memory accounting.
	var full struct {
		Memory *struct {
			PrivateMiB float64 `json:"private_mib"`
			SharedMiB  float64 `json:"shared_mib"`
		} `json:"memory"`
	}
	do(t, key, "GET", "/v1/sandboxes/"+parent.ID, nil).json(t, &full)
	if full.Memory == nil || full.Memory.PrivateMiB <= 0 || full.Memory.SharedMiB <= 0 {
		t.Errorf("memory of a running sandbox: %+v", full.Memory)
	}
	var hosts struct {
		Hosts []struct {
			ID              string
			Sandboxes       int
			SandboxesPSSMiB float64 `json:"sandboxes_pss_mib"`
		}
	}
	do(t, key, "GET", "/v1/hosts", nil).json(t, &hosts)
	if len(hosts.Hosts) != 1 || hosts.Hosts[0].Sandboxes < 1 || hosts.Hosts[0].SandboxesPSSMiB <= 0 {
		t.Errorf("hosts %+v", hosts)
	}
}

func TestForkQuota(t *testing.T) {
	world(t)
	key := newKey(t, "forkquota", map[string]int{"max_sandboxes": 3})
	parent := create(t, key, nil)
	r, children := forkReq(t, key, parent.ID, 4)
	expect(t, r, 200, "")
	ok, over := 0, 0
	for _, c := range children {
		if _, yes := c["sandbox"]; yes {
			ok++
		} else if e, _ := c["error"].(map[string]any); e["code"] == "quota_exceeded" {
			over++
		}
	}
	if ok != 2 || over != 2 {
		t.Errorf("got %d children and %d over quota, want 2 and 2: %v", ok, over, children)
	}
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+parent.ID+"/fork", map[string]any{}), 429, "quota_exceeded")
}

func TestOnExpirePause(t *testing.T) {
	world(t)
	key := newKey(t, "expirepause", nil)
	// A long TTL until the file is written (a loaded machine may take more
	// than a second to answer), then 1 s.
	sb := create(t, key, map[string]any{"ttl_seconds": 600, "on_expire": "pause"})
	run(t, key, sb.ID, map[string]any{"cmd": "echo kept > /root/k"})
	expect(t, do(t, key, "PUT", "/v1/sandboxes/"+sb.ID+"/ttl", map[string]any{"ttl_seconds": 1}), 200, "")
	deadline := time.Now().Add(10 * time.Second)
	var got sandbox
	for time.Now().Before(deadline) {
		do(t, key, "GET", "/v1/sandboxes/"+sb.ID, nil).json(t, &got)
		if got.State == "paused" {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling a condition, bounded by the deadline
	}
	if got.State != "paused" {
		t.Fatalf("after its TTL: %+v", got)
	}
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil), 200, "")
	// The resumed sandbox has its 1 s TTL again: give it time to answer.
	expect(t, do(t, key, "PUT", "/v1/sandboxes/"+sb.ID+"/ttl", map[string]any{"ttl_seconds": 60}), 200, "")
	if x := run(t, key, sb.ID, map[string]any{"cmd": "cat /root/k"}); x.Stdout != "kept\n" {
		t.Errorf("after resume %q", x.Stdout)
	}
}

// TestCreateProgress: a create with ?progress=1 answers NDJSON: the steps
// of what it must do first (here: bake a shape never baked), then done
// with the sandbox; an error in the stream; nothing to report, done alone.
// Against a remote host (PANDA_TEST_HOST=remote) the progress comes
// through the host API.
func TestCreateProgress(t *testing.T) {
	world(t)
	type event struct {
		Type    string
		Message string
		Sandbox sandbox
		Error   struct{ Code, Message string }
	}
	stream := func(key string, body map[string]any) []event {
		t.Helper()
		r := do(t, key, "POST", "/v1/sandboxes?progress=1", body)
		if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "application/x-ndjson") {
			t.Fatalf("create with progress: %d %s %s", r.status, r.header.Get("Content-Type"), r.body)
		}
		var evs []event
		for _, line := range strings.Split(strings.TrimSpace(string(r.body)), "\n") {
			var ev event
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			evs = append(evs, ev)
		}
		if last := evs[len(evs)-1]; last.Type == "done" {
			t.Cleanup(func() { do(t, key, "DELETE", "/v1/sandboxes/"+last.Sandbox.ID, nil) })
		}
		return evs
	}
	evs := stream(e.admin, map[string]any{"memory_mib": 224})
	last := evs[len(evs)-1]
	if last.Type != "done" || last.Sandbox.State != "running" || last.Sandbox.MemoryMiB != 224 {
		t.Fatalf("create of a new shape: %+v, want done with the sandbox running", evs)
	}
	var steps []string
	for _, ev := range evs[:len(evs)-1] {
		if ev.Type != "progress" || ev.Message == "" {
			t.Errorf("event %+v before done, want progress lines", ev)
		}
		steps = append(steps, ev.Message)
	}
	if len(steps) == 0 || !strings.Contains(steps[0], "baking template tiny-224m-1c") {
		t.Errorf("progress of a create that bakes: %q, want it to start with the bake", steps)
	}
	x := run(t, e.admin, last.Sandbox.ID, map[string]any{"cmd": "echo up"})
	if x.Stdout != "up\n" {
		t.Errorf("exec in the created sandbox: %+v", x)
	}

	// The same shape again: nothing to do first.
	if evs := stream(e.admin, map[string]any{"memory_mib": 224}); len(evs) != 1 || evs[0].Type != "done" {
		t.Errorf("create of a baked shape: %+v, want done alone", evs)
	}
	// An error comes in the stream, classified as ever.
	if evs := stream(e.admin, map[string]any{"template": "nosuch"}); len(evs) != 1 || evs[0].Type != "error" || evs[0].Error.Code != "not_found" {
		t.Errorf("create of a missing template: %+v, want one error not_found", evs)
	}
	// A malformed request is refused before any stream.
	expect(t, do(t, e.admin, "POST", "/v1/sandboxes?progress=1", `{"memory_mib": "x"}`), 400, "bad_request")
}
