package network_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"

	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// Every test of this package runs in a network namespace of its own (see
// nettest.MainInNewNetns) and sends sandbox traffic only inside the
// namespaces nettest.NewEnv makes.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		crashHelper()
		return
	}
	nettest.MainInNewNetns(m)
}

// testPrefix is a prefix no other test (or engineer) uses.
func testPrefix() string {
	var b [3]byte
	rand.Read(b[:])
	return "pt" + hex.EncodeToString(b[:])
}

// newManager makes a Manager whose host is env.Host, closed (and checked
// to leave nothing) at the test's end.
func newManager(t testing.TB, env *nettest.Env, cfg network.Config) *network.Manager {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = testPrefix()
	}
	cfg.HostNetNS = env.Host.Path
	cfg.Upstreams = []string{nettest.DNSAddr.String()}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = -1
	}
	cfg.Logger = slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m, err := network.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		assertNothingLeft(t, env, cfg.Prefix)
	})
	return m
}

type tlog struct{ t testing.TB }

func (l tlog) Write(b []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// assertNothingLeft checks that no namespace, veth or host table of prefix
// survives: in /run/netns, in `ip netns`, in the host's links and in its
// nftables tables.
func assertNothingLeft(t testing.TB, env *nettest.Env, prefix string) {
	t.Helper()
	for _, left := range leftovers(t, env, prefix) {
		t.Errorf("left behind: %s", left)
	}
}

func leftovers(t testing.TB, env *nettest.Env, prefix string) []string {
	t.Helper()
	var out []string
	entries, _ := os.ReadDir(network.NetnsDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix+"-") {
			out = append(out, "namespace "+e.Name())
		}
	}
	if b, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, prefix+"-") {
				out = append(out, "ip netns: "+l)
			}
		}
	}
	if b, err := exec.Command("ip", "-n", env.Host.Name, "-o", "link", "show").Output(); err == nil {
		re := regexp.MustCompile(`^\d+: (` + prefix + `[0-9]+)[@:]`)
		for _, l := range strings.Split(string(b), "\n") {
			if m := re.FindStringSubmatch(l); m != nil {
				out = append(out, "ip link: "+m[1])
			}
		}
	}
	links, err := env.Host.Netlink().LinkList()
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^` + prefix + `[0-9]+$`)
	for _, l := range links {
		if re.MatchString(l.Attrs().Name) {
			out = append(out, "veth "+l.Attrs().Name)
		}
	}
	if n := hostTables(t, env, prefix); n > 0 {
		out = append(out, fmt.Sprintf("%d host nft tables %s", n, prefix))
	}
	return out
}

func hostTables(t testing.TB, env *nettest.Env, name string) int {
	t.Helper()
	fd, err := os.Open(env.Host.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	cc, err := nftables.New(nftables.WithNetNSFd(int(fd.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := cc.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tb := range tables {
		if tb.Name == name {
			n++
		}
	}
	return n
}

// attach acquires nothing: it joins a new guest to ns's TAP.
func attach(t testing.TB, env *nettest.Env, ns *network.Namespace) *nettest.Guest {
	t.Helper()
	g := nettest.NewGuest(t, env)
	f, err := ns.TapFD()
	if err != nil {
		t.Fatalf("TapFD: %v", err)
	}
	g.Attach(f)
	return g
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// wantGet fetches url from the guest and wants the hello of addr.
func wantGet(t testing.TB, g *nettest.Guest, url string, from netip.Addr) {
	t.Helper()
	body, err := g.Get(ctxT(t, 5*time.Second), url)
	if err != nil {
		t.Fatalf("GET %s from the guest: %v", url, err)
	}
	if want := nettest.Hello(from); body != want {
		t.Fatalf("GET %s: got %q, want %q", url, body, want)
	}
}

// wantRefused wants a TCP connection from the guest to addr rejected
// (reset or ICMP prohibited), not dropped: a dropped SYN ends in the
// dial's deadline, which is not a refusal (nettest.IsRefused).
func wantRefused(t *testing.T, g *nettest.Guest, addr string) {
	t.Helper()
	c, err := g.DialContext(ctxT(t, 10*time.Second), "tcp4", addr)
	if err == nil {
		c.Close()
		t.Fatalf("guest connected to %s, want it rejected", addr)
	}
	if !nettest.IsRefused(err) {
		t.Fatalf("guest to %s: got %v, want it refused (reset or ICMP prohibited), not timed out", addr, err)
	}
}

func hostPort(a netip.Addr, port int) string { return netip.AddrPortFrom(a, uint16(port)).String() }

func lookup(t *testing.T, g *nettest.Guest, name string) ([]netip.Addr, error) {
	t.Helper()
	return g.Resolver().LookupNetIP(ctxT(t, 5*time.Second), "ip4", name)
}

func isNXDOMAIN(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

func query(t *testing.T, g *nettest.Guest, name string, qtype uint16, nw, server string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	r, err := g.Exchange(ctxT(t, 5*time.Second), m, nw, server)
	if err != nil {
		t.Fatalf("query %s from the guest to %s/%s: %v", name, server, nw, err)
	}
	return r
}

// TestIsolation: the test binary runs in a namespace of its own that has
// nothing but lo, so no test can reach the machine's uplink by mistake.
func TestIsolation(t *testing.T) {
	testkit.Root(t)
	if !nettest.InChild() {
		t.Fatal("the test binary was not re-executed in a new network namespace")
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(ifaces) != 1 || ifaces[0].Name != "lo" {
		t.Fatalf("the test namespace has %v, want only lo", ifaces)
	}
}
