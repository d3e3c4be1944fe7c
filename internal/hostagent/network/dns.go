package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// forwarder is one sandbox's DNS server: it listens on GatewayAddr:53 (UDP
// and TCP) inside the sandbox's namespace, answers NXDOMAIN for the names
// the policy denies and for the reverse names of ranges no sandbox
// reaches, forwards the others to the host's upstream resolvers (it does
// no recursion of its own), removes from their answers the addresses no
// sandbox reaches (see rebind.go) and has the addresses of allow-listed
// names allowed before it answers. Bounded: queries per second (token
// bucket, excess REFUSED), upstream queries in flight, TCP connections,
// answer size.
type forwarder struct {
	upstreams []string
	timeout   time.Duration
	maxAnswer int
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	// learn allows addrs, answered for the allow-listed name, for ttl.
	learn func(name string, addrs []netip.Addr, ttl time.Duration) error
	// filter is the Manager's current set of addresses no sandbox reaches.
	filter func() *addrFilter
	policy atomic.Pointer[compiled]
	log    *slog.Logger

	limiter  *tokenBucket
	inflight chan struct{}

	udp, tcp *dns.Server
	wg       sync.WaitGroup
}

const (
	maxUpstreamInflight = 32 // per sandbox
	maxTCPConns         = 16 // per sandbox
)

// start binds the forwarder's sockets in the namespace nsfd and serves
// them until stop.
func (f *forwarder) start(nsfd int) error {
	f.inflight = make(chan struct{}, maxUpstreamInflight)
	addr := netip.AddrPortFrom(GatewayAddr, DNSPort).String()
	var pc net.PacketConn
	var ln net.Listener
	err := inNetns(nsfd, func() (err error) {
		lc := net.ListenConfig{}
		if pc, err = lc.ListenPacket(context.Background(), "udp4", addr); err != nil {
			return err
		}
		if ln, err = lc.Listen(context.Background(), "tcp4", addr); err != nil {
			pc.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("dns forwarder listen %s: %w", addr, err)
	}
	f.udp = &dns.Server{PacketConn: pc, Handler: f, UDPSize: 4096}
	f.tcp = &dns.Server{Listener: newLimitListener(ln, maxTCPConns),
		Handler: f, MaxTCPQueries: 64}
	for _, s := range []*dns.Server{f.udp, f.tcp} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			if err := s.ActivateAndServe(); err != nil {
				f.log.Warn("dns forwarder stopped", "err", err)
			}
		}()
		<-started
	}
	return nil
}

// stop closes the sockets and waits for the servers to return.
func (f *forwarder) stop() {
	if f.udp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	f.udp.ShutdownContext(ctx)
	f.tcp.ShutdownContext(ctx)
	f.wg.Wait()
	f.udp, f.tcp = nil, nil
}

func (f *forwarder) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	_, isTCP := w.LocalAddr().(*net.TCPAddr)
	limit := f.maxAnswer
	if !isTCP {
		limit = dns.MinMsgSize
		if o := req.IsEdns0(); o != nil {
			limit = max(dns.MinMsgSize, min(int(o.UDPSize()), f.maxAnswer))
		}
	}
	write := func(m *dns.Msg) {
		m.Truncate(limit)
		w.WriteMsg(m)
	}
	fail := func(rcode int) {
		m := new(dns.Msg)
		m.SetRcode(req, rcode)
		m.RecursionAvailable = true
		write(m)
	}
	if !f.limiter.allow() {
		fail(dns.RcodeRefused)
		return
	}
	if req.Response || req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		fail(dns.RcodeNotImplemented)
		return
	}
	q := req.Question[0]
	if q.Qclass != dns.ClassINET || q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR || q.Qtype == dns.TypeANY {
		fail(dns.RcodeRefused)
		return
	}
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	verdict := f.policy.Load().resolve(name)
	if verdict == nameDenied {
		fail(dns.RcodeNameError)
		return
	}
	filter := f.filter()
	if p, ok := reversePrefix(name); ok && filter.blocksPrefix(p) {
		fail(dns.RcodeNameError)
		return
	}
	select {
	case f.inflight <- struct{}{}:
		defer func() { <-f.inflight }()
	default:
		fail(dns.RcodeServerFailure)
		return
	}
	resp, err := f.exchange(req, isTCP)
	if err != nil {
		f.log.Debug("dns upstream failed", "name", name, "err", err)
		fail(dns.RcodeServerFailure)
		return
	}
	resp.Id = req.Id
	var dropped, extra int
	resp.Answer, dropped = scrub(resp.Answer, filter)
	resp.Extra, extra = scrub(resp.Extra, filter)
	if dropped+extra > 0 {
		f.log.Debug("dns: dropped addresses no sandbox reaches from an answer", "name", name, "dropped", dropped+extra)
	}
	if verdict == nameAllowListed && resp.Rcode == dns.RcodeSuccess {
		var addrs []netip.Addr
		ttl := uint32(1<<32 - 1)
		for _, rr := range resp.Answer {
			if a, ok := rr.(*dns.A); ok {
				if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
					addrs = append(addrs, ip)
					ttl = min(ttl, a.Hdr.Ttl)
				}
			}
		}
		if len(addrs) > 0 {
			if err := f.learn(name, addrs, time.Duration(ttl)*time.Second); err != nil {
				f.log.Warn("dns: cannot allow answered addresses", "name", name, "err", err)
				fail(dns.RcodeServerFailure)
				return
			}
		}
	}
	write(resp)
}

// exchange asks the upstreams in turn, over the transport the guest used.
func (f *forwarder) exchange(req *dns.Msg, isTCP bool) (*dns.Msg, error) {
	network := "udp"
	if isTCP {
		network = "tcp"
	}
	m := req.Copy()
	m.Id = dns.Id()
	m.RecursionDesired = true
	c := &dns.Client{Net: network, Timeout: f.timeout, UDPSize: dns.MaxMsgSize}
	var errs []error
	for _, up := range f.upstreams {
		resp, err := func() (*dns.Msg, error) {
			ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
			defer cancel()
			nc, err := f.dial(ctx, network, up)
			if err != nil {
				return nil, err
			}
			co := &dns.Conn{Conn: nc, UDPSize: dns.MaxMsgSize}
			defer co.Close()
			resp, _, err := c.ExchangeWithConnContext(ctx, m, co)
			return resp, err
		}()
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", up, err))
	}
	if len(errs) == 0 {
		return nil, errors.New("no upstream resolver")
	}
	return nil, errors.Join(errs...)
}

// tokenBucket allows rate events per second with a burst of twice that; a
// rate of 0 allows everything.
type tokenBucket struct {
	mu     sync.Mutex
	rate   float64
	tokens float64
	last   time.Time
}

func newTokenBucket(rate int) *tokenBucket {
	return &tokenBucket{rate: float64(rate), tokens: 2 * float64(rate), last: time.Now()}
}

func (b *tokenBucket) allow() bool {
	if b.rate == 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.tokens = min(2*b.rate, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// limitListener holds at most cap(sem) accepted connections open at once;
// Accept waits for one to close (or for Close).
type limitListener struct {
	net.Listener
	sem  chan struct{}
	done chan struct{}
	once sync.Once
}

func newLimitListener(l net.Listener, n int) *limitListener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
