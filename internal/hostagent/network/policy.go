package network

import (
	"fmt"
	"net/netip"

	"github.com/pandastack/pandastack/internal/contract/netpolicy"
)

// compiled is a validated Policy in the forms the rules and the forwarder
// use.
type compiled struct {
	policy                netpolicy.Policy
	allowNets, denyNets   []netip.Prefix
	allowNames, denyNames nameSet
}

func compile(p netpolicy.Policy) (*compiled, error) {
	if n := len(p.AllowOut) + len(p.DenyOut); n > netpolicy.MaxEntries {
		return nil, &netpolicy.Error{Reason: fmt.Sprintf("%d entries, at most %d", n, netpolicy.MaxEntries)}
	}
	c := &compiled{policy: p}
	c.policy.AllowOut = append([]string(nil), p.AllowOut...)
	c.policy.DenyOut = append([]string(nil), p.DenyOut...)
	for _, l := range []struct {
		field   string
		entries []string
		nets    *[]netip.Prefix
		names   *nameSet
	}{
		{"allow_out", p.AllowOut, &c.allowNets, &c.allowNames},
		{"deny_out", p.DenyOut, &c.denyNets, &c.denyNames},
	} {
		for _, e := range l.entries {
			en, reason := netpolicy.ParseEntry(e)
			if reason != "" {
				return nil, &netpolicy.Error{Field: l.field, Entry: e, Reason: reason}
			}
			switch {
			case en.Prefix.IsValid():
				*l.nets = append(*l.nets, en.Prefix)
			case en.Wild:
				l.names.addWild(en.Name)
			default:
				l.names.addExact(en.Name)
			}
		}
	}
	return c, nil
}

// nameSet matches domain names: exact names and wildcards (every name
// strictly below a suffix).
type nameSet struct {
	exact map[string]bool
	below map[string]bool
}

func (s *nameSet) addExact(n string) {
	if s.exact == nil {
		s.exact = map[string]bool{}
	}
	s.exact[n] = true
}

func (s *nameSet) addWild(n string) {
	if s.below == nil {
		s.below = map[string]bool{}
	}
	s.below[n] = true
}

// match reports whether the lower-case name n (no trailing dot) is in the
// set: O(labels of n).
func (s *nameSet) match(n string) bool {
	if s.exact[n] {
		return true
	}
	if len(s.below) == 0 {
		return false
	}
	for i := 0; i < len(n); i++ {
		if n[i] == '.' && s.below[n[i+1:]] {
			return true
		}
	}
	return false
}

// nameVerdict is the policy's answer for a name the guest resolves.
type nameVerdict int

const (
	nameDenied      nameVerdict = iota // answer NXDOMAIN
	nameOpen                           // forward; the internet rule covers its addresses
	nameAllowListed                    // forward and allow the addresses it answered
)

func (c *compiled) resolve(name string) nameVerdict {
	switch {
	case c.allowNames.match(name):
		return nameAllowListed
	case c.denyNames.match(name):
		return nameDenied
	case c.policy.Internet:
		return nameOpen
	default:
		return nameDenied
	}
}
