package catalogtest

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

func testSandboxRoundTrip(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	full := catalog.Sandbox{
		ID: "k3v9q2m8x7c1b5n4z6a0", KeyID: "key_a", Template: "base", HostID: "host-1",
		State: catalog.StatePaused, StopReason: "host_restarted", LastError: "resume failed: 🐼 \"quoted\"",
		MemoryMiB: 2048, VCPUs: 4, DiskMiB: 4096, PausedBytes: 5<<30 + 17,
		Network: catalog.Network{Internet: true, AllowOut: []string{"10.1.0.0/16", "*.pypi.org"}, DenyOut: []string{"evil.example", "é.test"}},
		Metadata: map[string]string{
			"emoji": "🐼 panda", "中文键": "值", "quote\"back\\slash": "line\nbreak\ttab",
			"a.b": "dotted key", "$.x": "path-like", "rtl": "שלום", "empty": "", "<html>&": "<script>",
		},
		Env:        map[string]string{"PATH": "/usr/bin:/bin", "GREETING": "héllo wörld ✓", "JSON": `{"a":[1,2]}`},
		TTLSeconds: 86400, OnExpire: "pause", ParentID: "parent1", SnapshotID: "snap1",
		CreatedAt: t0.In(elsewhere), UpdatedAt: t0.Add(time.Second), ExpiresAt: t0.Add(24 * time.Hour).In(elsewhere),
		StoppedAt: t0.Add(2 * time.Second),
		Volumes: []catalog.VolumeMount{{VolumeID: "vol_aaaaaaaaaaaaaaaa", Path: "/mnt/data"},
			{VolumeID: "vol_bbbbbbbbbbbbbbbb", Path: "/srv/dé jà", ReadOnly: true}},
	}
	minimal := catalog.Sandbox{ID: "minimal", KeyID: "key_a", CreatedAt: t0}
	for _, sb := range []catalog.Sandbox{full, minimal} {
		reserve(t, c, sb)
		got, err := c.GetSandbox(ctx, sb.ID)
		if err != nil {
			t.Fatalf("GetSandbox(%s): %v", sb.ID, err)
		}
		if d := diff(got, stored(sb)); d != "" {
			t.Errorf("GetSandbox(%s): %s", sb.ID, d)
		}
		if got.Metadata == nil || got.Env == nil {
			t.Errorf("GetSandbox(%s): Metadata %v, Env %v; want non-nil maps", sb.ID, got.Metadata, got.Env)
		}
	}
}

func testSandboxNotFound(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	reserve(t, c, newSandbox("other", "key_a"))
	called := false
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"GetSandbox", func() error { _, err := c.GetSandbox(ctx, "none"); return err }()},
		{"DeleteSandbox", c.DeleteSandbox(ctx, "none")},
		{"UpdateSandbox", func() error {
			_, err := c.UpdateSandbox(ctx, "none", func(*catalog.Sandbox) error { called = true; return nil })
			return err
		}()},
	} {
		if !errors.Is(tc.err, catalog.ErrNotFound) {
			t.Errorf("%s of an unknown sandbox: got %v, want ErrNotFound", tc.name, tc.err)
		}
	}
	if called {
		t.Errorf("UpdateSandbox of an unknown sandbox called fn")
	}
}

func testReserveConflict(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	createKey(t, c, newKey("key_b", t0))
	orig := newSandbox("sb1", "key_a")
	reserve(t, c, orig)
	for _, keyID := range []string{"key_a", "key_b"} {
		dup := newSandbox("sb1", keyID)
		dup.Template = "tiny"
		if err := c.ReserveSandbox(ctx, dup, catalog.Limits{}); !errors.Is(err, catalog.ErrConflict) {
			t.Errorf("ReserveSandbox with a taken id (key %s): got %v, want ErrConflict", keyID, err)
		}
	}
	if got, err := c.GetSandbox(ctx, "sb1"); err != nil || diff(got, stored(orig)) != "" {
		t.Errorf("GetSandbox after conflicts = %+v, %v; want the original", got, err)
	}
}

