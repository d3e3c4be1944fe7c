package network_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

func url(a netip.Addr) string { return "http://" + a.String() + "/" }

// TestAlwaysBlocked: the host itself, other sandboxes, link-local and the
// host's private networks are rejected fast, while the test's host
// reaches the same addresses (so routing is not what stops the guest).
func TestAlwaysBlocked(t *testing.T) {
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{})
	ctx := ctxT(t, 20*time.Second)
	ns, err := m.Acquire(ctx, netpolicy.Default())
	if err != nil {
		t.Fatal(err)
	}
	g := attach(t, env, ns)
	other, err := m.Acquire(ctx, netpolicy.Default())
	if err != nil {
		t.Fatal(err)
	}
	// Something listening in the other sandbox's namespace, on its
	// veth address.
	otherNS, err := nettest.OpenNS(other.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer otherNS.Close()
	l, err := otherNS.Listen("tcp4", hostPort(other.NamespaceAddr(), 8080))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	wantGet(t, g, url(nettest.WebAddr), nettest.WebAddr) // the internet works

	// Controls: the test's host reaches what the guest must not.
	host := env.Host.HTTPClient(3 * time.Second)
	for _, a := range []netip.Addr{nettest.MetadataAddr, nettest.PrivateNetAddr, nettest.RouterAddr,
		nettest.HostPrivateAddr, nettest.HostUplinkAddr} {
		resp, err := host.Get(url(a))
		if err != nil {
			t.Fatalf("control: the host cannot reach %s: %v", a, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != nettest.Hello(a) {
			t.Fatalf("control: %s answered %q", a, b)
		}
	}

	for _, tc := range []struct{ what, addr string }{
		{"cloud metadata (link-local)", hostPort(nettest.MetadataAddr, 80)},
		{"a private network beyond the host", hostPort(nettest.PrivateNetAddr, 80)},
		{"a subnet of the host's uplink", hostPort(nettest.RouterAddr, 80)},
		{"the host's uplink address", hostPort(nettest.HostUplinkAddr, 80)},
		{"the host's private address", hostPort(nettest.HostPrivateAddr, 80)},
		{"the host end of its own veth", hostPort(ns.HostAddr(), 80)},
		{"the host end of another sandbox's veth", hostPort(other.HostAddr(), 80)},
		{"another sandbox's namespace", hostPort(other.NamespaceAddr(), 8080)},
		{"its own namespace's uplink address", hostPort(ns.NamespaceAddr(), 80)},
		{"its gateway, not DNS", hostPort(network.GatewayAddr, 22)},
	} {
		t.Run(tc.what, func(t *testing.T) { wantRefused(t, g, tc.addr) })
	}

	// UDP gets ICMP "prohibited": a connected socket sees it refused.
	t.Run("udp to metadata", func(t *testing.T) {
		c, err := g.DialContext(ctxT(t, time.Second), "udp4", hostPort(nettest.MetadataAddr, 9))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		c.Write([]byte("x"))
		_, err = c.Read(make([]byte, 10))
		if !errors.Is(err, unix.EHOSTUNREACH) {
			t.Fatalf("udp to metadata: got %v, want EHOSTUNREACH (ICMP prohibited)", err)
		}
	})
}

// TestPolicy walks one live namespace through policies, checking each
// against the test servers: allow and deny by IP, CIDR and domain, the
// precedence of allow over deny and of the always-blocked ranges over
// both, and DNS that cannot be bypassed.
func TestPolicy(t *testing.T) {
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{})
	ns, err := m.Acquire(ctxT(t, 10*time.Second), netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	g := attach(t, env, ns)

	ok := func(a netip.Addr) func(t *testing.T) {
		return func(t *testing.T) { wantGet(t, g, url(a), a) }
	}
	okName := func(name string, a netip.Addr) func(t *testing.T) {
		return func(t *testing.T) { wantGet(t, g, "http://"+name+"/", a) }
	}
	refused := func(a netip.Addr) func(t *testing.T) {
		return func(t *testing.T) { wantRefused(t, g, hostPort(a, 80)) }
	}
	// nx: the forwarder answers NXDOMAIN itself, without asking the
	// upstream resolver (whose queries the test world counts).
	nx := func(name string) func(t *testing.T) {
		return func(t *testing.T) {
			before := env.DNSQueries()
			_, err := lookup(t, g, name)
			if !isNXDOMAIN(err) {
				t.Fatalf("lookup %s: got %v, want NXDOMAIN", name, err)
			}
			if n := env.DNSQueries() - before; n != 0 {
				t.Fatalf("lookup %s: %d queries went upstream, want the forwarder's own NXDOMAIN", name, n)
			}
		}
	}
	// noAddress: the name exists, its address is one the sandbox can
	// never reach, and the forwarder keeps it to itself.
	noAddress := func(name string) func(t *testing.T) {
		return func(t *testing.T) {
			r := query(t, g, name, dns.TypeA, "udp", hostPort(network.GatewayAddr, 53))
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
				t.Fatalf("A %s: rcode %s, answers %v; want NOERROR with none", name, dns.RcodeToString[r.Rcode], r.Answer)
			}
		}
	}
	// bypass asks the internet's resolver directly: the namespace sends
	// the query to the forwarder anyway.
	bypass := func(name string, nw string) func(t *testing.T) {
		return func(t *testing.T) {
			r := query(t, g, name, dns.TypeA, nw, hostPort(nettest.DNSAddr, 53))
			if r.Rcode != dns.RcodeNameError {
				t.Fatalf("%s query for %s straight to %s: rcode %s, want NXDOMAIN", nw, name, nettest.DNSAddr, dns.RcodeToString[r.Rcode])
			}
		}
	}
	noAAAA := func(name string) func(t *testing.T) {
		return func(t *testing.T) {
			r := query(t, g, name, dns.TypeAAAA, "udp", hostPort(network.GatewayAddr, 53))
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
				t.Fatalf("AAAA %s: rcode %s, %d answers; want NOERROR with none", name, dns.RcodeToString[r.Rcode], len(r.Answer))
			}
		}
	}

	type step struct {
		name  string
		check func(t *testing.T)
	}
	for _, tc := range []struct {
		name   string
		policy netpolicy.Policy
		steps  []step
	}{
		{"internet off", netpolicy.Policy{}, []step{
			{"web refused", refused(nettest.WebAddr)},
			{"names NXDOMAIN", nx("allowed.test.")},
		}},
		{"allow an address", netpolicy.Policy{AllowOut: []string{nettest.WebAddr.String()}}, []step{
			{"web", ok(nettest.WebAddr)},
			{"other refused", refused(nettest.OtherAddr)},
		}},
		{"allow a CIDR", netpolicy.Policy{AllowOut: []string{"198.51.100.0/24"}}, []step{
			{"other", ok(nettest.OtherAddr)},
			{"denied host in the CIDR", ok(nettest.DeniedAddr)},
			{"web refused", refused(nettest.WebAddr)},
		}},
		{"deny a CIDR", netpolicy.Policy{Internet: true, DenyOut: []string{"198.51.100.0/24"}}, []step{
			{"web", ok(nettest.WebAddr)},
			{"other refused", refused(nettest.OtherAddr)},
		}},
		{"allow wins over deny", netpolicy.Policy{Internet: true, DenyOut: []string{"198.51.100.0/24"},
			AllowOut: []string{nettest.OtherAddr.String() + "/32"}}, []step{
			{"other", ok(nettest.OtherAddr)},
			{"denied refused", refused(nettest.DeniedAddr)},
		}},
		{"allow a domain", netpolicy.Policy{AllowOut: []string{"allowed.test"}}, []step{
			{"its address refused before it is resolved", refused(nettest.WebAddr)},
			{"by name", okName("allowed.test", nettest.WebAddr)},
			{"its address once resolved", ok(nettest.WebAddr)},
			{"other names NXDOMAIN", nx("other.test.")},
			{"other addresses refused", refused(nettest.OtherAddr)},
			{"no AAAA", noAAAA("allowed.test")},
		}},
		{"allow a domain behind a CNAME", netpolicy.Policy{AllowOut: []string{"cname.test"}}, []step{
			{"the old name's address is no longer allowed", refused(nettest.WebAddr)},
			{"by name", okName("cname.test", nettest.WebAddr)},
		}},
		{"allow a wildcard", netpolicy.Policy{AllowOut: []string{"*.wild.test"}}, []step{
			{"a name below", okName("www.wild.test", nettest.WildAddr)},
			{"not the apex", nx("wild.test.")},
			{"not others", nx("allowed.test.")},
		}},
		{"deny a domain", netpolicy.Policy{Internet: true, DenyOut: []string{"denied.test"}}, []step{
			{"NXDOMAIN", nx("denied.test.")},
			{"not through another resolver (udp)", bypass("denied.test", "udp")},
			{"not through another resolver (tcp)", bypass("denied.test", "tcp")},
			{"others resolve", okName("allowed.test", nettest.WebAddr)},
		}},
		{"deny a wildcard, allow one name", netpolicy.Policy{Internet: true, DenyOut: []string{"*.test"},
			AllowOut: []string{"allowed.test"}}, []step{
			{"the allowed one", okName("allowed.test", nettest.WebAddr)},
			{"the rest NXDOMAIN", nx("other.test.")},
		}},
		{"always-blocked wins over allow", netpolicy.Policy{Internet: true,
			AllowOut: []string{"metadata.test", "169.254.0.0/16", "10.0.0.0/8", "private.test"}}, []step{
			{"the name answers no address", noAddress("metadata.test")},
			{"metadata refused", refused(nettest.MetadataAddr)},
			{"private network refused", refused(nettest.PrivateNetAddr)},
			{"host refused", refused(nettest.HostPrivateAddr)},
		}},
		{"back to the default", netpolicy.Default(), []step{
			{"other", ok(nettest.OtherAddr)},
			{"other by name", okName("other.test", nettest.OtherAddr)},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := ns.SetPolicy(ctxT(t, 5*time.Second), tc.policy); err != nil {
				t.Fatalf("SetPolicy: %v", err)
			}
			if got := ns.Policy(); fmt.Sprint(got) != fmt.Sprint(tc.policy) {
				t.Fatalf("Policy() = %+v, want %+v", got, tc.policy)
			}
			for _, s := range tc.steps {
				t.Run(s.name, s.check)
			}
		})
	}
}

