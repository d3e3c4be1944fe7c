package rest_test

// The OpenAPI document (api/openapi.yaml, embedded as api.OpenAPI) is the
// contract; these tests hold the router to it in both directions. Both
// sides are read at test time, nothing is listed here: an endpoint added to
// one and not the other fails the test.
//
// Routing is pure logic, so the server under test has a hand-written Host
// that knows no sandboxes and no templates, and a real SQLite catalog (for
// authentication). No VM is started.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	apispec "github.com/pandastack/pandastack/api"
	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"gopkg.in/yaml.v3"
)

// storeTemplates is a template store as host.Templates (agent.Local's
// are the agent's own).
type storeTemplates struct{ s *template.Store }

func (t storeTemplates) Lookup(_ context.Context, p templates.Params) (*templates.Meta, string, error) {
	tp, reason, err := t.s.Lookup(p)
	if tp == nil {
		return nil, reason, err
	}
	return &tp.Meta, reason, err
}
func (t storeTemplates) List(context.Context) ([]templates.Meta, error) {
	ts, err := t.s.List()
	out := make([]templates.Meta, len(ts))
	for i := range ts {
		out[i] = ts[i].Meta
	}
	return out, err
}
func (t storeTemplates) Names(context.Context) ([]string, error) { return t.s.Names(), nil }
func (t storeTemplates) Bake(ctx context.Context, p templates.Params, progress templates.Progress) (*templates.Meta, error) {
	tp, err := t.s.Bake(ctx, p, progress)
	if tp == nil {
		return nil, err
	}
	return &tp.Meta, err
}

// routingHost is a host.Host with no sandboxes and no templates (its
// template store has no root filesystems, so nothing can be baked). Host
// methods it does not override are those of a nil embedded interface: they
// panic, which the API's recoverer answers with 500, still not the router's
// 404 or 405. That keeps this file compiling when Host grows.
type routingHost struct {
	host.Host
	templates *template.Store
}

func (h routingHost) Create(context.Context, host.CreateRequest) (host.Info, error) {
	return host.Info{}, host.ErrNotFound
}
func (h routingHost) Kill(context.Context, string) error { return host.ErrNotFound }
func (h routingHost) Get(context.Context, string) (host.Info, error) {
	return host.Info{}, host.ErrNotFound
}
func (h routingHost) List(context.Context) ([]host.Info, error) { return nil, nil }
func (h routingHost) Guest(context.Context, string) (host.Guest, error) {
	return nil, host.ErrNotFound
}
func (h routingHost) Memory(context.Context, string) (host.MemStats, error) {
	return host.MemStats{}, host.ErrNotFound
}
func (h routingHost) Templates() host.Templates { return storeTemplates{h.templates} }
func (h routingHost) TemplateParams(name string, mem, vcpus int) templates.Params {
	if name == "" {
		name = "base"
	}
	if mem == 0 {
		mem = 256
	}
	if vcpus == 0 {
		vcpus = 1
	}
	return templates.Params{Name: name, MemoryMiB: mem, VCPUs: vcpus}
}

// routingServer is an API server over routingHost, its router, and an
// admin key.
type routingServer struct {
	srv    *rest.Server
	routes chi.Routes
	url    string
	admin  string
}