func testReserveUnknownKey(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_revoked", t0))
	if err := c.RevokeKey(ctx, "key_revoked", t0); err != nil {
		t.Fatal(err)
	}
	for _, keyID := range []string{"key_none", "key_revoked"} {
		if err := c.ReserveSandbox(ctx, newSandbox("sb_"+keyID, keyID), catalog.Limits{}); !errors.Is(err, catalog.ErrNotFound) {
			t.Errorf("ReserveSandbox for %s: got %v, want ErrNotFound", keyID, err)
		}
		if _, err := c.GetSandbox(ctx, "sb_"+keyID); !errors.Is(err, catalog.ErrNotFound) {
			t.Errorf("GetSandbox after a refused reservation for %s: got %v, want ErrNotFound", keyID, err)
		}
	}
}

func testReserveConcurrent(t *testing.T, c catalog.Catalog) {
	tests := []struct {
		name             string
		maxCount, maxMem int
		want             int
	}{
		{"count", 10, 0, 10},
		{"memory", 0, 4096, 8}, // 512 MiB each
	}
	const callers = 30
	for _, tc := range tests {
		keyID := "key_" + tc.name
		createKey(t, c, newKey(keyID, t0))
		ok, quota := reserveAtOnce(t, callers, func(i int) error {
			return c.ReserveSandbox(t.Context(), newSandbox(fmt.Sprintf("%s%02d", tc.name, i), keyID), catalog.Limits{Sandboxes: tc.maxCount, MemoryMiB: tc.maxMem})
		})
		if ok != tc.want || quota != callers-tc.want {
			t.Errorf("%s: %d reservations succeeded and %d hit the quota, want %d and %d",
				tc.name, ok, quota, tc.want, callers-tc.want)
		}
		sbs, err := c.ListSandboxes(t.Context(), catalog.SandboxFilter{KeyID: keyID})
		if err != nil {
			t.Fatal(err)
		}
		if len(sbs) != tc.want {
			t.Errorf("%s: %d sandboxes stored, want %d", tc.name, len(sbs), tc.want)
		}
	}
}

// reserveAtOnce calls reserve(0) to reserve(callers-1) from as many
// goroutines released together and returns how many succeeded and how many
// hit a quota. Any other error fails the test.
func reserveAtOnce(t *testing.T, callers int, reserve func(i int) error) (ok, quota int) {
	t.Helper()
	start := make(chan struct{})
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			errs[i] = reserve(i)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, catalog.ErrQuota):
			quota++
		default:
			t.Errorf("caller %d: %v, want nil or ErrQuota", i, err)
		}
	}
	return ok, quota
}

func testListSandboxes(t *testing.T, c catalog.Catalog) {
	createKey(t, c, newKey("key_a", t0))
	createKey(t, c, newKey("key_b", t0))
	mk := func(id, keyID, state, host string, created time.Duration, md map[string]string) catalog.Sandbox {
		sb := newSandbox(id, keyID)
		sb.State, sb.HostID, sb.CreatedAt, sb.Metadata = state, host, t0.Add(created), md
		return sb
	}
	// Stored out of order; s1 and s4 tie on time and sort by id.
	reserve(t, c,
		mk("s3", "key_a", "stopped", "h1", 3*time.Second, map[string]string{"env": "dev"}),
		mk("s1", "key_a", "running", "h1", time.Second, map[string]string{"env": "prod", "team": "🐼"}),
		mk("s5", "key_b", "starting", "h2", 0, nil),
		mk("s4", "key_b", "running", "h1", time.Second, map[string]string{"env": "prod", "team": "🐼", "x": "y"}),
		mk("s2", "key_a", "paused", "h2", 2*time.Second, map[string]string{"env": "prod", "note": ""}),
	)
	tests := []struct {
		name string
		f    catalog.SandboxFilter
		want string
	}{
		{"all", catalog.SandboxFilter{}, "s5,s1,s4,s2,s3"},
		{"key", catalog.SandboxFilter{KeyID: "key_a"}, "s1,s2,s3"},
		{"unknown key", catalog.SandboxFilter{KeyID: "key_none"}, ""},
		{"one state", catalog.SandboxFilter{States: []string{"running"}}, "s1,s4"},
		{"not stopped", catalog.SandboxFilter{States: []string{"starting", "running", "paused"}}, "s5,s1,s4,s2"},
		{"metadata", catalog.SandboxFilter{Metadata: map[string]string{"env": "prod"}}, "s1,s4,s2"},
		{"metadata, all pairs", catalog.SandboxFilter{Metadata: map[string]string{"env": "prod", "team": "🐼"}}, "s1,s4"},
		{"metadata, wrong value", catalog.SandboxFilter{Metadata: map[string]string{"env": "staging"}}, ""},
		{"metadata, missing key", catalog.SandboxFilter{Metadata: map[string]string{"team": "🐼", "owner": "x"}}, ""},
		{"metadata, empty value", catalog.SandboxFilter{Metadata: map[string]string{"note": ""}}, "s2"},
		{"host", catalog.SandboxFilter{HostID: "h2"}, "s5,s2"},
		{"everything", catalog.SandboxFilter{KeyID: "key_a", States: []string{"running", "stopped"}, HostID: "h1"}, "s1,s3"},
		{"everything, metadata", catalog.SandboxFilter{KeyID: "key_b", States: []string{"running"}, HostID: "h1",
			Metadata: map[string]string{"x": "y"}}, "s4"},
	}
	for _, tc := range tests {
		sbs, err := c.ListSandboxes(t.Context(), tc.f)
		if err != nil {
			t.Errorf("%s: ListSandboxes: %v", tc.name, err)
			continue
		}
		if got := strings.Join(ids(sbs), ","); got != tc.want {
			t.Errorf("%s: ListSandboxes(%+v) = %q, want %q", tc.name, tc.f, got, tc.want)
		}
	}
	// Listed sandboxes are complete records.
	sbs, err := c.ListSandboxes(t.Context(), catalog.SandboxFilter{KeyID: "key_b", States: []string{"starting"}})
	if err != nil || len(sbs) != 1 {
		t.Fatalf("ListSandboxes = %v, %v; want s5", sbs, err)
	}
	if d := diff(sbs[0], stored(mk("s5", "key_b", "starting", "h2", 0, nil))); d != "" {
		t.Errorf("listed s5: %s", d)
	}
}

