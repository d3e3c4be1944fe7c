package fleet_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/fleet"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// storeSets stands for a host's view of the object store's user template
// sets: the sweep's decisions are what is tested here (the listing and the
// delete themselves are the agent's, tested in its package and through the
// host API).
type storeSets struct {
	mu      sync.Mutex
	sets    []string
	lists   int
	dropped []string
	listErr error
}

func (s *storeSets) StoredUserTemplates(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lists++
	return slices.Clone(s.sets), s.listErr
}

func (s *storeSets) DropStoredUserTemplate(_ context.Context, name string, v int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ref := templates.Ref(name, v)
	s.dropped = append(s.dropped, ref)
	s.sets = slices.DeleteFunc(s.sets, func(x string) bool { return x == ref })
	return nil
}

func (s *storeSets) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists
}

// TestSweepStore: the sweep drops the sets of versions the registry gave
// out and no longer has (a deleted version, a deleted template's), and
// keeps the registry's versions, a build's that still runs, numbers above
// a name's last and names the registry never recorded. A host's
// connection starts it at most once per SweepEvery; a failed one is tried
// again at the next connection.
func TestSweepStore(t *testing.T) {
	r, _, _, _ := newRegistry(t)
	ctx := t.Context()
	h1 := newBuildHost(t)
	ids, builderOf := fixed(map[string]builds.Builder{"h1": h1.m})
	ts := fleet.NewTemplates(r, "h1")
	fleet.SetBuilders(ts, ids, builderOf, func(string) bool { return false })
	t.Cleanup(ts.Close)
	runBuild := func(name, image string) builds.Status {
		t.Helper()
		st, err := ts.Start(ctx, builds.Spec{Name: name, FromImage: image, Owner: "key_a"})
		if err == nil && image[:4] != "slow" {
			st, err = ts.Follow(ctx, st.ID, func(string) {})
		}
		if err != nil {
			t.Fatalf("build %s from %s: %v", name, image, err)
		}
		return st
	}
	runBuild("app", "alpine:1")
	runBuild("app", "alpine:2")
	if err := ts.Remove(ctx, "app:1"); err != nil {
		t.Fatal(err)
	}
	runBuild("gone", "alpine:1")
	if err := ts.Remove(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	h1.release = make(chan struct{})
	running := runBuild("app", "slow:3") // version 3, building
	defer release(h1)

	store := &storeSets{sets: []string{"app:1", "app:2", "app:3", "app:9", "gone:1", "other:1"}}
	removed, err := ts.SweepStore(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"app:1", "gone:1"}; !slices.Equal(removed, want) || !slices.Equal(store.dropped, want) {
		t.Errorf("swept %v (dropped %v), want %v", removed, store.dropped, want)
	}
	if want := []string{"app:2", "app:3", "app:9", "other:1"}; !slices.Equal(store.sets, want) {
		t.Errorf("left %v in the store, want %v (app's version, the build %s's, a number never given out, a name never recorded)", store.sets, want, running.ID)
	}

	// Through host connections: one sweep, not another within SweepEvery.
	fleet.SetSweeper(ts, store)
	store.listErr = errors.New("store down")
	ts.HostConnected(ctx, "h1")
	testkit.WaitFor(t, 10*time.Second, "a sweep at the first connection", func() bool { return store.count() == 2 })
	store.mu.Lock()
	store.listErr = nil
	store.mu.Unlock()
	ts.HostConnected(ctx, "h1") // the failed one is tried again
	testkit.WaitFor(t, 10*time.Second, "a sweep after the failed one", func() bool { return store.count() == 3 })
	ts.Close() // waits for the sweep
	ts.HostConnected(ctx, "h1")
	ts.Close()
	if n := store.count(); n != 3 {
		t.Errorf("%d listings after a connection within SweepEvery of a sweep, want none more (3 in all)", n)
	}
}
