package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
	"github.com/pandastack/pandastack/internal/testing/hosttest"
)

// Pause and resume move the record and the host's sandbox together; each
// from the wrong state is a conflict naming the state.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.h.SetPausedBytes(3<<20 + 1)
	sb := e.create(controlplane.CreateRequest{TTLSeconds: ptr(60)})

	got, err := e.p.Pause(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != catalog.StatePaused || !got.ExpiresAt.IsZero() || got.PausedBytes != 3<<20+1 {
		t.Errorf("after pause: %s, expires %v, paused bytes %d; want paused, never, %d", got.State, got.ExpiresAt, got.PausedBytes, 3<<20+1)
	}
	if info, _ := e.h.Sandbox(sb.ID); info.State != lifecycle.Paused {
		t.Errorf("on the host: %s, want paused", info.State)
	}
	if !e.wasGone(sb.ID) {
		t.Error("Gone was not told that the paused sandbox's guest went away")
	}
	_, err = e.p.Pause(t.Context(), sb.ID)
	if ce := wantKind(t, "pause of a paused sandbox", err, controlplane.Conflict, nil); ce != nil {
		if want := fmt.Sprintf("sandbox %s is paused, not running", sb.ID); ce.Msg != want {
			t.Errorf("message %q, want %q", ce.Msg, want)
		}
	}
	if n := e.h.CallsOf(hosttest.Pause, sb.ID); n != 1 {
		t.Errorf("the host was asked to pause %d times, want 1", n)
	}

	now := e.clock.advance(time.Hour)
	got, err = e.p.Resume(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != catalog.StateRunning || !got.ExpiresAt.Equal(now.Add(time.Minute)) || got.PausedBytes != 0 {
		t.Errorf("after resume: %s, expires %v, paused bytes %d; want running, %v, 0", got.State, got.ExpiresAt, got.PausedBytes, now.Add(time.Minute))
	}
	_, err = e.p.Resume(t.Context(), sb.ID)
	if ce := wantKind(t, "resume of a running sandbox", err, controlplane.Conflict, nil); ce != nil {
		if want := fmt.Sprintf("sandbox %s is running, not paused", sb.ID); ce.Msg != want {
			t.Errorf("message %q, want %q", ce.Msg, want)
		}
	}
	if err := e.p.Stop(t.Context(), sb.ID, "killed"); err != nil {
		t.Fatal(err)
	}
	_, err = e.p.Pause(t.Context(), sb.ID)
	wantKind(t, "pause of a stopped sandbox", err, controlplane.Conflict, []string{"is stopped, not running"})
}

// A pause's capture counts against its key's disk quota while it is paused.
func TestPausedCaptureCountsAgainstDisk(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(k *catalog.Key) { k.MaxDiskMiB = 2048 + 10 })
	e.h.SetPausedBytes(20 << 20)
	sb := e.create(controlplane.CreateRequest{})
	if _, err := e.p.Pause(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	// 1024 (its disk) + 20 (its capture) + 1024 > 2058.
	_, err := e.p.Create(t.Context(), e.key, controlplane.CreateRequest{})
	wantKind(t, "create with a paused sandbox's capture held", err, controlplane.QuotaExceeded, []string{"disk quota exceeded"})
	if _, err := e.p.Resume(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Create(t.Context(), e.key, controlplane.CreateRequest{}); err != nil {
		t.Errorf("create once the capture is gone: %v", err)
	}
}

// Pause and resume run detached from the request: a client that goes away
// does not cancel them; a second request of the same kind joins the one in
// flight; another operation meanwhile is a conflict.
func TestPauseDetached(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	sb := e.create(controlplane.CreateRequest{})
	g := e.h.Block(hosttest.Pause, sb.ID)

	ctx, cancel := context.WithCancel(t.Context())
	first := make(chan error)
	go func() {
		_, err := e.p.Pause(ctx, sb.ID)
		first <- err
	}()
	<-g.Reached()
	e.wantState(sb.ID, catalog.StatePausing, "")
	cancel()
	err := <-first
	if !errors.Is(err, context.Canceled) {
		t.Errorf("pause whose client went away: %v, want context.Canceled", err)
	}
	wantKind(t, "pause whose client went away", err, controlplane.Canceled, nil)

	// A second pause joins the one in flight (a conflict would say it did
	// not); its client gone too, it returns while the pause goes on.
	gone, goneCancel := context.WithCancel(t.Context())
	goneCancel()
	_, err = e.p.Pause(gone, sb.ID)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("second pause: %v, want to join the first (context.Canceled)", err)
	}

	_, err = e.p.Resume(t.Context(), sb.ID)
	wantKind(t, "resume during a pause", err, controlplane.Conflict, []string{"busy: a pause is in progress"})
	_, err = e.p.Snapshot(t.Context(), e.key, sb, "s")
	wantKind(t, "snapshot during a pause", err, controlplane.Conflict, []string{"busy: a pause is in progress"})
	_, err = e.p.Fork(t.Context(), e.key, sb, 1, scheduler.Placement{}, "")
	wantKind(t, "fork during a pause", err, controlplane.Conflict, []string{"busy: a pause is in progress"})

	g.Release(nil)
	e.p.Shutdown(t.Context()) // waits for the pause, which the release let through
	e.wantState(sb.ID, catalog.StatePaused, "")
	if n := e.h.CallsOf(hosttest.Pause, sb.ID); n != 1 {
		t.Errorf("the host was asked to pause %d times, want 1 (the second request joins the first)", n)
	}
	if n := len(e.h.Calls()); n != 2 { // the create and the pause
		t.Errorf("the host had %d calls, want 2: the refused operations must not reach it", n)
	}
}

// A failed pause leaves the sandbox running, a failed resume leaves it
// paused with its capture; the record's last_error says why in words for
// users; a sandbox the host no longer has is recorded stopped.
func TestOperationFailures(t *testing.T) {
	t.Parallel()
	secret := "/var/lib/pandastack/store/sandboxes/x/paused.tmp/vm.mem"
	for _, tc := range []struct {
		name      string
		op        hosttest.Method
		err       error
		kind      controlplane.Kind
		state     string
		reason    string
		lastError string
		hostState lifecycle.State // "": the host has none
	}{
		{"pause out of space", hosttest.Pause, fmt.Errorf("write %s: %w", secret, host.ErrNoSpace), controlplane.NoSpace,
			catalog.StateRunning, "", "pause failed: the host is out of disk space for sandboxes; kill sandboxes or delete snapshots", lifecycle.Running},
		{"pause internal", hosttest.Pause, fmt.Errorf("pagemap %s: bad", secret), controlplane.Internal,
			catalog.StateRunning, "", "pause failed: internal error", lifecycle.Running},
		{"pause of a sandbox gone", hosttest.Pause, fmt.Errorf("pause: %w", host.ErrNotFound), controlplane.NotFound,
			catalog.StateStopped, "vmm_exited", "", ""},
		{"resume corrupt", hosttest.Resume, fmt.Errorf("resume x: %w: its saved memory or disk does not match its checksums", host.ErrCorrupt), controlplane.Corrupt,
			catalog.StatePaused, "", "resume failed: resume x: corrupt: its saved memory or disk does not match its checksums", lifecycle.Paused},
		{"resume internal", hosttest.Resume, fmt.Errorf("open %s: permission denied", secret), controlplane.Internal,
			catalog.StatePaused, "", "resume failed: internal error", lifecycle.Paused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			sb := e.create(controlplane.CreateRequest{})
			run := e.p.Pause
			if tc.op == hosttest.Resume {
				if _, err := e.p.Pause(t.Context(), sb.ID); err != nil {
					t.Fatal(err)
				}
				run = e.p.Resume
			}
			e.h.Fail(tc.op, sb.ID, tc.err)
			if tc.hostState == "" {
				e.h.Lose(sb.ID) // and the host says so
			}
			_, err := run(t.Context(), sb.ID)
			if !errors.Is(err, tc.err) {
				t.Errorf("%s: %v, want the host's error", tc.op, err)
			}
			wantKind(t, string(tc.op), err, tc.kind, nil, secret)
			got := e.wantState(sb.ID, tc.state, tc.reason)
			if got.LastError != tc.lastError {
				t.Errorf("last_error %q, want %q", got.LastError, tc.lastError)
			}
			info, ok := e.h.Sandbox(sb.ID)
			if ok != (tc.hostState != "") || info.State != tc.hostState {
				t.Errorf("on the host: %v %s, want %q", ok, info.State, tc.hostState)
			}
		})
	}
}