func testUpdateSandbox(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	orig := newSandbox("sb1", "key_a")
	orig.ExpiresAt = t0.Add(time.Minute)
	orig.Metadata = map[string]string{"a": "1"}
	reserve(t, c, orig)

	errFn := errors.New("state changed under us")
	if _, err := c.UpdateSandbox(ctx, "sb1", func(sb *catalog.Sandbox) error {
		sb.State = catalog.StateStopped
		return errFn
	}); !errors.Is(err, errFn) {
		t.Errorf("UpdateSandbox with a failing fn: got %v, want fn's error", err)
	}
	if _, err := c.UpdateSandbox(ctx, "sb1", func(sb *catalog.Sandbox) error {
		sb.ID = "sb2"
		return nil
	}); err == nil {
		t.Errorf("UpdateSandbox changing the id succeeded")
	}
	if got, err := c.GetSandbox(ctx, "sb1"); err != nil || diff(got, stored(orig)) != "" {
		t.Fatalf("GetSandbox after aborted updates = %+v, %v; want it unchanged: %s", got, err, diff(got, stored(orig)))
	}

	want := stored(orig)
	want.State, want.StopReason = catalog.StateStopped, "killed"
	want.StoppedAt, want.UpdatedAt = t0.Add(time.Hour).Truncate(time.Microsecond), t0.Add(time.Hour).Truncate(time.Microsecond)
	want.ExpiresAt = time.Time{}
	want.Metadata = map[string]string{"a": "1", "b": "ü"}
	want.Env = map[string]string{"K": "V"}
	want.HostID = "host2"
	got, err := c.UpdateSandbox(ctx, "sb1", func(sb *catalog.Sandbox) error {
		if d := diff(*sb, stored(orig)); d != "" {
			t.Errorf("fn got %s", d)
		}
		sb.State, sb.StopReason = catalog.StateStopped, "killed"
		sb.StoppedAt, sb.UpdatedAt = t0.Add(time.Hour).In(elsewhere), t0.Add(time.Hour)
		sb.ExpiresAt = time.Time{}
		sb.Metadata["b"] = "ü"
		sb.Env = map[string]string{"K": "V"}
		sb.HostID = "host2"
		return nil
	})
	if err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	if d := diff(got, want); d != "" {
		t.Errorf("UpdateSandbox returned %s", d)
	}
	if got, err := c.GetSandbox(ctx, "sb1"); err != nil || diff(got, want) != "" {
		t.Errorf("GetSandbox after UpdateSandbox: %v %s", err, diff(got, want))
	}
}

