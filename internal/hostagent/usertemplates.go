package hostagent

import (
	"context"

	"github.com/pandastack/pandastack/internal/contract/templates"
)

// User templates in the object store (Config.Store; docs/storage.md) are
// package storesync's (usertemplates.go there); these are the agent's
// calls of it.

// StoredUserTemplates lists the versions of user templates whose set the
// object store holds ("NAME:N"): every host's builds, this fleet's.
// Without a store: none.
func (a *Agent) StoredUserTemplates(ctx context.Context) ([]string, error) {
	return a.sync.StoredUserTemplates(ctx)
}

// SharesTemplates reports whether this host keeps the user templates it
// builds in an object store, where the other hosts of its fleet find them.
func (a *Agent) SharesTemplates() bool { return a.store != nil }

// PublishUserTemplate uploads version u of a user template, whose
// directory dir holds its rootfs.ext4. Without an object store it does
// nothing.
func (a *Agent) PublishUserTemplate(ctx context.Context, u templates.UserRootFS, dir string) error {
	return a.sync.PublishUserTemplate(ctx, u, dir)
}

// UnpublishUserTemplate deletes the sets of versions of user template
// name from the object store (those it has not are fine), then, if it
// deleted one, collects the garbage.
func (a *Agent) UnpublishUserTemplate(ctx context.Context, name string, versions []int) error {
	return a.sync.UnpublishUserTemplate(ctx, name, versions)
}

// SweepUserCopies removes this host's copies of user template versions
// whose set the object store does not have, with their bakes, and
// returns how many it removed (storesync.Sync.SweepUserCopies). Call it
// before the host builds or creates anything.
func (a *Agent) SweepUserCopies(ctx context.Context) (int, error) {
	return a.sync.SweepUserCopies(ctx)
}
