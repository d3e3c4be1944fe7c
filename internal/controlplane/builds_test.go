package controlplane_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/fleet"
)

// The rules of user templates and their builds run over a fleet's
// registry of them (fleet.Templates), which is the catalog's: templates
// and builds in progress are written to the catalog directly, no host
// builds anything.

// buildsEnv is a plane over a catalog holding user templates.
type buildsEnv struct {
	*env
	admin catalog.Key
	other catalog.Key
}

func newTemplatesEnv(t *testing.T, limits func(*controlplane.Config)) *buildsEnv {
	t.Helper()
	var tmpls *fleet.Templates
	e := newEnvWith(t, func(c *controlplane.Config, cat catalog.Catalog) {
		reg := fleet.New(fleet.Config{Catalog: cat})
		t.Cleanup(reg.Close)
		tmpls = fleet.NewTemplates(reg, "")
		t.Cleanup(tmpls.Close)
		c.Templates = tmpls
		if limits != nil {
			limits(c)
		}
	})
	b := &buildsEnv{env: e}
	b.admin = e.newKey("key_admin", func(k *catalog.Key) { k.Admin = true })
	b.other = e.newKey("key_other")
	return b
}

// addTemplate records user template name of key owner with versions
// 1..n, those of published published.
func (b *buildsEnv) addTemplate(name, owner string, n int, published ...int) {
	b.t.Helper()
	tp := catalog.Template{Name: name, Owner: owner, Published: published, LastVersion: n, CreatedAt: t0}
	for v := 1; v <= n; v++ {
		info, err := json.Marshal(templates.UserRootFS{Source: fmt.Sprintf("registry.example.com/%s:%d", name, v),
			SizeBytes: int64(v) << 20, BuiltAt: t0.Add(time.Duration(v) * time.Minute), BuildMS: int64(v),
			Startup: templates.Startup{StartCmd: "serve " + name}})
		if err != nil {
			b.t.Fatal(err)
		}
		tp.Versions = append(tp.Versions, catalog.TemplateVersion{Version: v, Info: info})
	}
	if err := b.cat.ImportTemplate(b.t.Context(), tp); err != nil {
		b.t.Fatalf("import template %s: %v", name, err)
	}
}

// startBuild records a build of name by key owner as running.
func (b *buildsEnv) startBuild(id, name, owner string) {
	b.t.Helper()
	bl := catalog.TemplateBuild{ID: id, HostID: "local", Owner: owner, CreatedAt: t0}
	if _, err := b.cat.ReserveTemplateBuild(b.t.Context(), name, bl, 0); err != nil {
		b.t.Fatalf("reserve build %s of %s: %v", id, name, err)
	}
}

// kindOf is err's kind ("" for nil).
func kindOf(err error) controlplane.Kind {
	if err == nil {
		return ""
	}
	return controlplane.Classify(err).Kind
}

func TestCheckBuildName(t *testing.T) {
	b := newTemplatesEnv(t, func(c *controlplane.Config) {
		c.MaxTemplatesPerKey, c.MaxTemplateVersions = 2, 3
	})
	b.addTemplate("mine", b.key.ID, 2)
	b.addTemplate("full", b.key.ID, 3)
	b.addTemplate("theirs", b.other.ID, 1, 1)
	b.addTemplate("legacy", "", 1)
	for _, tc := range []struct {
		name string
		key  catalog.Key
		tmpl string
		want controlplane.Kind
	}{
		{"bad syntax", b.key, "Bad Name", controlplane.Invalid},
		{"a version", b.key, "mine:2", controlplane.Invalid},
		{"built-in", b.key, templates.Reserved[0], controlplane.Invalid},
		{"the builds list", b.key, templates.NotAName, controlplane.Invalid},
		{"another key's, published", b.key, "theirs", controlplane.Conflict},
		{"one without an owner", b.key, "legacy", controlplane.Conflict},
		{"a rebuild under the version bound", b.key, "mine", ""},
		{"a rebuild at the version bound", b.key, "full", controlplane.TemplateLimit},
		// The key owns 2 templates: its bound.
		{"a new name at the template bound", b.key, "new", controlplane.TemplateLimit},
		{"a new name of another key", b.other, "new", ""},
		{"admin: another key's", b.admin, "theirs", ""},
		{"admin: one without an owner", b.admin, "legacy", ""},
		{"admin: past the version bound", b.admin, "full", ""},
	} {
		err := b.p.CheckBuildName(t.Context(), tc.key, tc.tmpl)
		if got := kindOf(err); got != tc.want {
			t.Errorf("%s: CheckBuildName(%q) = %v (kind %q), want kind %q", tc.name, tc.tmpl, err, got, tc.want)
		}
	}
}