// TestPolicyChangeKeepsConnections: a new policy rejects new connections
// at once and leaves established ones alone.
func TestPolicyChangeKeepsConnections(t *testing.T) {
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{})
	ctx := ctxT(t, 20*time.Second)
	ns, err := m.Acquire(ctx, netpolicy.Default())
	if err != nil {
		t.Fatal(err)
	}
	g := attach(t, env, ns)
	c, err := g.DialContext(ctx, "tcp4", hostPort(nettest.WebAddr, nettest.EchoPort))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo(t, c, "before")
	if err := ns.SetPolicy(ctx, netpolicy.Policy{}); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, g, hostPort(nettest.WebAddr, nettest.EchoPort))
	echo(t, c, "after the change")
	if err := ns.SetPolicy(ctx, netpolicy.Default()); err != nil {
		t.Fatal(err)
	}
	wantGet(t, g, url(nettest.WebAddr), nettest.WebAddr)
}

func echo(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo of %q: got %q, %v", msg, buf, err)
	}
}

// TestInvalidPolicy: a bad entry is named, and a failed change leaves the
// policy in force.
func TestInvalidPolicy(t *testing.T) {
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{})
	ctx := ctxT(t, 10*time.Second)
	_, err := m.Acquire(ctx, netpolicy.Policy{AllowOut: []string{"example.com", "10.0.0.0/33"}})
	var pe *netpolicy.Error
	if !errors.As(err, &pe) || !errors.Is(err, netpolicy.ErrInvalid) || pe.Entry != "10.0.0.0/33" {
		t.Fatalf("Acquire with a bad CIDR: got %v, want a netpolicy.Error naming 10.0.0.0/33", err)
	}
	ns, err := m.Acquire(ctx, netpolicy.Default())
	if err != nil {
		t.Fatal(err)
	}
	err = ns.SetPolicy(ctx, netpolicy.Policy{DenyOut: []string{"bad domain"}})
	if !errors.As(err, &pe) || pe.Entry != "bad domain" || pe.Field != "deny_out" {
		t.Fatalf("SetPolicy with a bad name: got %v", err)
	}
	g := attach(t, env, ns)
	wantGet(t, g, url(nettest.WebAddr), nettest.WebAddr)
}