// A kill while a pause is in flight wins: the sandbox ends stopped with
// the kill's reason, and the pause fails.
func TestKillDuringPause(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	sb := e.create(controlplane.CreateRequest{})
	g := e.h.Block(hosttest.Pause, sb.ID)
	done := make(chan error)
	go func() {
		_, err := e.p.Pause(context.Background(), sb.ID)
		done <- err
	}()
	<-g.Reached()
	if err := e.p.Stop(t.Context(), sb.ID, "killed"); err != nil {
		t.Fatal(err)
	}
	g.Release(nil)
	err := <-done
	wantKind(t, "pause of a sandbox killed meanwhile", err, controlplane.NotFound, nil)
	got := e.wantState(sb.ID, catalog.StateStopped, "killed")
	if got.LastError != "" {
		t.Errorf("last_error %q, want none", got.LastError)
	}
}

// Shutdown cancels the operations in flight (a pause rolls back: the
// sandbox runs on), waits for them, and refuses later ones as unavailable
// without asking the host.
func TestShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	sb := e.create(controlplane.CreateRequest{})
	paused := e.create(controlplane.CreateRequest{})
	if _, err := e.p.Pause(t.Context(), paused.ID); err != nil {
		t.Fatal(err)
	}
	var got catalog.Sandbox
	resuming := e.create(controlplane.CreateRequest{})
	if _, err := e.p.Pause(t.Context(), resuming.ID); err != nil {
		t.Fatal(err)
	}
	g := e.h.Block(hosttest.Pause, sb.ID)
	done := make(chan error)
	go func() {
		_, err := e.p.Pause(context.Background(), sb.ID)
		done <- err
	}()
	gr := e.h.Block(hosttest.Resume, resuming.ID)
	resumed := make(chan error)
	go func() {
		_, err := e.p.Resume(context.Background(), resuming.ID)
		resumed <- err
	}()
	<-g.Reached()
	<-gr.Reached()
	e.p.Shutdown(t.Context())
	got = e.wantState(resuming.ID, catalog.StatePaused, "")
	if want := "resume failed: interrupted by a server shutdown; resume it again"; got.LastError != want {
		t.Errorf("last_error %q, want %q", got.LastError, want)
	}
	if err := <-resumed; !errors.Is(err, context.Canceled) {
		t.Errorf("resume cut by shutdown: %v, want context.Canceled", err)
	}
	// Shutdown has returned: the pause is over, its rollback recorded.
	got = e.wantState(sb.ID, catalog.StateRunning, "")
	// The user canceled nothing: the server shut down.
	if want := "pause failed: interrupted by a server shutdown; the sandbox runs on"; got.LastError != want {
		t.Errorf("last_error %q, want %q", got.LastError, want)
	}
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("pause cut by shutdown: %v, want context.Canceled", err)
	}
	if info, _ := e.h.Sandbox(sb.ID); info.State != lifecycle.Running {
		t.Errorf("on the host: %s, want running", info.State)
	}

	calls := len(e.h.Calls())
	for what, err := range map[string]error{
		"pause":  func() error { _, err := e.p.Pause(t.Context(), sb.ID); return err }(),
		"resume": func() error { _, err := e.p.Resume(t.Context(), paused.ID); return err }(),
		"snapshot": func() error {
			_, err := e.p.Snapshot(t.Context(), e.key, e.get(sb.ID), "s")
			return err
		}(),
		"fork": func() error {
			_, err := e.p.Fork(t.Context(), e.key, e.get(sb.ID), 1, scheduler.Placement{}, "")
			return err
		}(),
	} {
		wantKind(t, what+" after shutdown", err, controlplane.Unavailable, []string{"shutting down"})
	}
	if n := len(e.h.Calls()); n != calls {
		t.Errorf("operations after shutdown made %d host calls", n-calls)
	}
	if n := len(e.live(e.key.ID)); n != 3 {
		t.Errorf("%d live records after a refused fork, want 3 (no child reserved)", n)
	}
}

