package fleet_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/fleet"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/hostagent/template/build"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// buildHost is a host's template builds: a real Manager on a real
// template store, whose conversions write the image's name (images named
// "missing…" are not found; "slow…" ones wait for release).
type buildHost struct {
	m       *build.Manager
	release chan struct{}
}

func newBuildHost(t *testing.T) *buildHost {
	t.Helper()
	dir := t.TempDir()
	st, err := template.NewStore(template.Config{Dir: filepath.Join(dir, "templates"), Images: template.Images{Dir: dir},
		UserDir: filepath.Join(dir, "rootfs"), Accel: accel.TCG})
	if err != nil {
		t.Fatal(err)
	}
	h := &buildHost{release: make(chan struct{})}
	h.m, err = build.New(build.Config{Store: st, Copies: true,
		Convert: func(ctx context.Context, src, out string, progress func(string)) (builds.Result, error) {
			switch {
			case strings.HasPrefix(src, "missing"):
				return builds.Result{}, builds.ErrImageNotFound
			case strings.HasPrefix(src, "slow"):
				select {
				case <-h.release:
				case <-ctx.Done():
					return builds.Result{}, ctx.Err()
				}
			}
			return builds.Result{Digest: "sha256:" + src}, os.WriteFile(out, []byte(src), 0o644)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.m.Close() })
	return h
}

// TestTemplatesRegistry: the fleet's registry of user templates over two
// hosts' real build managers: versions numbered by the catalog and
// recorded before a build is reported done; a failed build records
// nothing and its number is not given out again (a first build that fails
// leaves no template); deletes of one version or all, with the host's
// copy; the public flag; a build no one follows recorded by its watcher;
// a build left by a previous control plane recorded by the next one's
// watcher; a build whose host is away recorded once it is back; a build
// whose host is forgotten dropped.
func TestTemplatesRegistry(t *testing.T) {
	r, cat, _, _ := newRegistry(t)
	ctx := t.Context()
	h1, h2 := newBuildHost(t), newBuildHost(t)
	var h2gone, h2away atomic.Bool
	ids, fixedOf := fixed(map[string]builds.Builder{"h1": h1.m, "h2": h2.m})
	builderOf := func(id string) (builds.Builder, bool) {
		if id == "h2" && h2away.Load() {
			return nil, false
		}
		return fixedOf(id)
	}
	gone := func(id string) bool { return id == "h2" && h2gone.Load() }
	open := func(pin string) *fleet.Templates {
		tp := fleet.NewTemplates(r, pin)
		fleet.SetBuilders(tp, ids, builderOf, gone)
		t.Cleanup(tp.Close)
		return tp
	}
	ts := open("h1")
	runBuild := func(ts *fleet.Templates, name, image string) builds.Status {
		t.Helper()
		st, err := ts.Start(ctx, builds.Spec{Name: name, FromImage: image, Owner: "key_a"})
		if err != nil {
			t.Fatalf("Start(%s from %s): %v", name, image, err)
		}
		st, err = ts.Follow(ctx, st.ID, func(string) {})
		if err != nil {
			t.Fatalf("Follow(%s): %v", name, err)
		}
		return st
	}
	versions := func(name string) []int {
		t.Helper()
		vs, err := ts.Versions(ctx, name)
		if err != nil {
			t.Fatalf("Versions(%s): %v", name, err)
		}
		var out []int
		for _, u := range vs {
			out = append(out, u.Version)
		}
		return out
	}

	// Recorded before Follow returns: a create right after sees it.
	if st := runBuild(ts, "app", "alpine:1"); st.State != builds.StateSucceeded || st.Version != 1 {
		t.Fatalf("the first build: %+v", st)
	}
	u, err := ts.UserTemplate(ctx, "app")
	if err != nil || u.Version != 1 || u.Owner != "key_a" || u.Digest != "sha256:alpine:1" || u.SizeBytes != int64(len("alpine:1")) {
		t.Errorf("UserTemplate(app) after the build = %+v, %v", u, err)
	}
	// A failed first build leaves no template.
	if st := runBuild(ts, "bad", "missing:1"); st.State != builds.StateFailed {
		t.Errorf("a build of a missing image: %+v", st)
	}
	if _, err := ts.UserTemplate(ctx, "bad"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("UserTemplate of a template whose only build failed: %v, want templates.ErrNotFound", err)
	}
	if _, err := cat.GetTemplate(ctx, "bad"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("the catalog after a failed first build: %v, want no template", err)
	}
	// Versions on two hosts; a failed one uses up its number.
	ts2 := open("h2")
	if st := runBuild(ts2, "app", "alpine:2"); st.Version != 2 || st.HostID != "h2" {
		t.Errorf("a build on h2: %+v, want version 2 on h2", st)
	}
	if st := runBuild(ts, "app", "missing:3"); st.State != builds.StateFailed {
		t.Errorf("a build of a missing image: %+v", st)
	}
	if st := runBuild(ts, "app", "alpine:4"); st.Version != 4 {
		t.Errorf("the build after a failed one: %+v, want version 4", st)
	}
	if got := versions("app"); !slices.Equal(got, []int{1, 2, 4}) {
		t.Errorf("versions of app = %v, want 1 2 4", got)
	}
	// The same in one read, as GET /v1/templates lists them.
	if all, err := ts.AllVersions(ctx); err != nil || len(all["app"]) != 3 || all["app"][2].Version != 4 || all["app"][0].Owner != "key_a" {
		t.Errorf("AllVersions = %+v, %v; want app's 1, 2, 4", all, err)
	}
	if u, err := ts.UserTemplate(ctx, "app:2"); err != nil || u.Digest != "sha256:alpine:2" {
		t.Errorf("UserTemplate(app:2) = %+v, %v", u, err)
	}
	// Deletes: not the latest alone; a version, from the registry and
	// from the hosts that hold it.
	if err := ts.Remove(ctx, "app:4"); !errors.Is(err, templates.ErrConflict) {
		t.Errorf("Remove of the latest version: %v, want templates.ErrConflict", err)
	}
	if err := ts.Remove(ctx, "app:2"); err != nil {
		t.Fatalf("Remove(app:2): %v", err)
	}
	if got := versions("app"); !slices.Equal(got, []int{1, 4}) {
		t.Errorf("versions of app after the delete = %v, want 1 4", got)
	}
	if _, err := h2.m.UserTemplate(ctx, "app:2"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("h2's copy of the deleted app:2: %v, want it removed", err)
	}
	if err := ts.SetPublished(ctx, "app", true); err != nil {
		t.Fatal(err)
	}
	if us, err := ts.UserTemplates(ctx); err != nil || len(us) != 1 || !us[0].Published || us[0].Version != 4 {
		t.Errorf("UserTemplates = %+v, %v; want app version 4, published", us, err)
	}
	if u, err := ts.UserTemplate(ctx, "app:1"); err != nil || u.Published {
		t.Errorf("UserTemplate(app:1) = %+v, %v; want it not published: publishing app published its latest", u, err)
	}
	for _, ref := range []string{"nope", "app:2", "app:9"} {
		if err := ts.SetPublished(ctx, ref, true); !errors.Is(err, templates.ErrNotFound) {
			t.Errorf("SetPublished(%s): %v, want templates.ErrNotFound", ref, err)
		}
	}
	// A rebuild is not published: publishing granted version 4 alone.
	if st := runBuild(ts, "app", "alpine:5"); st.State != builds.StateSucceeded || st.Version != 5 {
		t.Fatalf("a rebuild of the published app: %+v", st)
	}
	published := func() (out []int) {
		vs, err := ts.Versions(ctx, "app")
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range vs {
			if u.Published {
				out = append(out, u.Version)
			}
		}
		return out
	}
	if got := published(); !slices.Equal(got, []int{4}) {
		t.Errorf("published versions after the rebuild: %v, want [4]", got)
	}
	if err := ts.SetPublished(ctx, "app:5", true); err != nil {
		t.Fatal(err)
	}
	if err := ts.SetPublished(ctx, "app:4", false); err != nil {
		t.Fatal(err)
	}
	if got := published(); !slices.Equal(got, []int{5}) {
		t.Errorf("published versions: %v, want [5]", got)
	}
	if err := ts.SetPublished(ctx, "app", false); err != nil {
		t.Fatal(err)
	}
	if got := published(); len(got) != 0 {
		t.Errorf("published versions after withdrawing app: %v, want none", got)
	}

	// Nobody follows: the watcher records it.
	st, err := ts.Start(ctx, builds.Spec{Name: "quiet", FromImage: "slow:1", Owner: "key_a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ts.Remove(ctx, "quiet"); !errors.Is(err, builds.ErrConflict) {
		t.Errorf("Remove of a template being built: %v, want tmplbuild.ErrConflict", err)
	}
	release(h1)
	testkit.WaitFor(t, 10*time.Second, "the watcher records quiet:1", func() bool { _, err := ts.UserTemplate(ctx, "quiet:1"); return err == nil })
	if got, err := ts.Get(ctx, st.ID); err != nil || got.State != builds.StateSucceeded || got.HostID != "h1" {
		t.Errorf("Get(%s) = %+v, %v; want succeeded on h1", st.ID, got, err)
	}
	if list, err := ts.List(ctx); err != nil || len(list) == 0 || list[0].ID != st.ID || list[0].HostID != "h1" {
		t.Errorf("List = %+v, %v; want %s on h1 first", list, err, st.ID)
	}

	// A build left by a control plane that stopped: the next one's
	// watcher records it.
	h1.release = make(chan struct{})
	before := open("h1")
	if _, err := before.Start(ctx, builds.Spec{Name: "left", FromImage: "slow:2", Owner: "key_a"}); err != nil {
		t.Fatal(err)
	}
	before.Close()
	release(h1)
	if _, err := ts.UserTemplate(ctx, "left"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("UserTemplate(left) with no watcher: %v, want not recorded yet", err)
	}
	after := open("h1")
	if err := after.Watch(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the next control plane records left:1", func() bool { _, err := after.UserTemplate(ctx, "left:1"); return err == nil })

	// A build whose host is away meanwhile (lost): recorded once it is
	// back; deletes wait for it.
	h2.release = make(chan struct{})
	pst, err := ts2.Start(ctx, builds.Spec{Name: "patient", FromImage: "slow:4", Owner: "key_a"})
	if err != nil {
		t.Fatal(err)
	}
	h2away.Store(true)
	release(h2)
	testkit.WaitFor(t, 10*time.Second, "patient's build done on h2", func() bool { st, err := h2.m.Get(ctx, pst.ID); return err == nil && st.Done() })
	if _, err := ts2.UserTemplate(ctx, "patient"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("UserTemplate(patient) while its host is away: %v, want not recorded yet", err)
	}
	if err := ts2.Remove(ctx, "patient"); !errors.Is(err, builds.ErrConflict) || !strings.Contains(err.Error(), "h2") {
		t.Errorf("Remove while the build's host is away: %v, want a conflict naming h2", err)
	}
	// Listed from the catalog while its host cannot say.
	list, err := ts2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(list, func(st builds.Status) bool { return st.ID == pst.ID }); i < 0 ||
		list[i].HostID != "h2" || list[i].State != builds.StateRunning || list[i].Name != "patient" || list[i].Owner != "key_a" {
		t.Errorf("builds listed while h2 is away: %+v, want patient's build running on h2", list)
	}
	h2away.Store(false)
	testkit.WaitFor(t, 40*time.Second, "patient recorded once h2 is back", func() bool { _, err := ts2.UserTemplate(ctx, "patient"); return err == nil })

	// A build whose host is forgotten: dropped.
	h2.release = make(chan struct{})
	before = open("h2")
	if _, err := before.Start(ctx, builds.Spec{Name: "orphan", FromImage: "slow:3", Owner: "key_a"}); err != nil {
		t.Fatal(err)
	}
	before.Close()
	h2gone.Store(true)
	after = open("h2")
	if err := after.Watch(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the build of the gone host dropped", func() bool { _, err := cat.GetTemplate(ctx, "orphan"); return errors.Is(err, catalog.ErrNotFound) })
	release(h2)
}

// fixed returns the ids of builders and a builderOf over them.
func fixed(builders map[string]builds.Builder) ([]string, func(string) (builds.Builder, bool)) {
	var ids []string
	for id := range builders {
		ids = append(ids, id)
	}
	return ids, func(id string) (builds.Builder, bool) { b, ok := builders[id]; return b, ok }
}

// release lets h's slow conversions finish.
func release(h *buildHost) { close(h.release) }

// lostAnswer is a host whose answer to Start is lost: it started the build
// (started) or not.
type lostAnswer struct {
	builds.Builder
	started bool
}

func (l lostAnswer) Start(ctx context.Context, spec builds.Spec) (builds.Status, error) {
	if l.started {
		if _, err := l.Builder.Start(ctx, spec); err != nil {
			return builds.Status{}, err
		}
	}
	return builds.Status{}, errors.New("read tcp 10.0.0.1:7789: connection reset by peer")
}

// TestTemplatesLostAnswer: a Start whose answer is lost fails, but the
// build is not forgotten: recorded if the host had started it, dropped
// if it had not. A host's refusal drops the reservation at once.
func TestTemplatesLostAnswer(t *testing.T) {
	r, cat, _, _ := newRegistry(t)
	ctx := t.Context()
	h1, h2 := newBuildHost(t), newBuildHost(t)
	ts := fleet.NewTemplates(r, "h1")
	ids, of := fixed(map[string]builds.Builder{"h1": lostAnswer{h1.m, true}})
	fleet.SetBuilders(ts, ids, of, func(string) bool { return false })
	defer ts.Close()
	if _, err := ts.Start(ctx, builds.Spec{Name: "app", FromImage: "alpine:1", Owner: "key_a"}); err == nil {
		t.Fatal("Start whose answer was lost succeeded")
	}
	testkit.WaitFor(t, 10*time.Second, "the started build recorded", func() bool { _, err := ts.UserTemplate(ctx, "app:1"); return err == nil })

	ts2 := fleet.NewTemplates(r, "h2")
	ids, of = fixed(map[string]builds.Builder{"h2": lostAnswer{h2.m, false}})
	fleet.SetBuilders(ts2, ids, of, func(string) bool { return false })
	defer ts2.Close()
	if _, err := ts2.Start(ctx, builds.Spec{Name: "never", FromImage: "alpine:1", Owner: "key_a"}); err == nil {
		t.Fatal("Start whose answer was lost succeeded")
	}
	testkit.WaitFor(t, 10*time.Second, "the build the host never started dropped", func() bool {
		_, err := cat.GetTemplate(ctx, "never")
		return errors.Is(err, catalog.ErrNotFound)
	})

	// Refused by the host (a name its images take, say): nothing kept.
	ts3 := fleet.NewTemplates(r, "h2")
	ids, of = fixed(map[string]builds.Builder{"h2": h2.m})
	fleet.SetBuilders(ts3, ids, of, func(string) bool { return false })
	defer ts3.Close()
	if _, err := ts3.Start(ctx, builds.Spec{Name: "app", FromImage: "x", Startup: templates.Startup{ReadyCmd: "true", ReadyTimeoutSeconds: -1}}); !errors.Is(err, templates.ErrInvalid) {
		t.Fatalf("a build the host refuses: %v, want templates.ErrInvalid", err)
	}
	if tp, err := cat.GetTemplate(ctx, "app"); err != nil || len(tp.Builds) != 0 || tp.LastVersion != 2 {
		t.Errorf("app after a refused build: %+v, %v; want no build left (its number 2 used up)", tp, err)
	}
}

// TestTemplatesImport: the templates the --template-host built while it
// kept the registry itself are imported when it connects, with their
// versions, owner and public flag; another host's are not, nor a name the
// catalog knows (even a deleted template's).
func TestTemplatesImport(t *testing.T) {
	r, cat, _, _ := newRegistry(t)
	ctx := t.Context()
	h1, h2 := newBuildHost(t), newBuildHost(t)
	for _, h := range []*buildHost{h1, h2} {
		for _, image := range []string{"alpine:1", "alpine:2"} {
			st, err := h.m.Start(ctx, builds.Spec{Name: "old", FromImage: image, Owner: "key_a"})
			if err == nil {
				st, err = h.m.Follow(ctx, st.ID, func(string) {})
			}
			if err != nil || st.State != builds.StateSucceeded {
				t.Fatalf("a build the old way: %+v, %v", st, err)
			}
		}
	}
	if err := h1.m.SetPublished(ctx, "old", true); err != nil {
		t.Fatal(err)
	}
	st, err := h2.m.Start(ctx, builds.Spec{Name: "other", FromImage: "alpine:3", Owner: "key_a"})
	if err == nil {
		_, err = h2.m.Follow(ctx, st.ID, func(string) {})
	}
	if err != nil {
		t.Fatal(err)
	}
	ts := fleet.NewTemplates(r, "h1")
	ids, of := fixed(map[string]builds.Builder{"h1": h1.m, "h2": h2.m})
	fleet.SetBuilders(ts, ids, of, func(string) bool { return false })
	defer ts.Close()
	ts.HostConnected(ctx, "h2")
	if _, err := cat.GetTemplate(ctx, "other"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("a template of a host that is not the --template-host: %v, want not imported", err)
	}
	ts.HostConnected(ctx, "h1")
	vs, err := ts.Versions(ctx, "old")
	if err != nil || len(vs) != 2 || vs[0].Version != 1 || vs[1].Version != 2 || vs[0].Published || !vs[1].Published || vs[1].Owner != "key_a" || vs[1].Digest != "sha256:alpine:2" {
		t.Fatalf("old after the import: %+v, %v; want versions 1 and 2 of key_a, 2 published", vs, err)
	}
	// The next build goes on from the imported numbers.
	st, err = ts.Start(ctx, builds.Spec{Name: "old", FromImage: "alpine:3", Owner: "key_a"})
	if err == nil {
		st, err = ts.Follow(ctx, st.ID, func(string) {})
	}
	if err != nil || st.Version != 3 {
		t.Errorf("a build after the import: %+v, %v; want version 3", st, err)
	}
	// Deleted, then connected again: not imported again.
	if err := ts.Remove(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	ts.HostConnected(ctx, "h1")
	if _, err := ts.UserTemplate(ctx, "old"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("old after its delete and a reconnect: %v, want not found", err)
	}
}
