package network

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Names of the chains and sets in the tables this package makes.
const (
	setBlocked  = "blocked"   // host: always-blocked ranges
	setAllowed  = "allowed"   // host: the operator's exceptions
	setAllowNet = "allow_net" // namespace: AllowOut addresses and CIDRs
	setDenyNet  = "deny_net"  // namespace: DenyOut addresses and CIDRs
	setAllowDNS = "allow_dns" // namespace: addresses of allowed names, with timeouts

	chainReject = "reject"
	chainEgress = "egress"
)

// alwaysBlocked are blocked for every sandbox besides the pool and the
// host's own subnets: cloud metadata and link-local, private networks,
// shared address space, "this network", loopback, multicast and reserved.
var alwaysBlocked = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("224.0.0.0/3"),
}

// ---- expression helpers ----

func ifnameBytes(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func metaCmp(key expr.MetaKey, data []byte, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: data},
	}
}

func iif(name string) []expr.Any {
	return metaCmp(expr.MetaKeyIIFNAME, ifnameBytes(name), expr.CmpOpEq)
}
func oif(name string) []expr.Any {
	return metaCmp(expr.MetaKeyOIFNAME, ifnameBytes(name), expr.CmpOpEq)
}
func iifPrefix(p string) []expr.Any { return metaCmp(expr.MetaKeyIIFNAME, []byte(p), expr.CmpOpEq) }
func oifPrefix(p string) []expr.Any { return metaCmp(expr.MetaKeyOIFNAME, []byte(p), expr.CmpOpEq) }
func notOifPrefix(p string) []expr.Any {
	return metaCmp(expr.MetaKeyOIFNAME, []byte(p), expr.CmpOpNeq)
}
func l4proto(p byte) []expr.Any { return metaCmp(expr.MetaKeyL4PROTO, []byte{p}, expr.CmpOpEq) }

func ctState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

const (
	offSaddr = 12
	offDaddr = 16
)

// addrInPrefix matches the IPv4 address at off (offSaddr, offDaddr) against
// a prefix; op CmpOpEq for "in", CmpOpNeq for "not in".
func addrInPrefix(off uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		clear(mask)
	}
	a := p.Masked().Addr().As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: op, Register: 1, Data: a[:]},
	}
}

func addrIs(off uint32, a netip.Addr, op expr.CmpOp) []expr.Any {
	b := a.As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Cmp{Op: op, Register: 1, Data: b[:]},
	}
}

func daddrInSet(s *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offDaddr, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID},
	}
}

func transportByte(off uint32, v byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{v}},
	}
}

func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

var (
	accept = &expr.Verdict{Kind: expr.VerdictAccept}
	drop   = &expr.Verdict{Kind: expr.VerdictDrop}
)

func gotoChain(name string) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: name} }
func jumpChain(name string) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictJump, Chain: name} }

func rule(t *nftables.Table, c *nftables.Chain, parts ...any) *nftables.Rule {
	var exprs []expr.Any
	for _, p := range parts {
		switch v := p.(type) {
		case []expr.Any:
			exprs = append(exprs, v...)
		case expr.Any:
			exprs = append(exprs, v)
		default:
			panic("nft rule: unexpected part")
		}
	}
	return &nftables.Rule{Table: t, Chain: c, Exprs: exprs}
}

// addRejectChain adds the chain every rejection goes to: a TCP reset for
// TCP, ICMP "administratively prohibited" for the rest, so that clients
// fail at once.
func addRejectChain(cc *nftables.Conn, t *nftables.Table) *nftables.Chain {
	c := cc.AddChain(&nftables.Chain{Name: chainReject, Table: t})
	cc.AddRule(rule(t, c, l4proto(unix.IPPROTO_TCP), &expr.Reject{Type: unix.NFT_REJECT_TCP_RST}))
	cc.AddRule(rule(t, c, &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 13})) // ICMP_PKT_FILTERED
	return c
}

