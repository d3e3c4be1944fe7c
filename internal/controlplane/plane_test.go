package controlplane_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/testing/hosttest"
)

// The tests of this package's logic run a Plane over a real catalog
// (SQLite, in a temporary directory) and hosttest's in-memory host, with a
// clock and a TTL loop ticker of their own: nothing waits for time to pass.

// t0 is when every test's clock starts.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// clock is a test's clock; it moves only when told.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

type env struct {
	t     *testing.T
	p     *controlplane.Plane
	cat   catalog.Catalog
	h     *hosttest.Host
	key   catalog.Key
	clock *clock
	tick  chan time.Time

	mu   sync.Mutex
	gone []string // what Config.Gone was told
}

// newEnv returns a plane over a fresh catalog and host, with a key
// (limits from keyLimits, if given) and the configuration cfg changes.
func newEnv(t *testing.T, cfg func(*controlplane.Config), keyLimits ...func(*catalog.Key)) *env {
	t.Helper()
	return newEnvWith(t, func(c *controlplane.Config, _ catalog.Catalog) {
		if cfg != nil {
			cfg(c)
		}
	}, keyLimits...)
}

// newEnvWith is newEnv whose configuration cfg changes knowing the
// plane's catalog.
func newEnvWith(t *testing.T, cfg func(*controlplane.Config, catalog.Catalog), keyLimits ...func(*catalog.Key)) *env {
	t.Helper()
	cat, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	e := &env{t: t, cat: cat, h: hosttest.New(), clock: &clock{now: t0}, tick: make(chan time.Time)}
	c := controlplane.Config{
		HostID: "local", DefaultTTL: 5 * time.Minute, MaxTTL: 24 * time.Hour,
		MaxSandboxesPerKey: 100, MaxMemoryMiBPerKey: 1 << 20, MaxVCPUsPerKey: 1000, MaxDiskMiBPerKey: 1 << 30,
		StoppedRetention: time.Hour,
		Gone: func(id string) {
			e.mu.Lock()
			e.gone = append(e.gone, id)
			e.mu.Unlock()
		},
		Now: e.clock.Now, Tick: e.tick,
	}
	cfg(&c, cat)
	if e.p, err = controlplane.New(c, cat, e.h, nil); err != nil {
		t.Fatal(err)
	}
	e.h.OnExit = e.p.SandboxExited
	t.Cleanup(func() { e.p.Shutdown(context.Background()) })
	e.key = e.newKey("key_test", keyLimits...)
	return e
}

func (e *env) newKey(id string, limits ...func(*catalog.Key)) catalog.Key {
	e.t.Helper()
	k := catalog.Key{ID: id, Name: id, Hash: "hash-" + id, Prefix: "pk_", CreatedAt: t0}
	for _, f := range limits {
		f(&k)
	}
	if err := e.cat.CreateKey(e.t.Context(), k); err != nil {
		e.t.Fatal(err)
	}
	return k
}

// create creates a sandbox of e's key or fails the test.
func (e *env) create(req controlplane.CreateRequest) catalog.Sandbox {
	e.t.Helper()
	sb, err := e.p.Create(e.t.Context(), e.key, req)
	if err != nil {
		e.t.Fatalf("create: %v", err)
	}
	return sb
}

func (e *env) get(id string) catalog.Sandbox {
	e.t.Helper()
	sb, err := e.cat.GetSandbox(e.t.Context(), id)
	if err != nil {
		e.t.Fatalf("get %s: %v", id, err)
	}
	return sb
}

// records is every record of key keyID, in any state.
func (e *env) records(keyID string) []catalog.Sandbox {
	e.t.Helper()
	sbs, err := e.cat.ListSandboxes(e.t.Context(), catalog.SandboxFilter{KeyID: keyID})
	if err != nil {
		e.t.Fatal(err)
	}
	return sbs
}

// live is the records of key keyID that are not stopped.
func (e *env) live(keyID string) []catalog.Sandbox {
	e.t.Helper()
	sbs, err := e.cat.ListSandboxes(e.t.Context(), catalog.SandboxFilter{KeyID: keyID, States: controlplane.LiveStates})
	if err != nil {
		e.t.Fatal(err)
	}
	return sbs
}

// hostCount is how many sandboxes the host has.
func (e *env) hostCount() int {
	e.t.Helper()
	l, err := e.h.List(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return len(l)
}

func (e *env) wasGone(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, g := range e.gone {
		if g == id {
			return true
		}
	}
	return false
}

// loop runs the TTL loop until the returned stop is called; stop returns
// once the loop and every expiry it started have returned.
func (e *env) loop() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.p.Run(ctx)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	e.t.Cleanup(stop)
	return stop
}

// wantState checks sandbox id's record's state and stop reason.
func (e *env) wantState(id, state, reason string) catalog.Sandbox {
	e.t.Helper()
	sb := e.get(id)
	if sb.State != state || sb.StopReason != reason {
		e.t.Errorf("sandbox %s is %s (stop reason %q), want %s (%q)", id, sb.State, sb.StopReason, state, reason)
	}
	return sb
}

// wantKind checks what users see of err: its kind, a message containing
// each of has and none of hasNot.
func wantKind(t *testing.T, what string, err error, kind controlplane.Kind, has []string, hasNot ...string) *controlplane.Error {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want %s", what, kind)
		return nil
	}
	ce := controlplane.Classify(err)
	if ce.Kind != kind {
		t.Errorf("%s: %v: kind %s, want %s", what, err, ce.Kind, kind)
	}
	for _, s := range has {
		if !strings.Contains(ce.Msg, s) {
			t.Errorf("%s: message %q does not contain %q", what, ce.Msg, s)
		}
	}
	for _, s := range hasNot {
		if strings.Contains(ce.Msg, s) {
			t.Errorf("%s: message %q contains %q; users must not see it", what, ce.Msg, s)
		}
	}
	return ce
}

func ptr[T any](v T) *T { return &v }

var errBoom = errors.New("boom")