func newRoutingServer(t *testing.T) *routingServer {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	store, err := template.NewStore(template.Config{
		Dir: filepath.Join(dir, "templates"), RunDir: filepath.Join(dir, "run"),
		Images: template.Images{Dir: filepath.Join(dir, "no-images")}, Accel: accel.TCG,
	})
	if err != nil {
		t.Fatal(err)
	}
	cat, err := sqlite.Open(ctx, filepath.Join(dir, "panda.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	_, secret, err := rest.NewKey(ctx, cat, "admin", true, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	srv, _, err := newServer(rest.Config{OpenAPI: apispec.OpenAPI, Logger: slog.New(slog.DiscardHandler)}, controlplane.Config{}, cat, routingHost{templates: store})
	if err != nil {
		t.Fatal(err)
	}
	routes, ok := srv.Handler().(chi.Routes)
	if !ok {
		t.Fatalf("api.Server.Handler() is a %T, not a chi router: this test needs an accessor for the routes (e.g. func (*Server) Routes() chi.Routes)", srv.Handler())
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &routingServer{srv: srv, routes: routes, url: hs.URL, admin: secret}
}

// specDoc is the part of an OpenAPI 3 document these tests read.
type specDoc struct {
	Paths      map[string]map[string]yaml.Node `yaml:"paths"`
	Components struct {
		Parameters map[string]specParam `yaml:"parameters"`
	} `yaml:"components"`
}

type specParam struct {
	Ref  string `yaml:"$ref"`
	Name string `yaml:"name"`
	In   string `yaml:"in"`
}

// httpMethods are the operation keys of an OpenAPI path item.
var httpMethods = map[string]bool{
	"get": true, "put": true, "post": true, "delete": true, "options": true, "head": true, "patch": true, "trace": true,
}

// chiMethods are the methods chi registers for a route added with Handle
// (any method).
var chiMethods = []string{"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}

type operation struct {
	method string // upper case
	path   string // as written in the document
}

func (o operation) String() string { return o.method + " " + o.path }

func loadSpec(t *testing.T) (specDoc, []operation) {
	t.Helper()
	var doc specDoc
	if err := yaml.Unmarshal(apispec.OpenAPI, &doc); err != nil {
		t.Fatalf("parse api/openapi.yaml: %v", err)
	}
	if len(doc.Paths) == 0 {
		t.Fatal("api/openapi.yaml has no paths")
	}
	var ops []operation
	for p, item := range doc.Paths {
		for k := range item {
			if httpMethods[k] {
				ops = append(ops, operation{method: strings.ToUpper(k), path: p})
			}
		}
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].String() < ops[j].String() })
	return doc, ops
}

var placeholder = regexp.MustCompile(`\{[^}/]*\}`)

// shape is a path with its parameter names erased: the router and the
// document may name one parameter differently ({keyID}, {key_id}). A
// trailing {path} of the document (the rest of the path, slashes included)
// is the router's catch-all, /*.
func shape(p string) string {
	if rest, ok := strings.CutSuffix(p, "/{path}"); ok {
		p = rest + "/*"
	}
	return placeholder.ReplaceAllString(p, "{}")
}

// underCatchAll reports whether a route of every method ending in /*
// covers shape s: the router then passes s's other methods on to it, on
// purpose (POST …/ports/{port}/url is routed; GET of it is proxied).
func underCatchAll(s string, routes map[string]map[string]bool) bool {
	for r, ms := range routes {
		if prefix, ok := strings.CutSuffix(r, "*"); ok && ms["*"] && r != s && strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// routerRoutes walks the router: shape → methods. A route that answers
// every method (registered with Handle) gets the method "*" only.
func routerRoutes(t *testing.T, routes chi.Routes) map[string]map[string]bool {
	t.Helper()
	got := map[string]map[string]bool{}
	err := chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		s := shape(route)
		if got[s] == nil {
			got[s] = map[string]bool{}
		}
		got[s][method] = true
		return nil
	})
	if err != nil {
		t.Fatalf("walk the router: %v", err)
	}
	for s, ms := range got {
		all := true
		for _, m := range chiMethods {
			all = all && ms[m]
		}
		if all {
			got[s] = map[string]bool{"*": true}
		}
	}
	if len(got) == 0 {
		t.Fatal("the router has no routes")
	}
	return got
}

// routerAnswer is how the API answered a request: status and error body.
type routerAnswer struct {
	status  int
	code    string
	message string
}

// unrouted reports whether the answer is the router's own "no such
// endpoint" (404) or "method not allowed" (405), not a handler's.
func (a routerAnswer) unrouted() bool {
	return a.status == http.StatusMethodNotAllowed ||
		(a.status == http.StatusNotFound && strings.HasPrefix(a.message, "no such endpoint"))
}

func (rs *routingServer) call(t *testing.T, method, path string) routerAnswer {
	t.Helper()
	req, err := http.NewRequest(method, rs.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+rs.admin)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	if res.Header.Get("Content-Type") == "application/x-ndjson" {
		// A stream that started (GET /v1/events) does not end by itself.
		return routerAnswer{status: res.StatusCode}
	}
	b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	var eb struct {
		Error struct{ Code, Message string }
	}
	json.Unmarshal(b, &eb)
	return routerAnswer{status: res.StatusCode, code: eb.Error.Code, message: eb.Error.Message}
}

// concrete fills a path template's parameters with a well-formed id that
// names nothing.
func concrete(p string) string { return placeholder.ReplaceAllString(p, "nosuch0") }

// TestOpenAPIOperationsAreRouted: every operation of the document reaches a
// handler (chi matches it, and the answer is not the router's 404/405).
func TestOpenAPIOperationsAreRouted(t *testing.T) {
	rs := newRoutingServer(t)
	_, ops := loadSpec(t)

	// The checks below rely on recognising the router's own answers.
	if a := rs.call(t, http.MethodGet, "/v1/no-such-endpoint-at-all"); !a.unrouted() || a.status != http.StatusNotFound {
		t.Fatalf("GET of an unknown path: got %d %s %q, want the router's 404 no such endpoint", a.status, a.code, a.message)
	}

	for _, op := range ops {
		t.Run(op.String(), func(t *testing.T) {
			path := concrete(op.path)
			if !rs.routes.Match(chi.NewRouteContext(), op.method, path) {
				t.Errorf("the router does not match %s %s (documented as %s)", op.method, path, op)
			}
			if a := rs.call(t, op.method, path); a.unrouted() {
				t.Errorf("%s %s: got the router's %d %s %q; want a handler's answer", op.method, path, a.status, a.code, a.message)
			}
		})
	}
}

// TestRoutesAreDocumented: every route of the router is an operation of the
// document.
func TestRoutesAreDocumented(t *testing.T) {
	rs := newRoutingServer(t)
	_, ops := loadSpec(t)
	documented := map[string]map[string]bool{}
	for _, op := range ops {
		s := shape(op.path)
		if documented[s] == nil {
			documented[s] = map[string]bool{}
		}
		documented[s][op.method] = true
	}
	routes := routerRoutes(t, rs.routes)
	shapes := make([]string, 0, len(routes))
	for s := range routes {
		shapes = append(shapes, s)
	}
	sort.Strings(shapes)
	for _, s := range shapes {
		methods := make([]string, 0, len(routes[s]))
		for m := range routes[s] {
			methods = append(methods, m)
		}
		sort.Strings(methods)
		for _, m := range methods {
			switch {
			case documented[s] == nil:
				t.Errorf("route %s %s is not in api/openapi.yaml", m, s)
			case m == "*":
				// Any method: the path must be documented with at least one.
			case !documented[s][m]:
				t.Errorf("route %s %s is not in api/openapi.yaml (documented methods of the path: %s)", m, s, keys(documented[s]))
			}
		}
	}

	// A documented path answers an undocumented method with the router's
	// 405, so that the methods above are the whole story. Checked on every
	// documented path that the router does not route for all methods.
	for _, s := range shapes {
		if routes[s]["*"] || documented[s] == nil || underCatchAll(s, routes) {
			continue
		}
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			if routes[s][m] {
				continue
			}
			if a := rs.call(t, m, concrete(s)); !a.unrouted() {
				t.Errorf("%s %s is not routed, but the answer was %d %s %q, not the router's 405", m, s, a.status, a.code, a.message)
			}
		}
	}
}

// TestOpenAPIPathParameters: every {parameter} of a documented path is
// declared as a path parameter of the operation or its path item.
func TestOpenAPIPathParameters(t *testing.T) {
	doc, ops := loadSpec(t)
	resolve := func(p specParam) (specParam, error) {
		if p.Ref == "" {
			return p, nil
		}
		name, ok := strings.CutPrefix(p.Ref, "#/components/parameters/")
		if !ok {
			return p, fmt.Errorf("unsupported $ref %q", p.Ref)
		}
		c, ok := doc.Components.Parameters[name]
		if !ok {
			return p, fmt.Errorf("$ref %q names no parameter", p.Ref)
		}
		return c, nil
	}
	declared := func(n yaml.Node) ([]specParam, error) {
		var ps []specParam
		if n.Kind == 0 {
			return nil, nil
		}
		if err := n.Decode(&ps); err != nil {
			return nil, err
		}
		return ps, nil
	}
	for _, op := range ops {
		item := doc.Paths[op.path]
		var all []specParam
		for _, n := range []yaml.Node{item["parameters"], opParams(t, item[strings.ToLower(op.method)])} {
			ps, err := declared(n)
			if err != nil {
				t.Errorf("%s: parameters: %v", op, err)
				continue
			}
			all = append(all, ps...)
		}
		inPath := map[string]bool{}
		for _, p := range all {
			r, err := resolve(p)
			if err != nil {
				t.Errorf("%s: %v", op, err)
				continue
			}
			if r.In == "path" {
				inPath[r.Name] = true
			}
		}
		for _, m := range placeholder.FindAllString(op.path, -1) {
			name := strings.Trim(m, "{}")
			if !inPath[name] {
				t.Errorf("%s: path parameter %q is not declared (in: path)", op, name)
			}
		}
	}
}

// opParams returns the parameters node of an operation node.
func opParams(t *testing.T, op yaml.Node) yaml.Node {
	var o struct {
		Parameters yaml.Node `yaml:"parameters"`
	}
	if err := op.Decode(&o); err != nil {
		t.Fatalf("decode operation: %v", err)
	}
	return o.Parameters
}

func keys(m map[string]bool) string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}