func baseChain(cc *nftables.Conn, t *nftables.Table, name string, typ nftables.ChainType,
	hook *nftables.ChainHook, prio *nftables.ChainPriority, policy nftables.ChainPolicy) *nftables.Chain {
	return cc.AddChain(&nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio, Policy: &policy})
}

// replaceTable queues, in cc's batch, the deletion of table name (if it
// exists) and the creation of an empty one, so that the batch swaps the
// old table for the new one atomically.
func replaceTable(cc *nftables.Conn, name string) *nftables.Table {
	t := &nftables.Table{Name: name, Family: nftables.TableFamilyIPv4}
	cc.AddTable(t)
	cc.DelTable(t)
	return cc.AddTable(t)
}

// ---- the host table ----

// hostTable is the state the host table is built from.
type hostTable struct {
	prefix  string
	pool    netip.Prefix
	blocked []netip.Prefix // always-blocked ranges, pool and host subnets included
	allowed []netip.Prefix // the operator's exceptions
}

// queue adds the whole host table to cc's batch, replacing any old one.
func (h *hostTable) queue(cc *nftables.Conn) error {
	t := replaceTable(cc, h.prefix)
	blocked := &nftables.Set{Table: t, ID: 1, Name: setBlocked, KeyType: nftables.TypeIPAddr, Interval: true}
	allowed := &nftables.Set{Table: t, ID: 2, Name: setAllowed, KeyType: nftables.TypeIPAddr, Interval: true}
	if err := cc.AddSet(blocked, intervalElements(h.blocked)); err != nil {
		return err
	}
	if err := cc.AddSet(allowed, intervalElements(h.allowed)); err != nil {
		return err
	}
	addRejectChain(cc, t)

	from := cc.AddChain(&nftables.Chain{Name: "from_sandbox", Table: t})
	cc.AddRule(rule(t, from, addrInPrefix(offSaddr, h.pool, expr.CmpOpNeq), drop))
	cc.AddRule(rule(t, from, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept))
	cc.AddRule(rule(t, from, oifPrefix(h.prefix), gotoChain(chainReject)))
	cc.AddRule(rule(t, from, addrInPrefix(offDaddr, h.pool, expr.CmpOpEq), gotoChain(chainReject)))
	cc.AddRule(rule(t, from, daddrInSet(allowed), accept))
	cc.AddRule(rule(t, from, daddrInSet(blocked), gotoChain(chainReject)))

	to := cc.AddChain(&nftables.Chain{Name: "to_sandbox", Table: t})
	cc.AddRule(rule(t, to, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept))
	cc.AddRule(rule(t, to, drop))

	fwd := baseChain(cc, t, "forward", nftables.ChainTypeFilter, nftables.ChainHookForward,
		nftables.ChainPriorityFilter, nftables.ChainPolicyAccept)
	cc.AddRule(rule(t, fwd, iifPrefix(h.prefix), jumpChain("from_sandbox")))
	cc.AddRule(rule(t, fwd, oifPrefix(h.prefix), jumpChain("to_sandbox")))

	in := baseChain(cc, t, "input", nftables.ChainTypeFilter, nftables.ChainHookInput,
		nftables.ChainPriorityFilter, nftables.ChainPolicyAccept)
	cc.AddRule(rule(t, in, iifPrefix(h.prefix), addrInPrefix(offDaddr, h.pool, expr.CmpOpEq), gotoChain(chainReject)))
	cc.AddRule(rule(t, in, iifPrefix(h.prefix), daddrInSet(allowed), accept))
	cc.AddRule(rule(t, in, iifPrefix(h.prefix), gotoChain(chainReject)))

	nat := baseChain(cc, t, "postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting,
		nftables.ChainPriorityNATSource, nftables.ChainPolicyAccept)
	cc.AddRule(rule(t, nat, addrInPrefix(offSaddr, h.pool, expr.CmpOpEq), notOifPrefix(h.prefix), &expr.Masq{}))
	return nil
}

