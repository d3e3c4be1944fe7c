package rest_test

// The template build endpoints over a real tmplbuild.Manager and template
// store whose image conversion is a function of this test (no registry,
// no VM): status codes, the log stream, the checks before deleting.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apispec "github.com/pandastack/pandastack/api"
	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/hostagent/template/build"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

type buildServer struct {
	url, admin, user string
	adminID, userID  string
	cat              *sqlite.Catalog
	store            *template.Store
	dir              string
	builds           *build.Manager
	srv              *rest.Server
	convert          build.Convert
	hs               *httptest.Server
	maxTemplates     int
	set              func(*build.Config, *rest.Config, *controlplane.Config)
	// wrap, if set, wraps the API's handler.
	wrap func(http.Handler) http.Handler
}

func newBuildServer(t *testing.T) *buildServer { return newBuildServerLimit(t, 0) }

func newBuildServerLimit(t *testing.T, maxTemplates int) *buildServer {
	t.Helper()
	return newBuildServerOpts(t, maxTemplates, nil)
}

// newBuildServerWith is newBuildServer with the builder's and the API's
// configuration changed by set before they start.
func newBuildServerWith(t *testing.T, set func(*build.Config, *rest.Config, *controlplane.Config)) *buildServer {
	t.Helper()
	return newBuildServerOpts(t, 0, set)
}

func newBuildServerOpts(t *testing.T, maxTemplates int, set func(*build.Config, *rest.Config, *controlplane.Config)) *buildServer {
	t.Helper()
	return newBuildServerWrapped(t, maxTemplates, set, nil)
}

