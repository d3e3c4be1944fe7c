// Package apifuzz fuzzes the REST API's request decoding and validation
// through the real router (api.New(...).Handler()) with a real SQLite
// catalog. It is a package of its own so that its fuzz workers do not each
// run package api's TestMain, which starts a host agent and boots a guest.
package apifuzz

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/api"
	"github.com/pandastack/pandastack/internal/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/host"
	"github.com/pandastack/pandastack/internal/template"
	"github.com/pandastack/pandastack/internal/vmm"
	"github.com/prometheus/client_golang/prometheus"
)

// Flags of a fuzz input: which key the request carries.
const (
	authAdmin = 1 << iota // the admin key
	authUser              // a key without admin rights (admin wins if both)
	jsonType              // Content-Type: application/json
)

// requestTimeout bounds one request: a handler still running after it
// counts as a hang.
const requestTimeout = 10 * time.Second

// FuzzAPI sends arbitrary method, path, query and body combinations
// through the API and checks that each is answered in time, never with a
// 5xx (the host answers every call with a classified error, so nothing is
// an internal error), and that every error answer is the API's JSON error
// object {"error":{"code","message"}} with both set.
func FuzzAPI(f *testing.F) {
	for _, s := range seeds {
		f.Add(s.method, s.target, []byte(s.body), s.flags)
	}
	env := newEnv(f)
	f.Fuzz(func(t *testing.T, method, target string, body []byte, flags uint8) {
		// What an HTTP/1.1 server would not hand to the router: a request
		// line it cannot parse.
		if strings.ContainsAny(target, " \r\n") || !strings.HasPrefix(target, "/") {
			return
		}
		if _, err := url.ParseRequestURI(target); err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, "http://api.test"+target, bytes.NewReader(body))
		if err != nil {
			return // an invalid method: the server answers 400 itself
		}
		req.RequestURI = target
		switch {
		case flags&authAdmin != 0:
			req.Header.Set("Authorization", "Bearer "+env.admin)
		case flags&authUser != 0:
			req.Header.Set("Authorization", "Bearer "+env.user)
		}
		if flags&jsonType != 0 {
			req.Header.Set("Content-Type", "application/json")
		}

		env.log.Reset()
		rec := httptest.NewRecorder()
		done := make(chan struct{})
		go func() {
			defer close(done)
			env.handler.ServeHTTP(rec, req)
		}()
		select {
		case <-done:
		case <-time.After(requestTimeout + 5*time.Second):
			t.Fatalf("%s %s: no answer after %s", method, target, requestTimeout+5*time.Second)
		}

		res := rec.Result()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode >= 500 {
			t.Fatalf("%s %s (body %q, flags %d): status %d, body %s; server log:\n%s",
				method, target, body, flags, res.StatusCode, b, env.log.String())
		}
		if res.StatusCode >= 400 {
			var e struct {
				Error *struct {
					Code    *string `json:"code"`
					Message *string `json:"message"`
				} `json:"error"`
			}
			if ct := res.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("%s %s: status %d with Content-Type %q, want application/json; body %s", method, target, res.StatusCode, ct, b)
			}
			// E2B's routes (outside /v1: its control plane, envd's) answer
			// in E2B's shape, {"code": status, "message": …}, as its SDK
			// expects (docs/e2b.md).
			var e2b struct {
				Code    *int    `json:"code"`
				Message *string `json:"message"`
			}
			if !strings.HasPrefix(target, "/v1/") && json.Unmarshal(b, &e2b) == nil &&
				e2b.Code != nil && *e2b.Code == res.StatusCode && e2b.Message != nil && *e2b.Message != "" {
				return
			}
			if err := json.Unmarshal(b, &e); err != nil || e.Error == nil || e.Error.Code == nil || e.Error.Message == nil ||
				*e.Error.Code == "" || *e.Error.Message == "" {
				t.Fatalf("%s %s: status %d, body %s: not an error object {\"error\":{\"code\",\"message\"}} (%v)", method, target, res.StatusCode, b, err)
			}
		} else if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") && !json.Valid(b) {
			t.Fatalf("%s %s: status %d, Content-Type JSON but the body is not: %q", method, target, res.StatusCode, b)
		}
	})
}

type env struct {
	handler     http.Handler
	admin, user string // API key secrets
	log         *syncBuffer
}