// TestDNSBounds: the forwarder limits queries per second and answer size.
func TestDNSBounds(t *testing.T) {
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{DNSQueriesPerSecond: 5, DNSMaxAnswer: 1024})
	ns, err := m.Acquire(ctxT(t, 10*time.Second), netpolicy.Default())
	if err != nil {
		t.Fatal(err)
	}
	g := attach(t, env, ns)
	gw := hostPort(network.GatewayAddr, 53)

	r := query(t, g, "big.test", dns.TypeA, "udp", gw)
	r.Compress = true // as it came on the wire
	if b, _ := r.Pack(); !r.Truncated || len(b) > 512 {
		t.Errorf("100 A records over UDP without EDNS: truncated %v, %d bytes; want truncated to 512", r.Truncated, len(b))
	}
	r = query(t, g, "big.test", dns.TypeA, "tcp", gw)
	r.Compress = true
	if b, _ := r.Pack(); len(b) > 1024 || len(r.Answer) == 0 {
		t.Errorf("over TCP: %d bytes, %d answers; want at most DNSMaxAnswer=1024", len(b), len(r.Answer))
	}

	before := env.DNSQueries()
	refused := 0
	for range 30 {
		r := query(t, g, "allowed.test", dns.TypeA, "udp", gw)
		if r.Rcode == dns.RcodeRefused {
			refused++
		}
	}
	if upstream := env.DNSQueries() - before; refused < 10 || upstream > 20 {
		t.Fatalf("30 queries at 5/s (burst 10): %d refused, %d reached upstream; want most refused", refused, upstream)
	}
}

