package controlplane

import (
	"context"
	"errors"
	"fmt"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// ForgetHost removes host id from the fleet (DELETE /v1/hosts/{id}). It
// is refused (Conflict) while the host holds live sandboxes, unless the
// host is lost, and while a sandbox is being placed on it; NotFound if the
// fleet has no such host; NotImplemented for a plane of one host.
//
// It cannot race with a placement on the host: a placement claims its
// host for as long as it takes to write the record that names it (a
// create's or a fork child's reservation; a resume's, from before the
// host restores it until the record says so; claimHost). ForgetHost marks
// the host as leaving when no claim is held and only then lists its live
// sandboxes, and a claim of a host that is leaving, or no longer in the
// fleet, fails: so either the placement's record is in the catalog before
// the list (and the host is not forgotten), or the placement fails and
// never names the host. The guarantee is this plane's: placements by
// another control plane sharing the catalog are not seen.
func (p *Plane) ForgetHost(ctx context.Context, id string) error {
	reg, ok := p.fleet.(Registry)
	if !ok {
		return Errorf(NotImplemented, "this server has one host, which cannot be removed")
	}
	done, err := p.leaving(id)
	if err != nil {
		return err
	}
	defer done()
	live, err := p.cat.ListSandboxes(ctx, catalog.SandboxFilter{HostID: id, States: LiveStates})
	if err != nil {
		return fmt.Errorf("list sandboxes of host %s: %w", id, err)
	}
	lost := false
	for _, st := range reg.Statuses() {
		lost = lost || (st.Record.ID == id && st.Record.State == catalog.HostLost)
	}
	if len(live) > 0 && !lost {
		return Errorf(Conflict, "host %s holds %d live sandboxes: drain it (POST /v1/hosts/%s/drain?migrate=true) or kill them first", id, len(live), id)
	}
	if err := reg.Forget(ctx, id); err != nil {
		if errors.Is(err, catalog.ErrNotFound) {
			return Errorf(NotFound, "host %s not found", id)
		}
		return reg.Classify(err)
	}
	return nil
}

// leaving marks host id as leaving the fleet until done: claimHost fails
// for it meanwhile. It is refused while a placement holds a claim on it.
func (p *Plane) leaving(id string) (done func(), err error) {
	p.hostsMu.Lock()
	defer p.hostsMu.Unlock()
	if p.claims[id] > 0 {
		return nil, Errorf(Conflict, "host %s has %d sandboxes being placed on it: try again when they are", id, p.claims[id])
	}
	if p.forgetting[id] {
		return nil, Errorf(Conflict, "host %s is being removed already", id)
	}
	p.forgetting[id] = true
	return func() {
		p.hostsMu.Lock()
		defer p.hostsMu.Unlock()
		delete(p.forgetting, id)
	}, nil
}

// claimHost claims host id for a placement until release: until then
// ForgetHost refuses the host. It fails (Unavailable: placing again
// chooses another host) if the host is leaving the fleet or no longer in
// it. Claims are held while a record naming the host is written (see
// ForgetHost), never across a wait for a user.
func (p *Plane) claimHost(id string) (release func(), err error) {
	p.hostsMu.Lock()
	defer p.hostsMu.Unlock()
	if p.forgetting[id] || p.fleet.HostState(id) == "" {
		return nil, Errorf(Unavailable, "host %s is leaving the fleet: try again", id)
	}
	p.claims[id]++
	return func() {
		p.hostsMu.Lock()
		defer p.hostsMu.Unlock()
		if p.claims[id]--; p.claims[id] == 0 {
			delete(p.claims, id)
		}
	}, nil
}
