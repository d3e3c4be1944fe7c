package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
	"github.com/pandastack/pandastack/internal/testing/hosttest"
)

// testFleet is a Registry: hosts can be forgotten.
var _ controlplane.Registry = (*testFleet)(nil)

func (f *testFleet) Statuses() []controlplane.HostStatus {
	f.mu.Lock()
	hook := f.onStatuses
	f.onStatuses = nil
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []controlplane.HostStatus
	for _, id := range f.ids {
		out = append(out, controlplane.HostStatus{Record: catalog.Host{ID: id, State: string(f.state[id])}, Connected: true})
	}
	return out
}

func (f *testFleet) Forget(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.hosts[id]; !ok {
		return fmt.Errorf("host %s: %w", id, catalog.ErrNotFound)
	}
	delete(f.hosts, id)
	delete(f.state, id)
	f.ids = slices.DeleteFunc(f.ids, func(x string) bool { return x == id })
	return nil
}

func (f *testFleet) Classify(err error) error { return err }

// liveOn returns the live sandboxes the catalog places on host id.
func (e *fleetEnv) liveOn(id string) []catalog.Sandbox {
	e.t.Helper()
	live, err := e.cat.ListSandboxes(e.t.Context(), catalog.SandboxFilter{HostID: id, States: controlplane.LiveStates})
	if err != nil {
		e.t.Fatal(err)
	}
	return live
}

// ForgetHost refuses a host with live sandboxes (not a lost one), answers
// for an unknown one, and forgets an idle one.
func TestForgetHost(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, false)
	sb := e.createOn("b")
	err := e.p.ForgetHost(t.Context(), "b")
	wantKind(t, "forget a host with a sandbox", err, controlplane.Conflict, []string{"host b holds 1 live sandboxes", "drain it"})
	err = e.p.ForgetHost(t.Context(), "nope")
	wantKind(t, "forget an unknown host", err, controlplane.NotFound, []string{"host nope not found"})
	e.f.set("b", scheduler.Lost)
	if err := e.p.ForgetHost(t.Context(), "b"); err != nil {
		t.Fatalf("forget a lost host with a sandbox: %v", err)
	}
	if _, err := e.f.Host("b"); !errors.Is(err, controlplane.ErrUnknownHost) {
		t.Errorf("after forget, host b: %v, want unknown", err)
	}
	if got := e.get(sb.ID); got.HostID != "b" {
		t.Errorf("the lost host's sandbox: on %q, want its record kept (host b)", got.HostID)
	}
	if err := e.p.ForgetHost(t.Context(), "a"); err != nil {
		t.Fatalf("forget an idle host: %v", err)
	}

	one, err := controlplane.New(controlplane.Config{}, e.cat, hosttest.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Shutdown(context.Background()) })
	wantKind(t, "forget the one host", one.ForgetHost(t.Context(), "local"), controlplane.NotImplemented, []string{"one host"})
}

// A create placed on a host while it is being forgotten, after the
// forget found no sandbox on it (the check) and before the fleet drops
// it (the act), fails: it never leaves a sandbox on a forgotten host.
// Checking, then forgetting, without holding off placements, let it run
// there.
func TestForgetHostRacesCreate(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, false)
	var createErr error
	created := false
	e.f.mu.Lock()
	e.f.onStatuses = func() { // ForgetHost's, between its list and its Forget
		var sb catalog.Sandbox
		sb, createErr = e.p.Create(t.Context(), e.key, controlplane.CreateRequest{Template: "base", Placement: scheduler.Placement{Host: "b"}})
		created = createErr == nil && sb.HostID == "b"
	}
	e.f.mu.Unlock()
	forgetErr := e.p.ForgetHost(t.Context(), "b")
	onB, _ := e.b.List(context.Background())
	if forgetErr == nil && (created || len(e.liveOn("b")) > 0 || len(onB) > 0) {
		t.Fatalf("host b forgotten with a sandbox created on it meanwhile (create: %v, records %v)", createErr, e.liveOn("b"))
	}
	if forgetErr != nil {
		t.Fatalf("forget: %v; the host had no sandbox when it was asked", forgetErr)
	}
	wantKind(t, "a create on a host being forgotten", createErr, controlplane.Unavailable, []string{"host b is leaving the fleet"})
	// The create is refused, not lost: placed again, it goes elsewhere.
	if sb := e.createOn("a"); sb.State != catalog.StateRunning {
		t.Errorf("create after the forget: %s", sb.State)
	}
}

// A resume onto another host holds that host from before the host
// restores the sandbox until its record names the host: a forget in
// between is refused, and the sandbox ends up running on a host the
// fleet still has.
func TestForgetHostRacesResume(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, true)
	sb := e.createOn("a")
	if _, err := e.p.Pause(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	gate := e.b.Block(hosttest.Resume, sb.ID)
	type result struct {
		sb  catalog.Sandbox
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := e.p.ResumeOn(context.Background(), sb.ID, scheduler.Placement{Host: "b"})
		done <- result{got, err}
	}()
	<-gate.Reached()
	// The record still names host a: only the claim stands in the way.
	if live := e.liveOn("b"); len(live) != 0 {
		t.Fatalf("records on b while the resume runs: %v", live)
	}
	err := e.p.ForgetHost(t.Context(), "b")
	wantKind(t, "forget a host a resume is restoring on", err, controlplane.Conflict, []string{"being placed on it"})
	gate.Release(nil)
	r := <-done
	if r.err != nil || r.sb.HostID != "b" || r.sb.State != catalog.StateRunning {
		t.Fatalf("resume: %s on %s, %v; want running on b", r.sb.State, r.sb.HostID, r.err)
	}
	if _, err := e.f.Host("b"); err != nil {
		t.Errorf("host b after the refused forget: %v", err)
	}
	// Released: the host can go once it is empty.
	if err := e.p.Stop(t.Context(), sb.ID, "killed"); err != nil {
		t.Fatal(err)
	}
	if err := e.p.ForgetHost(t.Context(), "b"); err != nil {
		t.Errorf("forget host b, empty again: %v", err)
	}
}
