package controlplane

import (
	"context"
	"slices"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/templates"
)

// Published is what PublishTemplate leaves: the versions of template Name
// every key may use, oldest first, and the Version it named (0: every
// version, for an unpublish of plain NAME).
type Published struct {
	Name     string
	Version  int
	Versions []int
}

// PublishTemplate publishes versions of a user template (public true):
// "NAME" its latest version, "NAME:N" version N; every key may then list
// and use them, and other keys' plain NAME means the latest published
// version. A version built later is not published until it is published
// in turn. Unpublishing (false) withdraws "NAME:N", or every version of
// "NAME"; sandboxes made already keep running. Who may is the caller's to
// check (admin keys). A built-in template is Invalid; without
// Config.Templates it is NotImplemented.
func (p *Plane) PublishTemplate(ctx context.Context, ref string, public bool) (Published, error) {
	b := p.cfg.Templates
	if b == nil {
		return Published{}, noBuilds()
	}
	name, v, err := templates.SplitRef(ref)
	if err != nil {
		return Published{}, Errorf(Invalid, "%v", strings.TrimPrefix(err.Error(), "invalid template parameters: "))
	}
	if slices.Contains(templates.Reserved, name) {
		return Published{}, Errorf(Invalid, "%s is a built-in template: every key may use it already", name)
	}
	if public && v == 0 {
		// The latest now, named: a build that lands meanwhile is not
		// what the caller saw, and stays unpublished.
		u, err := b.UserTemplate(ctx, name)
		if err != nil {
			return Published{}, err
		}
		v = u.Version
	}
	if err := b.SetPublished(ctx, templates.Ref(name, v), public); err != nil {
		return Published{}, err
	}
	vs, err := b.Versions(ctx, name)
	if err != nil {
		return Published{}, err
	}
	out := Published{Name: name, Version: v, Versions: []int{}}
	for _, u := range vs {
		if u.Published {
			out.Versions = append(out.Versions, u.Version)
		}
	}
	return out, nil
}