// A sandbox its host reports exited is recorded stopped, with the reason
// the cause gives, and Gone is told.
func TestSandboxExited(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	crashed := e.create(controlplane.CreateRequest{})
	shut := e.create(controlplane.CreateRequest{})
	paused := e.create(controlplane.CreateRequest{})
	if _, err := e.p.Pause(t.Context(), paused.ID); err != nil {
		t.Fatal(err)
	}
	now := e.clock.advance(time.Minute)
	e.h.Exit(crashed.ID, errors.New("qemu: signal 9"))
	e.h.Exit(shut.ID, fmt.Errorf("stop: %w", host.ErrHostShutdown))
	e.h.Exit(paused.ID, errors.New("capture removed"))
	e.h.Exit("nosuchsandbox", nil) // nothing to record, nothing breaks
	got := e.wantState(crashed.ID, catalog.StateStopped, "vmm_exited")
	if !got.StoppedAt.Equal(now) {
		t.Errorf("stopped at %v, want %v", got.StoppedAt, now)
	}
	e.wantState(shut.ID, catalog.StateStopped, "host_shutdown")
	if got := e.wantState(paused.ID, catalog.StateStopped, "vmm_exited"); got.PausedBytes != 0 {
		t.Errorf("a stopped sandbox holds %d paused bytes", got.PausedBytes)
	}
	if !e.wasGone(crashed.ID) || !e.wasGone(shut.ID) {
		t.Error("Gone was not told")
	}
	// A second report changes nothing.
	e.p.SandboxExited(shut.ID, errors.New("again"))
	e.wantState(shut.ID, catalog.StateStopped, "host_shutdown")

	// A kill under way (its host unreachable: the record stays stopping)
	// keeps its reason when the host then reports the sandbox gone.
	killed := e.create(controlplane.CreateRequest{})
	e.h.Fail(hosttest.Kill, killed.ID, fmt.Errorf("dial: %w", host.ErrUnavailable))
	if err := e.p.Stop(t.Context(), killed.ID, "killed"); err == nil {
		t.Fatal("Stop with its host unreachable: got no error")
	}
	e.wantState(killed.ID, catalog.StateStopping, "killed")
	e.h.Exit(killed.ID, fmt.Errorf("stop: %w", host.ErrHostShutdown))
	e.wantState(killed.ID, catalog.StateStopped, "killed")
}