func newEnv(f *testing.F) *env {
	ctx := context.Background()
	cat, err := sqlite.Open(ctx, filepath.Join(f.TempDir(), "panda.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { cat.Close() })
	logs := &syncBuffer{}
	srv, err := api.New(api.Config{
		MaxUploadBytes: 1 << 20, OpenAPI: []byte("openapi: 3.0.3\n"),
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}, cat, notFoundHost{}, prometheus.NewRegistry())
	if err != nil {
		f.Fatal(err)
	}
	_, admin, err := api.NewKey(ctx, cat, "admin", true, 0, 0)
	if err != nil {
		f.Fatal(err)
	}
	_, user, err := api.NewKey(ctx, cat, "user", false, 4, 1024)
	if err != nil {
		f.Fatal(err)
	}
	return &env{handler: srv.Handler(), admin: admin, user: user, log: logs}
}

// notFoundHost is a host agent without sandboxes or templates: every call
// fails with a not-found error, so requests exercise decoding and
// validation only. It embeds host.Host (nil) to keep compiling when the
// interface grows; a new method that a handler calls then panics, the API
// answers 500, and FuzzAPI's seeds say which method to add here.
type notFoundHost struct{ host.Host }

func (notFoundHost) Create(context.Context, host.CreateRequest) (host.Info, error) {
	return host.Info{}, host.ErrNotFound
}
func (notFoundHost) Kill(context.Context, string) error { return host.ErrNotFound }
func (notFoundHost) Get(context.Context, string) (host.Info, error) {
	return host.Info{}, host.ErrNotFound
}
func (notFoundHost) List(context.Context) ([]host.Info, error) { return nil, nil }
func (notFoundHost) Guest(context.Context, string) (host.Guest, error) {
	return nil, host.ErrNotFound
}
func (notFoundHost) Memory(context.Context, string) (host.MemStats, error) {
	return host.MemStats{}, host.ErrNotFound
}
func (notFoundHost) Templates() host.Templates                    { return noTemplates{} }
func (notFoundHost) Accel() vmm.Accel                             { return vmm.AccelTCG }
func (notFoundHost) DeleteSnapshot(context.Context, string) error { return host.ErrNotFound }
func (notFoundHost) Pause(context.Context, string) (host.CaptureStats, error) {
	return host.CaptureStats{}, host.ErrNotFound
}
func (notFoundHost) Resume(context.Context, string) (host.Info, error) {
	return host.Info{}, host.ErrNotFound
}
func (notFoundHost) Fork(context.Context, string, []string) (host.ForkResult, error) {
	return host.ForkResult{}, host.ErrNotFound
}
func (notFoundHost) Snapshot(context.Context, string, string) (host.SnapshotInfo, error) {
	return host.SnapshotInfo{}, host.ErrNotFound
}

// TemplateParams fills in defaults as the agent does.
func (notFoundHost) TemplateParams(name string, memoryMiB, vcpus int) template.Params {
	if name == "" {
		name = "tiny"
	}
	if memoryMiB == 0 {
		memoryMiB = 256
	}
	if vcpus == 0 {
		vcpus = 1
	}
	return template.Params{Name: name, MemoryMiB: memoryMiB, VCPUs: vcpus}
}

type noTemplates struct{}

func (noTemplates) Lookup(context.Context, template.Params) (*template.Template, string, error) {
	return nil, "", template.ErrNotFound
}
func (noTemplates) List(context.Context) ([]template.Template, error) { return nil, nil }
func (noTemplates) Names(context.Context) ([]string, error)           { return []string{"tiny"}, nil }
func (noTemplates) Bake(context.Context, template.Params, template.Progress) (*template.Template, error) {
	return nil, template.ErrNotFound
}

// syncBuffer collects the server's log for failure messages.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Reset()
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// seeds are one or more requests per route, valid and not.
var seeds = []struct {
	method, target, body string
	flags                uint8
}{
	{"GET", "/healthz", "", 0},
	{"GET", "/metrics", "", 0},
	{"GET", "/v1/openapi.yaml", "", 0},
	{"GET", "/nope", "", authAdmin},
	{"PATCH", "/v1/sandboxes", "", authAdmin},
	{"GET", "/v1/sandboxes", "", 0},
	{"GET", "/v1/sandboxes", "", authUser},
	{"POST", "/v1/sandboxes", `{"template":"tiny","memory_mib":256,"vcpus":1,"ttl_seconds":60,"on_expire":"pause","metadata":{"a":"b"},"env":{"X":"1"}}`, authAdmin | jsonType},
	{"POST", "/v1/sandboxes", `{"template":"../etc","memory_mib":-1}`, authUser | jsonType},
	{"POST", "/v1/sandboxes", `{"memory_mib":1e99,"vcpus":1.5,"ttl_seconds":-1}`, authUser},
	{"POST", "/v1/sandboxes", `{"metadata":{"":"x","a\u0000":"y"},"env":{"A":"\u0000"}}`, authAdmin},
	{"POST", "/v1/sandboxes", `{"snapshot_id":"snapabc"}`, authAdmin},
	{"POST", "/v1/sandboxes", `{"unknown":1}{"x":2}`, authAdmin},
	{"POST", "/v1/sandboxes", "[]", authAdmin},
	{"POST", "/v1/sandboxes", "null", authAdmin},
	{"POST", "/v1/sandboxes", "\"\xff\"", authAdmin},
	{"POST", "/v1/sandboxes", "", authAdmin},
	{"GET", "/v1/sandboxes?state=running&metadata=a%3Db&metadata=c%3D", "", authAdmin},
	{"GET", "/v1/sandboxes?state=stopped&metadata=%25%3D_&metadata=%22%3D%5C", "", authAdmin},
	{"GET", "/v1/sandboxes?metadata=a%00b%3Dc", "", authAdmin},
	{"GET", "/v1/sandboxes?metadata=a%3D%ff", "", authAdmin},
	{"GET", "/v1/sandboxes?metadata=%3Dx&state=bogus", "", authAdmin},
	{"GET", "/v1/sandboxes/abc", "", authAdmin},
	{"GET", "/v1/sandboxes/ABC%2F..", "", authAdmin},
	{"DELETE", "/v1/sandboxes/abc", "", authUser},
	{"PUT", "/v1/sandboxes/abc/ttl", `{"ttl_seconds":10}`, authAdmin},
	{"PUT", "/v1/sandboxes/abc/ttl", `{"ttl_seconds":9223372036854775807}`, authAdmin},
	{"POST", "/v1/sandboxes/abc/fork", `{"count":2}`, authAdmin},
	{"POST", "/v1/sandboxes/abc/fork", `{"count":-2}`, authAdmin},
	{"POST", "/v1/sandboxes/abc/snapshots", `{"name":"before"}`, authAdmin},
	{"POST", "/v1/sandboxes/abc/pause", "", authAdmin},
	{"POST", "/v1/sandboxes/abc/resume", "", authAdmin},
	{"GET", "/v1/snapshots", "", authUser},
	{"GET", "/v1/snapshots/snapabc", "", authUser},
	{"DELETE", "/v1/snapshots/snapabc", "", authAdmin},
	{"GET", "/v1/hosts", "", authAdmin},
	{"POST", "/v1/sandboxes/abc/exec", `{"cmd":"echo hi","timeout_seconds":5,"env":{"A":"b"},"cwd":"/work"}`, authAdmin},
	{"POST", "/v1/sandboxes/abc/exec", `{"argv":["ls","-l"],"stdin":"x","timeout_seconds":-1}`, authAdmin},
	{"POST", "/v1/sandboxes/abc/exec/stream", `{"cmd":"cat"}`, authAdmin},
	{"GET", "/v1/sandboxes/abc/files?path=/etc/hosts", "", authAdmin},
	{"PUT", "/v1/sandboxes/abc/files?path=/work/x&mode=0644", "hello", authAdmin},
	{"DELETE", "/v1/sandboxes/abc/files?path=/work&recursive=true", "", authAdmin},
	{"GET", "/v1/sandboxes/abc/files/list?path=%2F", "", authAdmin},
	{"GET", "/v1/sandboxes/abc/files/stat?path=relative", "", authAdmin},
	{"POST", "/v1/sandboxes/abc/files/mkdir", `{"path":"/work/d"}`, authAdmin},
	{"POST", "/v1/sandboxes/abc/files/rename", `{"from":"/a","to":"/b"}`, authAdmin},
	{"GET", "/v1/sandboxes/abc/ports", "", authUser},
	{"GET", "/v1/sandboxes/abc/ports/8000/a/b%2Fc?x=1", "", authUser},
	{"DELETE", "/v1/sandboxes/abc/ports/65536/", "", authAdmin},
	{"OPTIONS", "/v1/sandboxes/abc/ports/80", "", authAdmin},
	{"POST", "/v1/sandboxes/abc/ports/8000/url", `{"ttl_seconds":60}`, authUser},
	{"POST", "/v1/sandboxes/abc/ports/0/url", `{"ttl_seconds":-1}`, authAdmin},
	{"GET", "/p/AQAAAABpK9fkH0AUcm9ha3k2djNnZjl3Z2R6OWNzMzn0XkGyYBwE8Yg6aXUOJ7Dn/x?y=1", "", 0},
	{"PUT", "/p/%2F..", "x", 0},
	{"GET", "/v1/templates", "", authUser},
	{"POST", "/v1/templates/tiny/bake", `{"memory_mib":256,"vcpus":1}`, authAdmin},
	{"POST", "/v1/templates/..%2Fx/bake", `{}`, authAdmin},
	{"POST", "/v1/keys", `{"name":"k","admin":false,"max_sandboxes":2,"max_memory_mib":512}`, authAdmin},
	{"POST", "/v1/keys", `{"name":"k"}`, authUser},
	{"GET", "/v1/keys", "", authAdmin},
	{"DELETE", "/v1/keys/keyabc", "", authAdmin},
}
