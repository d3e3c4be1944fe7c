// Package catalogtest is the conformance suite of catalog.Catalog: every
// implementation's tests call Run, so the stores cannot drift apart.
package catalogtest

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Run runs the suite. open must return a new, empty catalog each time it is
// called (it may register its own cleanups with t); Run closes it.
func Run(t *testing.T, open func(t *testing.T) catalog.Catalog) {
	tests := []struct {
		name string
		fn   func(*testing.T, catalog.Catalog)
	}{
		{"KeyRoundTrip", testKeyRoundTrip},
		{"KeyNotFound", testKeyNotFound},
		{"KeyConflict", testKeyConflict},
		{"ListKeys", testListKeys},
		{"RevokeKey", testRevokeKey},
		{"SandboxRoundTrip", testSandboxRoundTrip},
		{"SandboxNotFound", testSandboxNotFound},
		{"ReserveConflict", testReserveConflict},
		{"ReserveUnknownKey", testReserveUnknownKey},
		{"Quota", testQuota},
		{"ReserveConcurrent", testReserveConcurrent},
		{"QuotaVCPUsAndDisk", testQuotaVCPUsAndDisk},
		{"ListSandboxes", testListSandboxes},
		{"UpdateSandbox", testUpdateSandbox},
		{"UpdateSandboxConcurrent", testUpdateSandboxConcurrent},
		{"DeleteSandbox", testDeleteSandbox},
		{"Due", testDue},
		{"PurgeStopped", testPurgeStopped},
		{"Snapshots", testSnapshots},
		{"Hosts", testHosts},
		{"Templates", testTemplates},
		{"TemplatePublished", testTemplatePublished},
		{"TemplateQuotaConcurrent", testTemplateQuotaConcurrent},
		{"CloseTwice", testCloseTwice},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := open(t)
			t.Cleanup(func() {
				if err := c.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tc.fn(t, c)
		})
	}
}

// Shared checks what must hold across several catalogs open on one store
// at once, as control-plane processes or replicas have them: many
// reservations for one key, spread over every catalog, never take it over
// its quota, and each catalog sees every sandbox the others stored. cats
// share one empty store; Shared does not close them.
func Shared(t *testing.T, cats []catalog.Catalog) {
	createKey(t, cats[0], newKey("key_a", t0))
	const limit = 10
	ok, _ := reserveAtOnce(t, 40, func(i int) error {
		return cats[i%len(cats)].ReserveSandbox(t.Context(), newSandbox(fmt.Sprintf("sb%02d", i), "key_a"), catalog.Limits{Sandboxes: limit})
	})
	if ok != limit {
		t.Errorf("%d reservations across %d catalogs succeeded, want %d", ok, len(cats), limit)
	}
	for i, c := range cats {
		sbs, err := c.ListSandboxes(t.Context(), catalog.SandboxFilter{KeyID: "key_a"})
		if err != nil || len(sbs) != limit {
			t.Errorf("catalog %d lists %d sandboxes (%v), want %d", i, len(sbs), err, limit)
		}
	}
}

// NewerSchema checks that a program refuses a store migrated by a newer
// one rather than running against a schema it does not know. open opens
// the store (the same, initially empty, one each time); addVersion records
// a schema version in the store's schema_migrations table.
func NewerSchema[C catalog.Catalog](t *testing.T, open func() (C, error), addVersion func(version int) error) {
	c, err := open()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := addVersion(9999); err != nil {
		t.Fatal(err)
	}
	c, err = open()
	if err == nil {
		c.Close()
		t.Fatal("Open of a store with a newer schema succeeded")
	}
	if !strings.Contains(err.Error(), "9999") {
		t.Errorf("Open: %v; want it to name the newer version", err)
	}
}

