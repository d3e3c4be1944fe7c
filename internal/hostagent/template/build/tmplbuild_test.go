package build

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// ctx is the context of the tests' calls.
var ctx = context.Background()

func newStore(t *testing.T) *template.Store {
	t.Helper()
	dir := t.TempDir()
	st, err := template.NewStore(template.Config{Dir: filepath.Join(dir, "templates"), Images: template.Images{Dir: dir}, UserDir: filepath.Join(dir, "rootfs"), Accel: accel.TCG})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// fakeConvert writes src into out; "missing" is an image the registry
// lacks, "bad" fails; it blocks while gate is not closed.
type fakeConvert struct {
	gate    chan struct{}
	running atomic.Int32
	peak    atomic.Int32
	mu      sync.Mutex
	order   []string
}

func (f *fakeConvert) convert(ctx context.Context, src, out string, progress func(string)) (builds.Result, error) {
	n := f.running.Add(1)
	defer f.running.Add(-1)
	for {
		p := f.peak.Load()
		if n <= p || f.peak.CompareAndSwap(p, n) {
			break
		}
	}
	f.mu.Lock()
	f.order = append(f.order, src)
	f.mu.Unlock()
	progress("pulling " + src)
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return builds.Result{}, ctx.Err()
		}
	}
	switch src {
	case "missing":
		return builds.Result{}, fmt.Errorf("pull %s: %w: MANIFEST_UNKNOWN", src, builds.ErrImageNotFound)
	case "bad":
		return builds.Result{}, errors.New("layer 2: invalid tar header")
	}
	progress("writing " + out)
	return builds.Result{Image: templates.ImageConfig{Env: []string{"SRC=" + src}, WorkingDir: "/srv"}, Digest: "sha256:" + src}, os.WriteFile(out, []byte(src), 0o644)
}

func follow(t *testing.T, m *Manager, id string) (builds.Status, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var lines []string
	st, err := m.Follow(ctx, id, func(l string) { lines = append(lines, l) })
	if err != nil {
		t.Fatalf("Follow %s: %v", id, err)
	}
	return st, lines
}

func TestBuildOutcomes(t *testing.T) {
	store := newStore(t)
	fc := &fakeConvert{}
	m, err := New(Config{Store: store, Convert: fc.convert})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, tc := range []struct {
		name, src string
		state     string
		code      string
	}{
		{"app", "good", builds.StateSucceeded, ""},
		{"app2", "missing", builds.StateFailed, builds.CodeImageNotFound},
		{"app3", "bad", builds.StateFailed, builds.CodeFailed},
	} {
		st, err := m.Start(ctx, builds.Spec{Name: tc.name, FromImage: tc.src, Startup: templates.Startup{}})
		if err != nil {
			t.Fatal(err)
		}
		got, lines := follow(t, m, st.ID)
		if got.State != tc.state || got.Code != tc.code {
			t.Errorf("build %s from %s: %s %s (%s), want %s %s", tc.name, tc.src, got.State, got.Code, got.Error, tc.state, tc.code)
		}
		if len(lines) < 2 || !strings.Contains(lines[1], "pulling "+tc.src) {
			t.Errorf("build %s lines: %q", tc.name, lines)
		}
	}
	u, err := store.UserRootFS("app")
	if err != nil || u.Digest != "sha256:good" || u.Image.WorkingDir != "/srv" || u.Source != "good" {
		t.Errorf("installed: %+v, %v", u, err)
	}
	for _, name := range []string{"app2", "app3"} {
		if _, err := store.UserRootFS(name); !errors.Is(err, templates.ErrNotFound) {
			t.Errorf("failed build %s installed something: %v", name, err)
		}
	}
	for _, tc := range []struct{ name, src string }{{"base", "x"}, {"tiny", "x"}, {"Bad", "x"}, {"ok", ""}} {
		if _, err := m.Start(ctx, builds.Spec{Name: tc.name, FromImage: tc.src, Startup: templates.Startup{}}); !errors.Is(err, templates.ErrInvalid) {
			t.Errorf("Start(%q, %q) = %v, want ErrInvalid", tc.name, tc.src, err)
		}
	}
	if _, err := m.Get(ctx, "nope"); !errors.Is(err, builds.ErrNotFound) {
		t.Errorf("Get(nope) = %v", err)
	}
}

