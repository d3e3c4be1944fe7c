package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Who may build a user template and read its builds (Config.Templates):
// any key may build a new name, which it then owns (up to
// Config.MaxTemplatesPerKey of them); only its owner or an admin key may
// build it again (up to Config.MaxTemplateVersions versions); a build is
// read by the key that started it and by admin keys only (another key's
// is not found). Admin keys have no bound on builds, templates or
// versions. The builder checks the bounds again when a build starts
// (builds.Spec's MaxTemplates, MaxBuilds, MaxVersions): what it says wins.

// Defaults of Config.MaxTemplatesPerKey, MaxTemplateBuildsPerKey and
// MaxTemplateVersions.
const (
	DefaultMaxTemplatesPerKey      = 20
	DefaultMaxTemplateBuildsPerKey = 2
	DefaultMaxTemplateVersions     = 10
)

// noBuilds answers what needs Config.Templates without it (a new error
// each time: callers may change what they are given).
func noBuilds() *Error {
	return Errorf(NotImplemented, "this server does not build templates; built-in templates work everywhere")
}

// Builds returns the user templates' builder (Config.Templates), or
// NotImplemented without one.
func (p *Plane) Builds() (builds.Builder, error) {
	if p.cfg.Templates == nil {
		return nil, noBuilds()
	}
	return p.cfg.Templates, nil
}

// ActiveBuilds returns the builds of the key keyID that have not ended.
func (p *Plane) ActiveBuilds(ctx context.Context, keyID string) ([]builds.Status, error) {
	b, err := p.Builds()
	if err != nil {
		return nil, err
	}
	return activeBuilds(ctx, b, keyID)
}

func activeBuilds(ctx context.Context, b builds.Builder, keyID string) ([]builds.Status, error) {
	list, err := b.List(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list, func(st builds.Status) bool { return st.Owner != keyID || st.Done() }), nil
}

// CheckBuildName checks a build of template name by key before what it
// is built from is received: the name's syntax and that it is not a
// built-in's (Invalid), its owner (another key's name, whether key may
// see it or not: Conflict), for a new name the key's templates, counting
// the names its builds in progress make (builds.ErrLimit), and for a
// rebuild the template's versions, counting its builds in progress
// (builds.VersionLimit).
func (p *Plane) CheckBuildName(ctx context.Context, key catalog.Key, name string) error {
	b, err := p.Builds()
	if err != nil {
		return err
	}
	if n, v, err := templates.SplitRef(name); err != nil || v != 0 || n != name {
		return Errorf(Invalid, "template name %q must be 1-32 lowercase letters, digits, - or _", name)
	}
	if slices.Contains(templates.Reserved, name) {
		return Errorf(Invalid, "%q is a built-in template; pick another name", name)
	}
	if name == templates.NotAName {
		return Errorf(Invalid, "%q names the API's list of builds (/v1/templates/builds); pick another name", name)
	}
	u, err := b.UserTemplate(ctx, name)
	if err != nil && !errors.Is(err, templates.ErrNotFound) {
		return err
	}
	exists := err == nil
	if exists && !OwnsTemplate(key, u) {
		return errNameTaken(name)
	}
	if key.Admin {
		return nil
	}
	max := p.cfg.MaxTemplatesPerKey
	if exists {
		max = p.cfg.MaxTemplateVersions
	}
	if max <= 0 {
		return nil
	}
	active, err := activeBuilds(ctx, b, key.ID)
	if err != nil {
		return err
	}
	if exists {
		vs, err := b.Versions(ctx, name)
		if err != nil {
			return err
		}
		n := len(vs)
		for _, st := range active {
			if st.Name == name {
				n++
			}
		}
		if n >= max {
			return builds.VersionLimit(name, n)
		}
		return nil
	}
	owned := map[string]bool{}
	us, err := b.UserTemplates(ctx)
	if err != nil {
		return err
	}
	for _, u := range us {
		if u.Owner == key.ID {
			owned[u.Name] = true
		}
	}
	for _, st := range active {
		owned[st.Name] = true
	}
	if len(owned) >= max {
		return fmt.Errorf("%w: this key has %d templates, its limit; delete one first", builds.ErrLimit, len(owned))
	}
	return nil
}

// ClaimBuild fills in the owner of a build of spec.Name by key and, for a
// key other than an admin one, the bounds the builder checks when it
// starts it (Config.MaxTemplatesPerKey, MaxTemplateBuildsPerKey,
// MaxTemplateVersions); it refuses a rebuild of another key's template
// (Conflict, as CheckBuildName).
func (p *Plane) ClaimBuild(ctx context.Context, key catalog.Key, spec *builds.Spec) error {
	b, err := p.Builds()
	if err != nil {
		return err
	}
	spec.Owner = key.ID
	if !key.Admin {
		spec.MaxTemplates = max(p.cfg.MaxTemplatesPerKey, 0)
		spec.MaxBuilds = max(p.cfg.MaxTemplateBuildsPerKey, 0)
		spec.MaxVersions = max(p.cfg.MaxTemplateVersions, 0)
	}
	u, err := b.UserTemplate(ctx, spec.Name)
	if errors.Is(err, templates.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if !OwnsTemplate(key, u) {
		return errNameTaken(spec.Name)
	}
	return nil
}

func errNameTaken(name string) error {
	return Errorf(Conflict, "the template name %s is taken; pick another", name)
}

// GetBuild returns build id's status if key may read it: the key that
// started it, or an admin key; another key's build is NotFound.
func (p *Plane) GetBuild(ctx context.Context, key catalog.Key, id string) (builds.Status, error) {
	b, err := p.Builds()
	if err != nil {
		return builds.Status{}, err
	}
	st, err := b.Get(ctx, id)
	if err != nil {
		return st, err
	}
	if !key.Admin && st.Owner != key.ID {
		return builds.Status{}, Errorf(NotFound, "template build %q not found", id)
	}
	return st, nil
}

// ListBuilds returns the builds key may read (its own; every build for an
// admin key), newest first, of template name ("": of every template).
func (p *Plane) ListBuilds(ctx context.Context, key catalog.Key, name string) ([]builds.Status, error) {
	b, err := p.Builds()
	if err != nil {
		return nil, err
	}
	list, err := b.List(ctx)
	if err != nil {
		return nil, err
	}
	out := []builds.Status{}
	for _, st := range list {
		if (key.Admin || st.Owner == key.ID) && (name == "" || st.Name == name) {
			out = append(out, st)
		}
	}
	return out, nil
}