// Builds in progress count: a build of a new name as a template of its
// key, a build of a template as one of its versions.
func TestCheckBuildNameCountsBuildsInProgress(t *testing.T) {
	b := newTemplatesEnv(t, func(c *controlplane.Config) {
		c.MaxTemplatesPerKey, c.MaxTemplateVersions = 2, 3
	})
	b.addTemplate("mine", b.key.ID, 2)
	if err := b.p.CheckBuildName(t.Context(), b.key, "mine"); err != nil {
		t.Fatalf("rebuild of a template with 2 of 3 versions: %v", err)
	}
	if err := b.p.CheckBuildName(t.Context(), b.key, "second"); err != nil {
		t.Fatalf("a second template of 2: %v", err)
	}
	b.startBuild("b1", "mine", b.key.ID)
	if got := kindOf(b.p.CheckBuildName(t.Context(), b.key, "mine")); got != controlplane.TemplateLimit {
		t.Errorf("rebuild with 2 versions and 1 build of 3: kind %q, want %q", got, controlplane.TemplateLimit)
	}
	b.startBuild("b2", "second", b.key.ID)
	if got := kindOf(b.p.CheckBuildName(t.Context(), b.key, "third")); got != controlplane.TemplateLimit {
		t.Errorf("a third name while a second one builds, of 2: kind %q, want %q", got, controlplane.TemplateLimit)
	}
	// The other key's bound is its own.
	if err := b.p.CheckBuildName(t.Context(), b.other, "third"); err != nil {
		t.Errorf("another key's first template: %v", err)
	}
	active, err := b.p.ActiveBuilds(t.Context(), b.key.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(active) != 2 {
		t.Errorf("ActiveBuilds: %d builds, want 2", len(active))
	}
}

func TestClaimBuild(t *testing.T) {
	b := newTemplatesEnv(t, func(c *controlplane.Config) {
		c.MaxTemplatesPerKey, c.MaxTemplateBuildsPerKey, c.MaxTemplateVersions = 4, 5, -1
	})
	b.addTemplate("theirs", b.other.ID, 1, 1)
	b.addTemplate("mine", b.key.ID, 1)

	spec := builds.Spec{Name: "mine"}
	if err := b.p.ClaimBuild(t.Context(), b.key, &spec); err != nil {
		t.Fatalf("claim a rebuild of the key's own: %v", err)
	}
	if spec.Owner != b.key.ID || spec.MaxTemplates != 4 || spec.MaxBuilds != 5 || spec.MaxVersions != 0 {
		t.Errorf("spec = owner %q, bounds %d/%d/%d; want %q, 4/5/0 (unbounded: 0)", spec.Owner,
			spec.MaxTemplates, spec.MaxBuilds, spec.MaxVersions, b.key.ID)
	}
	spec = builds.Spec{Name: "theirs"}
	if got := kindOf(b.p.ClaimBuild(t.Context(), b.key, &spec)); got != controlplane.Conflict {
		t.Errorf("claim another key's template: kind %q, want %q", got, controlplane.Conflict)
	}
	spec = builds.Spec{Name: "theirs"}
	if err := b.p.ClaimBuild(t.Context(), b.admin, &spec); err != nil {
		t.Fatalf("admin claims another key's template: %v", err)
	}
	if spec.Owner != b.admin.ID || spec.MaxTemplates != 0 || spec.MaxBuilds != 0 || spec.MaxVersions != 0 {
		t.Errorf("admin spec = owner %q, bounds %d/%d/%d; want %q, none", spec.Owner,
			spec.MaxTemplates, spec.MaxBuilds, spec.MaxVersions, b.admin.ID)
	}
}

func TestListAndGetBuilds(t *testing.T) {
	b := newTemplatesEnv(t, nil)
	b.startBuild("mine1", "alpha", b.key.ID)
	b.startBuild("mine2", "beta", b.key.ID)
	b.startBuild("theirs1", "gamma", b.other.ID)
	ids := func(sts []builds.Status) []string {
		var out []string
		for _, st := range sts {
			out = append(out, st.ID)
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		key  catalog.Key
		name string
		want []string
	}{
		{b.key, "", []string{"mine1", "mine2"}},
		{b.key, "beta", []string{"mine2"}},
		{b.key, "gamma", nil},
		{b.other, "", []string{"theirs1"}},
		{b.admin, "", []string{"mine1", "mine2", "theirs1"}},
		{b.admin, "gamma", []string{"theirs1"}},
	} {
		got, err := b.p.ListBuilds(t.Context(), tc.key, tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if got == nil {
			t.Errorf("ListBuilds(%s, %q) = nil, want a list (JSON [])", tc.key.ID, tc.name)
		}
		if !slices.Equal(ids(got), tc.want) {
			t.Errorf("ListBuilds(%s, %q) = %v, want %v", tc.key.ID, tc.name, ids(got), tc.want)
		}
	}
	if _, err := b.p.GetBuild(t.Context(), b.key, "nosuchbuild"); kindOf(err) != controlplane.NotFound {
		t.Errorf("GetBuild of no build: %v, want not found", err)
	}
}

// Without a builder, every build rule answers NotImplemented.
func TestBuildsNotImplemented(t *testing.T) {
	e := newEnv(t, nil)
	for name, err := range map[string]error{
		"CheckBuildName": e.p.CheckBuildName(t.Context(), e.key, "app"),
		"ClaimBuild":     e.p.ClaimBuild(t.Context(), e.key, &builds.Spec{Name: "app"}),
		"ListBuilds":     second(e.p.ListBuilds(t.Context(), e.key, "")),
		"GetBuild":       second(e.p.GetBuild(t.Context(), e.key, "x")),
	} {
		if got := kindOf(err); got != controlplane.NotImplemented {
			t.Errorf("%s without a builder: %v (kind %q), want %q", name, err, got, controlplane.NotImplemented)
		}
	}
}

func second[T any](_ T, err error) error { return err }

func TestListTemplates(t *testing.T) {
	b := newTemplatesEnv(t, nil)
	b.addTemplate("mine", b.key.ID, 2)
	b.addTemplate("theirs", b.other.ID, 3, 2) // version 2 published
	b.addTemplate("hidden", b.other.ID, 1)
	// The host has them all, and "extra", a built-in of its own.
	for _, n := range []string{"mine", "theirs", "hidden", "extra"} {
		b.h.AddTemplate(n, 100)
	}
	type row struct {
		name            string
		version, latest int
		public          bool
		versions        []int
		owner           string
	}
	rowsOf := func(key catalog.Key) []row {
		t.Helper()
		rows, err := b.p.ListTemplates(t.Context(), key, b.h)
		if err != nil {
			t.Fatal(err)
		}
		var out []row
		for _, r := range rows {
			if r.State != "not_baked" {
				t.Errorf("%s: state %q, want not_baked (the host baked none)", r.Name, r.State)
			}
			x := row{name: r.Name, version: r.Version, latest: r.LatestVersion, owner: r.Owner}
			if r.Public != nil {
				x.public = *r.Public
			}
			for _, v := range r.Versions {
				x.versions = append(x.versions, v.Version)
			}
			out = append(out, x)
		}
		return out
	}
	eq := func(a, b row) bool {
		return a.name == b.name && a.version == b.version && a.latest == b.latest && a.public == b.public &&
			a.owner == b.owner && slices.Equal(a.versions, b.versions)
	}
	for _, tc := range []struct {
		who  string
		key  catalog.Key
		want []row
	}{
		{"owner of mine", b.key, []row{
			{name: "base"}, {name: "extra"},
			{name: "mine", version: 2, latest: 2, versions: []int{1, 2}},
			{name: "theirs", version: 2, latest: 2, public: true, versions: []int{2}},
		}},
		{"owner of theirs", b.other, []row{
			{name: "base"}, {name: "extra"},
			{name: "hidden", version: 1, latest: 1, versions: []int{1}},
			{name: "theirs", version: 3, latest: 3, public: true, versions: []int{1, 2, 3}},
		}},
		{"admin", b.admin, []row{
			{name: "base"}, {name: "extra"},
			{name: "hidden", version: 1, latest: 1, versions: []int{1}, owner: b.other.ID},
			{name: "mine", version: 2, latest: 2, versions: []int{1, 2}, owner: b.key.ID},
			{name: "theirs", version: 3, latest: 3, public: true, versions: []int{1, 2, 3}, owner: b.other.ID},
		}},
	} {
		got := rowsOf(tc.key)
		if !slices.EqualFunc(got, tc.want, eq) {
			t.Errorf("%s sees\n%+v\nwant\n%+v", tc.who, got, tc.want)
		}
	}
	// Commands are shown to admin keys only.
	rows, err := b.p.ListTemplates(t.Context(), b.key, b.h)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.StartCmd != "" {
			t.Errorf("%s: a key other than an admin one sees its start command %q", r.Name, r.StartCmd)
		}
	}
	rows, err = b.p.ListTemplates(t.Context(), b.admin, b.h)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(rows, func(r controlplane.TemplateRow) bool { return r.Name == "mine" })
	if i < 0 || rows[i].StartCmd != "serve mine" || rows[i].FromImage != "registry.example.com/mine:2" {
		t.Errorf("admin's row of mine: %+v, want start command \"serve mine\" from registry.example.com/mine:2", rows)
	}
}
