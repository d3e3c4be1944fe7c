package fleet

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
)

// StoreSweeper is a host that lists and drops the sets of user template
// versions in the object store the fleet shares (hostclient.Client).
type StoreSweeper interface {
	// StoredUserTemplates lists the versions whose set the store holds
	// ("NAME:N").
	StoredUserTemplates(ctx context.Context) ([]string, error)
	// DropStoredUserTemplate deletes the set of version v of name (none is
	// fine) and collects the garbage.
	DropStoredUserTemplate(ctx context.Context, name string, v int) error
}

var _ StoreSweeper = (*hostclient.Client)(nil)

// SweepEvery is how often, at most, a host's connection starts a sweep of
// the object store's user template sets (Templates.SweepStore).
const SweepEvery = time.Hour

// sweepState is when the last sweep ended well, and whether one runs.
type sweepState struct {
	mu       sync.Mutex
	running  bool
	lastDone time.Time
}

// SweepStore removes from the object store, through via, the sets of
// user template versions that the registry gave out and no longer has: a
// deleted version whose set no host removed (none was connected, or the
// store was down then), a build dropped after it had uploaded its set. It
// lists the store first and reads the registry after, so that a version
// still building (its set uploaded, not recorded yet) is in the registry's
// builds. Left alone: sets of names the registry never recorded (a host's
// templates from before it joined the fleet) and numbers above a name's
// last one. It returns the versions removed ("NAME:N").
func (t *Templates) SweepStore(ctx context.Context, via StoreSweeper) ([]string, error) {
	stored, err := via.StoredUserTemplates(ctx)
	if err != nil {
		return nil, err
	}
	recs, err := t.r.cfg.Catalog.ListTemplateRecords(ctx)
	if err != nil {
		return nil, err
	}
	byName := map[string]catalog.Template{}
	for _, rec := range recs {
		byName[rec.Name] = rec
	}
	var removed []string
	for _, ref := range stored {
		name, v, err := templates.SplitRef(ref)
		if err != nil || v == 0 {
			continue
		}
		rec, ok := byName[name]
		if !ok || v > rec.LastVersion || versionIndex(rec, v) >= 0 ||
			slices.ContainsFunc(rec.Builds, func(b catalog.TemplateBuild) bool { return b.Version == v }) {
			continue
		}
		if err := via.DropStoredUserTemplate(ctx, name, v); err != nil {
			return removed, err
		}
		t.log.Info("removed from the object store a user template version the registry does not have", "template", ref)
		removed = append(removed, ref)
	}
	return removed, nil
}

// maybeSweep starts a sweep through host id, now connected, unless one
// runs or the last one ended well less than SweepEvery ago.
func (t *Templates) maybeSweep(id string) {
	via, ok := t.sweeperOf(id)
	if !ok {
		return
	}
	s := &t.sweep
	s.mu.Lock()
	if s.running || (!s.lastDone.IsZero() && time.Since(s.lastDone) < SweepEvery) {
		s.mu.Unlock()
		return
	}
	s.running = true
	s.mu.Unlock()
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		_, err := t.SweepStore(t.life, via)
		s.mu.Lock()
		s.running = false
		if err == nil {
			s.lastDone = time.Now()
		}
		s.mu.Unlock()
		if err != nil && t.life.Err() == nil {
			t.log.Warn("cannot sweep the object store's user templates; the next host connection tries again", "host_id", id, "err", err)
		}
	}()
}

// memberSweeper is a connected member's client (a registered host's).
func (t *Templates) memberSweeper(id string) (StoreSweeper, bool) {
	h, err := t.r.Host(id)
	if err != nil {
		return nil, false
	}
	s, ok := h.(StoreSweeper)
	return s, ok
}
