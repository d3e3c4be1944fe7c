package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/testing/hosttest"
)

// A key's quota (count, memory, vCPUs, disk; its own limit over the
// configured default) is checked at the reservation: the create over it
// never reaches the host, and a stop frees the slot.
func TestCreateQuota(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		cfg    func(*controlplane.Config)
		key    func(*catalog.Key)
		req    controlplane.CreateRequest
		fit    int    // creates that fit
		msg    string // what the refusal says
		figure string // and the numbers it names
	}{
		{"sandboxes, the key's own limit over the default", func(c *controlplane.Config) { c.MaxSandboxesPerKey = 10 },
			func(k *catalog.Key) { k.MaxSandboxes = 2 }, controlplane.CreateRequest{}, 2, "sandbox quota exceeded", "2 of 2"},
		{"sandboxes, the default", func(c *controlplane.Config) { c.MaxSandboxesPerKey = 1 }, nil, controlplane.CreateRequest{}, 1, "sandbox quota exceeded", "1 of 1"},
		{"memory", func(c *controlplane.Config) { c.MaxMemoryMiBPerKey = 1500 }, nil, controlplane.CreateRequest{MemoryMiB: 512}, 2, "memory quota exceeded", "limit of 1500 MiB"},
		{"vcpus", nil, func(k *catalog.Key) { k.MaxVCPUs = 5 }, controlplane.CreateRequest{VCPUs: 2}, 2, "vCPU quota exceeded", "limit of 5"},
		// base's disk is 1024 MiB (hosttest.New).
		{"disk", nil, func(k *catalog.Key) { k.MaxDiskMiB = 3000 }, controlplane.CreateRequest{}, 2, "disk quota exceeded", "limit of 3000 MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var kl []func(*catalog.Key)
			if tc.key != nil {
				kl = append(kl, tc.key)
			}
			e := newEnv(t, tc.cfg, kl...)
			var made []catalog.Sandbox
			for range tc.fit {
				made = append(made, e.create(tc.req))
			}
			_, err := e.p.Create(t.Context(), e.key, tc.req)
			if !errors.Is(err, catalog.ErrQuota) {
				t.Fatalf("create over the quota: %v, want ErrQuota", err)
			}
			wantKind(t, "create over the quota", err, controlplane.QuotaExceeded, []string{tc.msg, tc.figure}, "reserve sandbox")
			if got := len(e.live(e.key.ID)); got != tc.fit {
				t.Errorf("%d live records, want %d", got, tc.fit)
			}
			if got := len(e.h.Calls()); got != tc.fit {
				t.Errorf("the host had %d calls, want %d (the refused create must not reach it)", got, tc.fit)
			}
			// Another key has a quota of its own.
			if _, err := e.p.Create(t.Context(), e.newKey("key_other"), tc.req); err != nil {
				t.Errorf("another key's create: %v", err)
			}
			if err := e.p.Stop(t.Context(), made[0].ID, "killed"); err != nil {
				t.Fatal(err)
			}
			if _, err := e.p.Create(t.Context(), e.key, tc.req); err != nil {
				t.Errorf("create after a stop freed a slot: %v", err)
			}
		})
	}
}

// A create the host fails leaves no record and no reservation, and users
// see the failure's kind, never its internal text.
func TestCreateHostFailureRollsBack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err    error
		kind   controlplane.Kind
		has    string
		hasNot string
	}{
		{fmt.Errorf("restore: write /var/lib/pandastack/store/sandboxes/x/rootfs.ext4: %w", host.ErrNoSpace), controlplane.NoSpace, "out of disk space", "/var/lib"},
		{fmt.Errorf("start vmm: %w", vmm.ErrExhausted), controlplane.Unavailable, "no room", "start vmm"},
		{fmt.Errorf("create: %w", host.ErrUnavailable), controlplane.Unavailable, "unavailable", ""},
		{fmt.Errorf("qemu /usr/bin/qemu-system-x86_64 exited: status 1"), controlplane.Internal, "internal error", "qemu"},
		{fmt.Errorf("hello: %w", context.DeadlineExceeded), controlplane.Timeout, "timed out", "hello"},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			e := newEnv(t, func(c *controlplane.Config) { c.MaxSandboxesPerKey = 1 })
			e.h.Fail(hosttest.Create, "", tc.err)
			_, err := e.p.Create(t.Context(), e.key, controlplane.CreateRequest{})
			if !errors.Is(err, tc.err) {
				t.Errorf("create: %v, want the host's error", err)
			}
			var hasNot []string
			if tc.hasNot != "" {
				hasNot = append(hasNot, tc.hasNot)
			}
			wantKind(t, "create", err, tc.kind, []string{tc.has}, hasNot...)
			if recs := e.records(e.key.ID); len(recs) != 0 {
				t.Errorf("a failed create left records: %+v", recs)
			}
			if n := e.hostCount(); n != 0 {
				t.Errorf("the host has %d sandboxes, want 0", n)
			}
			// The reservation is gone: the only slot is free.
			sb, err := e.p.Create(t.Context(), e.key, controlplane.CreateRequest{})
			if err != nil {
				t.Fatalf("create after a failed one: %v", err)
			}
			if sb.State != catalog.StateRunning {
				t.Errorf("state %s, want running", sb.State)
			}
		})
	}
}

