package rootfs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Pull is how FromImage reaches registries on behalf of someone who is
// not the host's operator (Options.Pull): the tenants of a server, who
// name whatever registry they like. Its connections may reach only public
// addresses — never loopback, link-local (cloud metadata), private
// (RFC 1918, IPv6 ULA), shared (CGNAT, 100.64.0.0/10), unspecified,
// multicast, broadcast or reserved addresses, nor the subnets of the
// host's own interfaces — unless AllowNets holds the address or
// AllowHosts the registry's name. The check is made on the address each
// connection is opened to, after DNS (a name that resolves, or rebinds,
// to a refused address is refused) and for every connection of the pull
// (a redirect to a refused address is refused). Credentials come only
// from Keychain: none by default.
//
// The zero value is usable: public registries, anonymous pulls.
type Pull struct {
	// AllowNets are addresses a pull may reach although they are refused
	// by default: the operator's own registries (e.g. 10.0.5.0/24).
	AllowNets []netip.Prefix
	// AllowHosts are registry host names, as image references name them
	// ("registry.internal", or "registry.internal:5000" for that port
	// only), whose connections are not checked at all: the operator
	// trusts wherever their DNS points.
	AllowHosts []string
	// Keychain, if set, gives the registries' credentials; nil: pulls
	// are anonymous.
	Keychain authn.Keychain

	// Resolver resolves registry names (nil: net.DefaultResolver), and
	// HostNets returns the host's own subnets (nil: the addresses of its
	// interfaces, read at each connection). For tests.
	Resolver *net.Resolver
	HostNets func() ([]netip.Prefix, error)

	once      sync.Once
	transport *http.Transport
	// proxies are the host:port of the proxies the environment named for
	// this pull's requests: the operator's, connected to unchecked.
	proxies sync.Map
}

// RefusedError is a connection a Pull refused because of the address it
// would have reached.
type RefusedError struct {
	Addr netip.Addr
	// Class says what kind of address it is ("a loopback address").
	Class string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refused to connect to %s: %s", e.Addr, e.Class)
}

// Refused returns the class of address a ("a loopback address", ...) if a
// pull may not reach it without the operator's allow-list, "" if it may.
// hostNets are the host's own subnets.
func Refused(a netip.Addr, hostNets []netip.Prefix) string {
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return "not an address"
	case a.IsUnspecified() || thisNet.Contains(a):
		return `an unspecified ("this network") address`
	case a.IsLoopback():
		return "a loopback address"
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast():
		return "a link-local address (such as cloud metadata)"
	case a.IsMulticast() || a.IsInterfaceLocalMulticast():
		return "a multicast address"
	case a.IsPrivate() || siteLocal.Contains(a):
		return "a private address"
	case sharedNet.Contains(a):
		return "a shared (carrier-grade NAT) address"
	case reservedNet.Contains(a):
		return "a reserved or broadcast address"
	case nat64.Contains(a):
		// The IPv4 address a NAT64 gateway would reach.
		b := a.As16()
		if c := Refused(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), hostNets); c != "" {
			return c + " (through NAT64)"
		}
	}
	for _, p := range hostNets {
		if p.Contains(a) {
			return "an address of the server's own networks"
		}
	}
	return ""
}

var (
	thisNet     = netip.MustParsePrefix("0.0.0.0/8")
	sharedNet   = netip.MustParsePrefix("100.64.0.0/10")
	reservedNet = netip.MustParsePrefix("240.0.0.0/4") // 255.255.255.255 too
	siteLocal   = netip.MustParsePrefix("fec0::/10")
	nat64       = netip.MustParsePrefix("64:ff9b::/96")
)

