package fleet_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/controlplane/fleet"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
	"github.com/pandastack/pandastack/internal/hostagent/hostapi"
	"github.com/pandastack/pandastack/internal/testing/hosttest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// The registry's logic over a real catalog, with a clock of the test's;
// the hosts it registers are never reached (nothing listens at their
// URLs): connecting to them is the cluster tests' (cmd/panda).

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newRegistry(t *testing.T) (*fleet.Registry, catalog.Catalog, *clock, host.Registration) {
	t.Helper()
	dir := t.TempDir()
	cat, err := sqlite.Open(t.Context(), filepath.Join(dir, "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	creds, err := hostapi.LoadOrCreateTLS(dir, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(creds.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	r := fleet.New(fleet.Config{Catalog: cat, JoinToken: "join-secret", LostAfter: 10 * time.Second, Now: c.Now})
	t.Cleanup(r.Close)
	reg := host.Registration{ID: "h1", URL: "https://127.0.0.1:1", Token: "agent-1", CACert: string(ca),
		Capacity: host.Capacity{CPUs: 8, MemoryMiB: 32768, DiskMiB: 100000, Accel: "kvm"},
		Load:     host.Load{FreeMemoryMiB: 30000, DiskFreeMiB: 90000, Templates: []string{"base"}}}
	return r, cat, c, reg
}

func state(t *testing.T, r *fleet.Registry, id string) scheduler.HostState {
	t.Helper()
	for _, h := range r.Inventory(context.Background()) {
		if h.ID == id {
			return h.State
		}
	}
	t.Fatalf("host %s not in the inventory", id)
	return ""
}

func TestRegisterAndHeartbeat(t *testing.T) {
	r, cat, c, reg := newRegistry(t)
	ctx := t.Context()
	if err := r.CheckJoinToken("wrong"); !errors.Is(err, fleet.ErrJoinToken) {
		t.Errorf("a wrong join token: %v", err)
	}
	if err := r.CheckJoinToken("join-secret"); err != nil {
		t.Errorf("the join token: %v", err)
	}
	for name, bad := range map[string]func(*host.Registration){
		"id":      func(g *host.Registration) { g.ID = "Bad_ID" },
		"url":     func(g *host.Registration) { g.URL = "http://127.0.0.1:1" },
		"token":   func(g *host.Registration) { g.Token = "" },
		"ca_cert": func(g *host.Registration) { g.CACert = "not pem" },
	} {
		g := reg
		bad(&g)
		if _, err := r.Register(ctx, g); !errors.Is(err, fleet.ErrInvalid) {
			t.Errorf("registration with a bad %s: %v, want ErrInvalid", name, err)
		}
	}
	rec, err := r.Register(ctx, reg)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != catalog.HostReady || rec.Token != "agent-1" {
		t.Errorf("registered %+v", rec)
	}
	if got, err := cat.GetHost(ctx, "h1"); err != nil || got.URL != reg.URL || got.Capacity.CPUs != 8 {
		t.Errorf("catalog record %+v, %v", got, err)
	}
	// The inventory has its capacity and load; not connected yet, it
	// takes no placement.
	inv := r.Inventory(ctx)
	if len(inv) != 1 || inv[0].FreeMemoryMiB != 30000 || inv[0].CPUs != 8 || len(inv[0].WarmTemplates) != 1 {
		t.Errorf("inventory %+v", inv)
	}
	if _, err := r.Host("h1"); !errors.Is(err, host.ErrUnavailable) {
		t.Errorf("Host of an unreached host: %v, want ErrUnavailable", err)
	}
	if _, err := r.Host("nope"); !errors.Is(err, controlplane.ErrUnknownHost) {
		t.Errorf("Host of an unknown host: %v", err)
	}
	// Another agent cannot take its id over.
	thief := reg
	thief.Token, thief.URL = "agent-2", "https://10.9.9.9:1"
	if _, err := r.Register(ctx, thief); !errors.Is(err, fleet.ErrHostToken) {
		t.Errorf("registration under a known id with another token: %v, want ErrHostToken", err)
	}
	if err := r.Heartbeat(ctx, "h1", "agent-2", host.Load{}); !errors.Is(err, fleet.ErrHostToken) {
		t.Errorf("heartbeat with another agent token: %v", err)
	}
	if err := r.Heartbeat(ctx, "nope", "agent-1", host.Load{}); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("heartbeat of an unknown host: %v, want ErrNotFound (the agent registers again)", err)
	}
	c.add(5 * time.Second)
	if err := r.Heartbeat(ctx, "h1", "agent-1", host.Load{FreeMemoryMiB: 1234}); err != nil {
		t.Fatal(err)
	}
	if inv := r.Inventory(ctx); inv[0].FreeMemoryMiB != 1234 {
		t.Errorf("heartbeat's load not in the inventory: %+v", inv[0])
	}
}

func TestLostAndBack(t *testing.T) {
	r, cat, c, reg := newRegistry(t)
	ctx := t.Context()
	if _, err := r.Register(ctx, reg); err != nil {
		t.Fatal(err)
	}
	lost := func() bool {
		_, err := r.Host("h1")
		return errors.Is(err, controlplane.ErrHostLost)
	}
	// Run's tick drives markLost; the clock decides.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.Run(runCtx) }()
	defer func() { stop(); <-done }()
	c.add(9 * time.Second)
	testkit.WaitFor(t, 2*time.Second, "a host within its heartbeat window stays", func() bool { return !lost() })
	c.add(2 * time.Second)
	testkit.WaitFor(t, 5*time.Second, "a silent host is lost", lost)
	if h, _ := cat.GetHost(ctx, "h1"); h.State != catalog.HostLost {
		t.Errorf("catalog: %s, want lost", h.State)
	}
	if st := state(t, r, "h1"); st != scheduler.Lost {
		t.Errorf("inventory: %s", st)
	}
	// A call for one of its sandboxes says that the sandbox is lost.
	key := catalog.Key{ID: "k1", Name: "k", Hash: "h1", CreatedAt: c.Now()}
	if err := cat.CreateKey(ctx, key); err != nil {
		t.Fatal(err)
	}
	sb := catalog.Sandbox{ID: "sb1", KeyID: key.ID, HostID: "h1", Template: "base", State: catalog.StateRunning, MemoryMiB: 256, VCPUs: 1,
		CreatedAt: c.Now(), UpdatedAt: c.Now(), ExpiresAt: c.Now().Add(time.Hour)}
	if err := cat.ReserveSandbox(ctx, sb, catalog.Limits{Sandboxes: -1, MemoryMiB: -1, VCPUs: -1, DiskMiB: -1}); err != nil {
		t.Fatal(err)
	}
	_, err := fleet.NewRouter(r, cat).Get(ctx, sb.ID)
	if ce := controlplane.Classify(err); ce.Kind != controlplane.Unavailable || !strings.Contains(ce.Msg, "sandbox sb1 is lost: its host h1 stopped heartbeating") {
		t.Errorf("a call for a sandbox of a lost host: %v (%s: %q), want unavailable saying it is lost", err, ce.Kind, ce.Msg)
	}
	if err := r.Heartbeat(ctx, "h1", "agent-1", host.Load{}); err != nil {
		t.Fatal(err)
	}
	if lost() {
		t.Errorf("a host that heartbeats again is still lost")
	}
	if h, _ := cat.GetHost(ctx, "h1"); h.State != catalog.HostReady {
		t.Errorf("catalog after the heartbeat: %s, want ready", h.State)
	}
}

func TestDrainActivateForget(t *testing.T) {
	r, cat, _, reg := newRegistry(t)
	ctx := t.Context()
	if _, err := r.Register(ctx, reg); err != nil {
		t.Fatal(err)
	}
	if _, err := r.SetDraining(ctx, "nope", true); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("drain of an unknown host: %v", err)
	}
	rec, err := r.SetDraining(ctx, "h1", true)
	if err != nil || rec.State != catalog.HostDraining || !rec.Draining {
		t.Fatalf("drain: %+v, %v", rec, err)
	}
	if st := state(t, r, "h1"); st != scheduler.Draining {
		t.Errorf("inventory of a draining host: %s", st)
	}
	// A drained host that registers again (an agent restart) stays
	// drained.
	if rec, err := r.Register(ctx, reg); err != nil || rec.State != catalog.HostDraining {
		t.Errorf("registration of a draining host: %+v, %v", rec, err)
	}
	if rec, err := r.SetDraining(ctx, "h1", false); err != nil || rec.State != catalog.HostReady {
		t.Errorf("activate: %+v, %v", rec, err)
	}
	if err := r.Forget(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	if _, err := cat.GetHost(ctx, "h1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("a forgotten host's record: %v", err)
	}
	if err := r.Forget(ctx, "h1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("forget twice: %v", err)
	}
	// Forgotten, its id may be registered by another agent.
	reg.Token = "agent-new"
	if _, err := r.Register(ctx, reg); err != nil {
		t.Errorf("registration after forget: %v", err)
	}
	// A static host is the server's own: not forgotten, not taken over.
	r.AddStatic("local", hosttest.New(), host.Capacity{})
	if err := r.Forget(ctx, "local"); !errors.Is(err, fleet.ErrInvalid) {
		t.Errorf("forget a static host: %v", err)
	}
	if _, err := r.Register(ctx, host.Registration{ID: "local", URL: reg.URL, Token: "x", CACert: reg.CACert}); !errors.Is(err, fleet.ErrHostToken) {
		t.Errorf("register over a static host: %v", err)
	}
}

func TestRestartLoadsHosts(t *testing.T) {
	r, cat, c, reg := newRegistry(t)
	ctx := t.Context()
	if _, err := r.Register(ctx, reg); err != nil {
		t.Fatal(err)
	}
	r2 := fleet.New(fleet.Config{Catalog: cat, JoinToken: "join-secret", LostAfter: 10 * time.Second, Now: c.Now})
	defer r2.Close()
	if err := r2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if st := r2.Statuses(); len(st) != 1 || st[0].Record.ID != "h1" || st[0].Record.Token != "agent-1" {
		t.Errorf("a new registry over the catalog knows %+v", st)
	}
	if err := r2.Heartbeat(ctx, "h1", "agent-1", host.Load{}); err != nil {
		t.Errorf("heartbeat to the restarted registry: %v", err)
	}
}

// TestInventoryCountsPlacementsSinceTheLoad: sandboxes created on a host
// after its last load report are counted at the scheduler's estimate
// against its free memory (a burst of creates between two heartbeats must
// not all see the same free memory); the next report takes over.
func TestInventoryCountsPlacementsSinceTheLoad(t *testing.T) {
	r, cat, c, reg := newRegistry(t)
	ctx := t.Context()
	if _, err := r.Register(ctx, reg); err != nil { // load: 30000 MiB free, at c's now
		t.Fatal(err)
	}
	key := catalog.Key{ID: "k1", Name: "k", Hash: "h1", CreatedAt: c.Now()}
	if err := cat.CreateKey(ctx, key); err != nil {
		t.Fatal(err)
	}
	add := func(id string, memMiB int, state string) {
		t.Helper()
		now := c.Now()
		sb := catalog.Sandbox{ID: id, KeyID: key.ID, HostID: "h1", Template: "base", State: state, MemoryMiB: memMiB, VCPUs: 1,
			CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := cat.ReserveSandbox(ctx, sb, catalog.Limits{Sandboxes: -1, MemoryMiB: -1, VCPUs: -1, DiskMiB: -1}); err != nil {
			t.Fatal(err)
		}
	}
	free := func() int64 {
		t.Helper()
		for _, h := range r.Inventory(ctx) {
			if h.ID == "h1" {
				return h.FreeMemoryMiB
			}
		}
		t.Fatal("h1 not in the inventory")
		return 0
	}
	add("before", 1024, catalog.StateRunning) // created with the report: in it
	c.add(time.Second)
	add("a", 1024, catalog.StateStarting)   // counted at 256 MiB
	add("b", 128, catalog.StateRunning)     // counted at its 128 MiB
	add("gone", 1024, catalog.StateStopped) // not live: not counted
	if got, want := free(), int64(30000-256-128); got != want {
		t.Errorf("free memory with two sandboxes placed since the report: %d MiB, want %d", got, want)
	}
	c.add(time.Second)
	if err := r.Heartbeat(ctx, "h1", "agent-1", host.Load{FreeMemoryMiB: 29000}); err != nil {
		t.Fatal(err)
	}
	if got := free(); got != 29000 {
		t.Errorf("free memory after a new report: %d MiB, want the report's 29000", got)
	}
}

// TestTemplateHostAway: the template builds of a fleet whose template host
// has not joined, or has not been reached yet, answer unavailable, saying
// which host and why; a refused build's context is removed.
// TestTemplatesWithoutAHost: builds while no host can run them answer 503
// naming why (the pinned host not joined or not reached; no host ready),
// the refused build's context is removed and nothing is reserved; the
// registry, which is the catalog's, answers without any host.
func TestTemplatesWithoutAHost(t *testing.T) {
	r, cat, _, reg := newRegistry(t)
	ctx := t.Context()
	unavailable := func(err error, want ...string) {
		t.Helper()
		var ce *controlplane.Error
		if !errors.As(err, &ce) || ce.Kind != controlplane.Unavailable {
			t.Errorf("got %v, want unavailable", err)
			return
		}
		for _, w := range want {
			if !strings.Contains(ce.Msg, w) {
				t.Errorf("got %q, want it to say %q", ce.Msg, w)
			}
		}
	}
	tar := filepath.Join(t.TempDir(), "context.tar")
	if err := os.WriteFile(tar, []byte("a build context"), 0o600); err != nil {
		t.Fatal(err)
	}
	pinned := fleet.NewTemplates(r, "h1")
	defer pinned.Close()
	_, err := pinned.Start(ctx, builds.Spec{Name: "app", Dockerfile: []byte("FROM tiny\n"), ContextTar: tar, Owner: "key_a"})
	unavailable(err, "host h1", "has not joined")
	if _, err := os.Stat(tar); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused build's context: %v, want it removed", err)
	}
	any := fleet.NewTemplates(r, "")
	defer any.Close()
	_, err = any.Start(ctx, builds.Spec{Name: "app", FromImage: "alpine", Owner: "key_a"})
	unavailable(err, "no host can build templates now")
	if _, err := r.Register(ctx, reg); err != nil {
		t.Fatal(err)
	}
	_, err = pinned.Start(ctx, builds.Spec{Name: "app", FromImage: "alpine", Owner: "key_a"})
	unavailable(err, "host h1", "not connected yet")
	if _, err := cat.GetTemplate(ctx, "app"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("a refused build left a template in the catalog: %v", err)
	}
	if us, err := pinned.UserTemplates(ctx); err != nil || len(us) != 0 {
		t.Errorf("UserTemplates = %v, %v; want none, nil", us, err)
	}
	if err := pinned.Remove(ctx, "app"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("Remove of nothing: got %v, want templates.ErrNotFound", err)
	}
	if _, err := any.Start(ctx, builds.Spec{Name: "base", FromImage: "alpine"}); !errors.Is(err, templates.ErrInvalid) {
		t.Errorf("a build of a built-in's name: got %v, want templates.ErrInvalid", err)
	}
}
