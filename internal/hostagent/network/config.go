package network

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// The guest's addressing: the same in every sandbox, baked into the
// template by the guest side. IPv4 only.
var (
	// GuestAddr is the guest's address on its one NIC, in GuestPrefix.
	GuestAddr = netip.MustParseAddr("100.96.0.2")
	// GatewayAddr is the guest's default gateway and DNS server: the
	// address of TapName in the sandbox's namespace.
	GatewayAddr = netip.MustParseAddr("100.96.0.1")
	// GuestPrefix is the link between guest and namespace.
	GuestPrefix = netip.MustParsePrefix("100.96.0.0/30")
	// GuestMAC is the guest NIC's MAC address (QEMU's -device
	// virtio-net-device,mac=...).
	GuestMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x70, 0x6e, 0x02}
	// GatewayMAC is TapName's MAC address. It is fixed too, so that the
	// ARP entry a guest saved in its template or its parent stays right in
	// every new namespace.
	GatewayMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x70, 0x6e, 0x01}
)

// TapName is the TAP device's name in every sandbox's namespace, and
// UplinkName the namespace's end of its veth pair.
const (
	TapName    = "tap0"
	UplinkName = "eth0"
)

// DNSPort is where the forwarder listens, on GatewayAddr, UDP and TCP.
const DNSPort = 53

// Config configures a Manager. The zero value of every field means its
// default (see Validate).
type Config struct {
	// Prefix names everything the Manager makes: namespaces
	// "<Prefix>-<8 hex>", host veths "<Prefix><n>", nftables tables
	// "<Prefix>". Lower-case letters and digits, starting with a letter,
	// at most 8 characters (a veth name is at most 15). Default "panda".
	Prefix string
	// Pool is the range the /30 of each namespace's veth pair is taken
	// from (host side .1, namespace side .2). Default 10.234.0.0/16. It is
	// always blocked for sandboxes.
	Pool netip.Prefix
	// PoolSize is how many prepared namespaces Run keeps ready. Default 4;
	// negative means none.
	PoolSize int
	// HostNetNS is the path of the network namespace the Manager treats
	// as the host (its veth ends, its table, its uplink, where the DNS
	// forwarders send their queries). Default: the namespace the calling
	// thread is in when New runs. Tests point it at a namespace they made.
	HostNetNS string
	// Upstreams are the DNS servers ("ip" or "ip:port") the forwarders
	// ask, from the host namespace. Default: the nameservers of
	// ResolvConf, unless those are only systemd-resolved's local stub
	// (127.0.0.53, 127.0.0.54), which answers the host's own names too
	// (/etc/hosts, LLMNR, mDNS, every link's DNS): then the upstream
	// servers resolved itself uses, from ResolvedConf, if it names any.
	Upstreams []string
	// ResolvConf is read for Upstreams when those are not given. Default
	// /etc/resolv.conf.
	ResolvConf string
	// ResolvedConf is systemd-resolved's list of its upstream servers.
	// Default /run/systemd/resolve/resolv.conf.
	ResolvedConf string
	// AllowedHostNets are the operator's exceptions to the always-blocked
	// ranges: sandboxes may reach them, including services of the host
	// itself on addresses inside them (a proxy on a private address, say).
	// The pool (other sandboxes, the veths' host ends) stays unreachable
	// whatever they say.
	AllowedHostNets []netip.Prefix
	// DNSQueriesPerSecond bounds each sandbox's queries (excess answered
	// REFUSED), with a burst of twice as many. Default 100.
	DNSQueriesPerSecond int
	// DNSMaxAnswer bounds an answer's size in bytes (larger ones are
	// truncated, with TC set over UDP). Default 4096.
	DNSMaxAnswer int
	// DNSMinTimeout is the shortest time an allowed name's address stays
	// allowed after the forwarder answered it. Default 60 s.
	DNSMinTimeout time.Duration
	// DNSTimeout bounds one upstream exchange. Default 3 s.
	DNSTimeout time.Duration
	// HostNetsRefresh is how often Run re-reads the host's interface
	// subnets for the always-blocked set. Default 30 s.
	HostNetsRefresh time.Duration
	// Logger receives the Manager's logs. Default: discarded.
	Logger *slog.Logger
}

var prefixRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "panda"
	}
	if !c.Pool.IsValid() {
		c.Pool = netip.MustParsePrefix("10.234.0.0/16")
	}
	if c.PoolSize == 0 {
		c.PoolSize = 4
	} else if c.PoolSize < 0 {
		c.PoolSize = 0
	}
	if c.ResolvConf == "" {
		c.ResolvConf = "/etc/resolv.conf"
	}
	if c.ResolvedConf == "" {
		c.ResolvedConf = "/run/systemd/resolve/resolv.conf"
	}
	if c.DNSQueriesPerSecond == 0 {
		c.DNSQueriesPerSecond = 100
	}
	if c.DNSMaxAnswer == 0 {
		c.DNSMaxAnswer = 4096
	}
	if c.DNSMinTimeout == 0 {
		c.DNSMinTimeout = 60 * time.Second
	}
	if c.DNSTimeout == 0 {
		c.DNSTimeout = 3 * time.Second
	}
	if c.HostNetsRefresh == 0 {
		c.HostNetsRefresh = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks c after defaults are applied. It does not read
// ResolvConf.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if !prefixRE.MatchString(c.Prefix) {
		errs = append(errs, fmt.Errorf("prefix %q: want 1 to 8 lower-case letters and digits, starting with a letter", c.Prefix))
	}
	if !c.Pool.Addr().Is4() || c.Pool.Bits() > 29 || c.Pool.Bits() < 8 {
		errs = append(errs, fmt.Errorf("pool %s: want an IPv4 prefix between /8 and /29", c.Pool))
	} else if c.Pool.Masked() != c.Pool {
		errs = append(errs, fmt.Errorf("pool %s: host bits set", c.Pool))
	} else if c.Pool.Overlaps(GuestPrefix) {
		errs = append(errs, fmt.Errorf("pool %s overlaps the guest link %s", c.Pool, GuestPrefix))
	}
	for _, u := range c.Upstreams {
		if _, err := upstreamAddr(u); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range c.AllowedHostNets {
		if !p.IsValid() || !p.Addr().Is4() {
			errs = append(errs, fmt.Errorf("allowed host net %s: want an IPv4 prefix", p))
		}
	}
	if c.DNSQueriesPerSecond < 0 || c.DNSMaxAnswer < 512 || c.DNSMaxAnswer > 65535 ||
		c.DNSMinTimeout < 0 || c.DNSTimeout < 0 || c.HostNetsRefresh < 0 {
		errs = append(errs, errors.New("dns limits: queries per second >= 0, max answer 512..65535, timeouts >= 0"))
	}
	return errors.Join(errs...)
}

// upstreamAddr turns "ip" or "ip:port" into an address with a port.
func upstreamAddr(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("dns upstream %q: want ip or ip:port", s)
	}
	return netip.AddrPortFrom(a, 53), nil
}

// resolvedStubs are the addresses of systemd-resolved's local stub
// resolver.
var resolvedStubs = []netip.AddrPort{
	netip.MustParseAddrPort("127.0.0.53:53"),
	netip.MustParseAddrPort("127.0.0.54:53"),
}

// hostUpstreams are the default upstreams (see Config.Upstreams): the
// host's resolvers. It logs where they come from, with a warning when
// they are the host's own resolver, which answers whatever the host can
// resolve.
func (m *Manager) hostUpstreams() ([]string, error) {
	ups, err := readResolvConf(m.cfg.ResolvConf)
	if err != nil {
		return nil, err
	}
	from := m.cfg.ResolvConf
	if !slices.ContainsFunc(ups, func(a netip.AddrPort) bool { return !slices.Contains(resolvedStubs, a) }) {
		// Only systemd-resolved's stub: ask its upstreams (the loopback
		// ones among them would be the host's own resolver again).
		real, err := readResolvConf(m.cfg.ResolvedConf)
		real = slices.DeleteFunc(real, func(a netip.AddrPort) bool { return a.Addr().IsLoopback() })
		if err == nil && len(real) > 0 {
			ups, from = real, m.cfg.ResolvedConf
		}
	}
	out := make([]string, len(ups))
	for i, a := range ups {
		out[i] = a.String()
	}
	if slices.ContainsFunc(ups, func(a netip.AddrPort) bool { return a.Addr().IsLoopback() }) {
		m.log.Warn("network: the sandboxes' DNS goes to the host's own resolver, so sandboxes resolve the names only the host should (its /etc/hosts, local and VPN zones); set dns_upstreams (--dns-upstream) to resolvers meant for sandboxes",
			"upstreams", strings.Join(out, ","), "from", from)
	} else {
		m.log.Info("network: the sandboxes' DNS goes to the host's resolvers; set dns_upstreams (--dns-upstream) to give sandboxes their own",
			"upstreams", strings.Join(out, ","), "from", from)
	}
	return out, nil
}

// readResolvConf returns the nameservers of a resolv.conf file.
func readResolvConf(path string) ([]netip.AddrPort, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []netip.AddrPort
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			a, err := netip.ParseAddr(fields[1])
			if err != nil || a.Zone() != "" {
				continue
			}
			out = append(out, netip.AddrPortFrom(a.Unmap(), 53))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no nameserver in %s", path)
	}
	return out, nil
}