// newBuildServerWrapped is newBuildServerOpts whose API handler is wrapped
// by wrap (if set).
func newBuildServerWrapped(t *testing.T, maxTemplates int, set func(*build.Config, *rest.Config, *controlplane.Config), wrap func(http.Handler) http.Handler) *buildServer {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	store, err := template.NewStore(template.Config{
		Dir: filepath.Join(dir, "templates"), Images: template.Images{Dir: filepath.Join(dir, "no-images")},
		UserDir: filepath.Join(dir, "rootfs"), Accel: accel.TCG,
	})
	if err != nil {
		t.Fatal(err)
	}
	convert := func(ctx context.Context, src, out string, progress func(string)) (builds.Result, error) {
		progress("pulling " + src)
		if strings.Contains(src, "missing") {
			return builds.Result{}, fmt.Errorf("%w: image %s not found in its registry", builds.ErrImageNotFound, src)
		}
		progress("writing the root filesystem")
		if strings.Contains(src, "hang") {
			<-ctx.Done()
			return builds.Result{}, ctx.Err()
		}
		return builds.Result{Digest: "sha256:abc", Image: templates.ImageConfig{WorkingDir: "/srv"}}, os.WriteFile(out, []byte(src), 0o644)
	}
	cat, err := sqlite.Open(ctx, filepath.Join(dir, "panda.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	adminKey, admin, err := rest.NewKey(ctx, cat, "admin", true, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	userKey, user, err := rest.NewKey(ctx, cat, "user", false, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := &buildServer{admin: admin, adminID: adminKey.ID, user: user, userID: userKey.ID, cat: cat, store: store,
		dir: dir, convert: convert, maxTemplates: maxTemplates, set: set, wrap: wrap}
	b.start(t)
	return b
}

// start starts the builds and the API server over b's store and catalog.
func (b *buildServer) start(t *testing.T) {
	t.Helper()
	bcfg := build.Config{Store: b.store, Convert: b.convert, Dir: filepath.Join(b.dir, "builds")}
	acfg := rest.Config{OpenAPI: apispec.OpenAPI, Logger: slog.New(slog.DiscardHandler)}
	pcfg := controlplane.Config{MaxTemplatesPerKey: b.maxTemplates}
	if b.set != nil {
		b.set(&bcfg, &acfg, &pcfg)
	}
	builds, err := build.New(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { builds.Close() })
	pcfg.Templates = builds
	srv, _, err := newServer(acfg, pcfg, b.cat, routingHost{templates: b.store})
	if err != nil {
		t.Fatal(err)
	}
	h := srv.Handler()
	if b.wrap != nil {
		h = b.wrap(h)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	b.builds, b.hs, b.url, b.srv = builds, hs, hs.URL, srv
}

// restart stops the builds and the API server, as a server restart does,
// and starts new ones over the same store, catalog and build directory.
func (b *buildServer) restart(t *testing.T) {
	t.Helper()
	b.hs.Close()
	b.builds.Close()
	b.start(t)
}

func (b *buildServer) do(t *testing.T, key, method, path, body string) (*http.Response, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, b.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp, out
}

// logs reads a build's log stream: its lines and final status.
func (b *buildServer) logs(t *testing.T, id string) ([]string, map[string]any) {
	return b.logsAs(t, b.admin, id)
}

func (b *buildServer) logsAs(t *testing.T, key, id string) ([]string, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("GET", b.url+"/v1/templates/builds/"+id+"/logs", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "application/x-ndjson" {
		t.Fatalf("logs: %d %s", resp.StatusCode, ct)
	}
	var lines []string
	var final map[string]any
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("logs: %q: %v", sc.Text(), err)
		}
		if final != nil {
			t.Errorf("logs: %q after the final status", sc.Text())
		}
		if l, ok := ev["line"].(string); ok {
			lines = append(lines, l)
		} else {
			final = ev
		}
	}
	return lines, final
}

func TestTemplateBuildEndpoints(t *testing.T) {
	b := newBuildServer(t)
	for _, tc := range []struct {
		key, body string
		status    int
	}{
		{b.user, `{"name":"base","from_image":"r.example/app:1"}`, 422},
		{b.admin, `{"name":"tiny","from_image":"r.example/app:1"}`, 422},
		{b.admin, `{"name":"App!","from_image":"r.example/app:1"}`, 422},
		{b.admin, `{"name":"builds","from_image":"r.example/app:1"}`, 422}, // the list of builds' path
		{b.admin, `{"name":"app","from_image":""}`, 400},                   // nothing to build from
		{b.admin, `{"name":"app","from_image":"/var/lib/x.tar"}`, 422},
		{b.admin, `{"name":"app","from_image":"oci:/srv"}`, 422},
		{b.admin, `{"name":"app","from_image":"docker-archive:/x"}`, 422},
		{b.admin, `{"name":"app","from_image":"r.example/app:1","extra":1}`, 400},
		{b.admin, `{"name":"app","from_image":"r.example/app:1","ready_cmd":"true","ready_timeout_seconds":-1}`, 422},
		{b.admin, `{"name":"app","from_image":"r.example/app:1","start_cmd":"x","ready_timeout_seconds":5}`, 422},
		{b.admin, `{"name":"app","from_image":"r.example/app:1","ready_cmd":"true","ready_timeout_seconds":99999}`, 422},
	} {
		if resp, out := b.do(t, tc.key, "POST", "/v1/templates", tc.body); resp.StatusCode != tc.status {
			t.Errorf("POST %s: %d %v, want %d", tc.body, resp.StatusCode, out, tc.status)
		}
	}

	resp, out := b.do(t, b.admin, "POST", "/v1/templates", `{"name":"app","from_image":"r.example/app:1"}`)
	id, _ := out["build_id"].(string)
	if resp.StatusCode != 202 || id == "" || resp.Header.Get("Location") != "/v1/templates/builds/"+id {
		t.Fatalf("POST: %d %v %s", resp.StatusCode, out, resp.Header.Get("Location"))
	}
	lines, final := b.logs(t, id)
	if len(lines) != 4 || lines[1] != "pulling r.example/app:1" || final["status"] != "succeeded" || final["digest"] != "sha256:abc" {
		t.Errorf("logs: %q, final %v", lines, final)
	}
	if _, out := b.do(t, b.admin, "GET", "/v1/templates/builds/"+id, ""); out["status"] != "succeeded" || out["name"] != "app" {
		t.Errorf("GET build: %v", out)
	}
	if resp, _ := b.do(t, b.user, "GET", "/v1/templates/builds/"+id, ""); resp.StatusCode != 404 {
		t.Errorf("GET another key's build: %d, want 404", resp.StatusCode)
	}
	if resp, _ := b.do(t, b.admin, "GET", "/v1/templates/builds/nope", ""); resp.StatusCode != 404 {
		t.Errorf("GET unknown build: %d", resp.StatusCode)
	}
	_, out = b.do(t, b.admin, "GET", "/v1/templates", "")
	if !strings.Contains(fmt.Sprint(out), "from_image:r.example/app:1") {
		t.Errorf("templates: %v", out)
	}

	// A missing image: the build fails, saying so.
	_, out = b.do(t, b.admin, "POST", "/v1/templates", `{"name":"app2","from_image":"r.example/missing:1"}`)
	_, final = b.logs(t, out["build_id"].(string))
	if final["status"] != "failed" || final["code"] != "image_not_found" || !strings.Contains(fmt.Sprint(final["error"]), "not found") {
		t.Errorf("missing image: %v", final)
	}

	// Delete: refused while a live sandbox of the template is in the
	// catalog, unless forced.
	now := time.Now().UTC()
	sb := catalog.Sandbox{ID: "sb1", KeyID: b.adminID, Template: "app:1", State: catalog.StateRunning, MemoryMiB: 256, VCPUs: 1,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := b.cat.ReserveSandbox(context.Background(), sb, catalog.Limits{Sandboxes: -1, MemoryMiB: -1, VCPUs: -1, DiskMiB: -1}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key, path string
		status    int
	}{
		{b.user, "/v1/templates/app", 404}, // an admin's private template
		{b.admin, "/v1/templates/tiny", 422},
		{b.admin, "/v1/templates/app?force=maybe", 422},
		{b.admin, "/v1/templates/nope", 404},
		{b.admin, "/v1/templates/app", 409},
		{b.admin, "/v1/templates/app?force=true", 204},
		{b.admin, "/v1/templates/app?force=true", 404},
		{b.admin, "/v1/templates/app2", 404},
	} {
		if resp, out := b.do(t, tc.key, "DELETE", tc.path, ""); resp.StatusCode != tc.status {
			t.Errorf("DELETE %s: %d %v, want %d", tc.path, resp.StatusCode, out, tc.status)
		}
	}
	if _, err := b.store.UserRootFS("app"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("after delete: %v", err)
	}
}

// TestTemplateBuildsNotImplemented: a server without builds answers 501,
// saying so.
func TestTemplateBuildsNotImplemented(t *testing.T) {
	rs := newRoutingServer(t)
	req, _ := http.NewRequest("POST", rs.url+"/v1/templates", strings.NewReader(`{"name":"app","from_image":"r.example/app:1"}`))
	req.Header.Set("Authorization", "Bearer "+rs.admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Error struct{ Code, Message string }
	}
	json.NewDecoder(resp.Body).Decode(&e)
	if resp.StatusCode != 501 || e.Error.Code != "not_implemented" || !strings.Contains(e.Error.Message, "does not build templates") {
		t.Errorf("POST /v1/templates without builds: %d %+v, want 501 not_implemented saying why", resp.StatusCode, e.Error)
	}
}

// build starts a build as key and waits for it; the final status.
func (b *buildServer) build(t *testing.T, key, body string) (int, map[string]any) {
	t.Helper()
	resp, out := b.do(t, key, "POST", "/v1/templates", body)
	if resp.StatusCode != 202 {
		return resp.StatusCode, out
	}
	_, final := b.logsAs(t, key, out["build_id"].(string))
	return resp.StatusCode, final
}

type listedTemplate struct {
	Name          string
	Version       int
	LatestVersion int   `json:"latest_version"`
	Public        *bool `json:"public"`
	Owner         string
	SizeBytes     int64 `json:"size_bytes"`
	DiskBytes     int64 `json:"disk_bytes"`
	Versions      []struct {
		Version   int
		SizeBytes int64  `json:"size_bytes"`
		FromImage string `json:"from_image"`
	}
}

func (b *buildServer) list(t *testing.T, key string) map[string]listedTemplate {
	t.Helper()
	req, _ := http.NewRequest("GET", b.url+"/v1/templates", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Templates []listedTemplate }
	json.NewDecoder(resp.Body).Decode(&out)
	m := map[string]listedTemplate{}
	for _, tm := range out.Templates {
		m[tm.Name] = tm
	}
	return m
}

// TestTemplatePublishVersions: publishing makes versions public, not a
// name: the owner's rebuild after a publish is its own until published in
// turn, other keys' NAME is the latest published version and NAME:N is
// theirs only if N is published; withdrawing one version or all.
func TestTemplatePublishVersions(t *testing.T) {
	b := newBuildServer(t)
	ctx := context.Background()
	otherKey, other, err := rest.NewKey(ctx, b.cat, "other", false, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	userKey, err := b.cat.GetKey(ctx, b.userID)
	if err != nil {
		t.Fatal(err)
	}
	build := func(img string, version int) {
		t.Helper()
		if code, st := b.build(t, b.user, `{"name":"app","from_image":"`+img+`"}`); code != 202 || st["status"] != "succeeded" || st["version"] != float64(version) {
			t.Fatalf("build of app from %s: %d %v, want version %d", img, code, st, version)
		}
	}
	resolve := func(key catalog.Key, ref, want string) {
		t.Helper()
		got, err := b.srv.ResolveTemplate(ctx, key, ref)
		if want == "" {
			if !strings.Contains(fmt.Sprint(err), "not found") || got != "" {
				t.Errorf("%s resolves %s to %q, %v; want not found", key.Name, ref, got, err)
			}
			return
		}
		if err != nil || got != want {
			t.Errorf("%s resolves %s to %q, %v; want %s", key.Name, ref, got, err, want)
		}
	}
	publish := func(verb, ref string, status int, want string) {
		t.Helper()
		resp, out := b.do(t, b.admin, "POST", "/v1/templates/"+ref+"/"+verb, "")
		if resp.StatusCode != status || (want != "" && fmt.Sprint(out["published_versions"]) != want) {
			t.Errorf("%s %s: %d %v, want %d with published_versions %s", verb, ref, resp.StatusCode, out, status, want)
		}
	}
	listed := func(key string) (latest int, versions []int) {
		t.Helper()
		got, ok := b.list(t, key)["app"]
		if !ok {
			return 0, nil
		}
		for _, v := range got.Versions {
			versions = append(versions, v.Version)
		}
		return got.LatestVersion, versions
	}

	build("r.example/app:1", 1)
	publish("publish", "app", 200, "[1]")
	resolve(otherKey, "app", "app:1")
	// The owner rebuilds: its own app is version 2; everyone else's is
	// still version 1, and version 2 is not there for them.
	build("r.example/app:2", 2)
	resolve(userKey, "app", "app:2")
	resolve(otherKey, "app", "app:1")
	resolve(otherKey, "app:1", "app:1")
	resolve(otherKey, "app:2", "")
	if resp, out := b.do(t, other, "POST", "/v1/sandboxes", `{"template":"app:2"}`); resp.StatusCode != 404 || !strings.Contains(fmt.Sprint(out), `template "app:2" not found`) {
		t.Errorf("another key creates from the unpublished app:2: %d %v, want 404 as for nothing", resp.StatusCode, out)
	}
	if latest, vs := listed(other); latest != 1 || fmt.Sprint(vs) != "[1]" {
		t.Errorf("another key lists app at %d with versions %v, want 1 and [1]", latest, vs)
	}
	if latest, vs := listed(b.user); latest != 2 || fmt.Sprint(vs) != "[1 2]" {
		t.Errorf("the owner lists app at %d with versions %v, want 2 and [1 2]", latest, vs)
	}
	// Publishing NAME:N publishes that version; NAME then means it.
	publish("publish", "app:2", 200, "[1 2]")
	resolve(otherKey, "app", "app:2")
	publish("unpublish", "app:2", 200, "[1]")
	resolve(otherKey, "app", "app:1")
	// Withdrawing NAME withdraws every version.
	publish("publish", "app:2", 200, "[1 2]")
	publish("unpublish", "app", 200, "[]")
	resolve(otherKey, "app", "")
	resolve(otherKey, "app:1", "")
	if latest, _ := listed(other); latest != 0 {
		t.Errorf("another key lists app after it was withdrawn")
	}
	resolve(userKey, "app:1", "app:1")
	publish("publish", "app:9", 404, "")
	publish("publish", "tiny", 422, "")
	publish("publish", "Bad", 422, "")
	publish("publish", "nope", 404, "")
	if resp, _ := b.do(t, b.user, "POST", "/v1/templates/app:2/publish", ""); resp.StatusCode != 403 {
		t.Errorf("publish as the owner: %d, want 403 (admin keys only)", resp.StatusCode)
	}
}

// TestTemplateVersionsOwnersPublish: builds make versions; a key's
// template is private to it (404 for others, its name taken: 409) until
// an admin publishes it; the per-key limit; deleting one version, and the
// checks against snapshots.
func TestTemplateVersionsOwnersPublish(t *testing.T) {
	b := newBuildServerLimit(t, 2)
	ctx := context.Background()
	_, other, err := rest.NewKey(ctx, b.cat, "other", false, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, img := range []string{"r.example/app:1", "r.example/app:22"} {
		if code, st := b.build(t, b.user, `{"name":"app","from_image":"`+img+`"}`); code != 202 || st["status"] != "succeeded" || st["version"] != float64(i+1) {
			t.Fatalf("build %d of app: %d %v", i+1, code, st)
		}
	}
	got := b.list(t, b.user)["app"]
	if got.Version != 2 || got.LatestVersion != 2 || got.Public == nil || *got.Public || got.Owner != "" ||
		len(got.Versions) != 2 || got.Versions[0].FromImage != "r.example/app:1" || got.Versions[1].SizeBytes != int64(len("r.example/app:22")) || got.DiskBytes == 0 {
		t.Errorf("the owner's listing: %+v", got)
	}
	if got := b.list(t, b.admin)["app"]; got.Owner != b.userID {
		t.Errorf("the admin's listing: owner %q, want %q", got.Owner, b.userID)
	}
	if _, ok := b.list(t, other)["app"]; ok {
		t.Errorf("another key lists a private template")
	}

	// Creating from it: another key gets the same 404 as for nothing.
	for _, tc := range []struct {
		key, tmpl string
		status    int
		msg       string
	}{
		{other, "app", 404, `template "app" not found`},
		{other, "app:1", 404, `template "app:1" not found`},
		{other, "nope", 404, `template "nope" not found`},
		{b.user, "app:3", 404, "has no version 3"},
		{b.user, "app:0", 422, "version"},
		{b.user, "tiny:1", 422, "no versions"},
	} {
		resp, out := b.do(t, tc.key, "POST", "/v1/sandboxes", `{"template":"`+tc.tmpl+`"}`)
		if resp.StatusCode != tc.status || !strings.Contains(fmt.Sprint(out), tc.msg) {
			t.Errorf("create from %s: %d %v, want %d %q", tc.tmpl, resp.StatusCode, out, tc.status, tc.msg)
		}
	}
	// Names are global; only the owner or an admin rebuilds.
	if code, out := b.build(t, other, `{"name":"app","from_image":"r.example/x:1"}`); code != 409 || out["error"].(map[string]any)["code"] != "conflict" {
		t.Errorf("building another key's name: %d %v, want 409 conflict", code, out)
	}
	if code, st := b.build(t, b.admin, `{"name":"app","from_image":"r.example/app:3"}`); code != 202 || st["version"] != float64(3) {
		t.Errorf("an admin's rebuild: %d %v", code, st)
	}
	if got := b.list(t, b.admin)["app"]; got.Owner != b.userID {
		t.Errorf("owner after an admin's rebuild: %q, want %q", got.Owner, b.userID)
	}
	// Build status: the builder's and the admins'.
	resp, out := b.do(t, b.user, "POST", "/v1/templates", `{"name":"app","from_image":"r.example/app:4"}`)
	id, _ := out["build_id"].(string)
	if resp.StatusCode != 202 {
		t.Fatalf("rebuild: %d %v", resp.StatusCode, out)
	}
	b.logsAs(t, b.user, id)
	for _, tc := range []struct {
		key    string
		status int
	}{{b.user, 200}, {b.admin, 200}, {other, 404}} {
		if resp, _ := b.do(t, tc.key, "GET", "/v1/templates/builds/"+id, ""); resp.StatusCode != tc.status {
			t.Errorf("GET build as %s: %d, want %d", tc.key[:8], resp.StatusCode, tc.status)
		}
	}
	// Listing builds: a key's own, newest first; an admin's, all of them.
	listBuilds := func(key, query string) (ids, images []string) {
		t.Helper()
		resp, out := b.do(t, key, "GET", "/v1/templates/builds"+query, "")
		list, ok := out["builds"].([]any)
		if resp.StatusCode != 200 || !ok {
			t.Fatalf("GET /v1/templates/builds%s: %d %v", query, resp.StatusCode, out)
		}
		for _, x := range list {
			m := x.(map[string]any)
			ids = append(ids, m["build_id"].(string))
			images = append(images, m["from_image"].(string))
		}
		return ids, images
	}
	if ids, images := listBuilds(b.user, ""); len(ids) != 3 || ids[0] != id || strings.Join(images, " ") != "r.example/app:4 r.example/app:22 r.example/app:1" {
		t.Errorf("the builder's builds: %v %v, want app:4, app:22, app:1 (%s first)", ids, images, id)
	}
	if ids, _ := listBuilds(b.admin, "?name=app"); len(ids) != 4 {
		t.Errorf("an admin's builds of app: %v, want 4", ids)
	}
	if ids, _ := listBuilds(b.admin, "?name=nope"); len(ids) != 0 {
		t.Errorf("builds of nope: %v", ids)
	}
	if ids, _ := listBuilds(other, ""); len(ids) != 0 {
		t.Errorf("another key lists builds %v", ids)
	}

	// Publishing: admins only; then every key lists it.
	if resp, _ := b.do(t, b.user, "POST", "/v1/templates/app/publish", ""); resp.StatusCode != 403 {
		t.Errorf("publish as the owner: %d, want 403", resp.StatusCode)
	}
	if resp, out := b.do(t, b.admin, "POST", "/v1/templates/app/publish", ""); resp.StatusCode != 200 || out["public"] != true {
		t.Errorf("publish: %d %v", resp.StatusCode, out)
	}
	if got, ok := b.list(t, other)["app"]; !ok || !*got.Public || got.Owner != "" {
		t.Errorf("another key's listing after publish: %+v, %v", got, ok)
	}
	if resp, _ := b.do(t, other, "DELETE", "/v1/templates/app", ""); resp.StatusCode != 403 {
		t.Errorf("delete a published template as another key: %d, want 403", resp.StatusCode)
	}
	if resp, _ := b.do(t, b.admin, "POST", "/v1/templates/app/unpublish", ""); resp.StatusCode != 200 {
		t.Errorf("unpublish: %d", resp.StatusCode)
	}
	if _, ok := b.list(t, other)["app"]; ok {
		t.Errorf("another key lists an unpublished template")
	}

	// The per-key limit (2): app and app2; a third name is refused.
	if code, st := b.build(t, b.user, `{"name":"app2","from_image":"r.example/b:1"}`); code != 202 || st["status"] != "succeeded" {
		t.Fatalf("app2: %d %v", code, st)
	}
	if code, out := b.build(t, b.user, `{"name":"app3","from_image":"r.example/c:1"}`); code != 429 || out["error"].(map[string]any)["code"] != "template_limit" {
		t.Errorf("a third template: %d %v, want 429 template_limit", code, out)
	}

	// Deleting: a version other than the latest, unless a snapshot of it
	// is in the catalog; the template, unless a snapshot of any is.
	now := time.Now().UTC()
	if err := b.cat.CreateSnapshot(ctx, catalog.Snapshot{ID: "sn1", KeyID: b.userID, SandboxID: "sbx", HostID: "local", Template: "app:1",
		MemoryMiB: 256, VCPUs: 1, CreatedAt: now}, catalog.Limits{Sandboxes: -1, MemoryMiB: -1, VCPUs: -1, DiskMiB: -1}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key, path string
		status    int
	}{
		{other, "/v1/templates/app:2", 404},
		{b.user, "/v1/templates/app:4", 409}, // the latest
		{b.user, "/v1/templates/app:9", 404},
		{b.user, "/v1/templates/app:1", 409},   // its snapshot
		{b.user, "/v1/templates/app%3A2", 204}, // the colon escaped
		{b.user, "/v1/templates/app:2", 404},
		{b.user, "/v1/templates/app", 409}, // the snapshot of app:1
		{b.user, "/v1/templates/app?force=true", 204},
	} {
		if resp, out := b.do(t, tc.key, "DELETE", tc.path, ""); resp.StatusCode != tc.status {
			t.Errorf("DELETE %s: %d %v, want %d", tc.path, resp.StatusCode, out, tc.status)
		}
	}
}

// TestTemplateBuildsAfterRestart: a build's status and log outlive a
// restart of the server; one running then is failed as interrupted.
func TestTemplateBuildsAfterRestart(t *testing.T) {
	b := newBuildServer(t)
	_, done := b.build(t, b.user, `{"name":"app","from_image":"r.example/app:1"}`)
	doneID := done["build_id"].(string)
	resp, out := b.do(t, b.user, "POST", "/v1/templates", `{"name":"slow","from_image":"r.example/hang:1"}`)
	if resp.StatusCode != 202 {
		t.Fatalf("start: %d %v", resp.StatusCode, out)
	}
	hungID := out["build_id"].(string)
	testkit.WaitFor(t, 30*time.Second, "the hanging build running", func() bool {
		_, st := b.do(t, b.user, "GET", "/v1/templates/builds/"+hungID, "")
		return st["status"] == "running"
	})
	// As if the server died mid-build: its record still says running.
	rec := filepath.Join(b.dir, "builds", hungID+".json")
	running, err := os.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	b.restart(t)
	os.WriteFile(rec, running, 0o600)
	b.restart(t)

	lines, final := b.logsAs(t, b.user, doneID)
	if final["status"] != "succeeded" || final["version"] != float64(1) || len(lines) < 3 {
		t.Errorf("finished build after restart: %q %v", lines, final)
	}
	_, st := b.do(t, b.user, "GET", "/v1/templates/builds/"+hungID, "")
	if st["status"] != "failed" || st["code"] != "interrupted" || !strings.Contains(fmt.Sprint(st["error"]), "restarted during the build") {
		t.Errorf("interrupted build after restart: %v", st)
	}
	_, other, _ := rest.NewKey(context.Background(), b.cat, "other", false, 0, 0)
	if resp, _ := b.do(t, other, "GET", "/v1/templates/builds/"+doneID, ""); resp.StatusCode != 404 {
		t.Errorf("another key's build after restart: %d, want 404", resp.StatusCode)
	}
}
