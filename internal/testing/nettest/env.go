package nettest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	"github.com/vishvananda/netlink"
)

// Addresses of the test world. None of them leaves the test's namespaces.
var (
	HostUplinkAddr   = netip.MustParseAddr("198.18.0.1")    // the host's uplink (a host subnet, 198.18.0.0/30)
	RouterAddr       = netip.MustParseAddr("198.18.0.2")    // the internet's end of it (in a host subnet: blocked)
	HostPrivateAddr  = netip.MustParseAddr("10.88.0.1")     // a private network of the host (priv0, /24)
	WebAddr          = netip.MustParseAddr("203.0.113.10")  // allowed.test: HTTP :80, echo :7
	DNSAddr          = netip.MustParseAddr("203.0.113.53")  // the internet's resolver, :53 UDP and TCP
	OtherAddr        = netip.MustParseAddr("198.51.100.10") // other.test
	DeniedAddr       = netip.MustParseAddr("198.51.100.20") // denied.test
	WildAddr         = netip.MustParseAddr("198.51.100.30") // www.wild.test
	MetadataAddr     = netip.MustParseAddr("169.254.169.254")
	PrivateNetAddr   = netip.MustParseAddr("10.77.0.10") // a private network beyond the host
	internetServices = []netip.Addr{WebAddr, DNSAddr, OtherAddr, DeniedAddr, WildAddr, MetadataAddr, PrivateNetAddr}
)

// Ports of the test servers.
const (
	HTTPPort = 80
	EchoPort = 7
)

// Records are the names every Env's resolver knows at first (A records,
// TTL 300; besides, "cname.test" is a CNAME to allowed.test and
// "big.test" has 100 A records; other names are NXDOMAIN). Env.AddRecord
// and Env.AddPTR add more.
var Records = map[string][]netip.Addr{
	"allowed.test":  {WebAddr},
	"other.test":    {OtherAddr},
	"denied.test":   {DeniedAddr},
	"www.wild.test": {WildAddr},
	"wild.test":     {WildAddr},
	"metadata.test": {MetadataAddr},
	"private.test":  {PrivateNetAddr},
}

// Env is the test world: a host namespace joined to an internet
// namespace that runs the test servers.
type Env struct {
	Prefix   string // of the namespaces' names ("nt<4 hex>")
	Host     *NS
	Internet *NS
	Echo     *EchoServer // the echo server on every internet address, port EchoPort

	mu         sync.Mutex
	closers    []func() // what Close undoes, in order of making
	dnsQueries int
	records    map[string][]netip.Addr
	ttls       map[string]uint32
	ptrs       map[string]string // reverse name (no trailing dot): target
}

