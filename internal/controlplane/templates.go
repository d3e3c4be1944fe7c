package controlplane

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Who may see and use the user templates (those built from images,
// Config.Templates): their owner and admin keys every version, other keys
// the published ones. A template or version a key may not use is not
// found for it, exactly like a missing one.

// OwnsTemplate reports whether key may see and use every version of user
// template u (any of its versions: it holds the template's owner): an
// admin key always, else the key that built it. A template without an
// owner (built before owners were recorded) is the admin keys'.
func OwnsTemplate(key catalog.Key, u templates.UserRootFS) bool {
	return key.Admin || (u.Owner != "" && u.Owner == key.ID)
}

// UsableVersions returns the versions of vs (a template's, oldest first)
// key may see and use: every one for the template's owner and admin keys
// (OwnsTemplate), the published ones for other keys. Publishing is per
// version: a version its owner builds after publishing is the owner's
// alone until it is published in turn.
func UsableVersions(key catalog.Key, vs []templates.UserRootFS) []templates.UserRootFS {
	if len(vs) == 0 || OwnsTemplate(key, vs[len(vs)-1]) {
		return vs
	}
	var out []templates.UserRootFS
	for _, u := range vs {
		if u.Published {
			out = append(out, u)
		}
	}
	return out
}

// templateVersions returns the versions of user template name key may
// use (UsableVersions) and whether key owns it (OwnsTemplate); none (and
// no error) if there is no such template.
func templateVersions(ctx context.Context, b builds.Builder, key catalog.Key, name string) ([]templates.UserRootFS, bool, error) {
	vs, err := b.Versions(ctx, name)
	if errors.Is(err, templates.ErrNotFound) || (err == nil && len(vs) == 0) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return UsableVersions(key, vs), OwnsTemplate(key, vs[len(vs)-1]), nil
}

// UserVersions returns the versions of every user template, by name
// (none without Config.Templates).
func (p *Plane) UserVersions(ctx context.Context) (map[string][]templates.UserRootFS, error) {
	users := map[string][]templates.UserRootFS{}
	b := p.cfg.Templates
	if b == nil {
		return users, nil
	}
	if vl, ok := b.(builds.VersionLister); ok {
		return vl.AllVersions(ctx)
	}
	latest, err := b.UserTemplates(ctx)
	if err != nil {
		return nil, err
	}
	for _, u := range latest {
		if vs, err := b.Versions(ctx, u.Name); err == nil {
			users[u.Name] = vs
		}
	}
	return users, nil
}

// VisibleTemplates returns whether key may see a template a host holds,
// by its reference ("NAME", "NAME:N"): an admin key every one; another key
// the built-in ones and the user templates it may use (every version of
// its own, the published versions of others', UsableVersions), as GET
// /v1/templates lists them. A pinned version of a template the registry
// does not know (a deleted one, still on a host) is nobody's but the
// admin keys'.
func (p *Plane) VisibleTemplates(ctx context.Context, key catalog.Key) (func(string) bool, error) {
	if key.Admin {
		return func(string) bool { return true }, nil
	}
	users, err := p.UserVersions(ctx)
	if err != nil {
		return nil, err
	}
	return func(ref string) bool {
		name, v, err := templates.SplitRef(ref)
		vs, ok := users[name]
		if err != nil || !ok || len(vs) == 0 {
			return err == nil && v == 0
		}
		usable := UsableVersions(key, vs)
		if v == 0 {
			return len(usable) > 0
		}
		return slices.ContainsFunc(usable, func(u templates.UserRootFS) bool { return u.Version == v })
	}, nil
}

// ResolveTemplate returns the reference a sandbox of template ref is
// created from: a built-in's name as is; for a user template, "NAME:N":
// for plain NAME the latest version the key may use (its owner and admin
// keys: the latest; other keys: the latest published), for NAME:N that
// version if the key may use it. A user template (or version) the key may
// not use is not found, exactly like a missing one.
func (p *Plane) ResolveTemplate(ctx context.Context, key catalog.Key, ref string) (string, error) {
	name, v, err := templates.SplitRef(ref)
	if err != nil {
		return "", Errorf(Invalid, "%v", strings.TrimPrefix(err.Error(), "invalid template parameters: "))
	}
	b := p.cfg.Templates
	if slices.Contains(templates.Reserved, name) || b == nil {
		if v > 0 {
			return "", Errorf(Invalid, "template %s is built in: it has no versions", name)
		}
		return ref, nil
	}
	u, err := b.UserTemplate(ctx, name)
	if errors.Is(err, templates.ErrNotFound) {
		if v > 0 {
			return "", Errorf(NotFound, "template %q not found", ref)
		}
		return ref, nil // a built-in of this host, or nothing: Lookup says
	}
	if err != nil {
		return "", err
	}
	if !OwnsTemplate(key, u) {
		vs, _, err := templateVersions(ctx, b, key, name)
		if err != nil {
			return "", err
		}
		i := len(vs) - 1
		if v > 0 {
			i = slices.IndexFunc(vs, func(u templates.UserRootFS) bool { return u.Version == v })
		}
		if i < 0 {
			return "", Errorf(NotFound, "template %q not found", ref)
		}
		return templates.Ref(name, vs[i].Version), nil
	}
	if v == 0 {
		return templates.Ref(name, u.Version), nil
	}
	if _, err := b.UserTemplate(ctx, ref); errors.Is(err, templates.ErrNotFound) {
		return "", Errorf(NotFound, "template %s has no version %d (its latest is %d)", name, v, u.Version)
	} else if err != nil {
		return "", err
	}
	return ref, nil
}
