package controlplane

import (
	"context"
	"errors"
	"slices"
	"sort"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// TemplateRow is one template as a key sees it (ListTemplates): a shape
// baked (State "ready" or "stale", with StaleReason), or a template not
// baked at its default shape ("not_baked").
//
// A user template's rows (built from an image) also carry the version of
// the row (Version; the latest for shapes baked from plain NAME) and what
// it was built from, the template's LatestVersion (for a key other than
// its owner or an admin one, the latest published), Public (some version
// is published), every Versions the key may use, and, for admin keys
// only, its Owner ("" for one built before owners were recorded: the
// admin keys') and start-up commands (they may hold secrets).
type TemplateRow struct {
	Name        string
	MemoryMiB   int
	VCPUs       int
	State       string
	StaleReason string
	BakedAt     *time.Time
	BakeMS      int64

	FromImage           string
	Digest              string
	BuiltAt             *time.Time
	BuildMS             int64
	SizeBytes           int64
	DiskBytes           int64
	Version             int
	LatestVersion       int
	Public              *bool
	Owner               string
	Versions            []VersionRow
	StartCmd            string
	ReadyCmd            string
	ReadyTimeoutSeconds int
}

// VersionRow is one version of a user template: SizeBytes is its root
// filesystem's apparent size, DiskBytes what it takes on disk; Published
// whether every key may use it.
type VersionRow struct {
	Version   int
	Published bool
	BuiltAt   time.Time
	BuildMS   int64
	SizeBytes int64
	DiskBytes int64
	FromImage string
	Digest    string
}

// TemplateHost is what ListTemplates reads of the hosts' templates: a
// host.Host's (the one host, or a fleet's router).
type TemplateHost interface {
	Templates() host.Templates
	TemplateParams(name string, memoryMiB, vcpus int) templates.Params
}

// ListTemplates returns the templates key may use, of those h holds and
// names: the built-in ones, its own, the published ones (an admin key:
// all), sorted by name, then newest version first, then smallest memory
// first. An admin key sees every shape baked; other keys see each
// template at its default shape (which shapes others had baked is theirs
// to know). A shape whose root filesystem is gone is not listed, nor a
// stale shape of plain NAME of a user template (one of an earlier latest
// version: the pinned rows say more). A user template's rows carry its
// versions (TemplateRow).
func (p *Plane) ListTemplates(ctx context.Context, key catalog.Key, h TemplateHost) ([]TemplateRow, error) {
	store := h.Templates()
	baked, err := store.List(ctx)
	if err != nil {
		return nil, err
	}
	users, err := p.UserVersions(ctx) // by name, the versions
	if err != nil {
		return nil, err
	}
	view := newTemplateView(key, users)
	if !key.Admin {
		var defaults []templates.Meta
		for _, t := range baked {
			if t.Params == h.TemplateParams(t.Name, 0, 0) {
				defaults = append(defaults, t)
			}
		}
		baked = defaults
	}
	out := []TemplateRow{}
	seen := map[string]bool{}
	for _, t := range baked {
		if !view.visible(t.Name) {
			continue
		}
		name, v, _ := templates.SplitRef(t.Name)
		_, reason, err := store.Lookup(ctx, t.Params)
		if errors.Is(err, templates.ErrNotFound) {
			continue // its root filesystem is gone
		}
		if _, ok := users[name]; ok && v == 0 && reason != "" {
			continue // a shape of an earlier latest version: the pinned rows say more
		}
		seen[name] = true
		row := TemplateRow{Name: name, Version: v, MemoryMiB: t.MemoryMiB, VCPUs: t.VCPUs, State: "ready", BakeMS: t.BakeMS}
		at := t.BakedAt
		row.BakedAt = &at
		if reason != "" {
			row.State, row.StaleReason = "stale", reason
		}
		out = append(out, row)
	}
	names, err := store.Names(ctx)
	if err != nil {
		p.log.Warn("list template names of host", "host_id", p.cfg.HostID, "err", err)
	}
	for _, name := range names {
		if !seen[name] && view.visibleName(name) {
			tp := h.TemplateParams(name, 0, 0)
			out = append(out, TemplateRow{Name: name, MemoryMiB: tp.MemoryMiB, VCPUs: tp.VCPUs, State: "not_baked"})
		}
	}
	for i := range out {
		view.describe(&out[i], key.Admin)
	}
	sortTemplateRows(out)
	return out, nil
}

// templateView is what one key may see of the user templates: users
// holds every user template's versions by name; usable, by name, the
// versions the key may use (its own and an admin key's: all; others':
// the published ones). A template with none usable is not listed. A
// version the registry does not list is a deleted one's (a host of a
// fleet that was away keeps it until its next start): not listed.
type templateView struct {
	users, usable map[string][]templates.UserRootFS
}

func newTemplateView(key catalog.Key, users map[string][]templates.UserRootFS) templateView {
	usable := map[string][]templates.UserRootFS{}
	for name, vs := range users {
		if uv := UsableVersions(key, vs); len(uv) > 0 {
			usable[name] = uv
		}
	}
	return templateView{users: users, usable: usable}
}

// visible reports whether a template baked as ref is listed: a built-in,
// or a version the key may use (for a shape of plain NAME, the latest
// version's: only if that one is usable).
func (tv templateView) visible(ref string) bool {
	name, v, err := templates.SplitRef(ref)
	vs, ok := tv.users[name]
	switch {
	case err != nil:
		return false
	case !ok:
		return v == 0
	case v == 0:
		uv := tv.usable[name]
		return len(uv) > 0 && uv[len(uv)-1].Version == vs[len(vs)-1].Version
	}
	return slices.ContainsFunc(tv.usable[name], func(u templates.UserRootFS) bool { return u.Version == v })
}

// visibleName reports whether template name, not baked, is listed: a
// built-in, or a user template with a version the key may use.
func (tv templateView) visibleName(name string) bool {
	_, user := tv.users[name]
	return !user || len(tv.usable[name]) > 0
}

// describe fills in a user template's row with what the key may see of
// it: its row's version (the latest for a shape of plain NAME), the
// latest and every usable version, whether it is public, and for an
// admin key its owner and commands. Other rows stay as they are.
func (tv templateView) describe(row *TemplateRow, admin bool) {
	vs, ok := tv.usable[row.Name]
	if !ok {
		return
	}
	latest := vs[len(vs)-1]
	if row.Version == 0 {
		row.Version = latest.Version
	}
	pub := slices.ContainsFunc(vs, func(u templates.UserRootFS) bool { return u.Published })
	row.LatestVersion, row.Public = latest.Version, &pub
	if admin {
		row.Owner = latest.Owner
		row.StartCmd, row.ReadyCmd, row.ReadyTimeoutSeconds = latest.StartCmd, latest.ReadyCmd, latest.ReadyTimeoutSeconds
	}
	for _, u := range vs {
		row.Versions = append(row.Versions, VersionRow{Version: u.Version, Published: u.Published, BuiltAt: u.BuiltAt, BuildMS: u.BuildMS,
			SizeBytes: u.SizeBytes, DiskBytes: u.DiskBytes, FromImage: u.Source, Digest: u.Digest})
		if u.Version == row.Version {
			at := u.BuiltAt
			row.FromImage, row.Digest, row.BuiltAt, row.BuildMS = u.Source, u.Digest, &at, u.BuildMS
			row.SizeBytes, row.DiskBytes = u.SizeBytes, u.DiskBytes
		}
	}
}

// sortTemplateRows sorts rows by name, then newest version first, then
// smallest memory first.
func sortTemplateRows(out []TemplateRow) {
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		if out[i].Version != out[j].Version {
			return out[i].Version > out[j].Version
		}
		return out[i].MemoryMiB < out[j].MemoryMiB
	})
}
