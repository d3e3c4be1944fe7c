package network_test

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/testing/nettest"
)

// TestDNSRebinding replays what a sandbox learns of the host's networks
// through its DNS: names of the host's resolvers whose addresses lie in
// ranges no sandbox reaches (an internal zone's, a public name rebound to
// 127.0.0.1, the host's own subnet, the pool) reach the guest without
// those addresses, and the reverse names of those ranges are answered
// NXDOMAIN without asking upstream. The operator's exceptions resolve,
// except the pool; ordinary names are untouched.
func TestDNSRebinding(t *testing.T) {
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{AllowedHostNets: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	ctx := ctxT(t, 20*time.Second)
	ns, err := m.Acquire(ctx, netpolicy.Default())
	if err != nil {
		t.Fatal(err)
	}
	g := attach(t, env, ns)
	gw := hostPort(network.GatewayAddr, 53)

	internal := netip.MustParseAddr("172.20.1.3")
	env.AddRecord("db.corp.test", internal)
	env.AddRecord("rebind.test", netip.MustParseAddr("127.0.0.1"))
	env.AddRecord("uplink.test", nettest.HostUplinkAddr)
	env.AddRecord("pool.test", ns.HostAddr())
	env.AddRecord("mixed.test", nettest.OtherAddr, netip.MustParseAddr("192.168.1.7"), netip.MustParseAddr("100.64.0.9"))
	env.AddRecord("mirror.corp.test", nettest.PrivateNetAddr) // 10.77.0.10: the operator allowed 10/8
	env.AddPTR(internal, "db.corp.test")
	env.AddPTR(nettest.PrivateNetAddr, "mirror.corp.test")
	env.AddPTR(nettest.OtherAddr, "other.test")

	addrs := func(t *testing.T, name string) []netip.Addr {
		t.Helper()
		r := query(t, g, name, dns.TypeA, "udp", gw)
		if r.Rcode != dns.RcodeSuccess {
			t.Fatalf("A %s: rcode %s, want NOERROR", name, dns.RcodeToString[r.Rcode])
		}
		var out []netip.Addr
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				ip, _ := netip.AddrFromSlice(a.A.To4())
				out = append(out, ip)
			}
		}
		return out
	}
	for _, tc := range []struct {
		name string
		want []netip.Addr
	}{
		{"allowed.test", []netip.Addr{nettest.WebAddr}},
		{"mixed.test", []netip.Addr{nettest.OtherAddr}},
		{"mirror.corp.test", []netip.Addr{nettest.PrivateNetAddr}},
		{"db.corp.test", nil},
		{"rebind.test", nil},
		{"uplink.test", nil},
		{"metadata.test", nil},
		{"pool.test", nil},
	} {
		if got := addrs(t, tc.name); !slices.Equal(got, tc.want) {
			t.Errorf("A %s: got %v, want %v", tc.name, got, tc.want)
		}
	}
	// What programs see: no address for the internal name, the exception
	// reachable by name.
	if got, err := lookup(t, g, "db.corp.test"); !isNXDOMAIN(err) {
		t.Errorf("the guest's resolver: db.corp.test is %v, %v; want no such host", got, err)
	}
	wantGet(t, g, "http://mirror.corp.test/", nettest.PrivateNetAddr)

	ptr := func(t *testing.T, name string) *dns.Msg {
		t.Helper()
		return query(t, g, name, dns.TypePTR, "udp", gw)
	}
	rev := func(a netip.Addr) string { r, _ := dns.ReverseAddr(a.String()); return r }
	before := env.DNSQueries()
	for _, name := range []string{
		rev(internal),
		"x.y." + rev(internal), // made up below a blocked range's zone
		"16.172.in-addr.arpa.",
		rev(netip.MustParseAddr("127.0.0.1")),
		rev(nettest.HostUplinkAddr),
		rev(ns.HostAddr()), // the pool, though 10/8 is allowed
		rev(netip.MustParseAddr("fd00::1")),
	} {
		if r := ptr(t, name); r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
			t.Errorf("PTR %s: rcode %s, %d answers; want NXDOMAIN", name, dns.RcodeToString[r.Rcode], len(r.Answer))
		}
	}
	if n := env.DNSQueries() - before; n != 0 {
		t.Errorf("%d reverse queries of blocked ranges reached the upstream, want none", n)
	}
	for addr, want := range map[netip.Addr]string{nettest.OtherAddr: "other.test.", nettest.PrivateNetAddr: "mirror.corp.test."} {
		r := ptr(t, rev(addr))
		if p, ok := firstPTR(r); !ok || len(r.Answer) != 1 || p != want {
			t.Errorf("PTR of %s: rcode %s, %v; want %s", addr, dns.RcodeToString[r.Rcode], r.Answer, want)
		}
	}
}

func firstPTR(r *dns.Msg) (string, bool) {
	if len(r.Answer) == 0 {
		return "", false
	}
	p, ok := r.Answer[0].(*dns.PTR)
	if !ok {
		return "", false
	}
	return p.Ptr, true
}
