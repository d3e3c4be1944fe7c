package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/control"
	"github.com/pandastack/pandastack/internal/template"
	"github.com/pandastack/pandastack/internal/tmplbuild"
)

// TemplateHost builds a fleet's user templates on one of its hosts (panda
// server --fleet --template-host ID), through its host API: that host
// keeps the registry of user templates (names, versions, owners, public
// flags) and runs every build. Each version it builds is in the object
// store before the build succeeds, so every other host can create
// sandboxes of it (it fetches the version on first use: see package
// agent, usertemplates.go); while the template host is away, builds, the
// template endpoints and creates of user templates (whose version it
// resolves) answer 503, and the sandboxes that run go on.
type TemplateHost struct {
	// Registry is the fleet's; set before the first call.
	Registry *Registry
	// ID is the template host's id.
	ID string
}

var _ tmplbuild.Builder = (*TemplateHost)(nil)

// builder is the template host's builder, or why there is none now.
func (t *TemplateHost) builder() (tmplbuild.Builder, error) {
	r := t.Registry
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.members[t.ID]
	switch {
	case !ok:
		return nil, &control.Error{Kind: control.Unavailable, Msg: fmt.Sprintf(
			"template builds run on host %s (--template-host), which has not joined this fleet", t.ID)}
	case m.rec.State == catalog.HostLost:
		return nil, &control.Error{Kind: control.Unavailable, Msg: fmt.Sprintf(
			"template builds run on host %s (--template-host), which stopped heartbeating; retry when it is back", t.ID)}
	case m.client == nil:
		return nil, &control.Error{Kind: control.Unavailable, Msg: fmt.Sprintf(
			"template builds run on host %s (--template-host), which is not connected yet; retry in a few seconds", t.ID)}
	}
	return m.client.Builds(), nil
}

func (t *TemplateHost) Start(ctx context.Context, spec tmplbuild.Spec) (tmplbuild.Status, error) {
	b, err := t.builder()
	if err != nil {
		if spec.ContextTar != "" {
			os.Remove(spec.ContextTar) // the builder's from Start on
		}
		return tmplbuild.Status{}, err
	}
	return b.Start(ctx, spec)
}

func (t *TemplateHost) Get(ctx context.Context, id string) (tmplbuild.Status, error) {
	b, err := t.builder()
	if err != nil {
		return tmplbuild.Status{}, err
	}
	return b.Get(ctx, id)
}

func (t *TemplateHost) List(ctx context.Context) ([]tmplbuild.Status, error) {
	b, err := t.builder()
	if err != nil {
		return nil, err
	}
	return b.List(ctx)
}

func (t *TemplateHost) Follow(ctx context.Context, id string, line func(string)) (tmplbuild.Status, error) {
	b, err := t.builder()
	if err != nil {
		return tmplbuild.Status{}, err
	}
	return b.Follow(ctx, id, line)
}

func (t *TemplateHost) Remove(ctx context.Context, ref string) error {
	b, err := t.builder()
	if err != nil {
		return err
	}
	if err := b.Remove(ctx, ref); err != nil {
		return err
	}
	t.dropCopies(ctx, ref)
	return nil
}

// dropCopies asks every other connected host to remove its copy of what
// ref named (and the bakes of it), best effort: a host that is away, or
// holds the version as its latest copy of a template that keeps others,
// keeps it, unused (every create resolves its version here first).
func (t *TemplateHost) dropCopies(ctx context.Context, ref string) {
	r := t.Registry
	type other struct {
		id string
		b  tmplbuild.Builder
	}
	var others []other
	r.mu.Lock()
	for id, m := range r.members {
		if id != t.ID && m.client != nil && m.rec.State != catalog.HostLost {
			others = append(others, other{id, m.client.Builds()})
		}
	}
	r.mu.Unlock()
	for _, o := range others {
		err := o.b.Remove(ctx, ref)
		switch {
		case err == nil:
			r.log.Info("removed a host's copy of a deleted template", "host_id", o.id, "template", ref)
		case !errors.Is(err, template.ErrNotFound):
			r.log.Warn("a host keeps its copy of a deleted template", "host_id", o.id, "template", ref, "err", err)
		}
	}
}

func (t *TemplateHost) SetPublic(ctx context.Context, name string, public bool) error {
	b, err := t.builder()
	if err != nil {
		return err
	}
	return b.SetPublic(ctx, name, public)
}

func (t *TemplateHost) UserTemplate(ctx context.Context, ref string) (template.UserRootFS, error) {
	b, err := t.builder()
	if err != nil {
		return template.UserRootFS{}, err
	}
	return b.UserTemplate(ctx, ref)
}

func (t *TemplateHost) UserTemplates(ctx context.Context) ([]template.UserRootFS, error) {
	b, err := t.builder()
	if err != nil {
		return nil, err
	}
	return b.UserTemplates(ctx)
}

func (t *TemplateHost) Versions(ctx context.Context, name string) ([]template.UserRootFS, error) {
	b, err := t.builder()
	if err != nil {
		return nil, err
	}
	return b.Versions(ctx, name)
}
