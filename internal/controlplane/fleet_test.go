package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
	"github.com/pandastack/pandastack/internal/testing/hosttest"
)

// testFleet is a fleet of in-memory hosts whose states a test sets.
type testFleet struct {
	mu    sync.Mutex
	hosts map[string]*hosttest.Host
	state map[string]scheduler.HostState
	ids   []string
	// onStatuses, if set, is called (once, then cleared) when Statuses
	// is, before it answers (forgethost_test.go).
	onStatuses func()
}

func (f *testFleet) Host(id string) (host.Host, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.hosts[id]
	switch {
	case !ok:
		return nil, fmt.Errorf("host %q: %w", id, controlplane.ErrUnknownHost)
	case f.state[id] == scheduler.Lost:
		return nil, fmt.Errorf("host %s: %w", id, controlplane.ErrHostLost)
	}
	return h, nil
}

func (f *testFleet) Inventory(context.Context) []scheduler.Host {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []scheduler.Host
	for _, id := range f.ids {
		out = append(out, scheduler.Host{ID: id, State: f.state[id], CPUs: 64, MemoryMiB: 1 << 20, FreeMemoryMiB: 1 << 20,
			DiskFreeMiB: 1 << 30, WarmTemplates: []string{"base"}})
	}
	return out
}

func (f *testFleet) HostState(id string) scheduler.HostState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state[id]
}

func (f *testFleet) set(id string, st scheduler.HostState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state[id] = st
}

// fleetEnv is a plane over hosts a and b (b's store shared with a's if
// store).
type fleetEnv struct {
	t     *testing.T
	p     *controlplane.Plane
	cat   catalog.Catalog
	f     *testFleet
	a, b  *hosttest.Host
	store *hosttest.Store
	key   catalog.Key
}

func newFleetEnv(t *testing.T, store bool, cfgs ...func(*controlplane.Config)) *fleetEnv {
	t.Helper()
	cat, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	e := &fleetEnv{t: t, cat: cat, a: hosttest.New(), b: hosttest.New()}
	e.f = &testFleet{hosts: map[string]*hosttest.Host{"a": e.a, "b": e.b},
		state: map[string]scheduler.HostState{"a": scheduler.Ready, "b": scheduler.Ready}, ids: []string{"a", "b"}}
	if store {
		e.store = hosttest.NewStore()
		e.a.UseStore(e.store)
		e.b.UseStore(e.store)
	}
	cfg := controlplane.Config{DefaultTTL: 5 * time.Minute, MaxTTL: time.Hour,
		MaxSandboxesPerKey: 100, MaxMemoryMiBPerKey: 1 << 20, MaxVCPUsPerKey: 1000, MaxDiskMiBPerKey: 1 << 30,
		StoppedRetention: time.Hour, StoreDownAfter: 100 * time.Millisecond}
	for _, f := range cfgs {
		f(&cfg)
	}
	e.p, err = controlplane.NewFleet(cfg, cat, e.f, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.p.Shutdown(context.Background()) })
	e.key = catalog.Key{ID: "key_f", Name: "f", Hash: "hash-f", Prefix: "pk_", CreatedAt: t0}
	if err := cat.CreateKey(t.Context(), e.key); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *fleetEnv) createOn(hostID string) catalog.Sandbox {
	e.t.Helper()
	sb, err := e.p.Create(e.t.Context(), e.key, controlplane.CreateRequest{Template: "base", Placement: scheduler.Placement{Host: hostID}})
	if err != nil {
		e.t.Fatalf("create on %s: %v", hostID, err)
	}
	if sb.HostID != hostID {
		e.t.Fatalf("create on %s: placed on %s", hostID, sb.HostID)
	}
	return sb
}