func TestBuildsSerializedPerNameAndBounded(t *testing.T) {
	store := newStore(t)
	fc := &fakeConvert{gate: make(chan struct{})}
	m, err := New(Config{Store: store, Convert: fc.convert, MaxConcurrent: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var ids []string
	for _, b := range [][2]string{{"a", "a1"}, {"a", "a2"}, {"b", "b1"}, {"c", "c1"}} {
		st, err := m.Start(ctx, builds.Spec{Name: b[0], FromImage: b[1], Startup: templates.Startup{}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, st.ID)
	}
	// Two builds run (a1 and one of b1, c1); a2 waits for a1 and the
	// other for a slot. The peak, checked below, says no third one ran.
	testkit.WaitFor(t, 30*time.Second, "two builds running", func() bool { return fc.running.Load() == 2 })
	var queued []string
	for _, id := range ids {
		if st, _ := m.Get(ctx, id); st.State == builds.StateQueued {
			queued = append(queued, st.Source)
		}
	}
	if len(queued) != 2 || !slices.Contains(queued, "a2") {
		t.Errorf("queued builds: %q, want a2 and one of b1, c1", queued)
	}
	if !m.Building("a") {
		t.Errorf("Building(a) = false")
	}
	if err := m.Remove(ctx, "a"); !errors.Is(err, builds.ErrConflict) {
		t.Errorf("Remove during a build = %v, want builds.ErrConflict", err)
	}
	close(fc.gate)
	for _, id := range ids {
		if st, _ := follow(t, m, id); st.State != builds.StateSucceeded {
			t.Errorf("build %s: %+v", id, st)
		}
	}
	if p := fc.peak.Load(); p != 2 {
		t.Errorf("peak concurrent builds = %d, want 2", p)
	}
	fc.mu.Lock()
	order := strings.Join(fc.order, ",")
	fc.mu.Unlock()
	if strings.Index(order, "a1") > strings.Index(order, "a2") {
		t.Errorf("builds of a ran out of order: %s", order)
	}
	if u, _ := store.UserRootFS("a"); u.Source != "a2" {
		t.Errorf("a is built from %q, want the last build's a2", u.Source)
	}
	if err := m.Remove(ctx, "a"); err != nil {
		t.Errorf("Remove(a) = %v", err)
	}
	if err := m.Remove(ctx, "a"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("Remove(a) again = %v, want templates.ErrNotFound", err)
	}
}

func TestCloseCancelsBuilds(t *testing.T) {
	store := newStore(t)
	fc := &fakeConvert{gate: make(chan struct{})}
	m, err := New(Config{Store: store, Convert: fc.convert, MaxConcurrent: 1})
	if err != nil {
		t.Fatal(err)
	}
	st1, _ := m.Start(ctx, builds.Spec{Name: "a", FromImage: "a1", Startup: templates.Startup{}})
	st2, _ := m.Start(ctx, builds.Spec{Name: "b", FromImage: "b1", Startup: templates.Startup{}}) // waits for a slot
	// Close while a runs (in its conversion) and b waits for the slot.
	testkit.WaitFor(t, 30*time.Second, "build a converting", func() bool { return fc.running.Load() == 1 })
	m.Close()
	for _, id := range []string{st1.ID, st2.ID} {
		st, _ := m.Get(ctx, id)
		if st.State != builds.StateFailed || st.Code != builds.CodeCanceled {
			t.Errorf("build after Close: %+v", st)
		}
	}
	if _, err := m.Start(ctx, builds.Spec{Name: "c", FromImage: "c1", Startup: templates.Startup{}}); !errors.Is(err, builds.ErrClosed) {
		t.Errorf("Start after Close = %v", err)
	}
	m.Close()
}

// A build whose template starts commands bakes it: a failed bake fails the
// build, with the ready command's own words, and removes the template; a
// build without commands does not bake.
func TestBuildBakesStartup(t *testing.T) {
	store := newStore(t)
	fc := &fakeConvert{}
	var baked []string
	bake := func(ctx context.Context, name string, progress func(string)) error {
		baked = append(baked, name)
		u, err := store.UserRootFS(name)
		if err != nil {
			return err
		}
		switch u.ReadyCmd {
		case "never":
			return fmt.Errorf("bake %s-256m-1c: %w", name, &templates.ReadyError{Msg: "the ready command did not succeed: not-ready"})
		case "crash":
			return errors.New("guest agent did not answer: dial unix /host/path")
		}
		progress("ready")
		return nil
	}
	m, err := New(Config{Store: store, Convert: fc.convert, Bake: bake})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, tc := range []struct {
		name  string
		su    templates.Startup
		state string
		err   string
	}{
		{"plain", templates.Startup{}, builds.StateSucceeded, ""},
		{"web", templates.Startup{StartCmd: "serve", ReadyCmd: "check"}, builds.StateSucceeded, ""},
		{"never", templates.Startup{StartCmd: "serve", ReadyCmd: "never"}, builds.StateFailed, "the build was undone: the ready command did not succeed: not-ready"},
		{"crash", templates.Startup{StartCmd: "serve", ReadyCmd: "crash"}, builds.StateFailed, "the build was undone: its first boot failed (see the server's log)"},
	} {
		st, err := m.Start(ctx, builds.Spec{Name: tc.name, FromImage: "good", Startup: tc.su})
		if err != nil {
			t.Fatal(err)
		}
		st, _ = follow(t, m, st.ID)
		if st.State != tc.state || st.Error != tc.err {
			t.Errorf("build %s: %s %q, want %s %q", tc.name, st.State, st.Error, tc.state, tc.err)
		}
		u, err := store.UserRootFS(tc.name)
		if kept := err == nil; kept != (tc.state == builds.StateSucceeded) {
			t.Errorf("build %s (%s): template kept %v (%v)", tc.name, st.State, kept, err)
		}
		if err == nil && u.Startup != tc.su {
			t.Errorf("build %s: stored startup %+v, want %+v", tc.name, u.Startup, tc.su)
		}
	}
	if got, want := strings.Join(baked, ","), "web:1,never:1,crash:1"; got != want { // the version just installed
		t.Errorf("baked %s, want %s", got, want)
	}
	// A rebuild whose bake fails leaves the version it was to replace.
	st, err := m.Start(ctx, builds.Spec{Name: "web", FromImage: "other", Startup: templates.Startup{StartCmd: "serve2", ReadyCmd: "never"}})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ = follow(t, m, st.ID); st.State != builds.StateFailed {
		t.Errorf("failed rebuild: %s", st.State)
	}
	if u, err := store.UserRootFS("web"); err != nil || u.Source != "good" || u.StartCmd != "serve" {
		t.Errorf("web after a failed rebuild: %+v, %v; want its first version", u, err)
	}
	if _, err := m.Start(ctx, builds.Spec{Name: "bad", FromImage: "good", Startup: templates.Startup{ReadyCmd: "x", ReadyTimeoutSeconds: -1}}); !errors.Is(err, templates.ErrInvalid) {
		t.Errorf("Start with a negative ready timeout: %v, want ErrInvalid", err)
	}
}

// TestPublish: a build publishes the version it installed (its number,
// description and directory) before it succeeds; a failed publish fails
// the build and undoes the version; Remove unpublishes what it removed.
func TestPublish(t *testing.T) {
	store := newStore(t)
	var mu sync.Mutex
	var published []string
	var unpublished []string
	fail := atomic.Bool{}
	m, err := New(Config{Store: store, Convert: (&fakeConvert{}).convert,
		Publish: func(ctx context.Context, u templates.UserRootFS, dir string) error {
			b, err := os.ReadFile(filepath.Join(dir, "rootfs.ext4"))
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			published = append(published, fmt.Sprintf("%s:%d=%s/%s", u.Name, u.Version, b, u.Owner))
			if fail.Load() {
				return errors.New("the store is down")
			}
			return nil
		},
		Unpublish: func(ctx context.Context, name string, versions []int) error {
			mu.Lock()
			defer mu.Unlock()
			unpublished = append(unpublished, fmt.Sprintf("%s%v", name, versions))
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	build := func(src string) builds.Status {
		t.Helper()
		st, err := m.Start(ctx, builds.Spec{Name: "app", FromImage: src, Owner: "k1"})
		if err != nil {
			t.Fatal(err)
		}
		st, _ = follow(t, m, st.ID)
		return st
	}
	if st := build("one"); st.State != builds.StateSucceeded || st.Version != 1 {
		t.Fatalf("first build: %+v", st)
	}
	fail.Store(true)
	if st := build("two"); st.State != builds.StateFailed || !strings.Contains(st.Error, "object store") {
		t.Errorf("build whose upload fails: %s %q, want failed naming the store", st.State, st.Error)
	}
	if u, err := store.UserRootFS("app"); err != nil || u.Version != 1 || u.Source != "one" {
		t.Errorf("app after the failed upload: %+v, %v; want version 1", u, err)
	}
	fail.Store(false)
	if st := build("three"); st.State != builds.StateSucceeded || st.Version != 2 {
		t.Errorf("build after the failed one: %+v; want version 2 (the undone one's number is free again)", st)
	}
	if err := m.Remove(ctx, "app:1"); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got, want := strings.Join(published, " "), "app:1=one/k1 app:2=two/k1 app:2=three/k1"; got != want {
		t.Errorf("published %s, want %s", got, want)
	}
	if got, want := strings.Join(unpublished, " "), "app[1] app[2]"; got != want {
		t.Errorf("unpublished %s, want %s", got, want)
	}
}