// A snapshot is recorded for its key once its host has it; one the key's
// disk quota cannot hold is deleted from the host again.
func TestSnapshot(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(k *catalog.Key) { k.MaxDiskMiB = 1024 + 1 })
	sb := e.create(controlplane.CreateRequest{})
	sn, err := e.p.Snapshot(t.Context(), e.key, sb, "first")
	if err != nil {
		t.Fatal(err)
	}
	if sn.KeyID != e.key.ID || sn.SandboxID != sb.ID || sn.Name != "first" || sn.MemoryMiB != 512 || !e.h.HasSnapshot(sn.ID) {
		t.Errorf("snapshot %+v (on the host: %v)", sn, e.h.HasSnapshot(sn.ID))
	}
	// The host's snapshots are 1 MiB: a second one is over 1025 MiB.
	_, err = e.p.Snapshot(t.Context(), e.key, sb, "second")
	wantKind(t, "snapshot over the disk quota", err, controlplane.QuotaExceeded, []string{"disk quota exceeded"})
	recs, err := e.cat.ListSnapshots(t.Context(), e.key.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Errorf("%d snapshot records, want 1", len(recs))
	}
	snaps, _ := e.h.Snapshots(t.Context())
	if len(snaps) != 1 || snaps[0].ID != sn.ID {
		t.Errorf("the host holds %v, want only %s (the unrecorded one deleted)", snaps, sn.ID)
	}

	e.h.Fail(hosttest.Snapshot, sb.ID, fmt.Errorf("capture: %w", host.ErrNoSpace))
	_, err = e.p.Snapshot(t.Context(), e.key, sb, "third")
	wantKind(t, "snapshot out of space", err, controlplane.NoSpace, nil)

	// A delete the host already did (a reconcile finished it) is no error.
	if err := e.h.DeleteSnapshot(t.Context(), sn.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.p.DeleteSnapshot(t.Context(), sn.ID); err != nil {
		t.Errorf("delete: %v", err)
	}
	if _, err := e.cat.GetSnapshot(t.Context(), sn.ID); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("the record is left: %v", err)
	}
}

// A network policy is applied on the host first: if the host refuses it,
// the record keeps the old one.
func TestSetNetwork(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	sb := e.create(controlplane.CreateRequest{})
	deny := netpolicy.Policy{Internet: false, AllowOut: []string{"10.0.0.0/8"}}
	got, err := e.p.SetNetwork(t.Context(), sb, deny)
	if err != nil {
		t.Fatal(err)
	}
	if got.Network.Internet || len(got.Network.AllowOut) != 1 {
		t.Errorf("record's policy %+v, want %+v", got.Network, deny)
	}
	if np, _ := e.h.Network(sb.ID); np.Internet || len(np.AllowOut) != 1 {
		t.Errorf("host's policy %+v, want %+v", np, deny)
	}
	e.h.Fail(hosttest.SetNetwork, sb.ID, fmt.Errorf("nft: %w", host.ErrUnavailable))
	_, err = e.p.SetNetwork(t.Context(), got, netpolicy.Default())
	wantKind(t, "set network with the host away", err, controlplane.Unavailable, nil)
	if rec := e.get(sb.ID); rec.Network.Internet {
		t.Error("the record took a policy its host refused")
	}
	_, err = e.p.SetNetwork(t.Context(), got, netpolicy.Policy{AllowOut: []string{"not a cidr/99"}})
	wantKind(t, "set a bad policy", err, controlplane.BadRequest, []string{"not a cidr/99"})
}