func (e *fleetEnv) get(id string) catalog.Sandbox {
	e.t.Helper()
	sb, err := e.cat.GetSandbox(e.t.Context(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return sb
}

func TestFleetPlacement(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, false)
	sb := e.createOn("b")
	if _, ok := e.b.Sandbox(sb.ID); !ok {
		t.Errorf("host b does not have the sandbox placed there")
	}
	if _, ok := e.a.Sandbox(sb.ID); ok {
		t.Errorf("host a has the sandbox placed on b")
	}
	_, err := e.p.Create(t.Context(), e.key, controlplane.CreateRequest{Placement: scheduler.Placement{Host: "nope"}})
	wantKind(t, "create on an unknown host", err, controlplane.NotFound, []string{"nope"})
	e.f.set("a", scheduler.Draining)
	_, err = e.p.Create(t.Context(), e.key, controlplane.CreateRequest{Placement: scheduler.Placement{Host: "a"}})
	wantKind(t, "create on a draining host", err, controlplane.Conflict, []string{"a"})
	// Default forks stay on the parent's host.
	got, err := e.p.Fork(t.Context(), e.key, sb, 2, scheduler.Placement{}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range got.Children {
		if c.Err != nil || c.Sandbox.HostID != "b" {
			t.Errorf("default fork child: %+v, want one on the parent's host b", c)
		}
	}
	if got.CrossHostCaptureBytes != 0 {
		t.Errorf("same-host fork moved %d bytes", got.CrossHostCaptureBytes)
	}
	// Per-host records: a resync of a leaves b's sandboxes alone.
	if err := e.p.ResyncHost(t.Context(), "a", e.a.List); err != nil {
		t.Fatal(err)
	}
	if st := e.get(sb.ID).State; st != catalog.StateRunning {
		t.Errorf("a resync of host a changed b's sandbox to %s", st)
	}
}

func TestFleetForkAcrossHosts(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, true)
	parent := e.createOn("a")
	got, err := e.p.Fork(t.Context(), e.key, parent, 3, scheduler.Placement{Host: "b"}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range got.Children {
		if c.Err != nil {
			t.Fatalf("child: %v", c.Err)
		}
		if c.Sandbox.HostID != "b" || c.Sandbox.State != catalog.StateRunning || c.Sandbox.ParentID != parent.ID {
			t.Errorf("child %+v, want running on b with parent %s", c.Sandbox, parent.ID)
		}
		if info, ok := e.b.Sandbox(c.Sandbox.ID); !ok || info.Snapshot == "" {
			t.Errorf("host b: child %s %+v, want restored from the parent's capture", c.Sandbox.ID, info)
		}
	}
	if got.CrossHostCaptureBytes <= 0 {
		t.Errorf("cross-host fork moved %d bytes, want the capture's size", got.CrossHostCaptureBytes)
	}
	// The capture that travelled is gone from the parent's host and
	// never was a user's snapshot.
	controlplane.SettleTails(e.p)
	for name, h := range map[string]*hosttest.Host{"a": e.a, "b": e.b} {
		if snaps, _ := h.Snapshots(t.Context()); len(snaps) != 0 {
			t.Errorf("host %s keeps %d captures after the fork", name, len(snaps))
		}
	}
	if recs, _ := e.cat.ListSandboxes(t.Context(), catalog.SandboxFilter{}); len(recs) != 4 {
		t.Errorf("%d records, want the parent and 3 children", len(recs))
	}
	if sn, _ := e.cat.ListSnapshots(t.Context(), ""); len(sn) != 0 {
		t.Errorf("the fork recorded %d snapshots", len(sn))
	}
}

// TestFleetForkAcrossOlderAgent: a parent's host whose agent predates the
// wait for durability (501 unsupported) is polled through its snapshot
// list instead, and the fork works the same.
func TestFleetForkAcrossOlderAgent(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, true)
	parent := e.createOn("a")
	e.a.Fail(hosttest.SnapshotPack, "", fmt.Errorf("GET /host/v1/snapshots/x/pack: %w", errors.ErrUnsupported))
	e.a.Fail(hosttest.AwaitStored, "", fmt.Errorf("GET /host/v1/snapshots/x/stored: %w", errors.ErrUnsupported))
	before := e.a.CallsOf(hosttest.Snapshots, "")
	got, err := e.p.Fork(t.Context(), e.key, parent, 2, scheduler.Placement{Host: "b"}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range got.Children {
		if c.Err != nil || c.Sandbox.HostID != "b" || c.Sandbox.State != catalog.StateRunning {
			t.Errorf("child %+v (%v), want running on b", c.Sandbox, c.Err)
		}
	}
	waits := 0
	for _, c := range e.a.Calls() {
		if c.Method == hosttest.AwaitStored {
			waits++
		}
	}
	if waits != 1 || e.a.CallsOf(hosttest.Snapshots, "") == before {
		t.Errorf("AwaitStored called %d times, Snapshots %d → %d: want one refused wait, then the list polled",
			waits, before, e.a.CallsOf(hosttest.Snapshots, ""))
	}
}

// TestFleetForkAcrossNeedsAStore: without a store, a capture that cannot
// go straight to the other host (here: the target has no template) has
// no way there: the fork is refused and leaves nothing.
func TestFleetForkAcrossNeedsAStore(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, false)
	parent := e.createOn("a")
	e.b.DropTemplate("base")
	_, err := e.p.Fork(t.Context(), e.key, parent, 1, scheduler.Placement{Host: "b"}, "")
	wantKind(t, "cross-host fork without a store", err, controlplane.Invalid, []string{"object store"})
	if live, _ := e.cat.ListSandboxes(t.Context(), catalog.SandboxFilter{States: controlplane.LiveStates}); len(live) != 1 {
		t.Errorf("%d live records after a failed fork, want the parent only", len(live))
	}
	if l, _ := e.b.List(t.Context()); len(l) != 0 {
		t.Errorf("host b has %d sandboxes after a failed fork", len(l))
	}
}

func TestFleetLostHost(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, true)
	run := e.createOn("a")
	paused := e.createOn("a")
	if _, err := e.p.Pause(t.Context(), paused.ID); err != nil {
		t.Fatal(err)
	}
	e.f.set("a", scheduler.Lost)
	// A kill of a lost host's sandbox stops its record at once.
	if err := e.p.Stop(t.Context(), run.ID, "killed"); err != nil {
		t.Fatalf("stop on a lost host: %v", err)
	}
	if sb := e.get(run.ID); sb.State != catalog.StateStopped || sb.StopReason != "killed" {
		t.Errorf("killed sandbox of a lost host: %s (%s), want stopped (killed)", sb.State, sb.StopReason)
	}
	// A paused one resumes on another host from the store.
	sb, err := e.p.Resume(t.Context(), paused.ID)
	if err != nil {
		t.Fatalf("resume of a lost host's paused sandbox: %v", err)
	}
	if sb.State != catalog.StateRunning || sb.HostID != "b" {
		t.Errorf("resumed %s on %s, want running on b", sb.State, sb.HostID)
	}
	if info, ok := e.b.Sandbox(paused.ID); !ok || info.State != "running" {
		t.Errorf("host b: %+v, %v", info, ok)
	}
}