// queueBlocked replaces the always-blocked set's elements.
func (h *hostTable) queueBlocked(cc *nftables.Conn) error {
	t := &nftables.Table{Name: h.prefix, Family: nftables.TableFamilyIPv4}
	s := &nftables.Set{Table: t, ID: 1, Name: setBlocked, KeyType: nftables.TypeIPAddr, Interval: true}
	cc.FlushSet(s)
	return addElements(cc, s, intervalElements(h.blocked))
}

// addElements queues elements for s, if there are any.
func addElements(cc *nftables.Conn, s *nftables.Set, els []nftables.SetElement) error {
	if len(els) == 0 {
		return nil
	}
	return cc.SetAddElements(s, els)
}

// ---- a sandbox's table ----

// Sets get their batch IDs from us: google/nftables would otherwise
// take them from an unsynchronised package counter (a data race between
// namespaces made concurrently). An ID needs to be unique in its batch.
func sandboxSets(t *nftables.Table) (allowNet, denyNet, allowDNS *nftables.Set) {
	return &nftables.Set{Table: t, ID: 1, Name: setAllowNet, KeyType: nftables.TypeIPAddr, Interval: true},
		&nftables.Set{Table: t, ID: 2, Name: setDenyNet, KeyType: nftables.TypeIPAddr, Interval: true},
		&nftables.Set{Table: t, ID: 3, Name: setAllowDNS, KeyType: nftables.TypeIPAddr, HasTimeout: true}
}

// queueSandboxTable adds a sandbox namespace's whole table to cc's batch,
// replacing any old one, with policy p and the learned addresses dns.
func queueSandboxTable(cc *nftables.Conn, name string, p *compiled, dns []learnedAddr) error {
	t := replaceTable(cc, name)
	allowNet, denyNet, allowDNS := sandboxSets(t)
	for _, s := range []*nftables.Set{allowNet, denyNet, allowDNS} {
		if err := cc.AddSet(s, nil); err != nil {
			return err
		}
	}
	addRejectChain(cc, t)
	cc.AddChain(&nftables.Chain{Name: chainEgress, Table: t})

	pre := baseChain(cc, t, "prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting,
		nftables.ChainPriorityNATDest, nftables.ChainPolicyAccept)
	gw := GatewayAddr.As4()
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		// Every DNS query of the guest goes to the forwarder, whatever
		// server it asked: the policy's names cannot be bypassed by
		// asking another resolver.
		cc.AddRule(rule(t, pre, iif(TapName), addrIs(offDaddr, GatewayAddr, expr.CmpOpNeq),
			l4proto(proto), dport(DNSPort),
			&expr.Immediate{Register: 1, Data: gw[:]},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1}))
	}

	post := baseChain(cc, t, "postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting,
		nftables.ChainPriorityNATSource, nftables.ChainPolicyAccept)
	cc.AddRule(rule(t, post, oif(UplinkName), addrIs(offSaddr, GuestAddr, expr.CmpOpEq), &expr.Masq{}))

	in := baseChain(cc, t, "input", nftables.ChainTypeFilter, nftables.ChainHookInput,
		nftables.ChainPriorityFilter, nftables.ChainPolicyDrop)
	cc.AddRule(rule(t, in, iif("lo"), accept))
	cc.AddRule(rule(t, in, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept))
	cc.AddRule(rule(t, in, iif(TapName), addrIs(offSaddr, GuestAddr, expr.CmpOpNeq), drop))
	cc.AddRule(rule(t, in, iif(TapName), l4proto(unix.IPPROTO_UDP), dport(DNSPort), accept))
	cc.AddRule(rule(t, in, iif(TapName), l4proto(unix.IPPROTO_TCP), dport(DNSPort), accept))
	cc.AddRule(rule(t, in, iif(TapName), l4proto(unix.IPPROTO_ICMP), transportByte(0, 8), accept)) // echo request
	cc.AddRule(rule(t, in, iif(TapName), gotoChain(chainReject)))

	fwd := baseChain(cc, t, "forward", nftables.ChainTypeFilter, nftables.ChainHookForward,
		nftables.ChainPriorityFilter, nftables.ChainPolicyDrop)
	cc.AddRule(rule(t, fwd, iif(TapName), addrIs(offSaddr, GuestAddr, expr.CmpOpNeq), drop))
	cc.AddRule(rule(t, fwd, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept))
	// A segment of a TCP connection this namespace never saw open (a fork
	// child's inherited connection; tcp_loose is off) is INVALID: reset it
	// toward the guest so that it never reaches the peer.
	cc.AddRule(rule(t, fwd, iif(TapName), ctState(expr.CtStateBitINVALID), gotoChain(chainReject)))
	cc.AddRule(rule(t, fwd, iif(TapName), oif(UplinkName), gotoChain(chainEgress)))
	cc.AddRule(rule(t, fwd, iif(TapName), gotoChain(chainReject)))

	return queuePolicy(cc, t, p, dns)
}

