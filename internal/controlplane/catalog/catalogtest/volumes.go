package catalogtest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

func newVolume(id, keyID, name string, sizeMiB int) catalog.Volume {
	return catalog.Volume{ID: id, KeyID: keyID, Name: name, HostID: "host1", SizeMiB: sizeMiB, CreatedAt: t0}
}

func createVolumes(t *testing.T, c catalog.Catalog, vs ...catalog.Volume) {
	t.Helper()
	if err := c.CreateVolumes(t.Context(), vs, catalog.Limits{}); err != nil {
		t.Fatalf("CreateVolumes: %v", err)
	}
}

func testVolumeRoundTrip(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	createKey(t, c, newKey("key_b", t0))
	full := catalog.Volume{ID: "vol_0123456789abcdef", KeyID: "key_a", Name: "data.v1_x-y", HostID: "host-7",
		SizeMiB: 1 << 20, UsedBytes: 5<<30 + 17, ParentID: "vol_fedcba9876543210", CreatedAt: t0.In(elsewhere)}
	later := newVolume("vol_b", "key_a", "b", 1)
	later.CreatedAt = t0.Add(time.Second)
	same := newVolume("vol_a", "key_a", "a", 1) // created with full: sorted by id
	same.CreatedAt = t0
	other := newVolume("vol_c", "key_b", "data.v1_x-y", 1)
	createVolumes(t, c, later, full)
	createVolumes(t, c, same)
	createVolumes(t, c, other)

	got, err := c.GetVolume(ctx, full.ID)
	if err != nil {
		t.Fatalf("GetVolume: %v", err)
	}
	if d := diff(got, stored(full)); d != "" {
		t.Errorf("GetVolume: %s", d)
	}
	got, err = c.VolumeByName(ctx, "key_a", full.Name)
	if err != nil || got.ID != full.ID {
		t.Errorf("VolumeByName(key_a, %s) = %s, %v; want %s", full.Name, got.ID, err, full.ID)
	}
	if got, err := c.VolumeByName(ctx, "key_b", full.Name); err != nil || got.ID != other.ID {
		t.Errorf("VolumeByName(key_b, %s) = %s, %v; want %s", full.Name, got.ID, err, other.ID)
	}
	if _, err := c.VolumeByName(ctx, "key_b", "a"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("VolumeByName of another key's volume: %v, want ErrNotFound", err)
	}
	for _, tc := range []struct {
		key  string
		want []string
	}{
		{"key_a", []string{"vol_0123456789abcdef", "vol_a", "vol_b"}},
		{"key_b", []string{"vol_c"}},
		{"", []string{"vol_0123456789abcdef", "vol_a", "vol_c", "vol_b"}},
		{"key_none", []string{}},
	} {
		vs, err := c.ListVolumes(ctx, tc.key)
		if err != nil || !slices.Equal(ids(vs), tc.want) {
			t.Errorf("ListVolumes(%q) = %v, %v; want %v", tc.key, ids(vs), err, tc.want)
		}
	}

	// UpdateVolume writes what fn changed; an error of fn writes nothing.
	upd, err := c.UpdateVolume(ctx, full.ID, catalog.Limits{}, func(v *catalog.Volume) error {
		v.UsedBytes, v.ParentID, v.SizeMiB = 42, "", v.SizeMiB+1
		return nil
	})
	if err != nil || upd.UsedBytes != 42 || upd.ParentID != "" || upd.SizeMiB != 1<<20+1 {
		t.Fatalf("UpdateVolume = %+v, %v", upd, err)
	}
	if got, _ := c.GetVolume(ctx, full.ID); diff(got, upd) != "" {
		t.Errorf("GetVolume after UpdateVolume: %s", diff(got, upd))
	}
	boom := errors.New("boom")
	if _, err := c.UpdateVolume(ctx, full.ID, catalog.Limits{}, func(v *catalog.Volume) error { v.UsedBytes = 7; return boom }); err != boom {
		t.Errorf("UpdateVolume with failing fn: %v, want fn's error unwrapped", err)
	}
	if _, err := c.UpdateVolume(ctx, full.ID, catalog.Limits{}, func(v *catalog.Volume) error { v.Name = "renamed"; return nil }); err == nil {
		t.Error("UpdateVolume that renames: nil error")
	}
	if got, _ := c.GetVolume(ctx, full.ID); got.UsedBytes != 42 || got.Name != full.Name {
		t.Errorf("after failed updates: %+v", got)
	}

	if err := c.DeleteVolume(ctx, full.ID); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	called := false
	for name, err := range map[string]error{
		"GetVolume":    func() error { _, err := c.GetVolume(ctx, full.ID); return err }(),
		"VolumeByName": func() error { _, err := c.VolumeByName(ctx, "key_a", full.Name); return err }(),
		"DeleteVolume": c.DeleteVolume(ctx, full.ID),
		"UpdateVolume": func() error {
			_, err := c.UpdateVolume(ctx, full.ID, catalog.Limits{}, func(*catalog.Volume) error { called = true; return nil })
			return err
		}(),
	} {
		if !errors.Is(err, catalog.ErrNotFound) {
			t.Errorf("%s of a deleted volume: %v, want ErrNotFound", name, err)
		}
	}
	if called {
		t.Error("UpdateVolume of a deleted volume called fn")
	}
	// Its name is free again.
	createVolumes(t, c, newVolume("vol_d", "key_a", full.Name, 1))
}