func TestFleetResumeElsewhereWithoutCapture(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, false)
	sb := e.createOn("a")
	if _, err := e.p.Pause(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	e.f.set("a", scheduler.Lost)
	_, err := e.p.Resume(t.Context(), sb.ID)
	wantKind(t, "resume of a lost host's sandbox not in the store", err, controlplane.Unavailable, []string{"object store"})
	// Still paused, on its own host: it resumes there when a returns.
	if got := e.get(sb.ID); got.State != catalog.StatePaused || got.HostID != "a" {
		t.Errorf("after the failed resume: %s on %s, want paused on a", got.State, got.HostID)
	}
	e.f.set("a", scheduler.Ready)
	if got, err := e.p.Resume(t.Context(), sb.ID); err != nil || got.HostID != "a" {
		t.Errorf("resume once a is back: %+v, %v", got, err)
	}
}

func TestFleetMoveTo(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, true)
	sb := e.createOn("a")
	before := e.get(sb.ID).ExpiresAt
	to, err := e.p.MoveTo(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if to != "b" {
		t.Errorf("moved to %s, want b", to)
	}
	if got := e.get(sb.ID); got.State != catalog.StateRunning || got.HostID != "b" {
		t.Errorf("after the move: %s on %s, want running on b", got.State, got.HostID)
	}
	if got := e.get(sb.ID).ExpiresAt; !got.Equal(before) {
		t.Errorf("a move changed the expiry from %v to %v", before, got)
	}
	if _, ok := e.a.Sandbox(sb.ID); ok {
		t.Errorf("host a still holds the moved sandbox")
	}
	if e.store.Paused(sb.ID) {
		t.Errorf("the store still holds the moved sandbox's capture")
	}
	// Without another host, nothing happens.
	e.f.set("a", scheduler.Draining)
	if _, err := e.p.MoveTo(t.Context(), sb.ID); err == nil {
		t.Errorf("move with no other ready host succeeded")
	}
	if got := e.get(sb.ID); got.State != catalog.StateRunning || got.HostID != "b" {
		t.Errorf("after a move that could not happen: %s on %s", got.State, got.HostID)
	}
	moved, failed := e.p.Migrate(t.Context(), "b")
	if len(moved) != 0 || len(failed) != 1 {
		t.Errorf("migrate with nowhere to go: moved %v failed %v", moved, failed)
	}
}

