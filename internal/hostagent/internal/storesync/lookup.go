package storesync

import (
	"context"
	"errors"
	"fmt"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"github.com/pandastack/pandastack/internal/storage/objstore"
	"golang.org/x/sys/unix"
)

// LookupError classifies a failure to read the manifest of a set of what
// (snapshot, paused sandbox, template) id in the object store:
// host.ErrNotFound, host.ErrUnavailable (with a message for users),
// ctx's error or host.ErrCorrupt.
func (s *Sync) LookupError(ctx context.Context, what, id string, err error) error {
	switch {
	case errors.Is(err, objstore.ErrNotFound):
		return fmt.Errorf("%s %s: %w", what, id, host.ErrNotFound)
	case errors.Is(err, objstore.ErrUnavailable):
		s.log.Error("look up in the object store", "what", what, "id", id, "err", err)
		return &classed{class: host.ErrUnavailable, msg: fmt.Sprintf("%s %s is not on this host and the object store that may keep it cannot be reached; retry when it is back", what, id)}
	case ctx.Err() != nil:
		return fmt.Errorf("look up %s %s: %w", what, id, ctx.Err())
	}
	s.log.Error("look up in the object store", "what", what, "id", id, "err", err)
	return fmt.Errorf("%s %s: %w: its record in the object store is unreadable", what, id, host.ErrCorrupt)
}

// FetchWhy is what users are told when a fetch from the object store
// fails: the whole message when the store cannot be reached, the detail
// after the class otherwise.
type FetchWhy struct{ Unavailable, NotFound, Corrupt string }

// FetchFailed classifies err, the failure of fetching the set of what
// (a "snapshot", a "sandbox") id from the object store.
func FetchFailed(ctx context.Context, what, id string, err error, why FetchWhy) error {
	switch {
	case errors.Is(err, objstore.ErrUnavailable):
		return &classed{class: host.ErrUnavailable, msg: why.Unavailable}
	case errors.Is(err, objstore.ErrNotFound):
		return fmt.Errorf("%s %s: %w: %s", what, id, host.ErrNotFound, why.NotFound)
	case errors.Is(err, host.ErrCorrupt), errors.Is(err, manifest.ErrCorrupt):
		return fmt.Errorf("%s %s: %w: %s", what, id, host.ErrCorrupt, why.Corrupt)
	case ctx.Err() != nil:
		return fmt.Errorf("fetch %s %s: %w", what, id, ctx.Err())
	}
	return fmt.Errorf("fetch %s %s: %w", what, id, classifyIO(err))
}

// classed is an error of class whose text is msg alone, where the class's
// own text would mislead (host.ErrUnavailable reads "host agent
// unavailable").
type classed struct {
	class error
	msg   string
}

func (e *classed) Error() string { return e.msg }
func (e *classed) Unwrap() error { return e.class }

// classifyIO is err as host.ErrNoSpace if the disk is full (as the
// agent's classifyIOError).
func classifyIO(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %w", host.ErrNoSpace, err)
	}
	return err
}
