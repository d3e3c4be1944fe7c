package build

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// TestBuildsSurviveRestart: a new Manager over the same Dir answers for
// the builds of the previous one, fails the one it interrupted, and
// forgets (files too) those past Retention.
func TestBuildsSurviveRestart(t *testing.T) {
	store := newStore(t)
	dir := filepath.Join(t.TempDir(), "builds")
	fc := &fakeConvert{gate: make(chan struct{})}
	m, err := New(Config{Store: store, Convert: fc.convert, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	done, err := m.Start(ctx, builds.Spec{Name: "app", FromImage: "good", Owner: "key-a"})
	if err != nil {
		t.Fatal(err)
	}
	close(fc.gate)
	_, wantLines := follow(t, m, done.ID)
	fc.gate = make(chan struct{}) // the next one hangs until Close
	hung, err := m.Start(ctx, builds.Spec{Name: "app2", FromImage: "good", Owner: "key-b"})
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "the second build running", func() bool {
		st, _ := m.Get(ctx, hung.ID)
		return st.State == builds.StateRunning
	})
	// A crash, as far as the files go: the record says running.
	b, _ := os.ReadFile(filepath.Join(dir, hung.ID+".json"))
	m.Close()
	os.WriteFile(filepath.Join(dir, hung.ID+".json"), b, 0o600)

	m2, err := New(Config{Store: store, Convert: fc.convert, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	st, lines := follow(t, m2, done.ID)
	if st.State != builds.StateSucceeded || st.Version != 1 || st.Owner != "key-a" || len(lines) != len(wantLines) {
		t.Errorf("after restart: %+v, %q; want succeeded, version 1, owner key-a, lines %q", st, lines, wantLines)
	}
	st, err = m2.Get(ctx, hung.ID)
	if err != nil || st.State != builds.StateFailed || st.Code != builds.CodeInterrupted || st.Owner != "key-b" || st.EndedAt == nil {
		t.Errorf("interrupted build after restart: %+v, %v", st, err)
	}

	// Retention prunes the files.
	m3, err := New(Config{Store: store, Convert: fc.convert, Dir: dir, Retention: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m3.Close()
	if _, err := m3.Get(ctx, done.ID); !errors.Is(err, builds.ErrNotFound) {
		t.Errorf("Get after retention: %v, want builds.ErrNotFound", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files after retention: %v", ents)
	}
}

func TestBuildVersionsAndOwners(t *testing.T) {
	store := newStore(t)
	fc := &fakeConvert{}
	m, err := New(Config{Store: store, Convert: fc.convert})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	build := func(spec builds.Spec) (builds.Status, error) {
		st, err := m.Start(ctx, spec)
		if err != nil {
			return st, err
		}
		st, _ = follow(t, m, st.ID)
		return st, nil
	}
	for i, src := range []string{"one", "two"} {
		st, err := build(builds.Spec{Name: "app", FromImage: src, Owner: "key-a", MaxTemplates: 1})
		if err != nil || st.State != builds.StateSucceeded || st.Version != i+1 {
			t.Fatalf("build %d: %+v, %v", i+1, st, err)
		}
	}
	if _, err := build(builds.Spec{Name: "app2", FromImage: "x", Owner: "key-a", MaxTemplates: 1}); !errors.Is(err, builds.ErrLimit) {
		t.Errorf("a second template past the limit: %v, want builds.ErrLimit", err)
	}
	// An admin's rebuild keeps the owner.
	if st, err := build(builds.Spec{Name: "app", FromImage: "three", Owner: "key-admin"}); err != nil || st.Version != 3 {
		t.Fatalf("rebuild by another key: %+v, %v", st, err)
	}
	vs, err := m.Versions(ctx, "app")
	if err != nil || len(vs) != 3 || vs[2].Owner != "key-a" || vs[0].Source != "one" {
		t.Errorf("versions: %+v, %v", vs, err)
	}
	if err := m.Remove(ctx, "app:3"); !errors.Is(err, templates.ErrConflict) {
		t.Errorf("Remove(app:3), the latest: %v, want templates.ErrConflict", err)
	}
	if err := m.Remove(ctx, "app:2"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.UserTemplate(ctx, "app:2"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("app:2 after its removal: %v", err)
	}

	// A new name another owner is building is taken.
	fc.gate = make(chan struct{})
	defer close(fc.gate)
	if _, err := m.Start(ctx, builds.Spec{Name: "new", FromImage: "x", Owner: "key-a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Start(ctx, builds.Spec{Name: "new", FromImage: "x", Owner: "key-b"}); !errors.Is(err, builds.ErrConflict) {
		t.Errorf("building a name another key is building: %v, want builds.ErrConflict", err)
	}
	if _, err := m.Start(ctx, builds.Spec{Name: "new", FromImage: "x", Owner: "key-a"}); err != nil {
		t.Errorf("building it again as its builder: %v", err)
	}
}