func TestFleetResumeOnAnotherHost(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, true)
	sb := e.createOn("a")
	if _, err := e.p.Pause(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	got, err := e.p.ResumeOn(t.Context(), sb.ID, scheduler.Placement{Host: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if got.State != catalog.StateRunning || got.HostID != "b" {
		t.Errorf("resumed: %s on %s, want running on b", got.State, got.HostID)
	}
	if _, ok := e.a.Sandbox(sb.ID); ok {
		t.Errorf("host a still holds the sandbox resumed on b")
	}
	if info, ok := e.b.Sandbox(sb.ID); !ok || info.State != "running" {
		t.Errorf("host b: %+v %v", info, ok)
	}
	// A running sandbox is not resumed anywhere.
	_, err = e.p.ResumeOn(t.Context(), sb.ID, scheduler.Placement{Host: "a"})
	wantKind(t, "resume of a running sandbox", err, controlplane.Conflict, []string{"running"})
	// Without a store the capture cannot travel.
	e2 := newFleetEnv(t, false)
	sb2 := e2.createOn("a")
	if _, err := e2.p.Pause(t.Context(), sb2.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e2.p.ResumeOn(t.Context(), sb2.ID, scheduler.Placement{Host: "b"})
	wantKind(t, "resume elsewhere without a store", err, controlplane.Invalid, []string{"object store"})
	if got := e2.get(sb2.ID); got.State != catalog.StatePaused || got.HostID != "a" {
		t.Errorf("after a refused move: %s on %s, want paused on a", got.State, got.HostID)
	}
}

// A host that comes back with a copy of a sandbox that moved meanwhile
// (its paused copy, resumed elsewhere while it was lost) drops that copy
// at its resync; the sandbox on its new host is left alone.
func TestFleetReturningHostDropsMovedCopies(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, true)
	sb := e.createOn("a")
	if _, err := e.p.Pause(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	e.f.set("a", scheduler.Lost)
	if got, err := e.p.Resume(t.Context(), sb.ID); err != nil || got.HostID != "b" {
		t.Fatalf("resume while a is lost: %+v, %v", got, err)
	}
	// The fake's store handed the capture over; a still has its copy.
	e.a.Put(host.Info{ID: sb.ID, Template: "base", State: "paused"})
	e.f.set("a", scheduler.Ready)
	if err := e.p.ResyncHost(t.Context(), "a", e.a.List); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.a.Sandbox(sb.ID); ok {
		t.Errorf("host a keeps its stale copy after its resync")
	}
	if got := e.get(sb.ID); got.State != catalog.StateRunning || got.HostID != "b" {
		t.Errorf("the moved sandbox: %s on %s, want running on b", got.State, got.HostID)
	}
	if _, ok := e.b.Sandbox(sb.ID); !ok {
		t.Errorf("host b lost the sandbox")
	}
}

// With the object store down, a cross-host fork whose capture cannot go
// straight to the other host, and a move, give up soon with a 503 and
// leave everything as it was.
func TestFleetStoreDown(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, true)
	sb := e.createOn("a")
	e.store.SetDown(true)
	e.b.DropTemplate("base") // the capture cannot go straight there either
	_, err := e.p.Fork(t.Context(), e.key, sb, 1, scheduler.Placement{Host: "b"}, "")
	wantKind(t, "cross-host fork with the store down", err, controlplane.Unavailable, []string{"object store"})
	if live, _ := e.cat.ListSandboxes(t.Context(), catalog.SandboxFilter{States: controlplane.LiveStates}); len(live) != 1 {
		t.Errorf("%d live records after the failed fork, want the parent only", len(live))
	}
	_, err = e.p.MoveTo(t.Context(), sb.ID)
	wantKind(t, "move with the store down", err, controlplane.Unavailable, []string{"object store"})
	if got := e.get(sb.ID); got.State != catalog.StateRunning || got.HostID != "a" {
		t.Errorf("after the failed move: %s on %s, want running on a", got.State, got.HostID)
	}
}

// forkTo forks parent into n children on host b and checks that they all
// run there, restored from the parent's capture, and that no capture is
// left on either host nor recorded as a snapshot.
func (e *fleetEnv) forkTo(parent catalog.Sandbox, n int) controlplane.Forked {
	e.t.Helper()
	got, err := e.p.Fork(e.t.Context(), e.key, parent, n, scheduler.Placement{Host: "b"}, "")
	if err != nil {
		e.t.Fatalf("fork to b: %v", err)
	}
	for _, c := range got.Children {
		if c.Err != nil {
			e.t.Fatalf("child: %v", c.Err)
		}
		if c.Sandbox.HostID != "b" || c.Sandbox.State != catalog.StateRunning || c.Sandbox.ParentID != parent.ID {
			e.t.Errorf("child %+v, want running on b with parent %s", c.Sandbox, parent.ID)
		}
		if info, ok := e.b.Sandbox(c.Sandbox.ID); !ok || info.Snapshot == "" {
			e.t.Errorf("host b: child %s %+v, want restored from the parent's capture", c.Sandbox.ID, info)
		}
	}
	controlplane.SettleTails(e.p) // the capture goes after the answer
	for name, h := range map[string]*hosttest.Host{"a": e.a, "b": e.b} {
		if snaps, _ := h.Snapshots(e.t.Context()); len(snaps) != 0 {
			e.t.Errorf("host %s keeps %d captures after the fork", name, len(snaps))
		}
	}
	if sn, _ := e.cat.ListSnapshots(e.t.Context(), ""); len(sn) != 0 {
		e.t.Errorf("the fork recorded %d snapshots", len(sn))
	}
	return got
}

// paths counts what the cross-host forks of the test did: packs a sent,
// packs b received, and waits of a for the object store.
func (e *fleetEnv) paths() (packs, received, waits int) {
	for _, c := range e.a.Calls() {
		switch c.Method {
		case hosttest.SnapshotPack:
			packs++
		case hosttest.AwaitStored:
			waits++
		}
	}
	for _, c := range e.b.Calls() {
		if c.Method == hosttest.ReceiveSnapshot {
			received++
		}
	}
	return packs, received, waits
}

// TestFleetForkAcrossFirstChildFails: the host that receives a
// cross-host fork's capture makes the first child from it at once
// (host.PackCreator); when that create fails, only that child fails: the
// capture was received, the other child is made from it, and nothing
// goes through the object store.
func TestFleetForkAcrossFirstChildFails(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, true)
	parent := e.createOn("a")
	e.b.Fail(hosttest.Create, "", fmt.Errorf("%w: boom", host.ErrUnavailable))
	got, err := e.p.Fork(t.Context(), e.key, parent, 2, scheduler.Placement{Host: "b"}, "")
	if err != nil {
		t.Fatalf("fork to b: %v", err)
	}
	failed := 0
	for _, c := range got.Children {
		if c.Err != nil {
			failed++
			continue
		}
		if c.Sandbox.HostID != "b" || c.Sandbox.State != catalog.StateRunning {
			t.Errorf("child %+v, want running on b", c.Sandbox)
		}
	}
	if failed != 1 {
		t.Errorf("%d children failed, want 1 (the one whose create failed)", failed)
	}
	if packs, received, waits := e.paths(); packs != 1 || received != 1 || waits != 0 {
		t.Errorf("%d packs sent, %d received, %d waits for the store; want 1, 1, 0", packs, received, waits)
	}
}

// TestFleetForkAcrossDirect: the capture of a cross-host fork goes
// straight from the parent's host to the child's, once for all the
// children there, and the object store is not waited for.
func TestFleetForkAcrossDirect(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, true)
	parent := e.createOn("a")
	got := e.forkTo(parent, 3)
	packs, received, waits := e.paths()
	if packs != 1 || received != 1 || waits != 0 {
		t.Errorf("%d packs sent, %d received, %d waits for the store; want 1, 1, 0", packs, received, waits)
	}
	if got.CrossHostDirectBytes < 1<<20 || got.CrossHostUploadedBytes != 0 || got.CrossHostFetchedBytes != 0 {
		t.Errorf("direct %d, uploaded %d, fetched %d bytes; want the pack (over 1 MiB) direct, nothing through the store",
			got.CrossHostDirectBytes, got.CrossHostUploadedBytes, got.CrossHostFetchedBytes)
	}
}

