package catalogtest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

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
