package network

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Policy is a sandbox's egress policy. Entries of AllowOut and DenyOut are
// IPv4 addresses ("203.0.113.7"), CIDRs ("203.0.113.0/24"), domain names
// ("example.com", exactly that name) or wildcard names ("*.example.com",
// every name below example.com, not example.com itself).
//
// Precedence, first match wins:
//
//  1. The always-blocked ranges of the host (see the package doc) are
//     rejected whatever the policy says, unless the operator's
//     Config.AllowedHostNets lists them.
//  2. An address or name that AllowOut matches is allowed.
//  3. An address or name that DenyOut matches is rejected.
//  4. Anything else is allowed if Internet is true, rejected otherwise.
//
// So Internet=true allows all but DenyOut, Internet=false denies all but
// AllowOut, and AllowOut wins over DenyOut. A name is matched by the DNS
// forwarder when the guest resolves it: a rejected name gets NXDOMAIN, an
// allowed name's A records are allowed for their TTL (at least
// Config.DNSMinTimeout). A denied name is only refused at the resolver: a
// guest that knows its address otherwise reaches it unless an address rule
// or Internet=false rejects that address.
//
// The zero Policy denies everything; DefaultPolicy allows the internet.
type Policy struct {
	Internet bool     `json:"internet"`
	AllowOut []string `json:"allow_out,omitempty"`
	DenyOut  []string `json:"deny_out,omitempty"`
}

// DefaultPolicy is the policy of a sandbox that asked for none: the
// internet, nothing else.
func DefaultPolicy() Policy { return Policy{Internet: true} }

// MaxPolicyEntries bounds AllowOut plus DenyOut of one policy.
const MaxPolicyEntries = 1024

// ErrInvalidPolicy is the class of every error of ParsePolicy and
// Policy.Validate (errors.Is); the error itself is a *PolicyError.
var ErrInvalidPolicy = errors.New("invalid network policy")

// PolicyError names the entry of a policy that is wrong and why, in words
// fit for a user (a 400 answer).
type PolicyError struct {
	Field  string // "allow_out", "deny_out" or "" for the whole policy
	Entry  string // the entry as given
	Reason string
}

func (e *PolicyError) Error() string {
	if e.Entry == "" && e.Field == "" {
		return "network policy: " + e.Reason
	}
	return fmt.Sprintf("network policy: %s entry %q: %s", e.Field, e.Entry, e.Reason)
}

func (e *PolicyError) Is(target error) bool { return target == ErrInvalidPolicy }

// ParsePolicy decodes a policy from its JSON form
// ({"internet": true, "allow_out": [...], "deny_out": [...]}); "internet"
// defaults to true when absent. Unknown fields are an error. It validates
// the result.
func ParsePolicy(data []byte) (Policy, error) {
	var raw struct {
		Internet *bool    `json:"internet"`
		AllowOut []string `json:"allow_out"`
		DenyOut  []string `json:"deny_out"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return Policy{}, &PolicyError{Reason: "not a valid policy object: " + err.Error()}
	}
	p := Policy{Internet: true, AllowOut: raw.AllowOut, DenyOut: raw.DenyOut}
	if raw.Internet != nil {
		p.Internet = *raw.Internet
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p.Canonical(), nil
}

// Canonical returns a valid p with its entries in the form they are
// stored and shown: spaces and a name's trailing dot removed, names in
// lower case, CIDRs masked ("10.1.2.3/8" is "10.0.0.0/8").
func (p Policy) Canonical() Policy {
	p.AllowOut, p.DenyOut = canonical(p.AllowOut), canonical(p.DenyOut)
	return p
}

// canonical returns valid entries in canonical form (Policy.Canonical).
func canonical(entries []string) []string {
	if entries == nil {
		return nil
	}
	out := make([]string, len(entries))
	for i, e := range entries {
		pfx, name, wild, _ := parseEntry(e)
		switch {
		case pfx.IsValid() && !strings.Contains(e, "/"):
			out[i] = pfx.Addr().String()
		case pfx.IsValid():
			out[i] = pfx.String()
		case wild:
			out[i] = "*." + name
		default:
			out[i] = name
		}
	}
	return out
}

// Validate reports the first bad entry as a *PolicyError.
func (p Policy) Validate() error {
	_, err := p.compile()
	return err
}

// compiled is a validated Policy in the forms the rules and the forwarder
// use.
type compiled struct {
	policy                Policy
	allowNets, denyNets   []netip.Prefix
	allowNames, denyNames nameSet
}

func (p Policy) compile() (*compiled, error) {
	if n := len(p.AllowOut) + len(p.DenyOut); n > MaxPolicyEntries {
		return nil, &PolicyError{Reason: fmt.Sprintf("%d entries, at most %d", n, MaxPolicyEntries)}
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
			pfx, name, wild, reason := parseEntry(e)
			if reason != "" {
				return nil, &PolicyError{Field: l.field, Entry: e, Reason: reason}
			}
			switch {
			case pfx.IsValid():
				*l.nets = append(*l.nets, pfx)
			case wild:
				l.names.addWild(name)
			default:
				l.names.addExact(name)
			}
		}
	}
	return c, nil
}

// parseEntry classifies one entry: an address or CIDR (pfx valid), or a
// lower-case name without trailing dot (wild: "*." stripped), or a reason
// why it is neither.
func parseEntry(e string) (pfx netip.Prefix, name string, wild bool, reason string) {
	s := strings.TrimSpace(e)
	if s == "" {
		return pfx, "", false, "empty entry"
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return pfx, "", false, "not a valid CIDR"
		}
		if !p.Addr().Is4() {
			return pfx, "", false, "only IPv4 is supported"
		}
		return p.Masked(), "", false, ""
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if !a.Is4() && !a.Is4In6() {
			return pfx, "", false, "only IPv4 is supported"
		}
		return netip.PrefixFrom(a.Unmap(), 32), "", false, ""
	}
	if strings.ContainsAny(s, ":[]") {
		return pfx, "", false, "not a valid address, CIDR or domain name"
	}
	s = strings.ToLower(strings.TrimSuffix(s, "."))
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		wild, s = true, rest
	}
	if r := checkName(s); r != "" {
		return pfx, "", false, r
	}
	return pfx, s, wild, ""
}

// checkName says what is wrong with a lower-case domain name, or "".
func checkName(s string) string {
	if len(s) == 0 || len(s) > 253 {
		return "not a valid domain name (1 to 253 characters)"
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 {
			return "not a valid domain name (empty or over-long label)"
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "not a valid domain name (label starts or ends with '-')"
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Sprintf("not a valid domain name (character %q)", c)
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" {
		return "not a valid address, CIDR or domain name"
	}
	return ""
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
