package catalogtest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

func testSnapshots(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	createKey(t, c, newKey("key_b", t0))
	snaps := []catalog.Snapshot{
		{ID: "snap1", KeyID: "key_a", SandboxID: "sb1", Name: "après-ski 🎿", HostID: "h1", Template: "base",
			MemoryMiB: 2048, VCPUs: 2, SizeBytes: 5 << 30, CreatedAt: t0.Add(time.Second).In(elsewhere)},
		{ID: "snap2", KeyID: "key_b", SandboxID: "gone", HostID: "h2", Template: "tiny", MemoryMiB: 256, VCPUs: 1,
			SizeBytes: 1, CreatedAt: t0},
		{ID: "snap3", KeyID: "key_a", CreatedAt: t0},
	}
	for _, s := range snaps {
		if err := c.CreateSnapshot(ctx, s, catalog.Limits{}); err != nil {
			t.Fatalf("CreateSnapshot(%s): %v", s.ID, err)
		}
	}
	for _, s := range snaps {
		got, err := c.GetSnapshot(ctx, s.ID)
		if err != nil {
			t.Fatalf("GetSnapshot(%s): %v", s.ID, err)
		}
		if d := diff(got, stored(s)); d != "" {
			t.Errorf("GetSnapshot(%s): %s", s.ID, d)
		}
	}
	for _, tc := range []struct{ keyID, want string }{
		{"key_a", "snap3,snap1"},
		{"key_b", "snap2"},
		{"key_none", ""},
		{"", "snap2,snap3,snap1"},
	} {
		ss, err := c.ListSnapshots(ctx, tc.keyID)
		if err != nil {
			t.Errorf("ListSnapshots(%q): %v", tc.keyID, err)
		} else if got := strings.Join(ids(ss), ","); got != tc.want {
			t.Errorf("ListSnapshots(%q) = %s, want %s", tc.keyID, got, tc.want)
		}
	}

	if err := c.CreateSnapshot(ctx, catalog.Snapshot{ID: "snap1", KeyID: "key_b", CreatedAt: t0}, catalog.Limits{}); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("CreateSnapshot with a taken id: got %v, want ErrConflict", err)
	}
	if err := c.CreateSnapshot(ctx, catalog.Snapshot{ID: "snap9", KeyID: "key_none", CreatedAt: t0}, catalog.Limits{}); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("CreateSnapshot for an unknown key: got %v, want ErrNotFound", err)
	}
	if err := c.DeleteSnapshot(ctx, "snap1"); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	if _, err := c.GetSnapshot(ctx, "snap1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("GetSnapshot after DeleteSnapshot: got %v, want ErrNotFound", err)
	}
	if err := c.DeleteSnapshot(ctx, "snap1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("DeleteSnapshot twice: got %v, want ErrNotFound", err)
	}
	if ss, err := c.ListSnapshots(ctx, "key_a"); err != nil || strings.Join(ids(ss), ",") != "snap3" {
		t.Errorf("ListSnapshots(key_a) after a delete = %v, %v; want snap3", ids(ss), err)
	}
}
