package pandastack

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
)

// testClient returns a client for a test double of the HTTP layer.
func testClient(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := NewClient(Options{APIURL: srv.URL, APIKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func TestErrorMapping(t *testing.T) {
	tests := []struct {
		status   int
		body     string
		wantCode string
		wantIs   error
		wantMsg  string
	}{
		{404, `{"error":{"code":"not_found","message":"sandbox x not found"}}`, "not_found", ErrNotFound, "sandbox x not found (not_found)"},
		{401, `{"error":{"code":"unauthorized","message":"unknown API key"}}`, "unauthorized", ErrUnauthorized, "unknown API key (unauthorized)"},
		{409, `{"error":{"code":"conflict","message":"sandbox is stopped"}}`, "conflict", ErrConflict, ""},
		{422, `{"error":{"code":"invalid","message":"ttl too long"}}`, "invalid", ErrInvalid, ""},
		{429, `{"error":{"code":"quota_exceeded","message":"at most 2 sandboxes"}}`, "quota_exceeded", ErrQuotaExceeded, ""},
		{507, `{"error":{"code":"insufficient_storage","message":"disk full"}}`, "insufficient_storage", ErrInsufficientStorage, ""},
		{403, `{"error":{"code":"forbidden","message":"admin only"}}`, "forbidden", ErrForbidden, ""},
		{413, `{"error":{"code":"payload_too_large","message":"too big"}}`, "payload_too_large", ErrPayloadTooLarge, ""},
		{400, `{"error":{"code":"bad_request","message":"unknown field"}}`, "bad_request", ErrBadRequest, ""},
		{503, `{"error":{"code":"unavailable","message":"shutting down"}}`, "unavailable", ErrUnavailable, ""},
		{500, `{"error":{"code":"internal","message":"bug"}}`, "internal", ErrInternal, ""},
		// Not the API's error body: the status decides.
		{404, `404 page not found`, "not_found", ErrNotFound, "404 page not found (not_found)"},
		{502, `<html>bad gateway</html>`, "internal", ErrInternal, "GET /v1/sandboxes/abc: 502 Bad Gateway (internal)"},
		{429, ``, "quota_exceeded", ErrQuotaExceeded, ""},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.status, tt.wantCode), func(t *testing.T) {
			c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			})
			_, err := c.Get(context.Background(), "abc")
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("got %T %v, want *Error", err, err)
			}
			if e.Status != tt.status || e.Code != tt.wantCode {
				t.Errorf("got status %d code %q, want %d %q", e.Status, e.Code, tt.status, tt.wantCode)
			}
			if !errors.Is(err, tt.wantIs) {
				t.Errorf("errors.Is(%v, %v) = false", err, tt.wantIs)
			}
			for _, other := range []error{ErrNotFound, ErrConflict, ErrUnauthorized} {
				if other != tt.wantIs && errors.Is(err, other) {
					t.Errorf("errors.Is(%v, %v) = true, want false", err, other)
				}
			}
			if tt.wantMsg != "" && err.Error() != tt.wantMsg {
				t.Errorf("got message %q, want %q", err.Error(), tt.wantMsg)
			}
		})
	}
}

func TestConnectionRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c, err := NewClient(Options{APIURL: "http://" + addr, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.List(context.Background(), ListOptions{})
	if err == nil {
		t.Fatal("got no error, want connection refused")
	}
	if want := "is `panda up` running at http://" + addr; !strings.Contains(err.Error(), want) {
		t.Errorf("got %q, want it to contain %q", err, want)
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("errors.Is(%v, ErrUnavailable) = false", err)
	}
}

func TestNewClientOptions(t *testing.T) {
	t.Setenv("PANDASTACK_API_URL", "")
	t.Setenv("PANDASTACK_API_KEY", "")
	c, err := NewClient(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.APIURL(); got != DefaultAPIURL {
		t.Errorf("got URL %q, want %q", got, DefaultAPIURL)
	}
	t.Setenv("PANDASTACK_API_URL", "http://example.test:1234/prefix/")
	t.Setenv("PANDASTACK_API_KEY", "envkey")
	c, err = NewClient(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if c.APIURL() != "http://example.test:1234/prefix" || c.key != "envkey" {
		t.Errorf("got %q %q, want the environment's values", c.APIURL(), c.key)
	}
	for _, bad := range []string{"127.0.0.1:7788", "ftp://x", "http://", "http://h/?q=1"} {
		if _, err := NewClient(Options{APIURL: bad}); err == nil {
			t.Errorf("NewClient(%q): got no error", bad)
		}
	}
}

// canonJSON is the JSON text s with its objects' keys sorted (s, trimmed,
// if it is not JSON): the order of a body's keys is no part of the API.
func canonJSON(s string) string {
	s = strings.TrimSpace(s)
	var v any
	if json.Unmarshal([]byte(s), &v) != nil {
		return s
	}
	b, err := json.Marshal(v)
	if err != nil {
		return s
	}
	return string(b)
}

func TestRequests(t *testing.T) {
	type seen struct {
		method, path, query, auth, body string
	}
	var got seen
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = seen{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Authorization"), canonJSON(string(b))}
		switch {
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case strings.HasSuffix(r.URL.Path, "/exec"):
			writeJSON(w, 200, map[string]any{"exit_code": 3, "stdout": "out", "stderr": "err", "duration_ms": 5, "truncated": true})
		case r.URL.Path == "/v1/sandboxes" && r.Method == http.MethodGet:
			writeJSON(w, 200, map[string]any{"sandboxes": []any{map[string]any{"id": "a1", "state": "running", "metadata": map[string]string{}}}})
		default:
			writeJSON(w, 200, map[string]any{"id": "abc", "state": "running", "created_at": "2025-01-02T03:04:05Z", "expires_at": nil, "metadata": map[string]string{"k": "v"}})
		}
	})
	ctx := context.Background()
	sb := c.Sandbox("abc")
	tests := []struct {
		name string
		call func() error
		want seen
	}{
		{"create minimal", func() error { _, err := c.Create(ctx, CreateOptions{}); return err },
			seen{"POST", "/v1/sandboxes", "", "Bearer k1", `{}`}},
		{"create full", func() error {
			_, err := c.Create(ctx, CreateOptions{Template: "tiny", TTLSeconds: 60, MemoryMiB: 256, VCPUs: 2, Metadata: map[string]string{"a": "b"}, Env: map[string]string{"X": "1"}, OnExpire: "pause"})
			return err
		}, seen{"POST", "/v1/sandboxes", "", "Bearer k1", `{"template":"tiny","ttl_seconds":60,"memory_mib":256,"vcpus":2,"metadata":{"a":"b"},"env":{"X":"1"},"on_expire":"pause"}`}},
		{"create network", func() error {
			_, err := c.Create(ctx, CreateOptions{Network: &Network{AllowOut: []string{"pypi.org", "10.0.0.0/8"}}})
			return err
		}, seen{"POST", "/v1/sandboxes", "", "Bearer k1", `{"network":{"internet":false,"allow_out":["pypi.org","10.0.0.0/8"]}}`}},
		{"create network internet", func() error {
			_, err := c.Create(ctx, CreateOptions{Network: &Network{Internet: true, DenyOut: []string{"*.example.com"}}})
			return err
		}, seen{"POST", "/v1/sandboxes", "", "Bearer k1", `{"network":{"internet":true,"deny_out":["*.example.com"]}}`}},
		{"list", func() error {
			_, err := c.List(ctx, ListOptions{State: StateRunning, Metadata: map[string]string{"b": "2", "a": "x=y"}})
			return err
		}, seen{"GET", "/v1/sandboxes", "metadata=a%3Dx%3Dy&metadata=b%3D2&state=running", "Bearer k1", ``}},
		{"get", func() error { _, err := c.Get(ctx, "abc"); return err }, seen{"GET", "/v1/sandboxes/abc", "", "Bearer k1", ``}},
		{"ttl", func() error { return sb.SetTTL(ctx, 90) }, seen{"PUT", "/v1/sandboxes/abc/ttl", "", "Bearer k1", `{"ttl_seconds":90}`}},
		{"set network", func() error {
			return sb.SetNetwork(ctx, NetworkUpdate{Internet: new(false), AllowOut: &[]string{"pypi.org"}})
		}, seen{"PATCH", "/v1/sandboxes/abc/network", "", "Bearer k1", `{"internet":false,"allow_out":["pypi.org"]}`}},
		{"set network clears a list", func() error { return sb.SetNetwork(ctx, NetworkUpdate{DenyOut: &[]string{}}) },
			seen{"PATCH", "/v1/sandboxes/abc/network", "", "Bearer k1", `{"deny_out":[]}`}},
		{"set network nil list clears it", func() error { return sb.SetNetwork(ctx, NetworkUpdate{AllowOut: new([]string)}) },
			seen{"PATCH", "/v1/sandboxes/abc/network", "", "Bearer k1", `{"allow_out":[]}`}},
		{"set network nothing", func() error { return sb.SetNetwork(ctx, NetworkUpdate{}) },
			seen{"PATCH", "/v1/sandboxes/abc/network", "", "Bearer k1", `{}`}},
		{"kill", func() error { return sb.Kill(ctx) }, seen{"DELETE", "/v1/sandboxes/abc", "", "Bearer k1", ``}},
		{"exec cmd", func() error { _, err := sb.Exec(ctx, Command{Cmd: "echo hi"}); return err },
			seen{"POST", "/v1/sandboxes/abc/exec", "", "Bearer k1", `{"cmd":"echo hi"}`}},
		{"exec argv", func() error {
			_, err := sb.Exec(ctx, Command{Argv: []string{"ls", "-l"}, Env: map[string]string{"A": "1"}, Cwd: "/tmp", User: "app:staff", Timeout: 1500 * time.Millisecond, Stdin: "in"})
			return err
		}, seen{"POST", "/v1/sandboxes/abc/exec", "", "Bearer k1", `{"argv":["ls","-l"],"env":{"A":"1"},"cwd":"/tmp","user":"app:staff","timeout_seconds":1.5,"stdin":"in"}`}},
		{"exec no timeout", func() error { _, err := sb.Exec(ctx, Command{Cmd: "sleep 1000", Timeout: NoTimeout}); return err },
			seen{"POST", "/v1/sandboxes/abc/exec", "", "Bearer k1", `{"cmd":"sleep 1000","timeout_seconds":0}`}},
		{"stat", func() error { _, err := sb.Stat(ctx, "/a b/c&d"); return err },
			seen{"GET", "/v1/sandboxes/abc/files/stat", "path=%2Fa+b%2Fc%26d", "Bearer k1", ``}},
		{"rm -r", func() error { return sb.Remove(ctx, "/w", true) },
			seen{"DELETE", "/v1/sandboxes/abc/files", "path=%2Fw&recursive=true", "Bearer k1", ``}},
		{"mkdir", func() error { _, err := sb.Mkdir(ctx, "/w/x"); return err },
			seen{"POST", "/v1/sandboxes/abc/files/mkdir", "", "Bearer k1", `{"path":"/w/x"}`}},
		{"rename", func() error { _, err := sb.Rename(ctx, "/a", "/b"); return err },
			seen{"POST", "/v1/sandboxes/abc/files/rename", "", "Bearer k1", `{"from":"/a","to":"/b"}`}},
		{"pause", func() error { return sb.Pause(ctx) }, seen{"POST", "/v1/sandboxes/abc/pause", "", "Bearer k1", ``}},
		{"resume", func() error { return sb.Resume(ctx) }, seen{"POST", "/v1/sandboxes/abc/resume", "", "Bearer k1", ``}},
		{"snapshot", func() error { _, err := sb.Snapshot(ctx, "s1"); return err },
			seen{"POST", "/v1/sandboxes/abc/snapshots", "", "Bearer k1", `{"name":"s1"}`}},
		{"delete snapshot", func() error { return c.DeleteSnapshot(ctx, "snap1") }, seen{"DELETE", "/v1/snapshots/snap1", "", "Bearer k1", ``}},
		{"create key", func() error { _, err := c.CreateKey(ctx, "ci", false, Quotas{MaxSandboxes: 3}); return err },
			seen{"POST", "/v1/keys", "", "Bearer k1", `{"name":"ci","max_sandboxes":3}`}},
		{"revoke key", func() error { return c.RevokeKey(ctx, "key1") }, seen{"DELETE", "/v1/keys/key1", "", "Bearer k1", ``}},
		{"ports", func() error { _, err := sb.Ports(ctx); return err }, seen{"GET", "/v1/sandboxes/abc/ports", "", "Bearer k1", ``}},
		{"url", func() error { _, err := sb.URL(ctx, 8000, 1500*time.Millisecond); return err },
			seen{"POST", "/v1/sandboxes/abc/ports/8000/url", "", "Bearer k1", `{"ttl_seconds":2}`}},
		{"url default ttl", func() error { _, err := sb.URL(ctx, 443, 0); return err },
			seen{"POST", "/v1/sandboxes/abc/ports/443/url", "", "Bearer k1", `{}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got = seen{}
			if err := tt.call(); err != nil {
				t.Fatal(err)
			}
			want := tt.want
			want.body = canonJSON(want.body)
			if got != want {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
	if sb.Info.CreatedAt.IsZero() || !sb.Info.ExpiresAt.IsZero() || sb.Info.Metadata["k"] != "v" {
		t.Errorf("got Info %+v, want it updated by the last call", sb.Info)
	}
	res, err := sb.Exec(ctx, Command{Cmd: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if want := (ExecResult{ExitCode: 3, Stdout: "out", Stderr: "err", DurationMS: 5, Truncated: true}); res != want {
		t.Errorf("got %+v, want %+v", res, want)
	}
}

func TestPortsAndURL(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/sandboxes/abc/ports":
			writeJSON(w, 200, map[string]any{"ports": []any{map[string]any{"port": 22, "address": "::1"}, map[string]any{"port": 8000, "address": "0.0.0.0"}}})
		case "/v1/sandboxes/abc/ports/8000/url":
			writeJSON(w, 200, map[string]any{"url": "http://h/p/TOKEN/", "expires_at": "2030-01-02T03:04:05Z"})
		default:
			writeJSON(w, 409, map[string]any{"error": map[string]string{"code": "conflict", "message": "sandbox abc is paused, not running"}})
		}
	})
	ctx := context.Background()
	sb := c.Sandbox("abc")
	ports, err := sb.Ports(ctx)
	if err != nil || !reflect.DeepEqual(ports, []Port{{22, "::1"}, {8000, "0.0.0.0"}}) {
		t.Errorf("ports: got %+v, %v", ports, err)
	}
	u, err := sb.URL(ctx, 8000, time.Hour)
	if want := (PortURL{URL: "http://h/p/TOKEN/", ExpiresAt: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}); err != nil || u != want {
		t.Errorf("url: got %+v, %v; want %+v", u, err, want)
	}
	if _, err := sb.URL(ctx, 9000, time.Hour); !errors.Is(err, ErrConflict) {
		t.Errorf("url of a paused sandbox: got %v, want ErrConflict", err)
	}
	if got, want := sb.PortProxyURL(8000), c.APIURL()+"/v1/sandboxes/abc/ports/8000/"; got != want {
		t.Errorf("PortProxyURL: got %q, want %q", got, want)
	}
}

func TestNetwork(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/sandboxes/abc/network":
			writeJSON(w, 200, map[string]any{"id": "abc", "state": "running", "network": map[string]any{"internet": false, "allow_out": []string{"pypi.org"}}})
		case "/v1/sandboxes/abc":
			writeJSON(w, 200, map[string]any{"id": "abc", "state": "running", "network": map[string]any{"internet": true}})
		case "/v1/sandboxes/old":
			writeJSON(w, 200, map[string]any{"id": "old", "state": "running"})
		default:
			writeJSON(w, 400, map[string]any{"error": map[string]string{"code": "bad_request", "message": `network policy: allow_out entry "not a name": not a valid domain name (character ' ')`}})
		}
	})
	ctx := context.Background()
	sb, err := c.Get(ctx, "abc")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sb.Info.Network, (&Network{Internet: true}); !reflect.DeepEqual(got, want) {
		t.Errorf("get: got network %+v, want %+v", got, want)
	}
	if err := sb.SetNetwork(ctx, NetworkUpdate{Internet: new(false), AllowOut: &[]string{"pypi.org"}}); err != nil {
		t.Fatal(err)
	}
	if got, want := sb.Info.Network, (&Network{AllowOut: []string{"pypi.org"}}); !reflect.DeepEqual(got, want) {
		t.Errorf("set network: got Info.Network %+v, want %+v", got, want)
	}
	old, err := c.Get(ctx, "old")
	if err != nil || old.Info.Network != nil {
		t.Errorf("a sandbox without network: got %+v, %v, want Network nil", old.Info.Network, err)
	}
	_, err = c.Create(ctx, CreateOptions{Network: &Network{AllowOut: []string{"not a name"}}})
	if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), `allow_out entry "not a name"`) {
		t.Errorf("create with a bad entry: got %v, want ErrBadRequest naming the entry", err)
	}
}

func TestLocalValidation(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("unexpected request %s %s", r.Method, r.URL)
	})
	ctx := context.Background()
	if _, err := c.Get(ctx, ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("Get(\"\"): got %v, want ErrInvalid", err)
	}
	sb := c.Sandbox("abc")
	for _, cmd := range []Command{{}, {Cmd: "a", Argv: []string{"b"}}} {
		if _, err := sb.Exec(ctx, cmd); !errors.Is(err, ErrInvalid) {
			t.Errorf("Exec(%+v): got %v, want ErrInvalid", cmd, err)
		}
	}
	if _, err := sb.Fork(ctx, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("Fork(0): got %v, want ErrInvalid", err)
	}
	for _, p := range []int{0, 65536} {
		if _, err := sb.URL(ctx, p, 0); !errors.Is(err, ErrInvalid) {
			t.Errorf("URL(port %d): got %v, want ErrInvalid", p, err)
		}
	}
	if _, err := sb.URL(ctx, 80, -time.Second); !errors.Is(err, ErrInvalid) {
		t.Errorf("URL(ttl -1s): got %v, want ErrInvalid", err)
	}
}

// chunkedWriter writes the given pieces, flushing after each, so that the
// client sees JSON lines split across reads.
func chunkedHandler(pieces []string, gap time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(200)
		for _, p := range pieces {
			io.WriteString(w, p)
			w.(http.Flusher).Flush()
			time.Sleep(gap)
		}
	}
}

func TestExecStreamSplitLines(t *testing.T) {
	stream := `{"type":"start","pid":7}` + "\n" +
		`{"type":"stdout","data":"hel"}` + "\n" +
		`{"type":"stderr","data":"warn\n"}` + "\n" +
		`{"type":"future_event","x":1}` + "\n" +
		`{"type":"stdout","data":"lo ✓\n"}` + "\n" +
		`{"type":"exit","exit_code":3,"signal":"","timed_out":false,"duration_ms":12}` + "\n"
	want := ExecResult{ExitCode: 3, DurationMS: 12}

	t.Run("one byte reads", func(t *testing.T) {
		var out, errb strings.Builder
		got, err := readExecStream(iotest.OneByteReader(strings.NewReader(stream)), &out, &errb)
		if err != nil {
			t.Fatal(err)
		}
		if got != want || out.String() != "hello ✓\n" || errb.String() != "warn\n" {
			t.Errorf("got %+v %q %q, want %+v %q %q", got, out.String(), errb.String(), want, "hello ✓\n", "warn\n")
		}
	})
	t.Run("http pieces", func(t *testing.T) {
		// Cut inside lines and inside a multi-byte character.
		var pieces []string
		for i := 0; i < len(stream); i += 7 {
			pieces = append(pieces, stream[i:min(i+7, len(stream))])
		}
		c := testClient(t, chunkedHandler(pieces, 0))
		var out, errb strings.Builder
		got, err := c.Sandbox("abc").ExecStream(context.Background(), Command{Cmd: "x"}, &out, &errb)
		if err != nil {
			t.Fatal(err)
		}
		if got != want || out.String() != "hello ✓\n" || errb.String() != "warn\n" {
			t.Errorf("got %+v %q %q", got, out.String(), errb.String())
		}
	})
}

// TestExecStreamLive checks that output reaches the writer before the
// command exits, not at the end.
func TestExecStreamLive(t *testing.T) {
	release := make(chan struct{})
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		io.WriteString(w, `{"type":"start","pid":1}`+"\n"+`{"type":"stdout","data":"first\n"}`+"\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, `{"type":"exit","exit_code":0,"duration_ms":1}`+"\n")
	})
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := c.Sandbox("abc").ExecStream(context.Background(), Command{Cmd: "x"}, pw, nil)
		pw.CloseWithError(err)
		done <- err
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("got %q %v, want the first line before exit", line, err)
	}
	close(release)
	go io.Copy(io.Discard, pr)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestExecStreamEnds(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		check  func(error) bool
	}{
		{"error event", `{"type":"start","pid":1}` + "\n" + `{"type":"error","error":{"code":"unavailable","message":"guest agent died"}}` + "\n",
			func(err error) bool {
				return errors.Is(err, ErrUnavailable) && strings.Contains(err.Error(), "guest agent died")
			}},
		{"cut short", `{"type":"start","pid":1}` + "\n" + `{"type":"stdout","data":"x"}` + "\n",
			func(err error) bool { return errors.Is(err, ErrStreamEnded) }},
		{"cut mid-line", `{"type":"start","pid":1}` + "\n" + `{"type":"stdo`,
			func(err error) bool { return err != nil && !errors.Is(err, ErrNotFound) }},
		{"garbage", "not json\n", func(err error) bool { return err != nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := readExecStream(strings.NewReader(tt.stream), nil, nil)
			if !tt.check(err) {
				t.Errorf("got %v", err)
			}
		})
	}
	// An HTTP error before the stream starts is an ordinary *Error.
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 409, map[string]any{"error": map[string]string{"code": "conflict", "message": "sandbox is stopped"}})
	})
	if _, err := c.Sandbox("abc").ExecStream(context.Background(), Command{Cmd: "x"}, nil, nil); !errors.Is(err, ErrConflict) {
		t.Errorf("got %v, want ErrConflict", err)
	}
}

// failWriter fails every write.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestExecStreamWriterFails(t *testing.T) {
	closed := make(chan struct{})
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		io.WriteString(w, `{"type":"stdout","data":"x"}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the client must hang up (which kills the command)
		close(closed)
	})
	_, err := c.Sandbox("abc").ExecStream(context.Background(), Command{Cmd: "x"}, failWriter{}, nil)
	if err == nil || !strings.Contains(err.Error(), "broken pipe") {
		t.Errorf("got %v, want the write error", err)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Error("the connection was not closed after the writer failed")
	}
}

func TestWriteFileStreams(t *testing.T) {
	const size = 20 << 20
	var gotSum [32]byte
	var gotLen int64
	var gotTE []string
	var gotQuery string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, _ := io.Copy(h, r.Body)
		copy(gotSum[:], h.Sum(nil))
		gotLen, gotTE, gotQuery = r.ContentLength, r.TransferEncoding, r.URL.RawQuery
		writeJSON(w, 200, FileInfo{Name: "f", Path: "/f", Size: n, Mode: 0o600})
	})
	ctx := context.Background()
	sb := c.Sandbox("abc")

	// Unknown length: chunked.
	h := sha256.New()
	fi, err := sb.WriteFile(ctx, "/f", io.TeeReader(guestprototest.PatternReader(1, size), h), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != size || [32]byte(h.Sum(nil)) != gotSum {
		t.Errorf("got size %d, sum mismatch %v", fi.Size, [32]byte(h.Sum(nil)) != gotSum)
	}
	if gotLen != -1 || !reflect.DeepEqual(gotTE, []string{"chunked"}) || gotQuery != "mode=600&path=%2Ff" {
		t.Errorf("got length %d, transfer encoding %v, query %q", gotLen, gotTE, gotQuery)
	}

	// A regular file: its remaining length is sent.
	f, err := os.Create(filepath.Join(t.TempDir(), "src"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	io.WriteString(f, "0123456789")
	f.Seek(3, io.SeekStart)
	if _, err := sb.WriteFile(ctx, "/f", f, 0); err != nil {
		t.Fatal(err)
	}
	if gotLen != 7 || gotQuery != "path=%2Ff" {
		t.Errorf("got length %d query %q, want 7 and no mode", gotLen, gotQuery)
	}
	// The caller's file is not closed.
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Errorf("the file was closed: %v", err)
	}
}

func TestReadFileErrors(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("path") == "/missing" {
			writeJSON(w, 404, map[string]any{"error": map[string]string{"code": "not_found", "message": "no such file /missing"}})
			return
		}
		io.WriteString(w, "content")
	})
	sb := c.Sandbox("abc")
	if _, err := sb.ReadFile(context.Background(), "/missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("got %v, want ErrNotFound", err)
	}
	rc, err := sb.ReadFile(context.Background(), "/ok")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if b, _ := io.ReadAll(rc); string(b) != "content" {
		t.Errorf("got %q", b)
	}
}

func TestFork(t *testing.T) {
	var body string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		body = string(b)
		writeJSON(w, 200, map[string]any{"children": []any{
			map[string]any{"sandbox": map[string]any{"id": "c1", "state": "running"}},
			map[string]any{"error": map[string]string{"code": "quota_exceeded", "message": "at most 2 sandboxes"}},
			map[string]any{"sandbox": map[string]any{"id": "c2", "state": "running"}},
		}})
	})
	kids, err := c.Sandbox("abc").Fork(context.Background(), 3)
	if body != `{"count":3}` {
		t.Errorf("got body %s", body)
	}
	if len(kids) != 2 || kids[0].ID != "c1" || kids[1].ID != "c2" || kids[1].Info.State != StateRunning {
		t.Errorf("got children %+v", kids)
	}
	var fe *ForkError
	if !errors.As(err, &fe) || len(fe.Failures) != 1 || fe.Requested != 3 {
		t.Fatalf("got %v, want a *ForkError with one failure", err)
	}
	if !errors.Is(err, ErrQuotaExceeded) || fe.Failures[0].Status != 429 {
		t.Errorf("got %v (status %d), want it to match ErrQuotaExceeded", err, fe.Failures[0].Status)
	}
}

func TestBakeStream(t *testing.T) {
	stream := `{"type":"progress","message":"booting"}` + "\n" + `{"type":"progress","message":"snapshotting"}` + "\n" +
		`{"type":"done","template":{"name":"tiny","memory_mib":256,"vcpus":1,"state":"ready","baked_at":"2025-01-02T03:04:05Z","bake_ms":900}}` + "\n"
	var pieces []string
	for i := 0; i < len(stream); i += 5 {
		pieces = append(pieces, stream[i:min(i+5, len(stream))])
	}
	c := testClient(t, chunkedHandler(pieces, 0))
	var msgs []string
	tpl, err := c.BakeTemplate(context.Background(), "tiny", 256, 1, func(m string) { msgs = append(msgs, m) })
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(msgs, []string{"booting", "snapshotting"}) || tpl.State != TemplateReady || tpl.MemoryMiB != 256 || tpl.BakedAt.IsZero() {
		t.Errorf("got %q %+v", msgs, tpl)
	}

	c = testClient(t, chunkedHandler([]string{`{"type":"error","error":{"code":"insufficient_storage","message":"disk full"}}` + "\n"}, 0))
	if _, err := c.BakeTemplate(context.Background(), "tiny", 0, 0, nil); !errors.Is(err, ErrInsufficientStorage) {
		t.Errorf("got %v, want ErrInsufficientStorage", err)
	}
}

// TestCreateProgress: CreateOptions.Progress asks for the create's
// progress (?progress=1) and gets its lines, then the sandbox; an error in
// the stream is an *Error; a server that answers plain JSON (one that
// does not stream a create's progress) gives the sandbox alone.
func TestCreateProgress(t *testing.T) {
	stream := `{"type":"progress","message":"baking template tiny-224m-1c (not baked yet)"}` + "\n" +
		`{"type":"done","sandbox":{"id":"abc","template":"tiny","state":"running","memory_mib":224,"vcpus":1}}` + "\n"
	var query string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		query = r.URL.RawQuery
		chunkedHandler([]string{stream}, 0)(w, r)
	})
	var msgs []string
	sb, err := c.Create(context.Background(), CreateOptions{MemoryMiB: 224, Progress: func(m string) { msgs = append(msgs, m) }})
	if err != nil {
		t.Fatal(err)
	}
	if query != "progress=1" || sb.ID != "abc" || sb.Info.MemoryMiB != 224 || !reflect.DeepEqual(msgs, []string{"baking template tiny-224m-1c (not baked yet)"}) {
		t.Errorf("query %q, sandbox %+v, progress %q", query, sb.Info, msgs)
	}

	c = testClient(t, chunkedHandler([]string{`{"type":"error","error":{"code":"not_found","message":"template \"x\" not found"}}` + "\n"}, 0))
	if _, err := c.Create(context.Background(), CreateOptions{Template: "x", Progress: func(string) {}}); !errors.Is(err, ErrNotFound) {
		t.Errorf("got %v, want ErrNotFound", err)
	}
	c = testClient(t, chunkedHandler([]string{`{"type":"progress","message":"baking"}` + "\n"}, 0))
	if _, err := c.Create(context.Background(), CreateOptions{Progress: func(string) {}}); !errors.Is(err, ErrStreamEnded) {
		t.Errorf("a stream cut short: %v, want ErrStreamEnded", err)
	}

	c = testClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		io.WriteString(w, `{"id":"old","state":"running"}`)
	})
	if sb, err := c.Create(context.Background(), CreateOptions{Progress: func(string) { t.Error("progress from a server that sent none") }}); err != nil || sb.ID != "old" {
		t.Errorf("create against a server without progress: %v, %v", sb, err)
	}
}

// TestJSONRoundTrip checks that SDK values marshal back to the API's shape
// (the CLI prints them with --json).
func TestJSONRoundTrip(t *testing.T) {
	in := `{"id":"abc","template":"base","state":"stopped","memory_mib":1024,"vcpus":1,"created_at":"2025-01-02T03:04:05Z","expires_at":null,"metadata":{},"stop_reason":"killed","network":{"internet":false,"deny_out":["10.0.0.0/8"]}}`
	var info SandboxInfo
	if err := json.Unmarshal([]byte(in), &info); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(info)
	want := `{"id":"abc","template":"base","state":"stopped","memory_mib":1024,"vcpus":1,"created_at":"2025-01-02T03:04:05Z","metadata":{},"stop_reason":"killed","network":{"internet":false,"deny_out":["10.0.0.0/8"]}}`
	if string(out) != want {
		t.Errorf("got  %s\nwant %s", out, want)
	}
	var k KeyWithSecret
	json.Unmarshal([]byte(`{"id":"k1","name":"n","admin":true,"created_at":"2025-01-02T03:04:05Z","key":"ps_secret"}`), &k)
	if k.ID != "k1" || !k.Admin || k.Key != "ps_secret" {
		t.Errorf("got %+v", k)
	}
}

// TestStandardLibraryOnly enforces that the SDK imports only the standard
// library, so that it can be used (and later split out) on its own. The
// one exception is Docker's own .dockerignore matcher (a module that
// itself needs only the standard library): a build context must leave out
// exactly what Docker leaves out. The SDK's own internal packages (the
// generated wire types) are held to the same rule.
func TestStandardLibraryOnly(t *testing.T) {
	allowed := map[string]bool{"github.com/moby/patternmatcher": true, "github.com/moby/patternmatcher/ignorefile": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	internal, err := filepath.Glob("internal/*/*.go")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, internal...)
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			if strings.HasPrefix(p, "github.com/pandastack/pandastack/sdk/go/internal/") {
				continue
			}
			if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") && !allowed[p] {
				t.Errorf("%s imports %s: the SDK must use the standard library only", name, p)
			}
		}
	}
}

func TestStartTemplateBuildOptions(t *testing.T) {
	for _, tc := range []struct {
		opts []BuildOption
		want string
	}{
		{nil, `{"name":"web","from_image":"r.example/web:1"}`},
		{[]BuildOption{WithStartCmd("exec srv"), WithReadyCmd("check"), WithReadyTimeout(1500 * time.Millisecond)},
			`{"name":"web","from_image":"r.example/web:1","start_cmd":"exec srv","ready_cmd":"check","ready_timeout_seconds":2}`},
	} {
		var got string
		c := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got = string(b)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, `{"build_id":"b1","name":"web","from_image":"r.example/web:1","status":"queued","created_at":"2025-01-02T03:04:05Z"}`)
		}))
		b, err := c.StartTemplateBuild(context.Background(), "web", "r.example/web:1", tc.opts...)
		if err != nil || b.ID != "b1" {
			t.Fatalf("StartTemplateBuild: %+v, %v", b, err)
		}
		if canonJSON(got) != canonJSON(tc.want) {
			t.Errorf("request body %s, want %s", got, tc.want)
		}
	}
}
