// Package netpolicy is a sandbox's egress policy as users write it and the
// control plane stores it: its form, its parsing and validation, and the
// classification of its entries (an address, a CIDR, a domain name, a
// wildcard). Enforcing it is a host's (internal/hostagent/network:
// nftables rules and the DNS forwarder). It imports the standard library
// only: the control plane and the hosts share it.
package netpolicy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/errs"
)

// Policy is a sandbox's egress policy. Entries of AllowOut and DenyOut are
// IPv4 addresses ("203.0.113.7"), CIDRs ("203.0.113.0/24"), domain names
// ("example.com", exactly that name) or wildcard names ("*.example.com",
// every name below example.com, not example.com itself).
//
// Precedence, first match wins:
//
//  1. The always-blocked ranges of the host (internal/hostagent/network's
//     package doc) are rejected whatever the policy says, unless the
//     operator's allowed_host_nets lists them.
//  2. An address or name that AllowOut matches is allowed.
//  3. An address or name that DenyOut matches is rejected.
//  4. Anything else is allowed if Internet is true, rejected otherwise.
//
// So Internet=true allows all but DenyOut, Internet=false denies all but
// AllowOut, and AllowOut wins over DenyOut. A name is matched by the DNS
// forwarder when the guest resolves it: a rejected name gets NXDOMAIN, an
// allowed name's A records are allowed for their TTL (with a floor the
// host sets). A denied name is only refused at the resolver: a
// guest that knows its address otherwise reaches it unless an address rule
// or Internet=false rejects that address.
//
// The zero Policy denies everything; Default allows the internet.
type Policy struct {
	Internet bool     `json:"internet"`
	AllowOut []string `json:"allow_out,omitempty"`
	DenyOut  []string `json:"deny_out,omitempty"`
}

// Default is the policy of a sandbox that asked for none: the internet,
// nothing else.
func Default() Policy { return Policy{Internet: true} }

// MaxEntries bounds AllowOut plus DenyOut of one policy.
const MaxEntries = 1024

// ErrInvalid is what every error of Parse and Policy.Validate is
// (errors.Is), of class errs.BadRequest: a policy is part of a request
// body. The error itself is an *Error.
var ErrInvalid = errs.New(errs.BadRequest, "invalid network policy")

// Error names the entry of a policy that is wrong and why, in words fit
// for a user (a 400 answer).
type Error struct {
	Field  string // "allow_out", "deny_out" or "" for the whole policy
	Entry  string // the entry as given
	Reason string
}

func (e *Error) Error() string {
	if e.Entry == "" && e.Field == "" {
		return "network policy: " + e.Reason
	}
	return fmt.Sprintf("network policy: %s entry %q: %s", e.Field, e.Entry, e.Reason)
}

func (e *Error) Unwrap() error { return ErrInvalid }

// Parse decodes a policy from its JSON form
// ({"internet": true, "allow_out": [...], "deny_out": [...]}); "internet"
// defaults to true when absent. Unknown fields are an error. It validates
// the result.
func Parse(data []byte) (Policy, error) {
	var raw struct {
		Internet *bool    `json:"internet"`
		AllowOut []string `json:"allow_out"`
		DenyOut  []string `json:"deny_out"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return Policy{}, &Error{Reason: "not a valid policy object: " + err.Error()}
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
		en, _ := ParseEntry(e)
		switch {
		case en.Prefix.IsValid() && !strings.Contains(e, "/"):
			out[i] = en.Prefix.Addr().String()
		case en.Prefix.IsValid():
			out[i] = en.Prefix.String()
		case en.Wild:
			out[i] = "*." + en.Name
		default:
			out[i] = en.Name
		}
	}
	return out
}

// Validate reports the first bad entry as an *Error.
func (p Policy) Validate() error {
	if n := len(p.AllowOut) + len(p.DenyOut); n > MaxEntries {
		return &Error{Reason: fmt.Sprintf("%d entries, at most %d", n, MaxEntries)}
	}
	for _, l := range []struct {
		field   string
		entries []string
	}{{"allow_out", p.AllowOut}, {"deny_out", p.DenyOut}} {
		for _, e := range l.entries {
			if _, reason := ParseEntry(e); reason != "" {
				return &Error{Field: l.field, Entry: e, Reason: reason}
			}
		}
	}
	return nil
}

// Entry is one entry of a policy, classified: an address or CIDR (Prefix
// valid: an address is a /32), or a lower-case domain name without a
// trailing dot, Wild if it was "*.NAME" (every name strictly below NAME).
type Entry struct {
	Prefix netip.Prefix
	Name   string
	Wild   bool
}

// ParseEntry classifies one entry of a policy, or says in words fit for
// a user why it is none of an address, a CIDR and a domain name (reason;
// "" for a valid entry).
func ParseEntry(e string) (en Entry, reason string) {
	s := strings.TrimSpace(e)
	if s == "" {
		return en, "empty entry"
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return en, "not a valid CIDR"
		}
		if !p.Addr().Is4() {
			return en, "only IPv4 is supported"
		}
		return Entry{Prefix: p.Masked()}, ""
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if !a.Is4() && !a.Is4In6() {
			return en, "only IPv4 is supported"
		}
		return Entry{Prefix: netip.PrefixFrom(a.Unmap(), 32)}, ""
	}
	if strings.ContainsAny(s, ":[]") {
		return en, "not a valid address, CIDR or domain name"
	}
	s = strings.ToLower(strings.TrimSuffix(s, "."))
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		en.Wild, s = true, rest
	}
	if r := checkName(s); r != "" {
		return Entry{}, r
	}
	en.Name = s
	return en, ""
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