func testVolumeConflict(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	createKey(t, c, newKey("key_b", t0))
	revoked := newKey("key_r", t0)
	createKey(t, c, revoked)
	if err := c.RevokeKey(ctx, "key_r", t0); err != nil {
		t.Fatal(err)
	}
	createVolumes(t, c, newVolume("vol_a", "key_a", "data", 1))
	for _, tc := range []struct {
		name string
		vs   []catalog.Volume
		want error
	}{
		{"id taken", []catalog.Volume{newVolume("vol_a", "key_b", "x", 1)}, catalog.ErrConflict},
		{"name taken", []catalog.Volume{newVolume("vol_b", "key_a", "data", 1)}, catalog.ErrConflict},
		{"two of one name", []catalog.Volume{newVolume("vol_c", "key_a", "twin", 1), newVolume("vol_d", "key_a", "twin", 1)}, catalog.ErrConflict},
		{"unknown key", []catalog.Volume{newVolume("vol_e", "key_none", "data", 1)}, catalog.ErrNotFound},
		{"revoked key", []catalog.Volume{newVolume("vol_f", "key_r", "data", 1)}, catalog.ErrNotFound},
	} {
		if err := c.CreateVolumes(ctx, tc.vs, catalog.Limits{}); !errors.Is(err, tc.want) {
			t.Errorf("%s: CreateVolumes: %v, want %v", tc.name, err, tc.want)
		}
		// Nothing of a refused call is stored.
		for _, v := range tc.vs {
			if got, err := c.GetVolume(ctx, v.ID); err == nil && v.ID != "vol_a" {
				t.Errorf("%s: volume %s stored: %+v", tc.name, v.ID, got)
			}
		}
	}
	// Another key may use the name.
	createVolumes(t, c, newVolume("vol_g", "key_b", "data", 1))
}

// Volumes count towards the key's volume count and disk; so does a growth.
func testVolumeQuota(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	createKey(t, c, newKey("key_b", t0))
	sb := newSandbox("sb1", "key_a")
	sb.DiskMiB = 1000
	reserve(t, c, sb)
	if err := c.CreateSnapshot(ctx, catalog.Snapshot{ID: "snap1", KeyID: "key_a", SizeBytes: 100 << 20, CreatedAt: t0}, catalog.Limits{}); err != nil {
		t.Fatal(err)
	}
	createVolumes(t, c, newVolume("vol_1", "key_a", "one", 400))
	createVolumes(t, c, newVolume("vol_b1", "key_b", "big", 100000))
	// key_a holds 1 volume and 1000 + 100 + 400 = 1500 MiB.
	lim := catalog.Limits{DiskMiB: 2000, Volumes: 3}
	quota := func(name string, err error, limit string, used, requested int) {
		t.Helper()
		var qe *catalog.QuotaError
		if !errors.As(err, &qe) || !errors.Is(err, catalog.ErrQuota) || qe.Limit != limit || qe.Used != used || qe.Requested != requested || qe.KeyID != "key_a" {
			t.Errorf("%s: %v (%+v), want a %s QuotaError, %d used, %d requested", name, err, qe, limit, used, requested)
		}
	}
	// Over the disk limit, all or none.
	err := c.CreateVolumes(ctx, []catalog.Volume{newVolume("vol_2", "key_a", "two", 250), newVolume("vol_3", "key_a", "three", 251)}, lim)
	quota("two volumes over disk", err, catalog.QuotaDisk, 1500, 501)
	if _, err := c.GetVolume(ctx, "vol_2"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("volume of a refused CreateVolumes stored: %v", err)
	}
	if err := c.CreateVolumes(ctx, []catalog.Volume{newVolume("vol_2", "key_a", "two", 250), newVolume("vol_3", "key_a", "three", 250)}, lim); err != nil {
		t.Fatalf("CreateVolumes up to the disk limit: %v", err)
	}
	// key_a: 3 volumes, 2000 MiB. The count limit.
	err = c.CreateVolumes(ctx, []catalog.Volume{newVolume("vol_4", "key_a", "four", 1)}, catalog.Limits{Volumes: 3})
	quota("fourth volume", err, catalog.QuotaVolumes, 3, 1)
	if !errorSays(err, "3") {
		t.Errorf("error %q does not say the limit", err)
	}
	// Sandboxes and snapshots count the volumes' disk too.
	sb2 := newSandbox("sb2", "key_a")
	sb2.DiskMiB = 1
	quota("sandbox over disk", c.ReserveSandbox(ctx, sb2, lim), catalog.QuotaDisk, 2000, 1)
	err = c.CreateSnapshot(ctx, catalog.Snapshot{ID: "snap2", KeyID: "key_a", SizeBytes: 1, CreatedAt: t0}, lim)
	quota("snapshot over disk", err, catalog.QuotaDisk, 2000, 1)
	// Growing checks the disk; shrinking or other changes do not.
	_, err = c.UpdateVolume(ctx, "vol_1", lim, func(v *catalog.Volume) error { v.SizeMiB++; return nil })
	quota("growth over disk", err, catalog.QuotaDisk, 2000, 1)
	if v, _ := c.GetVolume(ctx, "vol_1"); v.SizeMiB != 400 {
		t.Errorf("refused growth written: size %d", v.SizeMiB)
	}
	tight := catalog.Limits{DiskMiB: 10, Volumes: 1}
	if _, err := c.UpdateVolume(ctx, "vol_1", tight, func(v *catalog.Volume) error { v.UsedBytes = 5; return nil }); err != nil {
		t.Errorf("UpdateVolume of used bytes over the limits: %v, want success (no growth)", err)
	}
	if err := c.DeleteVolume(ctx, "vol_3"); err != nil {
		t.Fatal(err)
	}
	if v, err := c.UpdateVolume(ctx, "vol_1", lim, func(v *catalog.Volume) error { v.SizeMiB += 250; return nil }); err != nil || v.SizeMiB != 650 {
		t.Errorf("growth within the limit after a delete: %+v, %v", v, err)
	}
	// A key that is not key_a is not limited by key_a's usage.
	if err := c.CreateVolumes(ctx, []catalog.Volume{newVolume("vol_b2", "key_b", "small", 1)}, catalog.Limits{DiskMiB: 100001, Volumes: 2}); err != nil {
		t.Errorf("other key: %v", err)
	}
}