// LegacyPublic checks that a template row written before versions were
// published one by one, whose doc says "public": true (every version,
// later ones too), reads as its latest version published, and that a
// version recorded after it is not. insert writes the row of template
// "old" (owner key_a, versions 1 and 2) with doc as it is.
func LegacyPublic(t *testing.T, c catalog.Catalog, insert func(doc string) error) {
	ctx := t.Context()
	doc := `{"public":true,"last_version":3,"versions":[{"version":1,"info":{"a":1}},{"version":2,"info":{"a":2}}],` +
		`"builds":[{"id":"b3","host_id":"h1","version":3,"owner":"key_a","created_at":"2025-03-04T05:06:07Z"}]}`
	if err := insert(doc); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetTemplate(ctx, "old")
	if err != nil || !slices.Equal(got.Published, []int{2}) || got.Owner != "key_a" || got.LastVersion != 3 {
		t.Fatalf("GetTemplate(old) = %+v, %v; want version 2 published", got, err)
	}
	// Build 3 ends: its version is recorded, and is not published.
	if _, err := c.UpdateTemplate(ctx, "old", func(tp *catalog.Template) error {
		tp.Builds = nil
		tp.Versions = append(tp.Versions, catalog.TemplateVersion{Version: 3, Info: []byte(`{"a":3}`)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetTemplate(ctx, "old"); err != nil || !slices.Equal(got.Published, []int{2}) || len(got.Versions) != 3 {
		t.Errorf("GetTemplate(old) after version 3 = %+v, %v; want only version 2 published", got, err)
	}
	// Withdrawn, it stays so (the legacy flag is gone with the write).
	if _, err := c.UpdateTemplate(ctx, "old", func(tp *catalog.Template) error { tp.Published = nil; return nil }); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetTemplate(ctx, "old"); err != nil || got.Published != nil {
		t.Errorf("GetTemplate(old) after withdrawing = %+v, %v; want nothing published", got, err)
	}
}

// testTemplatePublished: published versions are kept per version, and a
// removed version is no longer published.
func testTemplatePublished(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	record := func(v int) {
		t.Helper()
		if _, err := c.ReserveTemplateBuild(ctx, "app", catalog.TemplateBuild{ID: fmt.Sprint("b", v), Owner: "key_a", CreatedAt: t0}, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := c.UpdateTemplate(ctx, "app", func(tp *catalog.Template) error {
			tp.Builds = nil
			tp.Versions = append(tp.Versions, catalog.TemplateVersion{Version: v, Info: []byte(`{}`)})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	publish := func(vs ...int) {
		t.Helper()
		if _, err := c.UpdateTemplate(ctx, "app", func(tp *catalog.Template) error { tp.Published = vs; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	published := func() []int {
		t.Helper()
		tp, err := c.GetTemplate(ctx, "app")
		if err != nil {
			t.Fatal(err)
		}
		return tp.Published
	}
	record(1)
	publish(1)
	record(2)
	if got := published(); !slices.Equal(got, []int{1}) {
		t.Errorf("published after version 2 was recorded: %v, want [1]", got)
	}
	record(3)
	publish(3, 1)
	if got := published(); !slices.Equal(got, []int{1, 3}) {
		t.Errorf("published: %v, want [1 3]", got)
	}
	if _, err := c.UpdateTemplate(ctx, "app", func(tp *catalog.Template) error { tp.Versions = tp.Versions[1:]; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := published(); !slices.Equal(got, []int{3}) {
		t.Errorf("published after version 1 was removed: %v, want [3]", got)
	}
	if ts, err := c.ListTemplates(ctx); err != nil || len(ts) != 1 || !slices.Equal(ts[0].Published, []int{3}) {
		t.Errorf("ListTemplates = %+v, %v; want app with version 3 published", ts, err)
	}
}

// t0 has nanoseconds, which a catalog drops (it keeps microseconds).
var t0 = time.Date(2025, 3, 4, 5, 6, 7, 891234567, time.UTC)

// elsewhere is a zone a catalog must convert from: times come back in UTC.
var elsewhere = time.FixedZone("UTC+05:30", 5*3600+1800)

func newKey(id string, created time.Time) catalog.Key {
	return catalog.Key{ID: id, Name: "name of " + id, Hash: "hash-" + id, Prefix: "pfx" + id, CreatedAt: created}
}

func newSandbox(id, keyID string) catalog.Sandbox {
	return catalog.Sandbox{ID: id, KeyID: keyID, Template: "base", HostID: "host1", State: catalog.StateRunning,
		MemoryMiB: 512, VCPUs: 1, TTLSeconds: 300, OnExpire: "kill", CreatedAt: t0}
}

func createKey(t *testing.T, c catalog.Catalog, k catalog.Key) {
	t.Helper()
	if err := c.CreateKey(t.Context(), k); err != nil {
		t.Fatalf("CreateKey(%s): %v", k.ID, err)
	}
}

func reserve(t *testing.T, c catalog.Catalog, sbs ...catalog.Sandbox) {
	t.Helper()
	for _, sb := range sbs {
		if err := c.ReserveSandbox(t.Context(), sb, catalog.Limits{}); err != nil {
			t.Fatalf("ReserveSandbox(%s): %v", sb.ID, err)
		}
	}
}

// stored returns v as a catalog returns it: times truncated to
// microseconds, nil maps empty.
func stored[T any](v T) T {
	rv := reflect.ValueOf(&v).Elem()
	for i := range rv.NumField() {
		switch f := rv.Field(i); x := f.Interface().(type) {
		case time.Time:
			f.Set(reflect.ValueOf(x.Truncate(time.Microsecond)))
		case map[string]string:
			if x == nil {
				f.Set(reflect.ValueOf(map[string]string{}))
			}
		case catalog.Network:
			if x.AllowOut == nil {
				x.AllowOut = []string{}
			}
			if x.DenyOut == nil {
				x.DenyOut = []string{}
			}
			f.Set(reflect.ValueOf(x))
		}
	}
	return v
}

// diff lists the fields in which got and want (structs of one type)
// differ. Times must be equal instants and, when set, in UTC.
func diff(got, want any) string {
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	var b strings.Builder
	for i := range gv.NumField() {
		name := gv.Type().Field(i).Name
		g, w := gv.Field(i).Interface(), wv.Field(i).Interface()
		if gt, ok := g.(time.Time); ok {
			wt := w.(time.Time)
			if !gt.Equal(wt) {
				fmt.Fprintf(&b, "%s: got %v, want %v; ", name, gt, wt)
			} else if !gt.IsZero() && gt.Location() != time.UTC {
				fmt.Fprintf(&b, "%s: got location %v, want UTC; ", name, gt.Location())
			}
			continue
		}
		if !reflect.DeepEqual(g, w) {
			fmt.Fprintf(&b, "%s: got %#v, want %#v; ", name, g, w)
		}
	}
	return b.String()
}

func ids[T any](vs []T) []string {
	out := []string{}
	for _, v := range vs {
		out = append(out, reflect.ValueOf(v).FieldByName("ID").String())
	}
	return out
}

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

func testQuota(t *testing.T, c catalog.Catalog) {
	type held struct {
		mem   int
		state string
	}
	tests := []struct {
		name       string
		mine       []held // the key's sandboxes before the reservation
		others     []held // another key's
		maxCount   int
		maxMem     int
		reqMem     int
		wantLimit  string // "" = accepted
		wantUsed   int
		wantMaxNum int
	}{
		{name: "unlimited", mine: []held{{1024, "running"}, {1024, "running"}, {1024, "paused"}}, reqMem: 4096},
		{name: "negative is unlimited", mine: []held{{1024, "running"}}, maxCount: -1, maxMem: -1, reqMem: 4096},
		{name: "below count", mine: []held{{512, "running"}}, maxCount: 2, reqMem: 512},
		{name: "at count", mine: []held{{512, "running"}, {512, "starting"}}, maxCount: 2, reqMem: 512,
			wantLimit: catalog.QuotaSandboxes, wantUsed: 2, wantMaxNum: 2},
		{name: "paused counts", mine: []held{{512, "paused"}}, maxCount: 1, reqMem: 512,
			wantLimit: catalog.QuotaSandboxes, wantUsed: 1, wantMaxNum: 1},
		{name: "stopped do not count", mine: []held{{512, "stopped"}, {512, "stopped"}, {4096, "stopped"}},
			maxCount: 1, maxMem: 512, reqMem: 512},
		{name: "other keys do not count", others: []held{{512, "running"}, {512, "running"}},
			maxCount: 1, maxMem: 512, reqMem: 512},
		{name: "memory up to the limit", mine: []held{{1024, "running"}, {1024, "paused"}}, maxMem: 3072, reqMem: 1024},
		{name: "memory over the limit", mine: []held{{1024, "running"}, {1024, "paused"}}, maxMem: 3072, reqMem: 1025,
			wantLimit: catalog.QuotaMemory, wantUsed: 2048, wantMaxNum: 3072},
		{name: "memory alone over the limit", maxMem: 1024, reqMem: 2048,
			wantLimit: catalog.QuotaMemory, wantUsed: 0, wantMaxNum: 1024},
		{name: "stopped memory does not count", mine: []held{{8192, "stopped"}}, maxMem: 1024, reqMem: 1024},
	}
	ctx := t.Context()
	for i, tc := range tests {
		// One catalog for all cases: each case has its own keys.
		mine, other := fmt.Sprintf("key_mine%d", i), fmt.Sprintf("key_other%d", i)
		createKey(t, c, newKey(mine, t0))
		createKey(t, c, newKey(other, t0))
		for j, h := range tc.mine {
			sb := newSandbox(fmt.Sprintf("q%dmine%d", i, j), mine)
			sb.MemoryMiB, sb.State = h.mem, h.state
			reserve(t, c, sb)
		}
		for j, h := range tc.others {
			sb := newSandbox(fmt.Sprintf("q%dother%d", i, j), other)
			sb.MemoryMiB, sb.State = h.mem, h.state
			reserve(t, c, sb)
		}
		sb := newSandbox(fmt.Sprintf("q%dnew", i), mine)
		sb.MemoryMiB = tc.reqMem
		err := c.ReserveSandbox(ctx, sb, catalog.Limits{Sandboxes: tc.maxCount, MemoryMiB: tc.maxMem})
		_, getErr := c.GetSandbox(ctx, sb.ID)
		if tc.wantLimit == "" {
			if err != nil {
				t.Errorf("%s: ReserveSandbox: %v, want success", tc.name, err)
			} else if getErr != nil {
				t.Errorf("%s: GetSandbox after ReserveSandbox: %v", tc.name, getErr)
			}
			continue
		}
		var qe *catalog.QuotaError
		if !errors.Is(err, catalog.ErrQuota) || !errors.As(err, &qe) {
			t.Errorf("%s: ReserveSandbox: got %v, want a QuotaError", tc.name, err)
			continue
		}
		want := catalog.QuotaError{KeyID: mine, Limit: tc.wantLimit, Used: tc.wantUsed, Max: tc.wantMaxNum, Requested: 1}
		if tc.wantLimit == catalog.QuotaMemory {
			want.Requested = tc.reqMem
		}
		if *qe != want {
			t.Errorf("%s: QuotaError = %+v, want %+v", tc.name, *qe, want)
		}
		for _, n := range []int{want.Used, want.Max} {
			if !strings.Contains(err.Error(), strconv.Itoa(n)) {
				t.Errorf("%s: error %q does not say %d", tc.name, err, n)
			}
		}
		if !errors.Is(getErr, catalog.ErrNotFound) {
			t.Errorf("%s: GetSandbox after a refused reservation: got %v, want ErrNotFound", tc.name, getErr)
		}
	}
}

// vCPUs and disk count like memory; disk counts sandbox disks, pause
// captures and snapshots, and CreateSnapshot checks it too.
func testQuotaVCPUsAndDisk(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	createKey(t, c, newKey("key_b", t0))
	held := newSandbox("held", "key_a")
	held.VCPUs, held.DiskMiB, held.State, held.PausedBytes = 3, 1000, catalog.StatePaused, 100<<20+1 // counts 101 MiB
	gone := newSandbox("gone", "key_a")
	gone.VCPUs, gone.DiskMiB, gone.State = 16, 100000, catalog.StateStopped
	other := newSandbox("other", "key_b")
	other.VCPUs, other.DiskMiB = 16, 100000
	reserve(t, c, held, gone, other)
	if err := c.CreateSnapshot(ctx, catalog.Snapshot{ID: "snapa", KeyID: "key_a", SizeBytes: 200 << 20, CreatedAt: t0}, catalog.Limits{}); err != nil {
		t.Fatal(err)
	}
	// key_a holds 3 vCPUs and 1000 + 101 + 200 = 1301 MiB of disk.
	tests := []struct {
		name      string
		vcpus     int
		disk      int
		lim       catalog.Limits
		wantLimit string
		wantUsed  int
	}{
		{"vcpus fit", 1, 0, catalog.Limits{VCPUs: 4}, "", 0},
		{"vcpus over", 2, 0, catalog.Limits{VCPUs: 4}, catalog.QuotaVCPUs, 3},
		{"disk fits", 1, 99, catalog.Limits{DiskMiB: 1400}, "", 0},
		{"disk over", 1, 100, catalog.Limits{DiskMiB: 1400}, catalog.QuotaDisk, 1301},
	}
	for i, tc := range tests {
		sb := newSandbox(fmt.Sprintf("vd%d", i), "key_a")
		sb.VCPUs, sb.DiskMiB = tc.vcpus, tc.disk
		err := c.ReserveSandbox(ctx, sb, tc.lim)
		if tc.wantLimit == "" {
			if err != nil {
				t.Errorf("%s: %v, want success", tc.name, err)
			}
			c.DeleteSandbox(ctx, sb.ID)
			continue
		}
		var qe *catalog.QuotaError
		if !errors.As(err, &qe) || qe.Limit != tc.wantLimit || qe.Used != tc.wantUsed {
			t.Errorf("%s: got %v (%+v), want a %s QuotaError with %d used", tc.name, err, qe, tc.wantLimit, tc.wantUsed)
		}
	}
	// A snapshot that would pass the disk limit is refused and not stored.
	err := c.CreateSnapshot(ctx, catalog.Snapshot{ID: "snapb", KeyID: "key_a", SizeBytes: 100 << 20, CreatedAt: t0}, catalog.Limits{DiskMiB: 1400})
	var qe *catalog.QuotaError
	if !errors.As(err, &qe) || qe.Limit != catalog.QuotaDisk || qe.Used != 1301 || qe.Requested != 100 {
		t.Errorf("CreateSnapshot over the disk limit: %v (%+v), want a disk QuotaError, 1301 used, 100 requested", err, qe)
	}
	if _, err := c.GetSnapshot(ctx, "snapb"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("refused snapshot stored: %v", err)
	}
	if err := c.CreateSnapshot(ctx, catalog.Snapshot{ID: "snapc", KeyID: "key_a", SizeBytes: 99 << 20, CreatedAt: t0}, catalog.Limits{DiskMiB: 1400}); err != nil {
		t.Errorf("CreateSnapshot within the disk limit: %v", err)
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

func testHosts(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	hosts := []catalog.Host{
		{ID: "h2", URL: "https://10.0.0.2:7789", Token: "secret-2", CACert: "-----BEGIN CERTIFICATE-----\nx\n", State: catalog.HostReady,
			Capacity:     catalog.HostCapacity{CPUs: 64, MemoryMiB: 512 << 10, DiskMiB: 4 << 20, Accel: "kvm"},
			RegisteredAt: t0.In(elsewhere), HeartbeatAt: t0.Add(time.Second)},
		{ID: "h1", URL: "https://10.0.0.1:7789", Token: "secret-1", State: catalog.HostLost, Draining: true, RegisteredAt: t0},
	}
	for _, h := range hosts {
		if err := c.PutHost(ctx, h); err != nil {
			t.Fatalf("PutHost(%s): %v", h.ID, err)
		}
	}
	for _, h := range hosts {
		got, err := c.GetHost(ctx, h.ID)
		if err != nil {
			t.Fatalf("GetHost(%s): %v", h.ID, err)
		}
		if d := diff(got, stored(h)); d != "" {
			t.Errorf("GetHost(%s): %s", h.ID, d)
		}
	}
	if hs, err := c.ListHosts(ctx); err != nil || strings.Join(ids(hs), ",") != "h1,h2" {
		t.Errorf("ListHosts = %v, %v; want h1,h2", ids(hs), err)
	}
	// PutHost replaces.
	re := hosts[1]
	re.URL, re.State, re.Draining = "https://10.0.0.9:7789", catalog.HostReady, false
	if err := c.PutHost(ctx, re); err != nil {
		t.Fatalf("PutHost again: %v", err)
	}
	if got, err := c.GetHost(ctx, "h1"); err != nil || diff(got, stored(re)) != "" {
		t.Errorf("GetHost after a second PutHost: %+v, %v; want %+v", got, err, re)
	}
	beat := t0.Add(time.Hour).Truncate(time.Microsecond)
	got, err := c.UpdateHost(ctx, "h2", func(h *catalog.Host) error {
		h.HeartbeatAt, h.State = beat, catalog.HostDraining
		return nil
	})
	if err != nil || !got.HeartbeatAt.Equal(beat) || got.State != catalog.HostDraining || got.Token != "secret-2" {
		t.Errorf("UpdateHost = %+v, %v", got, err)
	}
	if got, err := c.GetHost(ctx, "h2"); err != nil || !got.HeartbeatAt.Equal(beat) || got.Capacity.CPUs != 64 {
		t.Errorf("GetHost after UpdateHost = %+v, %v", got, err)
	}
	errFn := errors.New("no")
	if _, err := c.UpdateHost(ctx, "h2", func(h *catalog.Host) error { h.URL = "x"; return errFn }); err != errFn {
		t.Errorf("UpdateHost whose fn fails: got %v, want fn's error unwrapped", err)
	}
	if got, _ := c.GetHost(ctx, "h2"); got.URL != hosts[0].URL {
		t.Errorf("UpdateHost whose fn failed wrote %q", got.URL)
	}
	if _, err := c.UpdateHost(ctx, "nope", func(*catalog.Host) error { return nil }); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("UpdateHost(unknown): got %v, want ErrNotFound", err)
	}
	if err := c.DeleteHost(ctx, "h1"); err != nil {
		t.Fatalf("DeleteHost: %v", err)
	}
	if _, err := c.GetHost(ctx, "h1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("GetHost after DeleteHost: got %v, want ErrNotFound", err)
	}
	if err := c.DeleteHost(ctx, "h1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("DeleteHost twice: got %v, want ErrNotFound", err)
	}
}

func testTemplates(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	createKey(t, c, newKey("key_b", t0))
	if _, err := c.GetTemplate(ctx, "app"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("GetTemplate of nothing: got %v, want ErrNotFound", err)
	}
	b1 := catalog.TemplateBuild{ID: "b1", HostID: "h1", Owner: "key_a", CreatedAt: t0.In(elsewhere)}
	got, err := c.ReserveTemplateBuild(ctx, "app", b1, 0)
	if err != nil {
		t.Fatalf("ReserveTemplateBuild: %v", err)
	}
	if got.Owner != "key_a" || got.LastVersion != 1 || len(got.Builds) != 1 || got.Builds[0].Version != 1 || got.Published != nil ||
		!got.CreatedAt.Equal(t0.Truncate(time.Microsecond)) || got.CreatedAt.Location() != time.UTC {
		t.Errorf("ReserveTemplateBuild = %+v", got)
	}
	// Another key may not take a name whose first build runs.
	if _, err := c.ReserveTemplateBuild(ctx, "app", catalog.TemplateBuild{ID: "x", Owner: "key_b", CreatedAt: t0}, 0); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("ReserveTemplateBuild of another key's new name: got %v, want ErrConflict", err)
	}
	b2 := catalog.TemplateBuild{ID: "b2", HostID: "h2", Owner: "key_a", CreatedAt: t0}
	if got, err = c.ReserveTemplateBuild(ctx, "app", b2, 0); err != nil || got.LastVersion != 2 || got.Builds[1].Version != 2 {
		t.Fatalf("a second ReserveTemplateBuild = %+v, %v; want version 2", got, err)
	}
	got, err = c.GetTemplate(ctx, "app")
	if err != nil || len(got.Builds) != 2 || got.Builds[0].ID != "b1" || got.Builds[0].HostID != "h1" || got.Builds[0].Owner != "key_a" ||
		!got.Builds[0].CreatedAt.Equal(t0.Truncate(time.Microsecond)) {
		t.Fatalf("GetTemplate = %+v, %v", got, err)
	}
	// Build 1 succeeds: its version is recorded, in one update; build 2 fails.
	info := []byte(`{"name":"app","version":1,"source":"alpine:3"}`)
	got, err = c.UpdateTemplate(ctx, "app", func(tp *catalog.Template) error {
		tp.Builds = tp.Builds[1:]
		tp.Versions = append(tp.Versions, catalog.TemplateVersion{Version: 1, Info: info})
		// Version 2 is not built yet: not kept as published.
		tp.Published = []int{2, 1, 1}
		return nil
	})
	if err != nil || len(got.Versions) != 1 || len(got.Builds) != 1 || !slices.Equal(got.Published, []int{1}) {
		t.Fatalf("UpdateTemplate = %+v, %v", got, err)
	}
	if _, err := c.UpdateTemplate(ctx, "app", func(tp *catalog.Template) error { tp.Builds = nil; return nil }); err != nil {
		t.Fatalf("UpdateTemplate: %v", err)
	}
	got, err = c.GetTemplate(ctx, "app")
	if l, ok := got.Latest(); err != nil || !ok || l.Version != 1 || string(l.Info) != string(info) || !slices.Equal(got.Published, []int{1}) || got.LastVersion != 2 || got.Builds != nil {
		t.Errorf("GetTemplate after the builds = %+v, %v", got, err)
	}
	// Another key may build a new version of a template that has one
	// (the caller checks who may).
	if got, err := c.ReserveTemplateBuild(ctx, "app", catalog.TemplateBuild{ID: "b3", Owner: "key_b", CreatedAt: t0}, 1); err != nil || got.Owner != "key_a" || got.LastVersion != 3 {
		t.Errorf("ReserveTemplateBuild of a new version by another key = %+v, %v", got, err)
	}
	if _, err := c.UpdateTemplate(ctx, "app", func(tp *catalog.Template) error { tp.Builds = nil; return nil }); err != nil {
		t.Fatalf("UpdateTemplate: %v", err)
	}
	errFn := errors.New("no")
	if _, err := c.UpdateTemplate(ctx, "app", func(tp *catalog.Template) error { tp.Published = nil; return errFn }); err != errFn {
		t.Errorf("UpdateTemplate whose fn fails: got %v, want fn's error unwrapped", err)
	}
	for what, fn := range map[string]func(*catalog.Template){
		"owner": func(tp *catalog.Template) { tp.Owner = "key_b" }, "last version": func(tp *catalog.Template) { tp.LastVersion = 0 },
	} {
		if _, err := c.UpdateTemplate(ctx, "app", func(tp *catalog.Template) error { fn(tp); return nil }); err == nil {
			t.Errorf("UpdateTemplate that changes the %s succeeded", what)
		}
	}
	if got, _ := c.GetTemplate(ctx, "app"); !got.IsPublished(1) || got.Owner != "key_a" || got.LastVersion != 3 {
		t.Errorf("a failed UpdateTemplate wrote: %+v", got)
	}
	if _, err := c.UpdateTemplate(ctx, "nope", func(*catalog.Template) error { return nil }); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("UpdateTemplate(unknown): got %v, want ErrNotFound", err)
	}
	if _, err := c.ReserveTemplateBuild(ctx, "aaa", catalog.TemplateBuild{ID: "b4", Owner: "key_b", CreatedAt: t0}, 1); err != nil {
		t.Fatalf("ReserveTemplateBuild(aaa): %v", err)
	}
	if ts, err := c.ListTemplates(ctx); err != nil || len(ts) != 2 || ts[0].Name != "aaa" || ts[1].Name != "app" {
		t.Errorf("ListTemplates = %+v, %v; want aaa, app", ts, err)
	}
	// Deleted (no versions, no builds): gone, but its numbers are not
	// given out again, and the name is anyone's.
	if _, err := c.UpdateTemplate(ctx, "app", func(tp *catalog.Template) error { tp.Versions = nil; return nil }); err != nil {
		t.Fatalf("UpdateTemplate that removes every version: %v", err)
	}
	if _, err := c.GetTemplate(ctx, "app"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("GetTemplate of a deleted template: got %v, want ErrNotFound", err)
	}
	if _, err := c.UpdateTemplate(ctx, "app", func(*catalog.Template) error { return nil }); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("UpdateTemplate of a deleted template: got %v, want ErrNotFound", err)
	}
	if ts, err := c.ListTemplates(ctx); err != nil || len(ts) != 1 || ts[0].Name != "aaa" {
		t.Errorf("ListTemplates after the delete = %+v, %v; want aaa", ts, err)
	}
	// Its record stays, empty, with the last number it gave out.
	if ts, err := c.ListTemplateRecords(ctx); err != nil || len(ts) != 2 || ts[1].Name != "app" || ts[1].Exists() || ts[1].LastVersion != 3 {
		t.Errorf("ListTemplateRecords after the delete = %+v, %v; want aaa and app's empty record at version 3", ts, err)
	}
	// key_b owns aaa: with a bound of 1 it may not take app.
	if _, err := c.ReserveTemplateBuild(ctx, "app", catalog.TemplateBuild{ID: "b5", Owner: "key_b", CreatedAt: t0}, 1); !errors.Is(err, catalog.ErrQuota) {
		t.Errorf("ReserveTemplateBuild over the bound: got %v, want ErrQuota", err)
	}
	got, err = c.ReserveTemplateBuild(ctx, "app", catalog.TemplateBuild{ID: "b5", Owner: "key_b", CreatedAt: t0.Add(time.Hour)}, 2)
	if err != nil || got.Owner != "key_b" || got.LastVersion != 4 || got.Builds[0].Version != 4 || got.Published != nil || !got.CreatedAt.Equal(t0.Add(time.Hour).Truncate(time.Microsecond)) {
		t.Errorf("ReserveTemplateBuild of a deleted template's name = %+v, %v; want key_b's, version 4, not public", got, err)
	}

	// Imports: only of names never recorded (not even deleted ones).
	legacy := catalog.Template{Name: "legacy", Owner: "key_a", Published: []int{5}, LastVersion: 5,
		Versions: []catalog.TemplateVersion{{Version: 2, Info: []byte(`{"a":1}`)}, {Version: 5, Info: []byte(`{"a":2}`)}}, CreatedAt: t0}
	if err := c.ImportTemplate(ctx, legacy); err != nil {
		t.Fatalf("ImportTemplate: %v", err)
	}
	if got, err := c.GetTemplate(ctx, "legacy"); err != nil || got.LastVersion != 5 || len(got.Versions) != 2 || !slices.Equal(got.Published, []int{5}) || got.Owner != "key_a" {
		t.Errorf("GetTemplate(legacy) = %+v, %v", got, err)
	}
	if err := c.ImportTemplate(ctx, legacy); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("ImportTemplate again: %v, want ErrConflict", err)
	}
	if _, err := c.UpdateTemplate(ctx, "legacy", func(tp *catalog.Template) error { tp.Versions = nil; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.ImportTemplate(ctx, legacy); !errors.Is(err, catalog.ErrConflict) {
		t.Errorf("ImportTemplate of a deleted template's name: %v, want ErrConflict", err)
	}
	bad := legacy
	bad.Name, bad.LastVersion = "bad", 4
	if err := c.ImportTemplate(ctx, bad); err == nil {
		t.Errorf("ImportTemplate with a version above LastVersion succeeded")
	}
}

// testTemplateQuotaConcurrent: reservations of one owner's new templates
// racing never take it over its bound.
func testTemplateQuotaConcurrent(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	const max = 3
	ok, quota := reserveAtOnce(t, 8, func(i int) error {
		_, err := c.ReserveTemplateBuild(ctx, fmt.Sprintf("t%d", i), catalog.TemplateBuild{ID: "b", Owner: "key_a", CreatedAt: t0}, max)
		return err
	})
	if ok != max || quota != 8-max {
		t.Errorf("8 reservations at once with a bound of %d: %d succeeded, %d over quota", max, ok, quota)
	}
}

func testCloseTwice(t *testing.T, c catalog.Catalog) {
	for i := range 2 {
		if err := c.Close(); err != nil {
			t.Errorf("Close #%d: %v", i+1, err)
		}
	}
}