// TestFleetForkAcrossPulled: where the hosts can reach each other (the
// parent's host gives a host.PackSource), the child's host fetches the
// capture from the parent's host itself (host.PackPuller): every byte sent
// directly was pulled, none relayed by the control plane. Where that pull
// fails without receiving the pack, the control plane relays it, and the
// fork works the same.
func TestFleetForkAcrossPulled(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("pull fails: %v", fail), func(t *testing.T) {
			e := newFleetEnv(t, true)
			e.a.AllowPulls()
			parent := e.createOn("a")
			if fail {
				e.b.Fail(hosttest.PullAndCreate, "", fmt.Errorf("%w: no route to host", host.ErrUnavailable))
			}
			got := e.forkTo(parent, 2)
			pulls := 0
			for _, c := range e.b.Calls() {
				if c.Method == hosttest.PullAndCreate {
					pulls++
				}
			}
			if packs, received, waits := e.paths(); pulls != 1 || packs != 1 || received != 1 || waits != 0 {
				t.Errorf("%d pulls, %d packs sent, %d received, %d waits for the store; want 1, 1, 1, 0", pulls, packs, received, waits)
			}
			want := got.CrossHostDirectBytes
			if fail {
				want = 0
			}
			if got.CrossHostDirectBytes < 1<<20 || got.CrossHostPulledBytes != want {
				t.Errorf("direct %d bytes, pulled %d; want the pack direct, %d of it pulled", got.CrossHostDirectBytes, got.CrossHostPulledBytes, want)
			}
		})
	}
}