func testUpdateSandboxConcurrent(t *testing.T, c catalog.Catalog) {
	createKey(t, c, newKey("key_a", t0))
	reserve(t, c, newSandbox("sb1", "key_a"))
	const writers = 20
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			<-start
			_, err := c.UpdateSandbox(t.Context(), "sb1", func(sb *catalog.Sandbox) error {
				n, _ := strconv.Atoi(sb.Metadata["n"])
				sb.Metadata["n"] = strconv.Itoa(n + 1)
				return nil
			})
			if err != nil {
				t.Errorf("UpdateSandbox: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	sb, err := c.GetSandbox(t.Context(), "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sb.Metadata["n"], strconv.Itoa(writers); got != want {
		t.Errorf("counter after %d concurrent increments = %s, want %s", writers, got, want)
	}
}

func testDeleteSandbox(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	reserve(t, c, newSandbox("sb1", "key_a"), newSandbox("sb2", "key_a"))
	if err := c.DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	if _, err := c.GetSandbox(ctx, "sb1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("GetSandbox after DeleteSandbox: got %v, want ErrNotFound", err)
	}
	if err := c.DeleteSandbox(ctx, "sb1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("DeleteSandbox twice: got %v, want ErrNotFound", err)
	}
	if _, err := c.GetSandbox(ctx, "sb2"); err != nil {
		t.Errorf("GetSandbox of the other sandbox: %v", err)
	}
	// A deleted sandbox frees its quota.
	if err := c.ReserveSandbox(ctx, newSandbox("sb3", "key_a"), catalog.Limits{Sandboxes: 2}); err != nil {
		t.Errorf("ReserveSandbox after a delete: %v", err)
	}
}

func testDue(t *testing.T, c catalog.Catalog) {
	createKey(t, c, newKey("key_a", t0))
	now := t0
	mk := func(id, state string, expires time.Time) catalog.Sandbox {
		sb := newSandbox(id, "key_a")
		sb.State, sb.ExpiresAt = state, expires
		return sb
	}
	reserve(t, c,
		mk("d1", "running", now.Add(-time.Second)),
		mk("d2", "running", now.Add(-10*time.Second).In(elsewhere)),
		mk("d3", "running", now), // exactly now is due
		mk("d4", "stopped", now.Add(-20*time.Second)),
		mk("d5", "running", time.Time{}),
		mk("d6", "paused", now.Add(time.Second)),
		mk("d7", "paused", now.Add(-5*time.Second)),
		mk("d8", "starting", now.Add(-10*time.Second)), // ties with d2
		mk("d9", "running", now.Add(time.Microsecond)),
	)
	sbs, err := c.Due(t.Context(), now)
	if err != nil {
		t.Fatalf("Due: %v", err)
	}
	if got, want := strings.Join(ids(sbs), ","), "d2,d8,d7,d1,d3"; got != want {
		t.Errorf("Due = %s, want %s", got, want)
	}
	if sbs, err := c.Due(t.Context(), now.Add(-time.Hour)); err != nil || len(sbs) != 0 {
		t.Errorf("Due an hour earlier = %v, %v; want none", ids(sbs), err)
	}
}

func testPurgeStopped(t *testing.T, c catalog.Catalog) {
	createKey(t, c, newKey("key_a", t0))
	before := t0
	mk := func(id, state string, stopped time.Time) catalog.Sandbox {
		sb := newSandbox(id, "key_a")
		sb.State, sb.StoppedAt = state, stopped
		return sb
	}
	reserve(t, c,
		mk("p1", "stopped", before.Add(-time.Hour)),
		mk("p2", "stopped", before), // not strictly before
		mk("p3", "stopped", time.Time{}),
		mk("p4", "running", before.Add(-time.Hour)),
		mk("p5", "stopped", before.Add(-time.Microsecond)),
	)
	n, err := c.PurgeStopped(t.Context(), before)
	if err != nil || n != 2 {
		t.Errorf("PurgeStopped = %d, %v; want 2, nil", n, err)
	}
	sbs, err := c.ListSandboxes(t.Context(), catalog.SandboxFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(ids(sbs), ","), "p2,p3,p4"; got != want {
		t.Errorf("left after PurgeStopped: %s, want %s", got, want)
	}
	if n, err := c.PurgeStopped(t.Context(), before); err != nil || n != 0 {
		t.Errorf("PurgeStopped again = %d, %v; want 0, nil", n, err)
	}
}
