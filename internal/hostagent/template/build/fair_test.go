package build

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// granted reports whether w holds a slot.
func granted(w *waiter) bool {
	select {
	case <-w.granted:
		return true
	default:
		return false
	}
}

// The slot queue: an owner holding a slot waits behind owners holding
// none, owners take turns, a slot nobody else wants is used, and a waiter
// that gives up leaves no trace.
func TestSlotsFair(t *testing.T) {
	s := newSlots(2)
	a1, a2 := s.enqueue("a"), s.enqueue("a")
	if !granted(a1) || !granted(a2) {
		t.Fatal("a's two builds wait with both slots free")
	}
	a3 := s.enqueue("a")
	b1 := s.enqueue("b")
	c1 := s.enqueue("c")
	b2 := s.enqueue("b")
	if granted(a3) || granted(b1) || granted(c1) || granted(b2) {
		t.Fatal("a build got a slot while both were held")
	}
	// a holds two: its third waits behind b and c, which hold none.
	s.release(a1)
	if !granted(b1) || granted(a3) || granted(c1) {
		t.Fatalf("after a released one: b1 %v c1 %v a3 %v, want b1 alone", granted(b1), granted(c1), granted(a3))
	}
	s.release(a2)
	if !granted(c1) || granted(a3) || granted(b2) {
		t.Fatalf("after a released the other: c1 %v a3 %v b2 %v, want c1 alone", granted(c1), granted(a3), granted(b2))
	}
	// b and c hold one each, a none: a goes first, then b (served before c).
	s.release(c1)
	if !granted(a3) || granted(b2) {
		t.Fatalf("after c released: a3 %v b2 %v, want a3 (a holds none)", granted(a3), granted(b2))
	}
	s.release(a3)
	if !granted(b2) {
		t.Fatal("b2 waits with a slot free")
	}
	// Giving up: a waiter whose context ends leaves the queue.
	x := s.enqueue("x")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.wait(ctx, x); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with an ended context = %v", err)
	}
	s.release(b1)
	s.release(b2)
	s.release(b2) // idempotent
	if holding, waiting := s.counts(); len(holding) != 0 || waiting != 0 || s.free != 2 || len(s.served) != 0 {
		t.Errorf("after every release: holding %v, %d waiting, %d free, served %v; want nothing held, 2 free", holding, waiting, s.free, s.served)
	}
}

// gatedConvert is a Convert whose build of src runs until release(src);
// started receives each src as it starts.
type gatedConvert struct {
	started chan string
	gates   map[string]chan struct{}
}

func newGatedConvert(srcs ...string) *gatedConvert {
	g := &gatedConvert{started: make(chan string, 16), gates: map[string]chan struct{}{}}
	for _, s := range srcs {
		g.gates[s] = make(chan struct{})
	}
	return g
}

func (g *gatedConvert) convert(ctx context.Context, src, out string, progress func(string)) (builds.Result, error) {
	g.started <- src
	select {
	case <-g.gates[src]:
	case <-ctx.Done():
		return builds.Result{}, ctx.Err()
	}
	return builds.Result{Digest: "sha256:" + src}, os.WriteFile(out, []byte(src), 0o644)
}

func (g *gatedConvert) release(src string) { close(g.gates[src]) }

// next returns the next build to start, failing t after a while.
func (g *gatedConvert) next(t *testing.T) string {
	t.Helper()
	select {
	case src := <-g.started:
		return src
	case <-time.After(10 * time.Second):
		t.Fatal("no build started")
		return ""
	}
}

