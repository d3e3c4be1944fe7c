package controlplane_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
	"github.com/pandastack/pandastack/internal/testing/hosttest"
)

// Each child of a fork has its own outcome: over the key's quota (not
// attempted), failed on the host (its reservation removed), or running.
func TestForkChildren(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(k *catalog.Key) { k.MaxSandboxes = 4 })
	parent := e.create(controlplane.CreateRequest{TTLSeconds: ptr(90), Metadata: map[string]string{"app": "x"}})
	// 3 children fit beside the parent; the host fails the second.
	secret := "/var/lib/pandastack/store/forks/abc/vm.mem"
	e.h.FailForkChild(1, fmt.Errorf("restore child: write %s: %w", secret, host.ErrNoSpace))
	now := e.clock.advance(time.Second)
	got, err := e.p.Fork(t.Context(), e.key, parent, 5, scheduler.Placement{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Children) != 5 {
		t.Fatalf("%d children, want 5", len(got.Children))
	}
	for i, c := range got.Children {
		switch i {
		case 0, 2:
			if c.Err != nil || c.Sandbox == nil {
				t.Errorf("child %d: %v, want running", i, c.Err)
				continue
			}
			sb := e.wantState(c.Sandbox.ID, catalog.StateRunning, "")
			if sb.ParentID != parent.ID || sb.Metadata["app"] != "x" || sb.TTLSeconds != 90 || !sb.ExpiresAt.Equal(now.Add(90*time.Second)) {
				t.Errorf("child %d: %+v, want the parent's metadata and TTL, expiring %v", i, sb, now.Add(90*time.Second))
			}
			if info, ok := e.h.Sandbox(c.Sandbox.ID); !ok || info.ParentID != parent.ID {
				t.Errorf("child %d on the host: %+v %v", i, info, ok)
			}
		case 1:
			if c.Sandbox != nil || c.Err == nil {
				t.Errorf("child 1: %v, %v; want the host's failure", c.Sandbox, c.Err)
				continue
			}
			wantKind(t, "child the host failed", c.Err, controlplane.NoSpace, []string{"out of disk space"}, secret)
		default:
			if c.Sandbox != nil || c.Err == nil {
				t.Errorf("child %d: %v, %v; want over the quota", i, c.Sandbox, c.Err)
				continue
			}
			wantKind(t, fmt.Sprintf("child %d over the quota", i), c.Err, controlplane.QuotaExceeded, []string{"4 of 4"}, "reserve sandbox")
		}
	}
	// The parent, two children; the failed child's reservation is gone
	// (no record in any state) and its slot free.
	if recs := e.records(e.key.ID); len(recs) != 3 {
		t.Errorf("%d records, want 3 (the parent and two children)", len(recs))
	}
	if n := e.hostCount(); n != 3 {
		t.Errorf("the host has %d sandboxes, want 3", n)
	}
	if _, err := e.p.Create(t.Context(), e.key, controlplane.CreateRequest{}); err != nil {
		t.Errorf("create into the failed child's slot: %v", err)
	}
	e.wantState(parent.ID, catalog.StateRunning, "")
}

// A fork that fails as a whole leaves no child reserved; one whose
// children all are over the quota never reaches the host.
func TestForkFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(k *catalog.Key) { k.MaxSandboxes = 3 })
	parent := e.create(controlplane.CreateRequest{})

	e.h.Fail(hosttest.Fork, parent.ID, fmt.Errorf("capture: %w", host.ErrConflict))
	_, err := e.p.Fork(t.Context(), e.key, parent, 2, scheduler.Placement{}, "")
	wantKind(t, "fork the host refused", err, controlplane.Conflict, nil)
	if recs := e.records(e.key.ID); len(recs) != 1 {
		t.Errorf("%d records after a failed fork, want 1 (the parent)", len(recs))
	}

	_, err = e.p.Fork(t.Context(), e.key, parent, 0, scheduler.Placement{}, "")
	wantKind(t, "fork of 0", err, controlplane.Invalid, []string{"count must be between 1 and 64"})
	_, err = e.p.Fork(t.Context(), e.key, parent, controlplane.MaxForkCount+1, scheduler.Placement{}, "")
	wantKind(t, "fork of too many", err, controlplane.Invalid, []string{"count must be between 1 and 64"})

	e.create(controlplane.CreateRequest{})
	e.create(controlplane.CreateRequest{})
	forks := e.h.CallsOf(hosttest.Fork, parent.ID)
	_, err = e.p.Fork(t.Context(), e.key, parent, 2, scheduler.Placement{}, "")
	if !errors.Is(err, catalog.ErrQuota) {
		t.Errorf("fork with no room: %v, want ErrQuota", err)
	}
	wantKind(t, "fork with no room", err, controlplane.QuotaExceeded, []string{"3 of 3"})
	if n := e.h.CallsOf(hosttest.Fork, parent.ID); n != forks {
		t.Error("a fork none of whose children fit reached the host")
	}

	// A paused parent: the host refuses, nothing is left reserved.
	e2 := newEnv(t, nil)
	p2 := e2.create(controlplane.CreateRequest{})
	if _, err := e2.p.Pause(t.Context(), p2.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e2.p.Fork(t.Context(), e2.key, e2.get(p2.ID), 1, scheduler.Placement{}, "")
	wantKind(t, "fork of a paused sandbox", err, controlplane.Conflict, nil)
	if recs := e2.records(e2.key.ID); len(recs) != 1 {
		t.Errorf("%d records after a refused fork, want 1", len(recs))
	}
}

// A child has its parent's egress policy on its host (the capture carries
// it), and its record says so: the record is what users see and what a
// partial network update starts from.
func TestForkChildNetwork(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	parent := e.create(controlplane.CreateRequest{Network: []byte(`{"internet": true, "deny_out": ["10.0.0.0/8"]}`)})
	got, err := e.p.Fork(t.Context(), e.key, parent, 1, scheduler.Placement{}, "")
	if err != nil {
		t.Fatal(err)
	}
	child := got.Children[0].Sandbox
	if child == nil {
		t.Fatalf("fork: %v", got.Children[0].Err)
	}
	onHost, _ := e.h.Network(child.ID)
	rec := e.get(child.ID).Network
	if !rec.Internet || len(rec.DenyOut) != 1 || rec.DenyOut[0] != "10.0.0.0/8" {
		t.Errorf("child's record has policy %+v, want its parent's %+v", rec, parent.Network)
	}
	if rec.Internet != onHost.Internet || len(rec.DenyOut) != len(onHost.DenyOut) {
		t.Errorf("child's record has policy %+v, its host %+v", rec, onHost)
	}
}
