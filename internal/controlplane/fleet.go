package controlplane

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

// Fleet is the hosts a Plane drives: one (SingleHost: `panda up`, or
// `panda server --agent URL`) or those that registered with the control
// plane (internal/controlplane/fleet). Sandbox records name their host (HostID); the
// plane reaches it through Host.
type Fleet interface {
	// Host returns the client of host id. Errors wrap ErrHostLost (the
	// host stopped heartbeating: its sandboxes cannot be reached until it
	// returns), ErrUnknownHost, or host.ErrUnavailable.
	Host(id string) (host.Host, error)
	// Inventory describes every host for placement, by id.
	Inventory(ctx context.Context) []scheduler.Host
	// HostState is host id's state as Inventory would give it, without
	// its load (cheap: no catalog read); "" for an unknown host.
	HostState(id string) scheduler.HostState
}

// HostStatus is one host of a fleet as its registry knows it (GET
// /v1/hosts).
type HostStatus struct {
	Record    catalog.Host
	Static    bool // given by configuration, not registered
	Connected bool // its client is up
	Load      host.Load
	Loaded    bool      // Load was reported
	LoadAt    time.Time // when (the control plane's clock)
}

// Fleet error classes. ErrHostLost wraps host.ErrUnavailable: what cannot
// reach a lost host is retried like any unreachable one.
var (
	ErrHostLost    = fmt.Errorf("host lost: %w", host.ErrUnavailable)
	ErrUnknownHost = errors.New("unknown host")
)

// SingleHost is the fleet of one host h named id, which is always ready
// and never refuses a placement for capacity (the host itself does, with
// host.ErrNoSpace).
func SingleHost(id string, h host.Host) Fleet { return single{id, h} }

type single struct {
	id string
	h  host.Host
}

func (s single) Host(id string) (host.Host, error) {
	if id != s.id {
		return nil, fmt.Errorf("host %q: %w", id, ErrUnknownHost)
	}
	return s.h, nil
}

func (s single) HostState(id string) scheduler.HostState {
	if id != s.id {
		return ""
	}
	return scheduler.Ready
}

func (s single) Inventory(context.Context) []scheduler.Host {
	return []scheduler.Host{{ID: s.id, State: scheduler.Ready, CPUs: math.MaxInt32, MemoryMiB: math.MaxInt32,
		FreeMemoryMiB: math.MaxInt32, DiskFreeMiB: math.MaxInt32}}
}

// on returns the client of host id, as a user-facing error if it has none.
func (p *Plane) on(id string) (host.Host, error) {
	h, err := p.fleet.Host(id)
	if err != nil {
		if errors.Is(err, ErrHostLost) {
			return nil, &Error{Kind: Unavailable, Msg: fmt.Sprintf("host %s is lost (it stopped heartbeating); its sandboxes are unreachable until it returns", id), Err: err}
		}
		return nil, err
	}
	return h, nil
}

// anyHost is a host to ask what every host answers alike (template
// defaults, the accelerator): the first ready one.
func (p *Plane) anyHost(ctx context.Context) (host.Host, string, error) {
	inv := p.fleet.Inventory(ctx)
	for _, h := range inv {
		if h.State == scheduler.Ready {
			c, err := p.fleet.Host(h.ID)
			if err == nil {
				return c, h.ID, nil
			}
		}
	}
	return nil, "", Errorf(Unavailable, "no host is ready (%d known)", len(inv))
}

// place chooses hosts for req (scheduler.Place over the fleet's
// inventory), as user-facing errors.
func (p *Plane) place(ctx context.Context, req scheduler.Request) ([]scheduler.Choice, error) {
	cs, err := scheduler.Place(req, p.fleet.Inventory(ctx))
	switch {
	case err == nil:
		return cs, nil
	case errors.Is(err, scheduler.ErrUnknownHost):
		return nil, &Error{Kind: NotFound, Msg: err.Error(), Err: err}
	case errors.Is(err, scheduler.ErrHostNotReady):
		return nil, &Error{Kind: Conflict, Msg: err.Error(), Err: err}
	case errors.Is(err, scheduler.ErrInvalid):
		return nil, &Error{Kind: Invalid, Msg: err.Error(), Err: err}
	case errors.Is(err, scheduler.ErrNoCapacity):
		return nil, &Error{Kind: Unavailable, Msg: err.Error(), Err: err}
	}
	return nil, err
}
