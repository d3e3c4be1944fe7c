package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/testing/hosttest"
)

// The TTL loop stops a running sandbox past its expiry, pauses one that
// asked for that, and leaves the others alone.
func TestExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	kill := e.create(controlplane.CreateRequest{TTLSeconds: ptr(60)})
	pause := e.create(controlplane.CreateRequest{TTLSeconds: ptr(60), OnExpire: "pause"})
	later := e.create(controlplane.CreateRequest{TTLSeconds: ptr(3600)})
	if !kill.ExpiresAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("expires at %v, want %v", kill.ExpiresAt, t0.Add(time.Minute))
	}
	stop := e.loop()

	// Not yet: a tick a second before the expiry does nothing (the second
	// tick is taken only once the first one's work is started).
	e.clock.advance(59 * time.Second)
	e.tick <- e.clock.Now()
	e.tick <- e.clock.Now()

	now := e.clock.advance(2 * time.Second)
	gk := e.h.Block(hosttest.Kill, kill.ID)
	gp := e.h.Block(hosttest.Pause, pause.ID)
	e.tick <- now
	<-gk.Reached()
	<-gp.Reached()
	gk.Release(nil)
	gp.Release(nil)
	stop()
	e.p.Shutdown(t.Context()) // waits for the detached pause

	sb := e.wantState(kill.ID, catalog.StateStopped, "expired")
	if !sb.StoppedAt.Equal(now) {
		t.Errorf("stopped at %v, want %v", sb.StoppedAt, now)
	}
	if _, ok := e.h.Sandbox(kill.ID); ok {
		t.Error("the host still has the expired sandbox")
	}
	if !e.wasGone(kill.ID) {
		t.Error("Gone was not told of the expired sandbox")
	}
	sb = e.wantState(pause.ID, catalog.StatePaused, "")
	if !sb.ExpiresAt.IsZero() {
		t.Errorf("a paused sandbox expires at %v; it must not expire", sb.ExpiresAt)
	}
	if info, _ := e.h.Sandbox(pause.ID); info.State != lifecycle.Paused {
		t.Errorf("on the host the expired sandbox is %s, want paused", info.State)
	}
	e.wantState(later.ID, catalog.StateRunning, "")
	if n := e.h.CallsOf(hosttest.Kill, later.ID) + e.h.CallsOf(hosttest.Pause, later.ID); n != 0 {
		t.Errorf("the host was asked %d times to end the sandbox not yet due", n)
	}
	if n := e.h.CallsOf(hosttest.Kill, kill.ID); n != 1 {
		t.Errorf("the host was asked %d times to kill the expired sandbox, want 1", n)
	}
}

// An expired sandbox that asked to be paused is not killed instead when
// its host cannot be reached (lost, or its agent restarting): it may run
// there still, and the pause is retried until the host answers.
func TestExpiryPauseWaitsForHost(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	sb := e.create(controlplane.CreateRequest{TTLSeconds: ptr(60), OnExpire: "pause"})
	stop := e.loop()
	now := e.clock.advance(61 * time.Second)
	g := e.h.Block(hosttest.Pause, sb.ID)
	e.tick <- now
	<-g.Reached()
	g.Release(fmt.Errorf("host h1 lost: %w", host.ErrUnavailable))
	// The next pause is only tried once the first expiry has returned (one
	// at a time per sandbox): reaching it means the first gave up.
	for again := e.h.Block(hosttest.Pause, sb.ID); ; {
		e.tick <- now
		select {
		case <-again.Reached():
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		default:
			if n := e.h.CallsOf(hosttest.Kill, sb.ID); n != 0 {
				t.Fatalf("the host was asked %d times to kill the sandbox whose pause could not reach it", n)
			}
			continue
		}
		again.Release(nil)
		break
	}
	stop()
	e.p.Shutdown(t.Context())
	e.wantState(sb.ID, catalog.StatePaused, "")
	if info, _ := e.h.Sandbox(sb.ID); info.State != lifecycle.Paused {
		t.Errorf("on the host the expired sandbox is %s, want paused", info.State)
	}
}