// TestFleetForkAcrossFallsBack: where the capture cannot go straight to
// the child's host, it goes through the object store and the fork works
// the same: the target lacks the template (it refuses the pack), either
// agent predates direct transfers (501), the stream breaks halfway.
func TestFleetForkAcrossFallsBack(t *testing.T) {
	t.Parallel()
	unsupported := func(what string) error {
		return fmt.Errorf("%s /host/v1/snapshots/x/pack: %w", what, errors.ErrUnsupported)
	}
	for _, c := range []struct {
		name  string
		setup func(e *fleetEnv)
		// packs, received: calls of SnapshotPack on a, ReceiveSnapshot on b
		packs, received int
		// direct: the capture went straight to b after all
		direct bool
	}{
		{"target lacks the template", func(e *fleetEnv) { e.b.DropTemplate("base") }, 1, 1, false},
		{"older source agent", func(e *fleetEnv) { e.a.Fail(hosttest.SnapshotPack, "", unsupported("GET")) }, 1, 0, false},
		// No pack and create (POST …/pack/create), no plain receive
		// either: two refusals.
		{"older target agent", func(e *fleetEnv) {
			e.b.Fail(hosttest.ReceiveSnapshot, "", unsupported("POST"))
			e.b.Fail(hosttest.ReceiveSnapshot, "", unsupported("POST"))
		}, 2, 2, false},
		// A plain receive, but no pack and create: the pack, then the
		// creates.
		{"target agent without pack and create", func(e *fleetEnv) {
			e.b.Fail(hosttest.ReceiveSnapshot, "", unsupported("POST"))
		}, 2, 2, true},
		{"stream breaks", func(e *fleetEnv) {
			e.a.BreakPack(fmt.Errorf("%w: connection reset", host.ErrUnavailable))
		}, 1, 1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newFleetEnv(t, true)
			parent := e.createOn("a")
			c.setup(e)
			got := e.forkTo(parent, 2)
			packs, received, waits := e.paths()
			if packs != c.packs || received != c.received || (waits == 0) != c.direct {
				t.Errorf("%d packs sent, %d received, %d waits for the store; want %d, %d, waits: %v", packs, received, waits, c.packs, c.received, !c.direct)
			}
			if c.direct {
				if got.CrossHostDirectBytes <= 0 || got.CrossHostCaptureBytes <= 0 {
					t.Errorf("direct %d bytes, capture %d; want the capture sent directly", got.CrossHostDirectBytes, got.CrossHostCaptureBytes)
				}
				return
			}
			if got.CrossHostDirectBytes != 0 || got.CrossHostCaptureBytes <= 0 {
				t.Errorf("direct %d bytes, capture %d; want none direct, the capture through the store", got.CrossHostDirectBytes, got.CrossHostCaptureBytes)
			}
		})
	}
}

// TestFleetForkAcrossStoreDownDirect: with the object store down (or
// none at all), a capture that can go straight to the child's host still
// makes the fork.
func TestFleetForkAcrossStoreDownDirect(t *testing.T) {
	t.Parallel()
	t.Run("store down", func(t *testing.T) {
		e := newFleetEnv(t, true)
		parent := e.createOn("a")
		e.store.SetDown(true)
		got := e.forkTo(parent, 2)
		if _, _, waits := e.paths(); waits != 0 || got.CrossHostDirectBytes <= 0 {
			t.Errorf("%d waits for the store, %d bytes direct; want none, some", waits, got.CrossHostDirectBytes)
		}
	})
	t.Run("no store", func(t *testing.T) {
		e := newFleetEnv(t, false)
		parent := e.createOn("a")
		if got := e.forkTo(parent, 1); got.CrossHostDirectBytes <= 0 {
			t.Errorf("%d bytes direct, want some", got.CrossHostDirectBytes)
		}
	})
}

// addHost adds a ready host id to the fleet, sharing the store if there
// is one.
func (e *fleetEnv) addHost(id string) *hosttest.Host {
	h := hosttest.New()
	if e.store != nil {
		h.UseStore(e.store)
	}
	e.f.mu.Lock()
	defer e.f.mu.Unlock()
	e.f.hosts[id] = h
	e.f.state[id] = scheduler.Ready
	e.f.ids = append(e.f.ids, id)
	return h
}

