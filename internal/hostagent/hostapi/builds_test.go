package hostapi_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
	"github.com/pandastack/pandastack/internal/hostagent/hostapi"
	"github.com/pandastack/pandastack/internal/hostagent/template/build"
)

// TestBuilds: the template builds of an agent through Client.Builds, on
// the agent's real template store: a Dockerfile build receives its spec
// and its context, its lines and final status come back, the owner
// travels with the status, the user template is listed, published and
// removed; the builder's error classes survive the wire; an agent that
// does not build answers unsupported. (The images are stand-ins: the
// conversion itself, rootfs.FromImage and the Dockerfile builder, is
// tested where it lives, and end to end in cmd/panda's
// TestSplitTemplateBuild.)
func TestBuilds(t *testing.T) {
	world(t)
	ctx := context.Background()
	gotContext := make(chan string, 1)
	m, err := build.New(build.Config{
		Store: ag.Templates(),
		Convert: func(ctx context.Context, src, out string, progress func(string)) (builds.Result, error) {
			if strings.Contains(src, "missing") {
				return builds.Result{}, builds.ErrImageNotFound
			}
			progress("converting " + src)
			return builds.Result{Digest: "sha256:abc"}, os.WriteFile(out, []byte(src), 0o644)
		},
		Dockerfile: func(ctx context.Context, spec builds.Spec, out string, progress func(string)) (builds.Result, error) {
			b, err := os.ReadFile(spec.ContextTar)
			if err != nil {
				return builds.Result{}, err
			}
			gotContext <- string(b)
			progress("dockerfile: " + string(spec.Dockerfile) + " arg " + spec.BuildArgs["A"])
			return builds.Result{}, os.WriteFile(out, spec.Dockerfile, 0o644)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	contexts := t.TempDir()
	_, c2 := secondServer(t, func(s *hostapi.Server) { s.ServeBuilds(m, contexts) })
	b := c2.Builds()

	// A Dockerfile build with a context, which the client removes once sent.
	ctxFile := filepath.Join(t.TempDir(), "context.tar")
	if err := os.WriteFile(ctxFile, []byte("the context"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := b.Start(ctx, builds.Spec{Name: "wired", Dockerfile: []byte("FROM tiny"), ContextTar: ctxFile,
		BuildArgs: map[string]string{"A": "1"}, Owner: "key-1"})
	if err != nil || st.Owner != "key-1" || st.Name != "wired" || st.Source != "Dockerfile" {
		t.Fatalf("Start: %+v, %v", st, err)
	}
	if _, err := os.Stat(ctxFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the context file after Start: %v, want it removed", err)
	}
	var lines []string
	final, err := b.Follow(ctx, st.ID, func(l string) { lines = append(lines, l) })
	if err != nil || final.State != builds.StateSucceeded || final.Version != 1 || final.Owner != "key-1" {
		t.Fatalf("Follow: %+v, %v (lines %q)", final, err, lines)
	}
	if got := <-gotContext; got != "the context" {
		t.Errorf("the agent's build got context %q", got)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "dockerfile: FROM tiny arg 1") {
		t.Errorf("lines %q lack the build's own", lines)
	}
	if left, _ := os.ReadDir(contexts); len(left) != 0 {
		t.Errorf("context files left on the agent: %v", left)
	}
	if got, err := b.Get(ctx, st.ID); err != nil || got.State != builds.StateSucceeded || got.Owner != "key-1" {
		t.Errorf("Get: %+v, %v", got, err)
	}
	if list, err := b.List(ctx); err != nil || len(list) != 1 || list[0].ID != st.ID {
		t.Errorf("List: %+v, %v", list, err)
	}

	// The template it made.
	u, err := b.UserTemplate(ctx, "wired")
	if err != nil || u.Version != 1 || u.Owner != "key-1" || u.SizeBytes != int64(len("FROM tiny")) || u.DiskBytes == 0 {
		t.Errorf("UserTemplate: %+v, %v", u, err)
	}
	if err := b.SetPublished(ctx, "wired", true); err != nil {
		t.Errorf("SetPublished: %v", err)
	}
	us, err := b.UserTemplates(ctx)
	if err != nil || len(us) != 1 || !us[0].Published {
		t.Errorf("UserTemplates: %+v, %v; want wired, public", us, err)
	}
	if vs, err := b.Versions(ctx, "wired"); err != nil || len(vs) != 1 || vs[0].Version != 1 {
		t.Errorf("Versions: %+v, %v", vs, err)
	}

	// Errors keep their classes.
	if _, err := b.Get(ctx, "nope"); !errors.Is(err, builds.ErrNotFound) {
		t.Errorf("Get of no build: %v, want tmplbuild.ErrNotFound", err)
	}
	if _, err := b.UserTemplate(ctx, "wired:7"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("UserTemplate of no version: %v, want templates.ErrNotFound", err)
	}
	if _, err := b.Start(ctx, builds.Spec{Name: "Bad Name", FromImage: "x"}); !errors.Is(err, templates.ErrInvalid) {
		t.Errorf("Start with a bad name: %v, want templates.ErrInvalid", err)
	}
	if _, err := b.Start(ctx, builds.Spec{Name: "other", FromImage: "x", Owner: "key-2", MaxTemplates: 0}); err != nil {
		t.Fatal(err)
	} else if _, err := b.Start(ctx, builds.Spec{Name: "third", FromImage: "x", Owner: "key-2", MaxTemplates: 1}); !errors.Is(err, builds.ErrLimit) {
		t.Errorf("Start over the owner's limit: %v, want tmplbuild.ErrLimit", err)
	}
	failed, err := b.Start(ctx, builds.Spec{Name: "gone", FromImage: "r.example/missing:1"})
	if err == nil {
		failed, err = b.Follow(ctx, failed.ID, func(string) {})
	}
	if err != nil || failed.State != builds.StateFailed || failed.Code != builds.CodeImageNotFound {
		t.Errorf("a build of a missing image: %+v, %v", failed, err)
	}

	// A fleet's build: its id and version are the control plane's.
	const id = "0123456789abcdef0123"
	fl, err := b.Start(ctx, builds.Spec{Name: "fleetbuilt", FromImage: "x", Owner: "key-1", ID: id, Version: 7})
	if err == nil {
		fl, err = b.Follow(ctx, fl.ID, func(string) {})
	}
	if err != nil || fl.ID != id || fl.State != builds.StateSucceeded || fl.Version != 7 {
		t.Errorf("a build with an id and a version: %+v, %v; want %s, succeeded as version 7", fl, err, id)
	}
	if u, err := b.UserTemplate(ctx, "fleetbuilt:7"); err != nil || u.Version != 7 || !u.Copy {
		t.Errorf("UserTemplate(fleetbuilt:7) = %+v, %v", u, err)
	}
	if _, err := b.Start(ctx, builds.Spec{Name: "fleetbuilt", FromImage: "x", ID: id, Version: 8}); !errors.Is(err, builds.ErrConflict) {
		t.Errorf("a build with a taken id: %v, want tmplbuild.ErrConflict", err)
	}
	if _, err := b.Start(ctx, builds.Spec{Name: "fleetbuilt", FromImage: "x", ID: "not-hex"}); !errors.Is(err, templates.ErrInvalid) {
		t.Errorf("a build with a malformed id: %v, want templates.ErrInvalid", err)
	}
	// A number this host has had already is refused at the install.
	old, err := b.Start(ctx, builds.Spec{Name: "fleetbuilt", FromImage: "x", Version: 7})
	if err == nil {
		old, err = b.Follow(ctx, old.ID, func(string) {})
	}
	if err != nil || old.State != builds.StateFailed {
		t.Errorf("a build of a version this host had: %+v, %v; want failed", old, err)
	}
	if u, err := b.UserTemplate(ctx, "fleetbuilt"); err != nil || u.Version != 7 {
		t.Errorf("fleetbuilt after the refused build: %+v, %v; want version 7 still", u, err)
	}

	// Removed.
	for _, name := range []string{"wired", "other", "fleetbuilt"} {
		if _, err := b.Follow(ctx, mustLatestBuild(t, b, name), func(string) {}); err != nil {
			t.Fatal(err)
		}
		if err := b.Remove(ctx, name); err != nil {
			t.Errorf("Remove %s: %v", name, err)
		}
	}
	if _, err := b.UserTemplate(ctx, "wired"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("UserTemplate after Remove: %v, want templates.ErrNotFound", err)
	}

	// The shared test server does not build.
	if _, err := client.Builds().List(ctx); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("List on an agent without builds: %v, want errors.ErrUnsupported", err)
	}
}

// mustLatestBuild returns the id of the newest build of name.
func mustLatestBuild(t *testing.T, b hostclient.Builds, name string) string {
	t.Helper()
	list, err := b.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range list {
		if st.Name == name {
			return st.ID
		}
	}
	t.Fatalf("no build of %s", name)
	return ""
}