// A paused sandbox never expires.
func TestPausedDoesNotExpire(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	sb := e.create(controlplane.CreateRequest{TTLSeconds: ptr(60)})
	if _, err := e.p.Pause(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	stop := e.loop()
	e.tick <- e.clock.advance(time.Hour)
	e.tick <- e.clock.Now()
	stop()
	e.wantState(sb.ID, catalog.StatePaused, "")
	if n := e.h.CallsOf(hosttest.Kill, sb.ID); n != 0 {
		t.Errorf("a paused sandbox was killed %d times", n)
	}
}

// A sandbox that asked to be paused at expiry, whose pause fails, is
// stopped instead.
func TestExpiryPauseFailsKills(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	sb := e.create(controlplane.CreateRequest{TTLSeconds: ptr(60), OnExpire: "pause"})
	e.h.Fail(hosttest.Pause, sb.ID, fmt.Errorf("capture: %w", host.ErrNoSpace))
	g := e.h.Block(hosttest.Kill, sb.ID)
	stop := e.loop()
	e.tick <- e.clock.advance(time.Minute)
	<-g.Reached()
	g.Release(nil)
	stop()
	e.wantState(sb.ID, catalog.StateStopped, "expired")
	if n := e.h.CallsOf(hosttest.Pause, sb.ID); n != 1 {
		t.Errorf("%d pauses tried, want 1", n)
	}
	if _, ok := e.h.Sandbox(sb.ID); ok {
		t.Error("the host still has the sandbox")
	}
}

// A stop whose host cannot be reached leaves the record stopping with the
// reason it was given; the TTL loop finishes it once the host is back.
func TestStopRetriedByTheLoop(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	sb := e.create(controlplane.CreateRequest{TTLSeconds: ptr(60)})
	e.h.Fail(hosttest.Kill, sb.ID, fmt.Errorf("kill: %w", host.ErrUnavailable))
	err := e.p.Stop(t.Context(), sb.ID, "killed")
	wantKind(t, "stop with the host away", err, controlplane.Unavailable, nil)
	e.wantState(sb.ID, catalog.StateStopping, "killed")

	g := e.h.Block(hosttest.Kill, sb.ID)
	stop := e.loop()
	e.tick <- e.clock.advance(time.Minute)
	<-g.Reached()
	g.Release(nil)
	stop()
	// The stop's own reason, not "expired".
	e.wantState(sb.ID, catalog.StateStopped, "killed")
	if _, ok := e.h.Sandbox(sb.ID); ok {
		t.Error("the host still has the sandbox")
	}
}

// SetTTL counts a new TTL from now; a paused sandbox's from its resume; a
// stopped sandbox's is a conflict.
func TestSetTTL(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	sb := e.create(controlplane.CreateRequest{TTLSeconds: ptr(60)})
	now := e.clock.advance(30 * time.Second)
	got, err := e.p.SetTTL(t.Context(), sb.ID, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !got.ExpiresAt.Equal(now.Add(10*time.Minute)) || got.TTLSeconds != 600 {
		t.Errorf("after SetTTL: ttl %d s, expires %v; want 600 s, %v", got.TTLSeconds, got.ExpiresAt, now.Add(10*time.Minute))
	}
	if _, err := e.p.Pause(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ = e.p.SetTTL(t.Context(), sb.ID, time.Hour); !got.ExpiresAt.IsZero() {
		t.Errorf("a paused sandbox's new TTL expires at %v, want never until its resume", got.ExpiresAt)
	}
	now = e.clock.advance(time.Minute)
	if got, err = e.p.Resume(t.Context(), sb.ID); err != nil || !got.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Errorf("after resume: expires %v (%v), want %v", got.ExpiresAt, err, now.Add(time.Hour))
	}
	if err := e.p.Stop(t.Context(), sb.ID, "killed"); err != nil {
		t.Fatal(err)
	}
	_, err = e.p.SetTTL(t.Context(), sb.ID, time.Hour)
	wantKind(t, "SetTTL of a stopped sandbox", err, controlplane.Conflict, []string{"is stopped"})
}

// A stop whose host cannot be reached is finished by the TTL loop at its
// next tick, whatever the sandbox's expiry was: a paused sandbox (which
// never expires) or one with hours left.
func TestStopRetriedAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	paused := e.create(controlplane.CreateRequest{TTLSeconds: ptr(60)})
	if _, err := e.p.Pause(t.Context(), paused.ID); err != nil {
		t.Fatal(err)
	}
	running := e.create(controlplane.CreateRequest{TTLSeconds: ptr(3600)})
	for _, id := range []string{paused.ID, running.ID} {
		e.h.Fail(hosttest.Kill, id, fmt.Errorf("kill: %w", host.ErrUnavailable))
		err := e.p.Stop(t.Context(), id, "killed")
		wantKind(t, "stop with the host away", err, controlplane.Unavailable, nil)
		e.wantState(id, catalog.StateStopping, "killed")
	}
	stop := e.loop()
	e.tick <- e.clock.advance(time.Second)
	e.tick <- e.clock.Now()
	stop()
	for _, id := range []string{paused.ID, running.ID} {
		e.wantState(id, catalog.StateStopped, "killed")
		if _, ok := e.h.Sandbox(id); ok {
			t.Errorf("the host still has %s", id)
		}
	}
}

// A TTL is between 1 s and MaxTTL, however large the number asked for:
// one whose nanoseconds overflow is refused, not wrapped around.
func TestTTLBounds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *controlplane.Config) { c.MaxTTL = time.Hour })
	for _, tc := range []struct {
		seconds int
		want    time.Duration // 0: refused
	}{
		{1, time.Second},
		{3600, time.Hour},
		{3601, 0},
		{0, 0},
		{-5, 0},
		{10_000_000_000, 0}, // wraps to a negative duration
		{18_446_744_074, 0}, // wraps to 0.29 s
		{1 << 62, 0},
	} {
		got, err := e.p.TTL(&tc.seconds)
		if tc.want == 0 {
			wantKind(t, fmt.Sprintf("TTL(%d)", tc.seconds), err, controlplane.Invalid, []string{"between 1 and 3600"})
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("TTL(%d) = %v, %v; want %v", tc.seconds, got, err, tc.want)
		}
	}
	if got, err := e.p.TTL(nil); err != nil || got != 5*time.Minute {
		t.Errorf("TTL(nil) = %v, %v; want the default, 5m", got, err)
	}
}

// A TTL set while the sandbox starts is the one it runs with: its expiry
// agrees with its recorded TTL.
func TestSetTTLWhileStarting(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	g := e.h.Block(hosttest.Create, "")
	done := make(chan error)
	go func() {
		_, err := e.p.Create(context.Background(), e.key, controlplane.CreateRequest{TTLSeconds: ptr(60)})
		done <- err
	}()
	<-g.Reached()
	if _, err := e.p.SetTTL(t.Context(), g.ID(), time.Hour); err != nil {
		t.Fatal(err)
	}
	now := e.clock.advance(time.Second)
	g.Release(nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sb := e.wantState(g.ID(), catalog.StateRunning, "")
	if sb.TTLSeconds != 3600 || !sb.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Errorf("ttl %d s, expires %v; want 3600 s, %v", sb.TTLSeconds, sb.ExpiresAt, now.Add(time.Hour))
	}
}