func errorSays(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }

// Concurrent creates and growths of one key never take it over its
// limits.
func testVolumeQuotaConcurrent(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	ok, _ := reserveAtOnce(t, 20, func(i int) error {
		return c.CreateVolumes(ctx, []catalog.Volume{newVolume(fmt.Sprintf("vol_%02d", i), "key_a", fmt.Sprintf("v%02d", i), 10)},
			catalog.Limits{Volumes: 5})
	})
	if ok != 5 {
		t.Errorf("%d concurrent creates succeeded under a limit of 5 volumes", ok)
	}
	vs, err := c.ListVolumes(ctx, "key_a")
	if err != nil || len(vs) != 5 {
		t.Fatalf("ListVolumes: %d, %v; want 5", len(vs), err)
	}
	// 50 MiB held; growths of 10 MiB each (and sandboxes of 10 MiB) under
	// 100 MiB: five fit.
	lim := catalog.Limits{DiskMiB: 100}
	var mu sync.Mutex
	ok, _ = reserveAtOnce(t, 20, func(i int) error {
		if i%2 == 0 {
			sb := newSandbox(fmt.Sprintf("sb%02d", i), "key_a")
			sb.DiskMiB = 10
			return c.ReserveSandbox(ctx, sb, lim)
		}
		mu.Lock()
		id := vs[i%len(vs)].ID
		mu.Unlock()
		_, err := c.UpdateVolume(ctx, id, lim, func(v *catalog.Volume) error { v.SizeMiB += 10; return nil })
		return err
	})
	if ok != 5 {
		t.Errorf("%d concurrent growths and reservations succeeded, want 5", ok)
	}
	vs, _ = c.ListVolumes(ctx, "key_a")
	sbs, _ := c.ListSandboxes(ctx, catalog.SandboxFilter{KeyID: "key_a"})
	total := 0
	for _, v := range vs {
		total += v.SizeMiB
	}
	for _, sb := range sbs {
		total += sb.DiskMiB
	}
	if total != 100 {
		t.Errorf("key holds %d MiB after concurrent growths, want 100", total)
	}
}

// A sandbox's mounts are written by UpdateSandbox and cleared by it.
func testSandboxVolumesUpdate(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	sb := newSandbox("sb1", "key_a")
	reserve(t, c, sb)
	if got, _ := c.GetSandbox(ctx, "sb1"); got.Volumes != nil {
		t.Errorf("Volumes of a sandbox without = %#v, want nil", got.Volumes)
	}
	mounts := []catalog.VolumeMount{{VolumeID: "vol_x", Path: "/data", ReadOnly: true}}
	got, err := c.UpdateSandbox(ctx, "sb1", func(x *catalog.Sandbox) error { x.Volumes = mounts; return nil })
	if err != nil || !slices.Equal(got.Volumes, mounts) {
		t.Fatalf("UpdateSandbox = %+v, %v", got.Volumes, err)
	}
	if got, _ := c.GetSandbox(ctx, "sb1"); !slices.Equal(got.Volumes, mounts) {
		t.Errorf("GetSandbox.Volumes = %+v, want %+v", got.Volumes, mounts)
	}
	got, err = c.UpdateSandbox(ctx, "sb1", func(x *catalog.Sandbox) error { x.Volumes = []catalog.VolumeMount{}; return nil })
	if err != nil || got.Volumes != nil {
		t.Errorf("UpdateSandbox to none = %#v, %v; want nil", got.Volumes, err)
	}
}
