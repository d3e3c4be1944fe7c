package network

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/miekg/dns"
)

// What the DNS forwarder keeps from the host's resolvers. A sandbox can
// never reach an always-blocked address, so an answer naming one serves
// only to map the networks around the host (an internal zone's names and
// where they live) or to rebind a name the guest resolved before; the
// forwarder drops such answers, as dnsmasq's --stop-dns-rebind does, and
// answers names in the reverse zones of those ranges itself (NXDOMAIN, as
// --bogus-priv does), so that PTR records of the host's networks stay
// where they are.

// addrFilter is the set of addresses no sandbox of a Manager reaches: the
// host table's blocked ranges (the always-blocked ones, the pool and the
// host's subnets) less the operator's exceptions (the pool is never an
// exception), as the host table applies them; and, for reverse names,
// the IPv6 ranges of the host's own networks (guests have no IPv6 at all).
type addrFilter struct {
	pool    netip.Prefix
	blocked []netip.Prefix
	allowed []netip.Prefix
}

// filter is the addrFilter of the ranges h blocks.
func (h *hostTable) filter() *addrFilter {
	return &addrFilter{pool: h.pool, blocked: h.blocked, allowed: h.allowed}
}

// blockedV6 are the IPv6 ranges whose reverse names the forwarder answers
// itself: loopback, unique local, link-local, IPv4-mapped.
var blockedV6 = []netip.Prefix{
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("::ffff:0:0/96"),
}

// within reports whether p lies wholly inside r.
func within(p, r netip.Prefix) bool {
	return r.IsValid() && r.Bits() <= p.Bits() && r.Contains(p.Addr())
}

// blocksPrefix reports whether every address of p is one no sandbox may
// reach.
func (f *addrFilter) blocksPrefix(p netip.Prefix) bool {
	if p.Addr().Is6() {
		for _, r := range blockedV6 {
			if within(p, r) {
				return true
			}
		}
		return false
	}
	if within(p, f.pool) {
		return true
	}
	for _, r := range f.allowed {
		if within(p, r) {
			return false
		}
	}
	for _, r := range f.blocked {
		if within(p, r) {
			return true
		}
	}
	return false
}

// blocks reports whether no sandbox may reach a.
func (f *addrFilter) blocks(a netip.Addr) bool {
	a = a.Unmap()
	return f.blocksPrefix(netip.PrefixFrom(a, a.BitLen()))
}

// reversePrefix is the range of addresses a name in in-addr.arpa or
// ip6.arpa stands for: the labels left of the zone, read from the right
// as octets (nibbles) as far as they are octets (nibbles), so that every
// name below a range's reverse zone (a PTR name, or anything made up
// below it) maps into that range. ok is false for other names and for the
// two zones themselves.
func reversePrefix(name string) (p netip.Prefix, ok bool) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if rest, found := strings.CutSuffix(name, ".in-addr.arpa"); found {
		labels := strings.Split(rest, ".")
		var b [4]byte
		n := 0
		for i := len(labels) - 1; i >= 0 && n < 4; i-- {
			l := labels[i]
			v, err := strconv.ParseUint(l, 10, 8)
			if err != nil || (len(l) > 1 && l[0] == '0') {
				break
			}
			b[n] = byte(v)
			n++
		}
		if n == 0 {
			return netip.Prefix{}, false
		}
		return netip.PrefixFrom(netip.AddrFrom4(b), 8*n), true
	}
	if rest, found := strings.CutSuffix(name, ".ip6.arpa"); found {
		labels := strings.Split(rest, ".")
		var b [16]byte
		n := 0
		for i := len(labels) - 1; i >= 0 && n < 32; i-- {
			v, err := strconv.ParseUint(labels[i], 16, 8)
			if err != nil || len(labels[i]) != 1 {
				break
			}
			b[n/2] |= byte(v) << (4 * (1 - n%2))
			n++
		}
		if n == 0 {
			return netip.Prefix{}, false
		}
		return netip.PrefixFrom(netip.AddrFrom16(b), 4*n), true
	}
	return netip.Prefix{}, false
}

// scrub removes from rrs what a guest must not be told: A records of
// blocked addresses, every AAAA record (guests are IPv4 only: they never
// try an address family they have no route for), and the same among the
// address hints of SVCB and HTTPS records. dropped counts the blocked
// IPv4 addresses removed.
func scrub(rrs []dns.RR, f *addrFilter) (out []dns.RR, dropped int) {
	out = rrs[:0]
	for _, rr := range rrs {
		switch rr := rr.(type) {
		case *dns.A:
			if a, ok := netip.AddrFromSlice(rr.A.To4()); !ok || f.blocks(a) {
				dropped++
				continue
			}
		case *dns.AAAA:
			continue
		case *dns.SVCB:
			var n int
			rr.Value, n = scrubHints(rr.Value, f)
			dropped += n
		case *dns.HTTPS:
			var n int
			rr.Value, n = scrubHints(rr.Value, f)
			dropped += n
		}
		out = append(out, rr)
	}
	return out, dropped
}

// scrubHints removes blocked addresses from an ipv4hint (the whole hint
// if none is left) and every ipv6hint.
func scrubHints(kvs []dns.SVCBKeyValue, f *addrFilter) (out []dns.SVCBKeyValue, dropped int) {
	out = kvs[:0]
	for _, kv := range kvs {
		switch kv := kv.(type) {
		case *dns.SVCBIPv4Hint:
			keep := kv.Hint[:0]
			for _, ip := range kv.Hint {
				if a, ok := netip.AddrFromSlice(ip.To4()); ok && !f.blocks(a) {
					keep = append(keep, ip)
				} else {
					dropped++
				}
			}
			if kv.Hint = keep; len(keep) == 0 {
				continue
			}
		case *dns.SVCBIPv6Hint:
			continue
		}
		out = append(out, kv)
	}
	return out, dropped
}