// NewEnv builds the test world; everything is removed at the test's end.
// It passes testkit's root gate first (network namespaces).
func NewEnv(t testing.TB) *Env {
	t.Helper()
	testkit.Root(t)
	e, err := Build()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// Build builds the world outside a test (a benchmark's): the same as
// NewEnv, but the caller must call Close, also when it fails later on
// (Close removes the namespaces, and with them everything in them).
func Build() (_ *Env, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("nettest needs root (network namespaces)")
	}
	var b [2]byte
	rand.Read(b[:])
	e := &Env{Prefix: "nt" + hex.EncodeToString(b[:]), records: map[string][]netip.Addr{}, ttls: map[string]uint32{}, ptrs: map[string]string{}}
	for n, a := range Records {
		e.records[n] = a
	}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	if e.Host, err = CreateNS(e.Prefix + "-host"); err != nil {
		return nil, err
	}
	e.closers = append(e.closers, e.Host.Remove)
	if e.Internet, err = CreateNS(e.Prefix + "-inet"); err != nil {
		return nil, err
	}
	e.closers = append(e.closers, e.Internet.Remove)

	// The uplink.
	up := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0"}, PeerName: "eth0",
		PeerNamespace: netlink.NsFd(e.Internet.fd)}
	if err := e.Host.nl.LinkAdd(up); err != nil {
		return nil, fmt.Errorf("create uplink: %w", err)
	}
	if err := addrUp(e.Host.nl, "uplink0", HostUplinkAddr, 30); err != nil {
		return nil, err
	}
	if err := addrUp(e.Internet.nl, "eth0", RouterAddr, 30); err != nil {
		return nil, err
	}
	if err := e.Host.nl.RouteAdd(&netlink.Route{Gw: RouterAddr.AsSlice()}); err != nil {
		return nil, fmt.Errorf("default route of the host: %w", err)
	}
	// A private network of the host.
	if err := stubLink(e.Host.nl, "priv0"); err != nil {
		return nil, err
	}
	if err := addrUp(e.Host.nl, "priv0", HostPrivateAddr, 24); err != nil {
		return nil, err
	}
	// The internet's addresses.
	if err := stubLink(e.Internet.nl, "srv0"); err != nil {
		return nil, err
	}
	for _, a := range internetServices {
		if err := addrUp(e.Internet.nl, "srv0", a, 32); err != nil {
			return nil, err
		}
	}

	// Servers: HTTP on every address of both namespaces, echo and DNS on
	// the internet.
	for _, n := range []*NS{e.Host, e.Internet} {
		if err := e.ServeHTTP(n, fmt.Sprintf(":%d", HTTPPort), http.HandlerFunc(hello)); err != nil {
			return nil, err
		}
	}
	el, err := e.Internet.Listen("tcp4", fmt.Sprintf(":%d", EchoPort))
	if err != nil {
		return nil, err
	}
	e.Echo = newEchoServer(el)
	e.closers = append(e.closers, e.Echo.Close)

	mux := dns.NewServeMux()
	mux.HandleFunc(".", e.serveDNS)
	pc, err := e.Internet.ListenPacket("udp4", netip.AddrPortFrom(DNSAddr, 53).String())
	if err != nil {
		return nil, err
	}
	dl, err := e.Internet.Listen("tcp4", netip.AddrPortFrom(DNSAddr, 53).String())
	if err != nil {
		pc.Close()
		return nil, err
	}
	for _, s := range []*dns.Server{{PacketConn: pc, Handler: mux}, {Listener: dl, Handler: mux}} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go s.ActivateAndServe()
		<-started
		e.closers = append(e.closers, func() { s.Shutdown() })
	}
	return e, nil
}

// Close stops the servers and removes the namespaces, in the reverse
// order of their making. Idempotent; NewEnv's world is closed at the
// test's end.
func (e *Env) Close() {
	e.mu.Lock()
	cs := e.closers
	e.closers = nil
	e.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// stubLink makes an interface to hold addresses: a veth pair whose other
// end ("<name>p") stays in the same namespace (kernels without the dummy
// driver have veth).
func stubLink(h *netlink.Handle, name string) error {
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	p, err := h.LinkByName(name + "p")
	if err != nil {
		return err
	}
	return h.LinkSetUp(p)
}

func addrUp(h *netlink.Handle, name string, a netip.Addr, bits int) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}}); err != nil {
		return fmt.Errorf("address %s on %s: %w", a, name, err)
	}
	return h.LinkSetUp(l)
}

// hello answers "hello from ADDR" with the address the request came to.
func hello(w http.ResponseWriter, r *http.Request) {
	la, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	host := ""
	if la != nil {
		host, _, _ = net.SplitHostPort(la.String())
	}
	fmt.Fprintf(w, "hello from %s", host)
}

// Hello is what the HTTP servers answer on address a.
func Hello(a netip.Addr) string { return "hello from " + a.String() }

func (e *Env) serveDNS(w dns.ResponseWriter, r *dns.Msg) {
	e.mu.Lock()
	e.dnsQueries++
	e.mu.Unlock()
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	q := r.Question[0]
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	switch {
	case name == "cname.test":
		m.Answer = append(m.Answer, &dns.CNAME{Hdr: hdr(q.Name, dns.TypeCNAME), Target: "allowed.test."})
		if q.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr("allowed.test.", dns.TypeA), A: WebAddr.AsSlice()})
		}
	case name == "big.test":
		if q.Qtype == dns.TypeA {
			for i := range 100 {
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr(q.Name, dns.TypeA), A: net.IPv4(198, 51, 100, byte(100+i))})
			}
		}
	case e.ptr(name) != "":
		if q.Qtype == dns.TypePTR {
			m.Answer = append(m.Answer, &dns.PTR{Hdr: hdr(q.Name, dns.TypePTR), Ptr: dns.Fqdn(e.ptr(name))})
		}
	case e.lookup(name) != nil:
		for _, a := range e.lookup(name) {
			switch q.Qtype {
			case dns.TypeA:
				h := hdr(q.Name, dns.TypeA)
				h.Ttl = e.ttl(name)
				m.Answer = append(m.Answer, &dns.A{Hdr: h, A: a.AsSlice()})
			case dns.TypeAAAA:
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr(q.Name, dns.TypeAAAA), AAAA: netip.AddrFrom16(a.As16()).AsSlice()})
			}
		}
	default:
		m.SetRcode(r, dns.RcodeNameError)
	}
	w.WriteMsg(m)
}