// A create records the sandbox running, its TTL counted from when the host
// restored it, and passes the host what it asked for.
func TestCreate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	g := e.h.Block(hosttest.Create, "")
	type result struct {
		sb  catalog.Sandbox
		err error
	}
	done := make(chan result)
	go func() {
		sb, err := e.p.Create(context.Background(), e.key, controlplane.CreateRequest{TTLSeconds: ptr(60), MemoryMiB: 1024, VCPUs: 2,
			Metadata: map[string]string{"a": "b"}, Env: map[string]string{"X": "1"}})
		done <- result{sb, err}
	}()
	<-g.Reached()
	// Reserved while the host restores it: starting, counted.
	starting := e.wantState(g.ID(), catalog.StateStarting, "")
	if starting.MemoryMiB != 1024 || starting.VCPUs != 2 || starting.DiskMiB != 1024 || starting.HostID != "local" {
		t.Errorf("reservation %+v, want 1024 MiB, 2 vCPUs, 1024 MiB disk on host local", starting)
	}
	restored := e.clock.advance(3 * time.Second)
	g.Release(nil)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.sb.ID != g.ID() || r.sb.State != catalog.StateRunning || !r.sb.ExpiresAt.Equal(restored.Add(time.Minute)) {
		t.Errorf("created %s %s expiring %v, want %s running expiring %v", r.sb.ID, r.sb.State, r.sb.ExpiresAt, g.ID(), restored.Add(time.Minute))
	}
	info, ok := e.h.Sandbox(r.sb.ID)
	if !ok || info.MemoryMiB != 1024 || info.VCPUs != 2 || info.Template != "base" {
		t.Errorf("on the host: %+v (%v)", info, ok)
	}
	if np, _ := e.h.Network(r.sb.ID); !np.Internet {
		t.Errorf("host network policy %+v, want the default (internet)", np)
	}
}

// A kill that arrives while the host restores the sandbox wins: the create
// fails with a conflict and the host's sandbox is stopped too.
func TestCreateKilledWhileStarting(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	g := e.h.Block(hosttest.Create, "")
	done := make(chan error)
	go func() {
		_, err := e.p.Create(context.Background(), e.key, controlplane.CreateRequest{})
		done <- err
	}()
	<-g.Reached()
	if err := e.p.Stop(t.Context(), g.ID(), "killed"); err != nil {
		t.Fatalf("stop while starting: %v", err)
	}
	g.Release(nil)
	err := <-done
	wantKind(t, "create killed while starting", err, controlplane.Conflict, []string{"was killed while it was starting"})
	e.wantState(g.ID(), catalog.StateStopped, "killed")
	if _, ok := e.h.Sandbox(g.ID()); ok {
		t.Error("the host still has the sandbox killed while it started")
	}
}

