package controlplane

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// DeleteTemplate removes a user template for key: ref is NAME (every
// version and every shape baked from them) or NAME:N (that version; the
// registry refuses the latest). Only its owner or an admin key may; a
// template the key may not use is not found, as is a built-in one's
// malformed name; a built-in is Invalid. Unless force, it is refused
// (Conflict, counting them) while sandboxes not stopped or snapshots made
// from it (of that version, for NAME:N) are in the catalog; with force
// they keep running, and restoring, from their own files. Without
// Config.Templates it is NotImplemented.
//
// The check and the removal are two steps: a sandbox created from the
// template between them runs on from its own files, as with force.
func (p *Plane) DeleteTemplate(ctx context.Context, key catalog.Key, ref string, force bool) error {
	b := p.cfg.Templates
	if b == nil {
		return noBuilds()
	}
	name, v, err := templates.SplitRef(ref)
	if err != nil {
		return Errorf(NotFound, "no template %q built from an image", ref)
	}
	if slices.Contains(templates.Reserved, name) {
		return Errorf(Invalid, "%s is a built-in template; it cannot be deleted", name)
	}
	vs, owns, err := templateVersions(ctx, b, key, name)
	if err != nil {
		return err
	}
	if len(vs) == 0 {
		return Errorf(NotFound, "no template %q built from an image", name)
	}
	if !owns {
		return Errorf(Forbidden, "only the key that built template %s, or an admin key, may delete it", name)
	}
	if v > 0 {
		if _, err := b.UserTemplate(ctx, ref); err != nil {
			return err
		}
	}
	if !force {
		if err := p.templateUnused(ctx, ref, name, v); err != nil {
			return err
		}
	}
	return b.Remove(ctx, ref)
}

// templateUnused refuses (Conflict) a delete of template ref (name, its
// version v; 0: every version) while live sandboxes or snapshots made
// from it are in the catalog.
func (p *Plane) templateUnused(ctx context.Context, ref, name string, v int) error {
	uses := func(t string) bool {
		if v > 0 {
			return t == ref
		}
		return t == name || strings.HasPrefix(t, name+":")
	}
	live, err := p.cat.ListSandboxes(ctx, catalog.SandboxFilter{States: LiveStates})
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	nsb := 0
	for _, sb := range live {
		if uses(sb.Template) {
			nsb++
		}
	}
	snaps, err := p.cat.ListSnapshots(ctx, "")
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	nsn := 0
	for _, sn := range snaps {
		if uses(sn.Template) {
			nsn++
		}
	}
	if nsb > 0 || nsn > 0 {
		return Errorf(Conflict, "template %s is in use: %d sandboxes not stopped and %d snapshots were made from it; kill and delete them first, or delete with ?force=true (they keep working from their own files)", ref, nsb, nsn)
	}
	return nil
}