// queuePolicy replaces, in cc's batch, the policy's sets and the egress
// chain of table t: one batch, so the change is atomic.
func queuePolicy(cc *nftables.Conn, t *nftables.Table, p *compiled, dns []learnedAddr) error {
	allowNet, denyNet, allowDNS := sandboxSets(t)
	cc.FlushSet(allowNet)
	cc.FlushSet(denyNet)
	cc.FlushSet(allowDNS)
	if err := addElements(cc, allowNet, intervalElements(p.allowNets)); err != nil {
		return err
	}
	if err := addElements(cc, denyNet, intervalElements(p.denyNets)); err != nil {
		return err
	}
	if err := addElements(cc, allowDNS, timeoutElements(dns, time.Now())); err != nil {
		return err
	}
	egress := &nftables.Chain{Name: chainEgress, Table: t}
	cc.FlushChain(egress)
	cc.AddRule(rule(t, egress, daddrInSet(allowNet), accept))
	cc.AddRule(rule(t, egress, daddrInSet(allowDNS), accept))
	cc.AddRule(rule(t, egress, daddrInSet(denyNet), gotoChain(chainReject)))
	if p.policy.Internet {
		cc.AddRule(rule(t, egress, accept))
	} else {
		cc.AddRule(rule(t, egress, gotoChain(chainReject)))
	}
	return nil
}

// learnedAddr is an address the forwarder answered for an allowed name,
// allowed until expires.
type learnedAddr struct {
	addr    netip.Addr
	expires time.Time
}

func timeoutElements(l []learnedAddr, now time.Time) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, len(l))
	for _, a := range l {
		d := a.expires.Sub(now)
		if d < time.Second {
			continue
		}
		b := a.addr.As4()
		out = append(out, nftables.SetElement{Key: b[:], Timeout: d.Truncate(time.Millisecond)})
	}
	return out
}

// intervalElements turns prefixes into the elements of an interval set:
// overlapping and adjacent ranges merged (the kernel refuses overlaps),
// each range as its start and, unless it runs to the end of the address
// space, its end+1 flagged as an interval end.
func intervalElements(ps []netip.Prefix) []nftables.SetElement {
	type span struct{ lo, hi uint64 } // hi exclusive
	spans := make([]span, 0, len(ps))
	for _, p := range ps {
		if !p.IsValid() || !p.Addr().Is4() {
			continue
		}
		a := p.Masked().Addr().As4()
		lo := uint64(binary.BigEndian.Uint32(a[:]))
		spans = append(spans, span{lo, lo + 1<<(32-p.Bits())})
	}
	slices.SortFunc(spans, func(a, b span) int {
		switch {
		case a.lo < b.lo:
			return -1
		case a.lo > b.lo:
			return 1
		}
		return 0
	})
	var merged []span
	for _, s := range spans {
		if n := len(merged); n > 0 && s.lo <= merged[n-1].hi {
			merged[n-1].hi = max(merged[n-1].hi, s.hi)
			continue
		}
		merged = append(merged, s)
	}
	var out []nftables.SetElement
	for _, s := range merged {
		out = append(out, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, uint32(s.lo))})
		if s.hi <= 0xffffffff {
			out = append(out, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, uint32(s.hi)), IntervalEnd: true})
		}
	}
	return out
}