// TestFleetForkAcrossDirectAndStore: a spread fork over three hosts where
// one of the two others cannot take the capture straight (it lacks the
// template) sends it direct to the one that can and through the object
// store to the other; with the store down, only the children of the host
// the capture could not reach fail.
func TestFleetForkAcrossDirectAndStore(t *testing.T) {
	t.Parallel()
	for _, storeDown := range []bool{false, true} {
		t.Run(fmt.Sprintf("store down %v", storeDown), func(t *testing.T) {
			e := newFleetEnv(t, true)
			c := e.addHost("c")
			parent := e.createOn("a")
			c.DropTemplate("base")
			if storeDown {
				e.store.SetDown(true)
			}
			got, err := e.p.Fork(t.Context(), e.key, parent, 3, scheduler.Placement{Spread: true}, "")
			if err != nil {
				t.Fatal(err)
			}
			failed := 0
			ran := map[string]int{}
			for _, ch := range got.Children {
				if ch.Err != nil {
					failed++
					continue
				}
				ran[ch.Sandbox.HostID]++
			}
			if ran["b"] != 1 {
				t.Errorf("children running per host %v, %d failed: want one on b", ran, failed)
			}
			if storeDown {
				if ran["c"] != 0 || failed != 1 {
					t.Errorf("children running per host %v, %d failed: want c's child failed (the store is down)", ran, failed)
				}
			} else if ran["c"] != 1 || failed != 0 {
				t.Errorf("children running per host %v, %d failed: want one on c, through the store", ran, failed)
			}
			if countCalls(c, hosttest.ReceiveSnapshot) == 0 {
				t.Errorf("host c was not offered the capture straight")
			}
			if countCalls(e.b, hosttest.ReceiveSnapshot) != 1 {
				t.Errorf("host b received %d packs, want 1", countCalls(e.b, hosttest.ReceiveSnapshot))
			}
			if countCalls(e.a, hosttest.AwaitStored) == 0 {
				t.Errorf("the parent's host was not asked to store the capture for c")
			}
			if got.CrossHostDirectBytes <= 0 {
				t.Errorf("direct %d bytes, want the pack to b", got.CrossHostDirectBytes)
			}
			for _, ch := range got.Children {
				if ch.Err == nil && ch.Sandbox.HostID == "c" {
					if info, ok := c.Sandbox(ch.Sandbox.ID); !ok || info.Snapshot == "" {
						t.Errorf("host c: child %s %+v, want restored from the parent's capture", ch.Sandbox.ID, info)
					}
				}
			}
			controlplane.SettleTails(e.p) // the captures are dropped after Fork returns
			for name, h := range map[string]*hosttest.Host{"a": e.a, "b": e.b, "c": c} {
				if snaps, _ := h.Snapshots(t.Context()); len(snaps) != 0 {
					t.Errorf("host %s keeps %d captures after the fork", name, len(snaps))
				}
			}
		})
	}
}

// countCalls counts h's calls of m.
func countCalls(h *hosttest.Host, m hosttest.Method) int {
	n := 0
	for _, c := range h.Calls() {
		if c.Method == m {
			n++
		}
	}
	return n
}

// TestFleetRestoreSnapshotElsewhere: a snapshot restored on another host
// than its own waits until it is durable in the object store, which the
// other host fetches it from; until then the create is refused as the
// store's trouble (503), not as an unknown snapshot, and leaves no record.
func TestFleetRestoreSnapshotElsewhere(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, true)
	sb := e.createOn("a")
	restoreOn := func(sn catalog.Snapshot, hostID string) (catalog.Sandbox, error) {
		return e.p.Create(t.Context(), e.key, controlplane.CreateRequest{SnapshotID: sn.ID, Placement: scheduler.Placement{Host: hostID}})
	}
	awaits := func() (n int) {
		for _, c := range e.a.Calls() {
			if c.Method == hosttest.AwaitStored {
				n++
			}
		}
		return n
	}

	sn, err := e.p.Snapshot(t.Context(), e.key, sb, "durable")
	if err != nil {
		t.Fatal(err)
	}
	child, err := restoreOn(sn, "b")
	if err != nil {
		t.Fatalf("restore on b: %v", err)
	}
	if info, ok := e.b.Sandbox(child.ID); child.HostID != "b" || !ok || info.Snapshot != sn.ID {
		t.Errorf("restored %+v (on b: %+v), want it on b from %s", child, info, sn.ID)
	}
	if n := awaits(); n != 1 {
		t.Errorf("host a was asked %d times whether the snapshot is durable, want once", n)
	}
	// On its own host, nothing waits for the store.
	if _, err := restoreOn(sn, "a"); err != nil {
		t.Fatalf("restore on a: %v", err)
	}
	if n := awaits(); n != 1 {
		t.Errorf("a restore on the snapshot's own host waited for the store (%d waits)", n)
	}

	// A snapshot its host no longer holds is looked for in the store.
	e.a.LoseSnapshot(sn.ID)
	if _, err := restoreOn(sn, "b"); err != nil {
		t.Errorf("restore on b of a snapshot only the store holds: %v", err)
	}

	e.store.SetDown(true)
	stuck, err := e.p.Snapshot(t.Context(), e.key, sb, "uploading")
	if err != nil {
		t.Fatal(err)
	}
	_, err = restoreOn(stuck, "b")
	wantKind(t, "restore elsewhere of a snapshot not in the store", err, controlplane.Unavailable, []string{"object store"})
	if live, _ := e.cat.ListSandboxes(t.Context(), catalog.SandboxFilter{States: controlplane.LiveStates}); len(live) != 4 {
		t.Errorf("%d live records after the refused restore, want 4", len(live))
	}
	if _, err := restoreOn(stuck, "a"); err != nil {
		t.Errorf("restore on the snapshot's own host with the store down: %v", err)
	}
}