// TestOperatorException: the operator's AllowedHostNets open an
// always-blocked range (here a private network beyond the host), but
// never the pool.
func TestOperatorException(t *testing.T) {
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{AllowedHostNets: []netip.Prefix{
		netip.MustParsePrefix("10.77.0.0/16"), netip.MustParsePrefix("10.0.0.0/8")}})
	ctx := ctxT(t, 10*time.Second)
	ns, err := m.Acquire(ctx, netpolicy.Default())
	if err != nil {
		t.Fatal(err)
	}
	g := attach(t, env, ns)
	wantGet(t, g, url(nettest.PrivateNetAddr), nettest.PrivateNetAddr)
	wantGet(t, g, url(nettest.HostPrivateAddr), nettest.HostPrivateAddr) // the host, on an allowed address
	wantRefused(t, g, hostPort(ns.HostAddr(), 80))                       // the pool: never
	wantRefused(t, g, hostPort(nettest.MetadataAddr, 80))
	// The sandbox's own policy still applies on top.
	if err := ns.SetPolicy(ctx, netpolicy.Policy{Internet: true, DenyOut: []string{"10.77.0.0/16"}}); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, g, hostPort(nettest.PrivateNetAddr, 80))
}

// TestDNSAddressTimeout: an allowed name's address stays allowed for its
// TTL (at least DNSMinTimeout), then not; answering the name again with a
// longer TTL extends it.
func TestDNSAddressTimeout(t *testing.T) {
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{DNSMinTimeout: 2 * time.Second})
	ns, err := m.Acquire(ctxT(t, 10*time.Second), netpolicy.Policy{AllowOut: []string{"other.test"}})
	if err != nil {
		t.Fatal(err)
	}
	g := attach(t, env, ns)
	env.SetTTL("other.test", 1)
	resolved := time.Now()
	wantGet(t, g, "http://other.test/", nettest.OtherAddr)
	// Allowed for max(1 s, 2 s), then rejected: poll for the rejection.
	testkit.WaitFor(t, 30*time.Second, "the address expires", func() bool {
		c, err := g.DialContext(ctxT(t, time.Second), "tcp4", hostPort(nettest.OtherAddr, 80))
		if err == nil {
			c.Close()
			return false
		}
		return nettest.IsRefused(err)
	})
	// The kernel expires set elements on its own clock, in jiffies: allow
	// it a few of them early against this wall-clock measure.
	if d := time.Since(resolved); d < 2*time.Second-50*time.Millisecond {
		t.Fatalf("the address expired after %v, before DNSMinTimeout", d)
	}

	// Renewal: first a short TTL, then the same name with a long one.
	wantGet(t, g, "http://other.test/", nettest.OtherAddr)
	env.SetTTL("other.test", 600)
	wantGet(t, g, "http://other.test/", nettest.OtherAddr)
	// The short answer's time (2 s) passes: the address must stay allowed.
	// (Waiting is the behaviour under test here, not synchronisation.)
	time.Sleep(3 * time.Second)
	wantGet(t, g, url(nettest.OtherAddr), nettest.OtherAddr)
}