// One key holding both slots does not keep another key's build waiting
// behind its own queue (issue 31, finding 11).
func TestBuildSlotsSharedBetweenKeys(t *testing.T) {
	g := newGatedConvert("a1", "a2", "a3", "a4", "b1")
	m, err := New(Config{Store: newStore(t), Convert: g.convert, MaxConcurrent: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	start := func(owner, name, src string) string {
		t.Helper()
		st, err := m.Start(ctx, builds.Spec{Name: name, FromImage: src, Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		return st.ID
	}
	var ids []string
	ids = append(ids, start("alice", "a1", "a1"), start("alice", "a2", "a2"))
	got := []string{g.next(t), g.next(t)}
	ids = append(ids, start("alice", "a3", "a3"), start("alice", "a4", "a4"), start("bob", "b1", "b1"))
	waitWaiting(t, m, 3)
	g.release("a1")
	if n := g.next(t); n != "b1" {
		t.Errorf("after one of alice's builds ended, %s started; want bob's b1 (alice still held a slot)", n)
	}
	g.release("a2")
	got = append(got, g.next(t))
	g.release("b1")
	got = append(got, g.next(t))
	g.release("a3")
	g.release("a4")
	for _, id := range ids {
		if st, _ := follow(t, m, id); st.State != builds.StateSucceeded {
			t.Errorf("build %s: %+v", id, st)
		}
	}
	if s := strings.Join(got[:2], ","); s != "a1,a2" && s != "a2,a1" {
		t.Errorf("alice's builds started in the order %s, want a1 and a2 first", strings.Join(got, ","))
	}
}

// waitWaiting waits until n builds of m wait for a slot.
func waitWaiting(t *testing.T, m *Manager, n int) {
	t.Helper()
	waiting := 0
	testkit.WaitForf(t, 10*time.Second, func() string { return fmt.Sprintf("%d builds wait for a slot, want %d", waiting, n) }, func() bool {
		_, waiting = m.slots.counts()
		return waiting == n
	})
}

// Per key and per template bounds: MaxBuilds builds queued or running,
// MaxVersions versions of a template (its builds in progress counted).
func TestBuildLimitsPerOwner(t *testing.T) {
	g := newGatedConvert("x1", "x2", "y1", "v2", "v3", "v4")
	store := newStore(t)
	m, err := New(Config{Store: store, Convert: g.convert, MaxConcurrent: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	lim := func(name, src, owner string) (builds.Status, error) {
		return m.Start(ctx, builds.Spec{Name: name, FromImage: src, Owner: owner, MaxBuilds: 2, MaxVersions: 3})
	}
	x1, err := lim("x", "x1", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim("x", "x2", "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := lim("y", "y1", "alice"); !errors.Is(err, builds.ErrBusy) {
		t.Errorf("alice's third build at once = %v, want builds.ErrBusy", err)
	}
	if _, err := lim("z", "y1", "bob"); err != nil {
		t.Errorf("bob's build while alice has two: %v", err)
	}
	if _, err := m.Cancel(ctx, x1.ID, "test"); err != nil {
		t.Fatal(err)
	}
	g.release("x2")
	g.release("y1")
	waitIdle(t, m)
	// x has one version; MaxVersions 3 leaves room for two more.
	if _, err := lim("x", "v2", "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := lim("x", "v3", "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Start(ctx, builds.Spec{Name: "x", FromImage: "v4", Owner: "alice", MaxVersions: 3}); !errors.Is(err, builds.ErrLimit) {
		t.Errorf("a fourth version of x (two of them in progress) = %v, want builds.ErrLimit", err)
	}
	g.release("v2")
	g.release("v3")
	waitIdle(t, m)
	if vs, _ := store.UserVersions("x"); len(vs) != 3 {
		t.Errorf("x has %d versions, want 3", len(vs))
	}
	if _, err := m.Start(ctx, builds.Spec{Name: "x", FromImage: "v4", Owner: "alice", MaxVersions: 3}); !errors.Is(err, builds.ErrLimit) {
		t.Errorf("a fourth version of x = %v, want builds.ErrLimit", err)
	}
	if err := m.Remove(ctx, "x:1"); err != nil {
		t.Fatal(err)
	}
	g.release("v4")
	if _, err := m.Start(ctx, builds.Spec{Name: "x", FromImage: "v4", Owner: "alice", MaxVersions: 3}); err != nil {
		t.Errorf("a new version after deleting an old one: %v", err)
	}
	waitIdle(t, m)
}

// waitIdle waits until m has no build queued or running.
func waitIdle(t *testing.T, m *Manager) {
	t.Helper()
	n := 0
	testkit.WaitForf(t, 10*time.Second, func() string { return fmt.Sprintf("%d templates still building", n) }, func() bool {
		m.mu.Lock()
		n = len(m.names)
		m.mu.Unlock()
		return n == 0
	})
}

// Cancel ends a running and a queued build with the reason given; an
// ended build is left as it was.
func TestCancelBuilds(t *testing.T) {
	g := newGatedConvert("r", "q", "done")
	m, err := New(Config{Store: newStore(t), Convert: g.convert, MaxConcurrent: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	g.release("done")
	done, _ := m.Start(ctx, builds.Spec{Name: "done", FromImage: "done", Owner: "k"})
	if st, _ := follow(t, m, done.ID); st.State != builds.StateSucceeded {
		t.Fatalf("build: %+v", st)
	}
	g.next(t)
	running, _ := m.Start(ctx, builds.Spec{Name: "r", FromImage: "r", Owner: "k"})
	g.next(t)
	queued, _ := m.Start(ctx, builds.Spec{Name: "q", FromImage: "q", Owner: "k"})
	const why = "the build was canceled: its API key was revoked"
	for _, id := range []string{running.ID, queued.ID, done.ID} {
		if _, err := m.Cancel(ctx, id, why); err != nil {
			t.Errorf("Cancel %s: %v", id, err)
		}
	}
	for _, id := range []string{running.ID, queued.ID} {
		if st, _ := follow(t, m, id); st.State != builds.StateFailed || st.Code != builds.CodeCanceled || st.Error != why {
			t.Errorf("canceled build: %s %s %q, want failed canceled %q", st.State, st.Code, st.Error, why)
		}
	}
	if st, _ := m.Get(ctx, done.ID); st.State != builds.StateSucceeded {
		t.Errorf("Cancel of an ended build changed it: %+v", st)
	}
	if _, err := m.Cancel(ctx, "nope", why); !errors.Is(err, builds.ErrNotFound) {
		t.Errorf("Cancel(nope) = %v", err)
	}
}

// A disk without room refuses new builds, and fails a queued build when
// its turn comes, with CodeNoSpace.
func TestBuildsNeedSpace(t *testing.T) {
	g := newGatedConvert("a", "b")
	full := make(chan bool, 1)
	full <- false
	check := func() error {
		f := <-full
		full <- f
		if f {
			return fmt.Errorf("%w: the server has 10 MiB free for template builds and keeps 1024 MiB", builds.ErrNoSpace)
		}
		return nil
	}
	setFull := func(f bool) { <-full; full <- f }
	m, err := New(Config{Store: newStore(t), Convert: g.convert, MaxConcurrent: 1, CheckSpace: check})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	a, err := m.Start(ctx, builds.Spec{Name: "a", FromImage: "a"})
	if err != nil {
		t.Fatal(err)
	}
	g.next(t)
	b, err := m.Start(ctx, builds.Spec{Name: "b", FromImage: "b"})
	if err != nil {
		t.Fatal(err)
	}
	setFull(true)
	if _, err := m.Start(ctx, builds.Spec{Name: "c", FromImage: "c"}); !errors.Is(err, builds.ErrNoSpace) {
		t.Errorf("Start on a full disk = %v, want builds.ErrNoSpace", err)
	}
	g.release("a")
	if st, _ := follow(t, m, a.ID); st.State != builds.StateSucceeded {
		t.Errorf("the build running when the disk filled: %+v", st)
	}
	if st, _ := follow(t, m, b.ID); st.State != builds.StateFailed || st.Code != builds.CodeNoSpace || !strings.Contains(st.Error, "MiB free") {
		t.Errorf("the build queued when the disk filled: %s %s %q, want failed %s", st.State, st.Code, st.Error, builds.CodeNoSpace)
	}
}
