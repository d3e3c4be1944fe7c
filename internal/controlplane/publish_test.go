package controlplane_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/events"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
	"github.com/pandastack/pandastack/internal/testing/hosttest"
)

// eventLine is an event as these tests compare them: type, id, and the
// state of a sandbox event.
func eventLine(ev events.Event) string {
	s := ev.Type + " " + ev.ID
	if sb, ok := ev.Data.(catalog.Sandbox); ok && ev.Type == controlplane.EventSandbox {
		s += " " + sb.State
	}
	return s
}

// take reads what sub has buffered.
func take(sub *events.Sub) []string {
	var out []string
	for {
		select {
		case ev, ok := <-sub.Events():
			if !ok {
				return out
			}
			out = append(out, eventLine(ev))
		default:
			return out
		}
	}
}

// Every record change the plane writes is published to its key's
// subscribers only, in order: create, TTL, pause, resume, fork, snapshot,
// kill, a failed create, a VMM exit; and a stopped sandbox loses its
// command history.
func TestEventsOfRecordChanges(t *testing.T) {
	t.Parallel()
	hub := events.New(nil)
	e := newEnv(t, func(c *controlplane.Config) { c.Events = hub })
	other := e.newKey("key_other")
	sub, _, err := hub.Subscribe(e.key.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	otherSub, _, _ := hub.Subscribe(other.ID, 0)
	ctx := t.Context()

	sb := e.create(controlplane.CreateRequest{})
	if _, err := e.p.SetTTL(ctx, sb.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	forked, err := e.p.Fork(ctx, e.key, e.get(sb.ID), 1, scheduler.Placement{}, "")
	if err != nil || len(forked.Children) != 1 || forked.Children[0].Sandbox == nil {
		t.Fatalf("fork: %+v %v", forked, err)
	}
	child := forked.Children[0].Sandbox.ID
	sn, err := e.p.Snapshot(ctx, e.key, e.get(sb.ID), "s")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.p.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	n := e.p.StartCommand(sb.ID, controlplane.CommandExec, "true", 0, 0)
	e.p.FinishCommand(sb.ID, n, ptr(0), "", 3)
	if err := e.p.Stop(ctx, sb.ID, "killed"); err != nil {
		t.Fatal(err)
	}
	if got := e.p.Commands(sb.ID); len(got) != 0 {
		t.Errorf("history of a stopped sandbox: %+v, want none", got)
	}
	e.h.Exit(child, errBoom)
	e.h.Fail(hosttest.Create, "", errBoom)
	if _, err := e.p.Create(ctx, e.key, controlplane.CreateRequest{}); err == nil {
		t.Fatal("create the host fails: no error")
	}

	got := take(sub)
	// The failed create's id is new: find it from its events.
	failed := ""
	if len(got) > 2 {
		failed = strings.Fields(got[len(got)-1])[1]
	}
	want := []string{
		"sandbox " + sb.ID + " starting",
		"sandbox " + sb.ID + " running",
		"sandbox " + sb.ID + " running", // TTL
		"sandbox " + sb.ID + " pausing",
		"sandbox " + sb.ID + " paused",
		"sandbox " + sb.ID + " resuming",
		"sandbox " + sb.ID + " running",
	}
	// The fork: the child reserved and started; the parent's record
	// is not written by a fork.
	want = append(want, "sandbox "+child+" starting", "sandbox "+child+" running")
	want = append(want, "snapshot "+sn.ID, "snapshot_deleted "+sn.ID)
	want = append(want, "sandbox "+sb.ID+" stopping", "sandbox_deleted "+sb.ID)
	want = append(want, "sandbox_deleted "+child)
	want = append(want, "sandbox "+failed+" starting", "sandbox_deleted "+failed)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if o := take(otherSub); len(o) != 0 {
		t.Errorf("another key's subscriber saw %v", o)
	}
}

func TestCommandHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	sb := e.create(controlplane.CreateRequest{})
	for i := 0; i < controlplane.MaxCommands+5; i++ {
		n := e.p.StartCommand(sb.ID, controlplane.CommandExec, fmt.Sprintf("echo %d", i), 0, 0)
		e.p.FinishCommand(sb.ID, n, ptr(i%2), "", -1)
	}
	p := e.p.StartCommand(sb.ID, controlplane.CommandProcess, "sleep 1", 42, 1000)
	got := e.p.Commands(sb.ID)
	if len(got) != controlplane.MaxCommands || got[0].Line != "echo 6" || got[len(got)-1].N != controlplane.MaxCommands+6 {
		t.Fatalf("history: %d entries, first %+v, last %+v; want %d from echo 6 to number %d", len(got), got[0], got[len(got)-1], controlplane.MaxCommands, controlplane.MaxCommands+6)
	}
	if c := got[0]; c.ExitCode == nil || *c.ExitCode != 0 || c.DurationMS == nil || c.FinishedAt.IsZero() {
		t.Errorf("finished exec: %+v", c)
	}
	if c := got[len(got)-1]; c.ExitCode != nil || c.DurationMS != nil || !c.FinishedAt.IsZero() || c.PID != 42 || c.Kind != controlplane.CommandProcess {
		t.Errorf("running process: %+v", c)
	}
	// Another process that reused the pid does not end this one.
	e.clock.advance(time.Hour)
	e.p.ProcessEnded(sb.ID, 42, 999, 1, "", 5)
	if c := e.p.Commands(sb.ID)[controlplane.MaxCommands-1]; c.ExitCode != nil {
		t.Errorf("ended by another process of the same pid: %+v", c)
	}
	e.p.ProcessEnded(sb.ID, 42, 1000, 3, "", 2000)
	e.p.ProcessEnded(sb.ID, 42, 1000, 4, "", 2000) // the first end stays
	ended := t0.Add(2 * time.Second)               // its start plus its duration
	c := e.p.Commands(sb.ID)[controlplane.MaxCommands-1]
	if c.N != p || c.ExitCode == nil || *c.ExitCode != 3 || !c.FinishedAt.Equal(ended) || *c.DurationMS != 2000 {
		t.Errorf("ended process: %+v", c)
	}
	if other := e.p.Commands("nosuch"); len(other) != 0 {
		t.Errorf("history of an unknown sandbox: %+v", other)
	}
}

func TestCommandLine(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", controlplane.MaxCommandLine) // 2 bytes each
	for _, tc := range []struct {
		shell string
		argv  []string
		want  string
	}{
		{"echo hi", nil, "echo hi"},
		{"", []string{"ls", "-l", "/tmp dir"}, "ls -l /tmp dir"},
		{long, nil, long[:controlplane.MaxCommandLine]},
		{"x" + long, nil, "x" + long[:controlplane.MaxCommandLine-2]},
		{"", []string{"a", long}, "a " + long[:controlplane.MaxCommandLine-2]},
	} {
		if got := controlplane.CommandLine(tc.shell, tc.argv); got != tc.want {
			t.Errorf("CommandLine(%.10q, %.10q): got %d bytes %.20q, want %d bytes", tc.shell, tc.argv, len(got), got, len(tc.want))
		}
	}
}

// A host lost or back republishes its live sandboxes to their keys (the
// API shows them as lost meanwhile), and nothing of other hosts.
func TestHostLostChangedRepublishes(t *testing.T) {
	t.Parallel()
	hub := events.New(nil)
	e := newEnv(t, func(c *controlplane.Config) { c.Events = hub })
	live := e.create(controlplane.CreateRequest{})
	gone := e.create(controlplane.CreateRequest{})
	if err := e.p.Stop(t.Context(), gone.ID, "killed"); err != nil {
		t.Fatal(err)
	}
	sub, _, err := hub.Subscribe(e.key.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	e.p.HostLostChanged(t.Context(), "another-host")
	if got := take(sub); len(got) != 0 {
		t.Errorf("another host lost: published %q, want nothing", got)
	}
	e.p.HostLostChanged(t.Context(), live.HostID)
	if got, want := take(sub), []string{"sandbox " + live.ID + " running"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("its host lost: published %q, want %q", got, want)
	}
}