func hdr(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: dns.Fqdn(name), Rrtype: t, Class: dns.ClassINET, Ttl: 300}
}

func (e *Env) ttl(name string) uint32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t, ok := e.ttls[name]; ok {
		return t
	}
	return 300
}

func (e *Env) lookup(name string) []netip.Addr {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.records[name]
}

// AddRecord makes the test resolver answer name (lower case, no trailing
// dot) with addrs.
func (e *Env) AddRecord(name string, addrs ...netip.Addr) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.records[name] = addrs
}

// AddPTR makes the test resolver answer the reverse name of a (in
// in-addr.arpa) with a PTR record to name.
func (e *Env) AddPTR(a netip.Addr, name string) {
	rev, _ := dns.ReverseAddr(a.String())
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ptrs[strings.TrimSuffix(rev, ".")] = name
}

func (e *Env) ptr(name string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ptrs[name]
}

// SetTTL sets the TTL of name's A records (default 300 s).
func (e *Env) SetTTL(name string, ttl uint32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ttls[name] = ttl
}

// AddAddr puts a (a /32) on the internet namespace, so that servers can
// listen there and the host routes to it. Use addresses outside the
// always-blocked ranges unless blocking is what is tested.
func (e *Env) AddAddr(t testing.TB, a netip.Addr) {
	t.Helper()
	must(t, addrUp(e.Internet.nl, "srv0", a, 32))
}

// Serve serves h over HTTP on addr ("ip:port") inside n until the test
// ends: e.g. a git HTTP server on the internet (git http-backend through
// net/http/cgi).
func (e *Env) Serve(t testing.TB, n *NS, addr string, h http.Handler) {
	t.Helper()
	l, err := n.Listen("tcp4", addr)
	must(t, err)
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

// ServeHTTP serves h over HTTP on addr ("ip:port") inside n until Close.
func (e *Env) ServeHTTP(n *NS, addr string, h http.Handler) error {
	l, err := n.Listen("tcp4", addr)
	if err != nil {
		return fmt.Errorf("listen on %s in %s: %w", addr, n.Name, err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	e.mu.Lock()
	e.closers = append(e.closers, func() { srv.Close() })
	e.mu.Unlock()
	return nil
}

// DNSQueries is how many queries the test resolver answered.
func (e *Env) DNSQueries() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.dnsQueries
}

// EchoServer echoes every connection and records what each received.
type EchoServer struct {
	l     net.Listener
	mu    sync.Mutex
	conns map[string]*EchoConn // by remote address
	open  map[net.Conn]bool
}

// EchoConn is what one connection to the echo server saw.
type EchoConn struct {
	Remote   string
	Received bytes.Buffer
	Err      error // how it ended (nil: still open or closed cleanly)
	Done     bool
}

func newEchoServer(l net.Listener) *EchoServer {
	s := &EchoServer{l: l, conns: map[string]*EchoConn{}, open: map[net.Conn]bool{}}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ec := &EchoConn{Remote: c.RemoteAddr().String()}
			s.mu.Lock()
			s.conns[ec.Remote] = ec
			s.open[c] = true
			s.mu.Unlock()
			go func() {
				defer func() {
					c.Close()
					s.mu.Lock()
					delete(s.open, c)
					s.mu.Unlock()
				}()
				buf := make([]byte, 32<<10)
				for {
					n, err := c.Read(buf)
					s.mu.Lock()
					ec.Received.Write(buf[:n])
					s.mu.Unlock()
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							err = werr
						}
					}
					if err != nil {
						s.mu.Lock()
						ec.Done = true
						if !errors.Is(err, io.EOF) {
							ec.Err = err
						}
						s.mu.Unlock()
						return
					}
				}
			}()
		}
	}()
	return s
}

// Conns is a snapshot of every connection the server saw.
func (s *EchoServer) Conns() []EchoConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []EchoConn
	for _, c := range s.conns {
		cp := EchoConn{Remote: c.Remote, Err: c.Err, Done: c.Done}
		cp.Received.Write(c.Received.Bytes())
		out = append(out, cp)
	}
	return out
}

// Close stops the server and closes its connections.
func (s *EchoServer) Close() {
	s.l.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.open {
		c.Close()
	}
}
