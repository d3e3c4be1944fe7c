// Package catalogtest is the conformance suite of catalog.Catalog: every
// implementation's tests call Run, so the stores cannot drift apart.
package catalogtest

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
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
		{"VolumeRoundTrip", testVolumeRoundTrip},
		{"VolumeConflict", testVolumeConflict},
		{"VolumeQuota", testVolumeQuota},
		{"VolumeQuotaConcurrent", testVolumeQuotaConcurrent},
		{"SandboxVolumesUpdate", testSandboxVolumesUpdate},
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

func testCloseTwice(t *testing.T, c catalog.Catalog) {
	for i := range 2 {
		if err := c.Close(); err != nil {
			t.Errorf("Close #%d: %v", i+1, err)
		}
	}
}
