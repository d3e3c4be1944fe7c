package controlplane_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/testing/hosttest"
)

// setState puts a record in a state as a crash of an earlier server would
// have left it.
func (e *env) setState(id, state, reason string) catalog.Sandbox {
	e.t.Helper()
	sb, err := e.cat.UpdateSandbox(e.t.Context(), id, func(x *catalog.Sandbox) error {
		x.State, x.StopReason = state, reason
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return sb
}

// reserve records a sandbox starting on hostID, as a create a crash
// interrupted left it.
func (e *env) reserve(id, hostID string) {
	e.t.Helper()
	sb := catalog.Sandbox{ID: id, KeyID: e.key.ID, Template: "base", HostID: hostID, State: catalog.StateStarting,
		MemoryMiB: 512, VCPUs: 1, TTLSeconds: 60, OnExpire: "kill", CreatedAt: t0, UpdatedAt: t0}
	if err := e.cat.ReserveSandbox(e.t.Context(), sb, catalog.Limits{}); err != nil {
		e.t.Fatal(err)
	}
}

// Resync makes the catalog agree with what the host lists: the host is the
// truth about what exists and in which settled state.
func TestResync(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := t.Context()

	lost := e.create(controlplane.CreateRequest{})
	e.h.Lose(lost.ID)
	e.reserve("startinglost", "local")
	e.reserve("startingonhost", "local")
	e.h.Put(host.Info{ID: "startingonhost", State: lifecycle.Running})
	e.reserve("otherhost", "elsewhere")
	e.h.Put(host.Info{ID: "orphan", State: lifecycle.Running})
	stoppedRec := e.create(controlplane.CreateRequest{})
	e.setState(stoppedRec.ID, catalog.StateStopped, "killed") // a kill its host never got

	unchanged := e.create(controlplane.CreateRequest{})
	pausingRan := e.create(controlplane.CreateRequest{TTLSeconds: ptr(60)})
	e.setState(pausingRan.ID, catalog.StatePausing, "")
	pausingPaused := e.create(controlplane.CreateRequest{})
	e.setState(pausingPaused.ID, catalog.StatePausing, "")
	if _, err := e.h.Pause(ctx, pausingPaused.ID); err != nil {
		t.Fatal(err)
	}
	resumingPaused := e.create(controlplane.CreateRequest{})
	if _, err := e.p.Pause(ctx, resumingPaused.ID); err != nil {
		t.Fatal(err)
	}
	e.setState(resumingPaused.ID, catalog.StateResuming, "")
	resumingRan := e.create(controlplane.CreateRequest{TTLSeconds: ptr(120)})
	if _, err := e.p.Pause(ctx, resumingRan.ID); err != nil {
		t.Fatal(err)
	}
	e.setState(resumingRan.ID, catalog.StateResuming, "")
	if _, err := e.h.Resume(ctx, resumingRan.ID); err != nil {
		t.Fatal(err)
	}
	stopping := e.create(controlplane.CreateRequest{})
	e.setState(stopping.ID, catalog.StateStopping, "key_revoked")
	unsettled := e.create(controlplane.CreateRequest{})
	e.setState(unsettled.ID, catalog.StatePausing, "")
	e.h.Put(host.Info{ID: unsettled.ID, State: lifecycle.Pausing, Busy: true})

	// A create in flight in this server: busy, left alone although its
	// host does not have it yet.
	g := e.h.Block(hosttest.Create, "")
	created := make(chan error)
	go func() {
		_, err := e.p.Create(context.Background(), e.key, controlplane.CreateRequest{})
		created <- err
	}()
	<-g.Reached()

	now := e.clock.advance(time.Minute)
	if err := e.p.Resync(ctx, e.h.List); err != nil {
		t.Fatal(err)
	}

	e.wantState(lost.ID, catalog.StateStopped, "vmm_exited")
	e.wantState("startinglost", catalog.StateStopped, "host_restarted")
	e.wantState("startingonhost", catalog.StateStopped, "host_restarted")
	e.wantState("otherhost", catalog.StateStarting, "")
	e.wantState(stoppedRec.ID, catalog.StateStopped, "killed")
	for _, id := range []string{"startingonhost", "orphan", stoppedRec.ID, stopping.ID} {
		if _, ok := e.h.Sandbox(id); ok {
			t.Errorf("the host still has %s", id)
		}
		if n := e.h.CallsOf(hosttest.Kill, id); n != 1 {
			t.Errorf("%s: %d kills, want 1", id, n)
		}
	}
	if got := e.wantState(unchanged.ID, catalog.StateRunning, ""); !got.UpdatedAt.Equal(unchanged.UpdatedAt) {
		t.Errorf("a record that agreed with its host was rewritten")
	}
	got := e.wantState(pausingRan.ID, catalog.StateRunning, "")
	if got.LastError != "pause failed: interrupted by a restart; the sandbox runs on" || !got.ExpiresAt.Equal(pausingRan.ExpiresAt) {
		t.Errorf("pause rolled back by the host: last_error %q, expires %v; want the interruption said, expiry %v kept",
			got.LastError, got.ExpiresAt, pausingRan.ExpiresAt)
	}
	if got := e.wantState(pausingPaused.ID, catalog.StatePaused, ""); !got.ExpiresAt.IsZero() || got.LastError != "" {
		t.Errorf("pause finished by the host: expires %v, last_error %q; want never, none", got.ExpiresAt, got.LastError)
	}
	if got := e.wantState(resumingPaused.ID, catalog.StatePaused, ""); got.LastError != "resume failed: interrupted by a restart; resume it again" {
		t.Errorf("resume rolled back by the host: last_error %q", got.LastError)
	}
	if got := e.wantState(resumingRan.ID, catalog.StateRunning, ""); !got.ExpiresAt.Equal(now.Add(2*time.Minute)) || got.PausedBytes != 0 {
		t.Errorf("resume finished by the host: expires %v, paused bytes %d; want %v, 0", got.ExpiresAt, got.PausedBytes, now.Add(2*time.Minute))
	}
	e.wantState(stopping.ID, catalog.StateStopped, "key_revoked")
	e.wantState(unsettled.ID, catalog.StatePausing, "")
	e.wantState(g.ID(), catalog.StateStarting, "")

	g.Release(nil)
	if err := <-created; err != nil {
		t.Errorf("the create Resync left alone: %v", err)
	}
	e.wantState(g.ID(), catalog.StateRunning, "")
}

// A record Resync left because its host was in the middle of an operation
// is settled by the TTL loop once the host's operation ends.
func TestResyncAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	sb := e.create(controlplane.CreateRequest{})
	e.setState(sb.ID, catalog.StatePausing, "")
	e.h.Put(host.Info{ID: sb.ID, State: lifecycle.Pausing, Busy: true})
	if err := e.p.Resync(t.Context(), e.h.List); err != nil {
		t.Fatal(err)
	}
	e.wantState(sb.ID, catalog.StatePausing, "")

	e.h.Put(host.Info{ID: sb.ID, State: lifecycle.Paused}) // the host's pause ends
	stop := e.loop()
	// Not before a second has passed since the loop started.
	e.tick <- e.clock.Now()
	e.tick <- e.clock.Now()
	e.wantState(sb.ID, catalog.StatePausing, "")
	e.tick <- e.clock.advance(time.Second)
	e.tick <- e.clock.Now() // the first tick's resync is done
	stop()
	e.wantState(sb.ID, catalog.StatePaused, "")
}

// Reconcile after a restart of the all-in-one server: what the host did
// not adopt is gone.
func TestReconcile(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	kept := e.create(controlplane.CreateRequest{})
	notAdopted := e.create(controlplane.CreateRequest{})
	if err := e.p.Reconcile(t.Context(), []string{kept.ID, "ghost"}); err != nil {
		t.Fatal(err)
	}
	e.wantState(kept.ID, catalog.StateRunning, "")
	e.wantState(notAdopted.ID, catalog.StateStopped, "vmm_exited")
}

// Resync records a snapshot its host completed that the catalog never
// recorded, for the key that owns its sandbox, and forgets the record of
// one the host deleted.
func TestResyncSnapshots(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := t.Context()
	sb := e.create(controlplane.CreateRequest{})
	e.h.PutSnapshot(host.SnapshotInfo{ID: "unrecorded", SandboxID: sb.ID, Template: "base",
		Spec: host.Shape{MemoryMiB: 512, VCPUs: 1}, CreatedAt: t0, SizeBytes: 5 << 20})
	e.h.PutSnapshot(host.SnapshotInfo{ID: "noowner", SandboxID: "nosuchsandbox", CreatedAt: t0})
	if err := e.cat.CreateSnapshot(ctx, catalog.Snapshot{ID: "deleted", KeyID: e.key.ID, SandboxID: sb.ID, HostID: "local",
		Template: "base", MemoryMiB: 512, VCPUs: 1, CreatedAt: t0}, catalog.Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Resync(ctx, e.h.List); err != nil {
		t.Fatal(err)
	}
	sn, err := e.cat.GetSnapshot(ctx, "unrecorded")
	if err != nil {
		t.Fatalf("the host's unrecorded snapshot: %v", err)
	}
	if sn.KeyID != e.key.ID || sn.SandboxID != sb.ID || sn.MemoryMiB != 512 || sn.SizeBytes != 5<<20 {
		t.Errorf("recorded %+v", sn)
	}
	if _, err := e.cat.GetSnapshot(ctx, "deleted"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("the record of a snapshot the host deleted: %v, want it forgotten", err)
	}
	if _, err := e.cat.GetSnapshot(ctx, "noowner"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("a snapshot of no known sandbox: %v, want it left unrecorded", err)
	}
}

// A Resync whose host cannot list leaves every record as it was.
func TestResyncHostAway(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	sb := e.create(controlplane.CreateRequest{})
	e.h.Fail(hosttest.List, "", host.ErrUnavailable)
	if err := e.p.Resync(t.Context(), e.h.List); !errors.Is(err, host.ErrUnavailable) {
		t.Errorf("resync: %v, want ErrUnavailable", err)
	}
	e.wantState(sb.ID, catalog.StateRunning, "")
}
