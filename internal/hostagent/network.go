package hostagent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/hostagent/internal/guestnet"
	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
)

// nic gives the next machine of s its network interface and returns the
// TAP device its VMM gets (the caller closes its own copy once the VMM has
// started). With Config.Network, s gets a namespace of its own joined to
// the host, under s's egress policy, named in s.rec.NetNS so that a
// restart of the agent finds it (the caller writes the record before it
// starts the VMM); releaseNet lets go of it once the VMM is gone. Without,
// the machine gets an isolated namespace where the guest reaches its
// gateway and nothing beyond (guestnet.Isolated), which goes away with the
// VMM.
func (a *Agent) nic(ctx context.Context, s *sandbox) (*os.File, error) {
	if a.cfg.Network == nil {
		nic, err := guestnet.Isolated()
		if err != nil {
			return nil, fmt.Errorf("network interface: %w", err)
		}
		return nic.TAP, nil
	}
	s.mu.Lock()
	policy := s.rec.Network
	s.mu.Unlock()
	ns, err := a.cfg.Network.Acquire(ctx, policy)
	if err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	tap, err := ns.TapFD()
	if err != nil {
		ns.Release()
		return nil, fmt.Errorf("network interface: %w", err)
	}
	s.mu.Lock()
	old := s.ns
	s.ns, s.rec.NetNS = ns, ns.Name()
	s.mu.Unlock()
	if old != nil { // never: the VMM before this one released it
		old.Release()
	}
	return tap, nil
}

// releaseNet removes s's network namespace, once its VMM is gone (a
// namespace outliving its VMM is only addresses and rules; releasing it
// before would leave the VMM's TAP in a namespace with no way out).
func (a *Agent) releaseNet(s *sandbox) {
	s.mu.Lock()
	ns := s.ns
	s.ns, s.rec.NetNS = nil, ""
	s.mu.Unlock()
	if ns == nil {
		return
	}
	if err := ns.Release(); err != nil {
		a.log.Warn("release network namespace", "sandbox_id", s.rec.ID, "netns", ns.Name(), "err", err)
	}
}

// adoptNet takes over the namespace an earlier agent gave s's VMM, which
// still runs: a failure leaves the sandbox running on without a network
// beyond its namespace (logged), which is better than losing it.
func (a *Agent) adoptNet(ctx context.Context, s *sandbox) {
	s.mu.Lock()
	name, policy := s.rec.NetNS, s.rec.Network
	s.mu.Unlock()
	if a.cfg.Network == nil || name == "" {
		return
	}
	ns, err := a.cfg.Network.Adopt(ctx, name, policy)
	if err != nil {
		a.log.Warn("adopted sandbox keeps running without its network", "sandbox_id", s.rec.ID, "netns", name, "err", err)
		return
	}
	s.mu.Lock()
	s.ns = ns
	s.mu.Unlock()
}

// cleanNetworks removes the namespaces of this host's prefix that no
// sandbox uses any more: those of VMMs a crash or a failed recovery left.
func (a *Agent) cleanNetworks(ctx context.Context) {
	if a.cfg.Network == nil {
		return
	}
	keep := map[string]bool{}
	a.mu.Lock()
	for _, s := range a.sandboxes {
		s.mu.Lock()
		if s.ns != nil {
			keep[s.ns.Name()] = true
		}
		s.mu.Unlock()
	}
	a.mu.Unlock()
	if err := a.cfg.Network.Cleanup(ctx, func(name string) bool { return keep[name] }); err != nil {
		a.log.Warn("remove leftover network namespaces", "err", err)
	}
}

// dialNet connects to port of s's guest from inside its namespace, as its
// gateway does (the egress policy does not apply).
func dialNet(ctx context.Context, s *sandbox, port int) (net.Conn, error) {
	s.mu.Lock()
	ns := s.ns
	s.mu.Unlock()
	if ns == nil {
		return nil, fmt.Errorf("sandbox %s has no network namespace: %w", s.rec.ID, ErrConflict)
	}
	return ns.DialContext(ctx, "tcp", netip.AddrPortFrom(network.GuestAddr, uint16(port)).String())
}

// bakeNIC is the template store's Net hook: with Config.Network and
// Config.BakeNetwork, a bake's machine gets a namespace of its own under
// that policy, removed once the machine has exited (or, should the agent
// crash meanwhile, by the next Recover); else nil, the store's isolated
// default.
func (a *Agent) bakeNIC() func(ctx context.Context, purpose string) (*vmm.Net, func(), error) {
	if a.cfg.Network == nil || a.cfg.BakeNetwork == nil {
		return nil
	}
	policy := *a.cfg.BakeNetwork
	return func(ctx context.Context, purpose string) (*vmm.Net, func(), error) {
		ns, err := a.cfg.Network.Acquire(ctx, policy)
		if err != nil {
			return nil, nil, fmt.Errorf("network namespace for %s: %w", purpose, err)
		}
		tap, err := ns.TapFD()
		if err != nil {
			ns.Release()
			return nil, nil, fmt.Errorf("network interface for %s: %w", purpose, err)
		}
		release := func() {
			tap.Close()
			if err := ns.Release(); err != nil {
				a.log.Warn("release network namespace", "purpose", purpose, "netns", ns.Name(), "err", err)
			}
		}
		return &vmm.Net{TAP: tap, MAC: guestnet.GuestMAC}, release, nil
	}
}

// SetNetwork changes a live sandbox's egress policy: at once for a sandbox
// that runs (its namespace's rules are replaced in one batch; established
// connections stay up), from its resume for a paused one.
func (a *Agent) SetNetwork(ctx context.Context, id string, p netpolicy.Policy) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("set network: %w: %w", ErrInvalid, err)
	}
	s, err := a.get(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.state == StateStopping || s.state == StateStopped {
		s.mu.Unlock()
		return fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
	}
	ns := s.ns
	s.mu.Unlock()
	if ns != nil {
		if err := ns.SetPolicy(ctx, p); err != nil {
			return fmt.Errorf("set network of %s: %w", id, err)
		}
	}
	s.mu.Lock()
	s.rec.Network = p
	s.mu.Unlock()
	paused := s.getState() == StatePaused
	if err := s.writeRecord(paused); err != nil {
		return classifyIOError(err)
	}
	if paused {
		a.restagePaused(s) // the copy in the object store says what it resumes with
	}
	return nil
}
