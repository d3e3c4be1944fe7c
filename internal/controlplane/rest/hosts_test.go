package rest_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/controlplane/fleet"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/hostagent/hostapi"
	"github.com/pandastack/pandastack/internal/hostagent/template/build"
)

// A fleet's GET /v1/hosts lists the templates each host holds: every one
// to an admin key; to another key only the built-in ones, its own and the
// published ones, never another tenant's private template (issue 31,
// finding 12).
func TestFleetHostsListVisibleTemplates(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	regCat, err := sqlite.Open(ctx, filepath.Join(dir, "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { regCat.Close() })
	reg := fleet.New(fleet.Config{Catalog: regCat, JoinToken: "join-secret", LostAfter: time.Hour})
	t.Cleanup(reg.Close)
	b := newBuildServerWith(t, func(_ *build.Config, ac *rest.Config, _ *controlplane.Config) { ac.Fleet = reg })
	_, other, err := rest.NewKey(ctx, b.cat, "other", false, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, bl := range []struct{ key, name string }{{b.user, "mine"}, {other, "secret"}, {other, "shared"}} {
		_, out := b.do(t, bl.key, "POST", "/v1/templates", `{"name":"`+bl.name+`","from_image":"r.example/app:1"}`)
		if final := b.waitBuild(t, out["build_id"].(string)); final["status"] != "succeeded" {
			t.Fatalf("build of %s: %v", bl.name, final)
		}
	}
	if resp, _ := b.do(t, b.admin, "POST", "/v1/templates/shared/publish", ""); resp.StatusCode != 200 {
		t.Fatalf("publish: %d", resp.StatusCode)
	}
	creds, err := hostapi.LoadOrCreateTLS(dir, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(creds.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	held := []string{"base", "mine:1", "secret:1", "secret", "shared:1", "gone:3"}
	if _, err := reg.Register(ctx, host.Registration{ID: "h1", URL: "https://127.0.0.1:1", Token: "agent-1", CACert: string(ca),
		Capacity: host.Capacity{CPUs: 2, MemoryMiB: 4096, DiskMiB: 10000, Accel: "tcg"},
		Load:     host.Load{FreeMemoryMiB: 4000, DiskFreeMiB: 9000, Templates: held}}); err != nil {
		t.Fatal(err)
	}
	list := func(key string) []string {
		t.Helper()
		resp, out := b.do(t, key, "GET", "/v1/hosts", "")
		hosts, _ := out["hosts"].([]any)
		if resp.StatusCode != 200 || len(hosts) != 1 {
			t.Fatalf("GET /v1/hosts: %d %v", resp.StatusCode, out)
		}
		var names []string
		for _, n := range hosts[0].(map[string]any)["templates"].([]any) {
			names = append(names, n.(string))
		}
		return names
	}
	if got, want := list(b.user), []string{"base", "mine:1", "shared:1"}; !slices.Equal(got, want) {
		t.Errorf("a tenant's /v1/hosts templates: %v, want %v", got, want)
	}
	if got := list(b.admin); !slices.Equal(got, held) {
		t.Errorf("an admin's /v1/hosts templates: %v, want %v", got, held)
	}
}