// Requests that cannot be served are refused before anything is reserved
// or asked of the host, with a message that says what is wrong.
func TestCreateRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *controlplane.Config) { c.MaxTTL = time.Hour })
	other := e.newKey("key_other")
	if err := e.cat.CreateSnapshot(t.Context(), catalog.Snapshot{ID: "othersnap", KeyID: other.ID, HostID: "local", Template: "base",
		MemoryMiB: 512, VCPUs: 1, CreatedAt: t0}, catalog.Limits{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  controlplane.CreateRequest
		kind controlplane.Kind
		has  string
	}{
		{"ttl too long", controlplane.CreateRequest{TTLSeconds: ptr(3601)}, controlplane.Invalid, "ttl_seconds must be between 1 and 3600"},
		{"ttl zero", controlplane.CreateRequest{TTLSeconds: ptr(0)}, controlplane.Invalid, "ttl_seconds"},
		{"on_expire", controlplane.CreateRequest{OnExpire: "sleep"}, controlplane.Invalid, "on_expire"},
		{"env name", controlplane.CreateRequest{Env: map[string]string{"A=B": "c"}}, controlplane.Invalid, "must not contain '='"},
		{"unknown template", controlplane.CreateRequest{Template: "nope"}, controlplane.NotFound, `template "nope" not found`},
		{"memory", controlplane.CreateRequest{MemoryMiB: 64}, controlplane.Invalid, "memory_mib 64"},
		{"another key's snapshot", controlplane.CreateRequest{SnapshotID: "othersnap"}, controlplane.NotFound, "snapshot othersnap not found"},
		{"network", controlplane.CreateRequest{Network: []byte(`{"allow_out": ["not a cidr/99"]}`)}, controlplane.BadRequest, "not a cidr/99"},
	} {
		_, err := e.p.Create(t.Context(), e.key, tc.req)
		wantKind(t, tc.name, err, tc.kind, []string{tc.has})
	}
	if recs := e.records(e.key.ID); len(recs) != 0 {
		t.Errorf("refused creates left records: %+v", recs)
	}
	if calls := e.h.Calls(); len(calls) != 0 {
		t.Errorf("refused creates reached the host: %v", calls)
	}
}

// A sandbox restored from a snapshot has the snapshot's template and shape;
// asking for another is invalid, and a snapshot of another key or of no
// valid id is not found.
func TestCreateFromSnapshot(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	from := e.create(controlplane.CreateRequest{MemoryMiB: 1024, VCPUs: 2})
	sn, err := e.p.Snapshot(t.Context(), e.key, from, "s")
	if err != nil {
		t.Fatal(err)
	}
	sb := e.create(controlplane.CreateRequest{SnapshotID: sn.ID})
	if sb.SnapshotID != sn.ID || sb.Template != "base" || sb.MemoryMiB != 1024 || sb.VCPUs != 2 || sb.DiskMiB != 1024 {
		t.Errorf("restored %+v, want base at 1024 MiB, 2 vCPUs, 1024 MiB disk from %s", sb, sn.ID)
	}
	if info, _ := e.h.Sandbox(sb.ID); info.Snapshot != sn.ID {
		t.Errorf("the host restored %q, want snapshot %s", info.Snapshot, sn.ID)
	}
	_, err = e.p.Create(t.Context(), e.key, controlplane.CreateRequest{SnapshotID: sn.ID, MemoryMiB: 512})
	wantKind(t, "snapshot with another shape", err, controlplane.Invalid, []string{"the snapshot's template (base), memory (1024 MiB) and vcpus (2)"})
	_, err = e.p.Create(t.Context(), e.newKey("key_other"), controlplane.CreateRequest{SnapshotID: sn.ID})
	wantKind(t, "another key's snapshot", err, controlplane.NotFound, []string{"snapshot " + sn.ID + " not found"})
	_, err = e.p.Create(t.Context(), e.key, controlplane.CreateRequest{SnapshotID: "Not-An-Id"})
	wantKind(t, "a snapshot id of the wrong form", err, controlplane.NotFound, []string{"not found"})
}

// A user template is created from the version ResolveTemplate picks, which
// the record keeps; its refusal is what users see.
func TestCreateResolvesTemplate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *controlplane.Config) {
		c.ResolveTemplate = func(_ context.Context, key catalog.Key, name string) (string, error) {
			if name == "web" {
				return "web:3", nil
			}
			if name == "private" {
				return "", controlplane.Errorf(controlplane.NotFound, "template %q not found", name)
			}
			return name, nil
		}
	})
	e.h.AddTemplate("web:3", 2048)
	sb := e.create(controlplane.CreateRequest{Template: "web"})
	if info, _ := e.h.Sandbox(sb.ID); sb.Template != "web:3" || info.Template != "web:3" || sb.DiskMiB != 2048 {
		t.Errorf("record %s (disk %d MiB), host %s; want web:3 with its 2048 MiB disk", sb.Template, sb.DiskMiB, info.Template)
	}
	_, err := e.p.Create(t.Context(), e.key, controlplane.CreateRequest{Template: "private"})
	wantKind(t, "a template ResolveTemplate refuses", err, controlplane.NotFound, []string{`template "private" not found`})
}