// TestFleetRestoreSnapshotWithoutStore: hosts without an object store
// cannot restore each other's snapshots; the error says what to do.
func TestFleetRestoreSnapshotWithoutStore(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, false)
	sb := e.createOn("a")
	sn, err := e.p.Snapshot(t.Context(), e.key, sb, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.p.Create(t.Context(), e.key, controlplane.CreateRequest{SnapshotID: sn.ID, Placement: scheduler.Placement{Host: "b"}})
	wantKind(t, "restore elsewhere without a store", err, controlplane.Invalid, []string{"no object store", "restore it there"})
}

// TestFleetExpiryOnLostHost: at the end of its TTL, a sandbox of a lost
// host that asked to be killed is stopped; one that asked to be paused is
// left alone (no pause is even tried: it would flap its record) and is
// paused once its host is back.
func TestFleetExpiryOnLostHost(t *testing.T) {
	t.Parallel()
	clk := &clock{now: t0}
	tick := make(chan time.Time)
	e := newFleetEnv(t, true, func(c *controlplane.Config) { c.Now, c.Tick = clk.Now, tick })
	create := func(onExpire string) catalog.Sandbox {
		sb, err := e.p.Create(t.Context(), e.key, controlplane.CreateRequest{TTLSeconds: ptr(60), OnExpire: onExpire, Placement: scheduler.Placement{Host: "a"}})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	kill, pause := create("kill"), create("pause")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); e.p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	e.f.set("a", scheduler.Lost)
	now := clk.advance(61 * time.Second)
	// The kill of the lost one is recorded at once.
	for e.get(kill.ID).State != catalog.StateStopped {
		tick <- now
	}
	for range 20 { // a pause tried would have been recorded by now
		tick <- now
	}
	if got := e.get(pause.ID); got.State != catalog.StateRunning || got.LastError != "" {
		t.Errorf("the sandbox to pause is %s (last error %q) while its host is lost, want running untouched", got.State, got.LastError)
	}
	if n := e.a.CallsOf(hosttest.Pause, pause.ID); n != 0 {
		t.Errorf("host a was asked %d times to pause while lost", n)
	}

	e.f.set("a", scheduler.Ready)
	for e.get(pause.ID).State != catalog.StatePaused {
		tick <- now
	}
	if n := e.a.CallsOf(hosttest.Kill, pause.ID); n != 0 {
		t.Errorf("host a was asked %d times to kill the sandbox to pause", n)
	}
}

// TestFleetResumeOffDrainingHost: a resume without a placement of a
// sandbox paused on a draining host goes to another host (a drain empties
// its host), and stays on its own host when none other can take it or the
// capture cannot travel.
func TestFleetResumeOffDrainingHost(t *testing.T) {
	t.Parallel()
	resume := func(e *fleetEnv, wantHost string) {
		t.Helper()
		sb := e.createOn("a")
		if _, err := e.p.Pause(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
		e.f.set("a", scheduler.Draining)
		defer e.f.set("a", scheduler.Ready)
		got, err := e.p.ResumeOn(t.Context(), sb.ID, scheduler.Placement{})
		if err != nil {
			t.Fatalf("resume: %v", err)
		}
		if got.State != catalog.StateRunning || got.HostID != wantHost {
			t.Errorf("resumed: %s on %s, want running on %s", got.State, got.HostID, wantHost)
		}
		if _, onA := e.a.Sandbox(sb.ID); onA != (wantHost == "a") {
			t.Errorf("host a holds the sandbox: %v, want %v", onA, wantHost == "a")
		}
	}
	t.Run("to another host", func(t *testing.T) { resume(newFleetEnv(t, true), "b") })
	t.Run("no store: on its own host", func(t *testing.T) { resume(newFleetEnv(t, false), "a") })
	t.Run("no other host: on its own host", func(t *testing.T) {
		e := newFleetEnv(t, true)
		e.f.set("b", scheduler.Lost)
		resume(e, "a")
	})
}
