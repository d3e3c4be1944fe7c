package api_test

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
	"github.com/pandastack/pandastack/internal/api"
	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/template"
	"github.com/pandastack/pandastack/internal/tmplbuild"
	"github.com/pandastack/pandastack/internal/vmm"
	"github.com/prometheus/client_golang/prometheus"
)

type buildServer struct {
	url, admin, user string
	adminID, userID  string
	cat              *sqlite.Catalog
	store            *template.Store
	dir              string
	builds           *tmplbuild.Manager
	convert          tmplbuild.Convert
	hs               *httptest.Server
	maxTemplates     int
}

func newBuildServer(t *testing.T) *buildServer { return newBuildServerLimit(t, 0) }

func newBuildServerLimit(t *testing.T, maxTemplates int) *buildServer {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	store, err := template.NewStore(template.Config{
		Dir: filepath.Join(dir, "templates"), Images: template.Images{Dir: filepath.Join(dir, "no-images")},
		UserDir: filepath.Join(dir, "rootfs"), Accel: vmm.AccelTCG,
	})
	if err != nil {
		t.Fatal(err)
	}
	convert := func(ctx context.Context, src, out string, progress func(string)) (tmplbuild.Result, error) {
		progress("pulling " + src)
		if strings.Contains(src, "missing") {
			return tmplbuild.Result{}, fmt.Errorf("%w: image %s not found in its registry", tmplbuild.ErrImageNotFound, src)
		}
		progress("writing the root filesystem")
		if strings.Contains(src, "hang") {
			<-ctx.Done()
			return tmplbuild.Result{}, ctx.Err()
		}
		return tmplbuild.Result{Digest: "sha256:abc", Image: template.ImageConfig{WorkingDir: "/srv"}}, os.WriteFile(out, []byte(src), 0o644)
	}
	cat, err := sqlite.Open(ctx, filepath.Join(dir, "panda.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	adminKey, admin, err := api.NewKey(ctx, cat, "admin", true, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	userKey, user, err := api.NewKey(ctx, cat, "user", false, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := &buildServer{admin: admin, adminID: adminKey.ID, user: user, userID: userKey.ID, cat: cat, store: store,
		dir: dir, convert: convert, maxTemplates: maxTemplates}
	b.start(t)
	return b
}

// start starts the builds and the API server over b's store and catalog.
func (b *buildServer) start(t *testing.T) {
	t.Helper()
	builds, err := tmplbuild.New(tmplbuild.Config{Store: b.store, Convert: b.convert, Dir: filepath.Join(b.dir, "builds")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { builds.Close() })
	srv, err := api.New(api.Config{OpenAPI: apispec.OpenAPI, Logger: slog.New(slog.DiscardHandler), TemplateBuilds: builds,
		MaxTemplatesPerKey: b.maxTemplates},
		b.cat, routingHost{templates: b.store}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	b.builds, b.hs, b.url = builds, hs, hs.URL
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
		{b.admin, `{"name":"app","from_image":""}`, 422},
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
	if _, err := b.store.UserRootFS("app"); !errors.Is(err, template.ErrNotFound) {
		t.Errorf("after delete: %v", err)
	}
}

// TestTemplateBuildsNotImplemented: a server without builds (panda
// server) answers 501.
func TestTemplateBuildsNotImplemented(t *testing.T) {
	rs := newRoutingServer(t)
	req, _ := http.NewRequest("POST", rs.url+"/v1/templates", strings.NewReader(`{"name":"app","from_image":"r.example/app:1"}`))
	req.Header.Set("Authorization", "Bearer "+rs.admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 501 {
		t.Errorf("POST /v1/templates without builds: %d, want 501", resp.StatusCode)
	}
}