// check returns a *RefusedError if a pull may not connect to a.
func (p *Pull) check(a netip.Addr) error {
	a = a.Unmap()
	for _, n := range p.AllowNets {
		if n.Contains(a) {
			return nil
		}
	}
	var nets []netip.Prefix
	if p.HostNets != nil {
		var err error
		if nets, err = p.HostNets(); err != nil {
			return fmt.Errorf("read the host's networks: %w", err)
		}
	} else {
		nets = interfaceNets()
	}
	if c := Refused(a, nets); c != "" {
		return &RefusedError{Addr: a, Class: c}
	}
	return nil
}

// interfaceNets are the subnets of the host's interfaces (in the calling
// process's network namespace); none if they cannot be read.
func interfaceNets() []netip.Prefix {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				ones, _ := n.Mask.Size()
				out = append(out, netip.PrefixFrom(ip.Unmap(), ones).Masked())
			}
		}
	}
	return out
}

// allowedHost reports whether the registry at host:port is in AllowHosts.
func (p *Pull) allowedHost(host, port string) bool {
	for _, h := range p.AllowHosts {
		h = strings.ToLower(h)
		if h == strings.ToLower(host) || h == strings.ToLower(net.JoinHostPort(host, port)) {
			return true
		}
	}
	return false
}

// DialContext connects to addr ("host:port") for a pull: to an allowed
// host or a proxy of the environment as asked, else only to an address
// check accepts, checked as the socket connects (whatever DNS answered).
func (p *Pull) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Resolver: p.Resolver}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if _, proxy := p.proxies.Load(addr); proxy || p.allowedHost(host, port) {
		return d.DialContext(ctx, network, addr)
	}
	d.Control = func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("connect to %s: %w", address, err)
		}
		return p.check(ap.Addr())
	}
	return d.DialContext(ctx, network, addr)
}

// proxy is http.ProxyFromEnvironment for a pull's request: the proxy
// reaches the registry, so the registry's addresses are checked here
// first (the proxy resolves the name again: a name that rebinds between
// the two can pass; use a proxy that refuses private addresses itself),
// and the proxy's own address is the operator's, connected to unchecked.
func (p *Pull) proxy(req *http.Request) (*url.URL, error) {
	u, err := http.ProxyFromEnvironment(req)
	if err != nil || u == nil {
		return u, err
	}
	host, port := req.URL.Hostname(), req.URL.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[req.URL.Scheme]
	}
	if !p.allowedHost(host, port) {
		r := p.Resolver
		if r == nil {
			r = net.DefaultResolver
		}
		ips, err := r.LookupNetIP(req.Context(), "ip", host)
		if err != nil {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
		}
		for _, ip := range ips {
			if err := p.check(ip); err != nil {
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
			}
		}
	}
	pport := u.Port()
	if pport == "" {
		pport = map[string]string{"http": "80", "https": "443", "socks5": "1080"}[u.Scheme]
	}
	p.proxies.Store(net.JoinHostPort(u.Hostname(), pport), true)
	return u, nil
}

// options are the remote options of a pull's requests.
func (p *Pull) options() []remote.Option {
	p.once.Do(func() {
		t := remote.DefaultTransport.(*http.Transport).Clone()
		t.DialContext = p.DialContext
		t.Proxy = p.proxy
		p.transport = t
	})
	auth := remote.WithAuth(authn.Anonymous)
	if p.Keychain != nil {
		auth = remote.WithAuthFromKeychain(p.Keychain)
	}
	return []remote.Option{remote.WithTransport(p.transport), auth}
}

// ParseAllowNets parses CIDRs (or single addresses) of Pull.AllowNets.
func ParseAllowNets(cidrs []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range cidrs {
		c = strings.TrimSpace(c)
		if !strings.Contains(c, "/") {
			a, err := netip.ParseAddr(c)
			if err != nil {
				return nil, fmt.Errorf("%q is neither a CIDR nor an address", c)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR: %v", c, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// errorsAsRefused reports whether err holds a *RefusedError.
func errorsAsRefused(err error) (*RefusedError, bool) {
	var re *RefusedError
	ok := errors.As(err, &re)
	return re, ok
}
