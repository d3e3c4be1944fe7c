package catalogtest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

func testKeyRoundTrip(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	if n, err := c.CountKeys(ctx); err != nil || n != 0 {
		t.Fatalf("CountKeys on an empty catalog = %d, %v; want 0, nil", n, err)
	}
	keys := []catalog.Key{
		{ID: "key_admin000001", Name: "admin 🐼", Hash: strings.Repeat("ab", 32), Prefix: "ps_12345", Admin: true,
			MaxSandboxes: 100, MaxMemoryMiB: 65536, MaxVCPUs: 64, MaxDiskMiB: 1 << 20, CreatedAt: t0.In(elsewhere)},
		{ID: "key_user0000001", Name: "", Hash: strings.Repeat("cd", 32), Prefix: "ps_abcde", CreatedAt: t0.Add(time.Second)},
		{ID: "key_revoked0001", Name: "old", Hash: strings.Repeat("ef", 32), Prefix: "ps_zzzzz",
			CreatedAt: t0, RevokedAt: t0.Add(time.Hour).In(elsewhere)},
	}
	for _, k := range keys {
		createKey(t, c, k)
	}
	for _, k := range keys {
		want := stored(k)
		got, err := c.GetKey(ctx, k.ID)
		if err != nil {
			t.Fatalf("GetKey(%s): %v", k.ID, err)
		}
		if d := diff(got, want); d != "" {
			t.Errorf("GetKey(%s): %s", k.ID, d)
		}
		got, err = c.KeyByHash(ctx, k.Hash)
		if err != nil {
			t.Fatalf("KeyByHash(%s): %v", k.Hash, err)
		}
		if d := diff(got, want); d != "" {
			t.Errorf("KeyByHash(%s): %s", k.Hash, d)
		}
	}
	if n, err := c.CountKeys(ctx); err != nil || n != len(keys) {
		t.Errorf("CountKeys = %d, %v; want %d, nil", n, err, len(keys))
	}
}

func testKeyNotFound(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"GetKey", func() error { _, err := c.GetKey(ctx, "key_none"); return err }()},
		{"KeyByHash", func() error { _, err := c.KeyByHash(ctx, "hash-key_none"); return err }()},
		{"KeyByHash(id)", func() error { _, err := c.KeyByHash(ctx, "key_a"); return err }()},
		{"RevokeKey", c.RevokeKey(ctx, "key_none", t0)},
	} {
		if !errors.Is(tc.err, catalog.ErrNotFound) {
			t.Errorf("%s of an unknown key: got %v, want ErrNotFound", tc.name, tc.err)
		}
	}
}

func testKeyConflict(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	orig := newKey("key_a", t0)
	createKey(t, c, orig)
	for _, tc := range []struct {
		name string
		k    catalog.Key
	}{
		{"same id", catalog.Key{ID: "key_a", Hash: "other", CreatedAt: t0}},
		{"same hash", catalog.Key{ID: "key_b", Hash: orig.Hash, CreatedAt: t0}},
	} {
		if err := c.CreateKey(ctx, tc.k); !errors.Is(err, catalog.ErrConflict) {
			t.Errorf("CreateKey with the %s: got %v, want ErrConflict", tc.name, err)
		}
	}
	if got, err := c.GetKey(ctx, "key_a"); err != nil || diff(got, stored(orig)) != "" {
		t.Errorf("GetKey after conflicts = %+v, %v; want the original %+v", got, err, orig)
	}
	if n, err := c.CountKeys(ctx); err != nil || n != 1 {
		t.Errorf("CountKeys = %d, %v; want 1, nil", n, err)
	}
}

func testListKeys(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	if ks, err := c.ListKeys(ctx); err != nil || len(ks) != 0 {
		t.Fatalf("ListKeys on an empty catalog = %v, %v; want none", ks, err)
	}
	// Created out of order; key_a and key_B tie on time and sort by id,
	// bytewise (B < a), whatever the database's locale.
	createKey(t, c, newKey("key_c", t0.Add(time.Hour)))
	createKey(t, c, newKey("key_a", t0.Add(time.Minute)))
	createKey(t, c, newKey("key_d", t0.Add(2*time.Hour)))
	createKey(t, c, newKey("key_B", t0.Add(time.Minute)))
	if err := c.RevokeKey(ctx, "key_c", t0.Add(3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	ks, err := c.ListKeys(ctx)
	if err != nil {
		t.Fatalf("ListKeys: %v", err)
	}
	if got, want := strings.Join(ids(ks), ","), "key_B,key_a,key_c,key_d"; got != want {
		t.Errorf("ListKeys = %s, want %s (oldest first, revoked included)", got, want)
	}
}

func testRevokeKey(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	k := newKey("key_a", t0)
	createKey(t, c, k)
	createKey(t, c, newKey("key_b", t0))
	at := t0.Add(time.Hour)
	if err := c.RevokeKey(ctx, "key_a", at); err != nil {
		t.Fatalf("RevokeKey: %v", err)
	}
	// Revoking again succeeds and keeps the first time.
	if err := c.RevokeKey(ctx, "key_a", at.Add(time.Hour)); err != nil {
		t.Fatalf("RevokeKey again: %v", err)
	}
	want := stored(k)
	want.RevokedAt = at.Truncate(time.Microsecond)
	got, err := c.KeyByHash(ctx, k.Hash)
	if err != nil {
		t.Fatalf("KeyByHash of a revoked key: %v", err)
	}
	if d := diff(got, want); d != "" {
		t.Errorf("KeyByHash of a revoked key: %s", d)
	}
	if !got.Revoked() {
		t.Errorf("Revoked() = false after RevokeKey")
	}
	if b, err := c.GetKey(ctx, "key_b"); err != nil || b.Revoked() {
		t.Errorf("GetKey(key_b) = revoked %v, %v; want active (only key_a was revoked)", b.Revoked(), err)
	}
}
