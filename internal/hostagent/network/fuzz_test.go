package network

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
)

// FuzzPolicy parses arbitrary policies (the JSON a create or PATCH
// /network request carries, E2B's allowOut/denyOut included) and a name a
// guest resolves, and checks: a refusal is a *PolicyError matching
// ErrInvalidPolicy; an accepted policy is canonical (Canonical changes
// nothing, every entry reparses to itself), within MaxPolicyEntries, its
// addresses IPv4 and masked, and encodes to JSON that parses back to it;
// and the forwarder's verdict on the name is that of a plain reading of
// the precedence rules (AllowOut wins, then DenyOut, then Internet; a
// wildcard covers the names below it, not itself).
func FuzzPolicy(f *testing.F) {
	for _, s := range [][2]string{
		{`{"internet":true,"deny_out":["blocked.example","*.ads.example","10.0.0.0/8"]}`, "x.ads.example"},
		{`{"internet":false,"allow_out":["api.example.com","*.cdn.example.com","203.0.113.7","198.51.100.0/24"]}`, "img.cdn.example.com"},
		{`{"internet":false,"allow_out":["*.example.com"],"deny_out":["*.example.com","example.com"]}`, "example.com"},
		{`{"allow_out":["Example.COM.", " 203.0.113.9/24 ", "::ffff:203.0.113.7", "_dmarc.example.com"]}`, "EXAMPLE.com."},
		{`{"deny_out":["2001:db8::1"]}`, "a"},
		{`{"deny_out":["*"]}`, "a"},
		{`{"deny_out":["*.*.example"]}`, "a.b.example"},
		{`{"deny_out":["1.2.3"]}`, "1.2.3"},
		{`{"deny_out":["a..b", "-a.b", "a-.b", "a.123"]}`, "a.123"},
		{`{"internet":true,"bogus":1}`, ""},
		{`{"internet":"yes"}`, ""},
		{`{"allow_out":["` + strings.Repeat("a", 64) + `.example"]}`, ""},
		{`{"allow_out":["[::1]", "a:b", "0.0.0.0/0"]}`, "a"},
		{`null`, "a"},
		{`{} {}`, "a"},
		{`{"allow_out":[]}`, "a"},
	} {
		f.Add([]byte(s[0]), s[1])
	}
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		p, err := netpolicy.Parse(data)
		if err != nil {
			var pe *netpolicy.Error
			if !errors.Is(err, netpolicy.ErrInvalid) || !errors.As(err, &pe) {
				t.Fatalf("netpolicy.Parse(%q): %v, want a *netpolicy.Error matching netpolicy.ErrInvalid", data, err)
			}
			return
		}
		if n := len(p.AllowOut) + len(p.DenyOut); n > netpolicy.MaxEntries {
			t.Fatalf("netpolicy.Parse(%q) accepted %d entries", data, n)
		}
		if c := p.Canonical(); !reflect.DeepEqual(c, p) {
			t.Fatalf("netpolicy.Parse(%q) = %+v, not canonical (%+v)", data, p, c)
		}
		for _, e := range append(append([]string(nil), p.AllowOut...), p.DenyOut...) {
			if got := (netpolicy.Policy{AllowOut: []string{e}}).Canonical().AllowOut; got[0] != e {
				t.Fatalf("entry %q of an accepted policy reparses as %q", e, got[0])
			}
			en, reason := netpolicy.ParseEntry(e)
			pfx := en.Prefix
			if reason != "" {
				t.Fatalf("entry %q of an accepted policy: %s", e, reason)
			}
			if pfx.IsValid() && (!pfx.Addr().Is4() || pfx != pfx.Masked()) {
				t.Fatalf("entry %q of an accepted policy: not a masked IPv4 prefix", e)
			}
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		again, err := netpolicy.Parse(b)
		if err != nil || !reflect.DeepEqual(normalPolicy(again), normalPolicy(p)) {
			t.Fatalf("policy %+v encoded as %s parses as %+v, %v", p, b, again, err)
		}

		c, err := compile(p)
		if err != nil {
			t.Fatalf("an accepted policy does not compile: %v", err)
		}
		q := strings.ToLower(strings.TrimSuffix(name, "."))
		if got, want := c.resolve(q), naiveVerdict(p, q); got != want {
			t.Fatalf("policy %s, name %q: verdict %d, want %d", data, q, got, want)
		}
	})
}

// normalPolicy treats empty and nil lists alike (JSON omits both).
func normalPolicy(p netpolicy.Policy) netpolicy.Policy {
	if len(p.AllowOut) == 0 {
		p.AllowOut = nil
	}
	if len(p.DenyOut) == 0 {
		p.DenyOut = nil
	}
	return p
}

// naiveVerdict reads the policy's precedence rules for a lower-case name
// without trailing dot, entry by entry.
func naiveVerdict(p netpolicy.Policy, name string) nameVerdict {
	matches := func(entries []string) bool {
		for _, e := range entries {
			if rest, ok := strings.CutPrefix(e, "*."); ok {
				if strings.HasSuffix(name, "."+rest) {
					return true
				}
			} else if e == name {
				if _, err := netip.ParseAddr(e); err != nil && !strings.Contains(e, "/") {
					return true
				}
			}
		}
		return false
	}
	switch {
	case matches(p.AllowOut):
		return nameAllowListed
	case matches(p.DenyOut):
		return nameDenied
	case p.Internet:
		return nameOpen
	}
	return nameDenied
}

// The policies FuzzDNS's forwarder runs with, by the input's choice.
var dnsPolicies = []netpolicy.Policy{
	{Internet: true, DenyOut: []string{"blocked.example", "*.ads.example", "10.0.0.0/8"}},
	{Internet: false, AllowOut: []string{"allowed.example", "*.ok.example", "203.0.113.0/24"}},
	{Internet: false},
	{Internet: true, AllowOut: []string{"*.example"}, DenyOut: []string{"*.example", "example"}},
}

// FuzzDNS sends arbitrary DNS messages from a guest to a sandbox's DNS
// forwarder, whose upstream (an in-process fake, no network) answers with
// arbitrary bytes under the query's id, and checks: every message the
// server would hand the forwarder gets exactly one answer, with the
// query's id, that fits the transport's limit; the forwarder asks the
// upstream only for a single IN query of an allowed type whose name the
// policy does not deny (and answers NXDOMAIN for a denied name); the
// answer has no AAAA record; and it allows addresses (learn) only for an
// allow-listed name, only the A records of the upstream's answer, and only
// when the upstream succeeded.
func FuzzDNS(f *testing.F) {
	q := func(name string, t uint16, edns uint16, mod func(*dns.Msg)) []byte {
		m := new(dns.Msg)
		m.SetQuestion(name, t)
		if edns > 0 {
			m.SetEdns0(edns, false)
		}
		if mod != nil {
			mod(m)
		}
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	a := func(name string, rrs ...string) []byte {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		m.Response, m.RecursionAvailable = true, true
		for _, s := range rrs {
			rr, err := dns.NewRR(s)
			if err != nil {
				f.Fatal(err)
			}
			m.Answer = append(m.Answer, rr)
		}
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	many := make([]string, 60)
	for i := range many {
		many[i] = "x.ok.example. 60 IN TXT \"" + strings.Repeat("t", 200) + "\""
	}
	for _, s := range []struct {
		query, answer []byte
		mode          uint8
	}{
		{q("www.example.com.", dns.TypeA, 0, nil), a("www.example.com.", "www.example.com. 300 IN A 93.184.215.14"), 0},
		{q("allowed.example.", dns.TypeA, 0, nil), a("allowed.example.", "allowed.example. 30 IN A 203.0.113.7", "allowed.example. 30 IN AAAA 2001:db8::1", "allowed.example. 5 IN A 198.51.100.1"), 1},
		{q("x.ok.example.", dns.TypeA, 1232, nil), a("x.ok.example.", "x.ok.example. 60 IN CNAME y.ok.example.", "y.ok.example. 60 IN A 203.0.113.9"), 1 | dnsTCP},
		{q("x.ok.example.", dns.TypeTXT, 4096, nil), a("x.ok.example.", many...), 1},
		{q("x.ok.example.", dns.TypeTXT, 0, nil), a("x.ok.example.", many...), 1 | dnsTCP},
		{q("blocked.example.", dns.TypeA, 0, nil), a("blocked.example.", "blocked.example. 1 IN A 10.0.0.1"), 0},
		{q("tracker.ads.example.", dns.TypeAAAA, 0, nil), nil, 0},
		{q("anything.", dns.TypeA, 0, nil), a("anything.", "anything. 1 IN A 1.2.3.4"), 2},
		{q("example.", dns.TypeANY, 0, nil), nil, 0},
		{q("example.", dns.TypeAXFR, 0, nil), nil, dnsTCP},
		{q("example.", dns.TypeA, 0, func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }), nil, 0},
		{q("example.", dns.TypeA, 0, func(m *dns.Msg) { m.Response = true }), nil, 0},
		{q("example.", dns.TypeA, 0, func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate }), nil, 0},
		{q("example.", dns.TypeA, 0, func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) }), nil, 0},
		{q("a.example.", dns.TypeA, 0, nil), []byte{0, 0, 0x81, 0x80, 0, 1, 0, 1}, 3}, // a truncated answer
		{q("a.example.", dns.TypeA, 0, nil), a("a.example.", "a.example. 0 IN A 0.0.0.0"), 3 | dnsUpstreamFails},
		{q("b.example.", dns.TypeMX, 0, nil), a("b.example.", "b.example. 60 IN MX 10 mail.b.example."), 3 | dnsKeepID},
	} {
		f.Add(s.query, s.answer, s.mode)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, query, answer []byte, mode uint8) {
		req := new(dns.Msg)
		if req.Unpack(query) != nil {
			return // the server answers FORMERR itself; the forwarder never sees it
		}
		pol := dnsPolicies[int(mode&3)]
		c, err := compile(pol)
		if err != nil {
			t.Fatal(err)
		}
		up := &fakeUpstream{answer: answer, keepID: mode&dnsKeepID != 0, fail: mode&dnsUpstreamFails != 0}
		var learned []learnCall
		filt := fuzzFilter()
		fw := &forwarder{
			upstreams: []string{"192.0.2.53:53"},
			timeout:   5 * time.Second,
			maxAnswer: 4096,
			dial:      up.dial,
			learn: func(name string, addrs []netip.Addr, ttl time.Duration) error {
				learned = append(learned, learnCall{name, addrs, ttl})
				return nil
			},
			filter:   func() *addrFilter { return filt },
			log:      log,
			limiter:  newTokenBucket(0),
			inflight: make(chan struct{}, maxUpstreamInflight),
		}
		fw.policy.Store(c)
		w := &recordWriter{tcp: mode&dnsTCP != 0}
		fw.ServeDNS(w, req)

		if len(w.msgs) != 1 {
			t.Fatalf("query %v: %d answers, want 1", req.Question, len(w.msgs))
		}
		resp := w.msgs[0]
		if resp.Id != req.Id {
			t.Fatalf("answer id %d, query id %d", resp.Id, req.Id)
		}
		limit := fw.maxAnswer
		if !w.tcp {
			limit = dns.MinMsgSize
			if o := req.IsEdns0(); o != nil {
				limit = max(dns.MinMsgSize, min(int(o.UDPSize()), fw.maxAnswer))
			}
		}
		packed, err := resp.Pack()
		if err != nil {
			t.Fatalf("the answer does not pack: %v", err)
		}
		if len(packed) > limit {
			t.Fatalf("answer of %d bytes over a %s limit of %d", len(packed), w.network(), limit)
		}
		for _, rr := range resp.Answer {
			if rr.Header().Rrtype == dns.TypeAAAA {
				t.Fatalf("the answer holds an AAAA record: %v", rr)
			}
			if a, ok := rr.(*dns.A); ok {
				if ip, ok := netip.AddrFromSlice(a.A.To4()); ok && filt.blocks(ip) {
					t.Fatalf("the answer holds %v, an address no sandbox may reach", ip)
				}
			}
		}

		// What the forwarder may do with the query.
		valid := !req.Response && req.Opcode == dns.OpcodeQuery && len(req.Question) == 1
		var verdict nameVerdict = nameDenied
		var name string
		if valid {
			qq := req.Question[0]
			if qq.Qclass != dns.ClassINET || qq.Qtype == dns.TypeAXFR || qq.Qtype == dns.TypeIXFR || qq.Qtype == dns.TypeANY {
				valid = false
			} else {
				name = strings.ToLower(strings.TrimSuffix(qq.Name, "."))
				verdict = c.resolve(name)
			}
		}
		switch {
		case !valid:
			if up.dials != 0 || resp.Rcode == dns.RcodeSuccess {
				t.Fatalf("query %v: forwarded (%d dials), rcode %s; want it refused", req, up.dials, dns.RcodeToString[resp.Rcode])
			}
		case verdict == nameDenied:
			if up.dials != 0 || resp.Rcode != dns.RcodeNameError {
				t.Fatalf("denied name %q: %d upstream dials, rcode %s; want none and NXDOMAIN", name, up.dials, dns.RcodeToString[resp.Rcode])
			}
		case isBlockedReverse(filt, name):
			if up.dials != 0 || resp.Rcode != dns.RcodeNameError {
				t.Fatalf("reverse name %q of a blocked range: %d upstream dials, rcode %s; want none and NXDOMAIN", name, up.dials, dns.RcodeToString[resp.Rcode])
			}
		case up.dials != 1:
			t.Fatalf("allowed name %q: %d upstream dials, want 1", name, up.dials)
		}
		if len(learned) > 0 {
			ans := new(dns.Msg)
			if verdict != nameAllowListed || up.replied == nil || ans.Unpack(up.replied) != nil || ans.Rcode != dns.RcodeSuccess {
				t.Fatalf("name %q (verdict %d) had addresses allowed %v; the upstream answered %q", name, verdict, learned, up.replied)
			}
			if len(learned) != 1 || learned[0].name != name {
				t.Fatalf("name %q: learned %v", name, learned)
			}
			want := map[netip.Addr]bool{}
			for _, rr := range ans.Answer {
				if a, ok := rr.(*dns.A); ok {
					if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
						want[ip] = true
					}
				}
			}
			for _, ip := range learned[0].addrs {
				if filt.blocks(ip) {
					t.Fatalf("name %q: allowed %v, an address no sandbox may reach", name, ip)
				}
				if !ip.Is4() || !want[ip] {
					t.Fatalf("name %q: allowed %v, not an A record of the upstream's answer %v", name, ip, ans.Answer)
				}
			}
		}
	})
}

// fuzzFilter is FuzzDNS's set of unreachable addresses: the always-blocked
// ranges and a pool, as a Manager has them.
func fuzzFilter() *addrFilter {
	pool := netip.MustParsePrefix("10.234.0.0/16")
	return &addrFilter{pool: pool, blocked: append(slices.Clone(alwaysBlocked), pool)}
}

// isBlockedReverse reports whether name is in the reverse zone of a range
// f blocks (the forwarder answers it itself).
func isBlockedReverse(f *addrFilter, name string) bool {
	p, ok := reversePrefix(name)
	return ok && f.blocksPrefix(p)
}

// Mode bits of FuzzDNS (the low two choose the policy).
const (
	dnsTCP           = 1 << 2 // the guest asks over TCP
	dnsKeepID        = 1 << 3 // the upstream answers with its own id
	dnsUpstreamFails = 1 << 4 // the upstream cannot be reached
)

type learnCall struct {
	name  string
	addrs []netip.Addr
	ttl   time.Duration
}

// recordWriter is the guest's end of a query: what the forwarder answers.
type recordWriter struct {
	tcp  bool
	msgs []*dns.Msg
}

func (w *recordWriter) network() string {
	if w.tcp {
		return "tcp"
	}
	return "udp"
}

func (w *recordWriter) LocalAddr() net.Addr {
	if w.tcp {
		return &net.TCPAddr{IP: GatewayAddr.AsSlice(), Port: DNSPort}
	}
	return &net.UDPAddr{IP: GatewayAddr.AsSlice(), Port: DNSPort}
}

func (w *recordWriter) RemoteAddr() net.Addr {
	return &net.UDPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 40000}
}

func (w *recordWriter) WriteMsg(m *dns.Msg) error {
	w.msgs = append(w.msgs, m.Copy())
	return nil
}

func (w *recordWriter) Write([]byte) (int, error) {
	return 0, errors.New("the forwarder writes messages, not bytes")
}

func (w *recordWriter) Close() error        { return nil }
func (w *recordWriter) TsigStatus() error   { return nil }
func (w *recordWriter) TsigTimersOnly(bool) {}
func (w *recordWriter) Hijack()             {}

// fakeUpstream is the host's resolver as the forwarder dials it: it reads
// one query and answers with answer, under the query's id unless keepID;
// or the dial fails.
type fakeUpstream struct {
	answer       []byte
	keepID, fail bool

	mu      sync.Mutex
	dials   int
	replied []byte // what it answered, id set
}

func (u *fakeUpstream) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	u.mu.Lock()
	u.dials++
	u.mu.Unlock()
	if u.fail {
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.ErrDeadlineExceeded}
	}
	var client, server net.Conn
	if network == "tcp" {
		client, server = net.Pipe()
	} else {
		client, server = datagramPipe()
	}
	go u.serve(server, network == "tcp")
	return client, nil
}

func (u *fakeUpstream) serve(c net.Conn, tcp bool) {
	defer c.Close()
	var q []byte
	if tcp {
		var n [2]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return
		}
		q = make([]byte, binary.BigEndian.Uint16(n[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
	} else {
		b := make([]byte, dns.MaxMsgSize)
		n, err := c.Read(b)
		if err != nil {
			return
		}
		q = b[:n]
	}
	ans := append([]byte(nil), u.answer...)
	if !u.keepID && len(ans) >= 2 && len(q) >= 2 {
		copy(ans, q[:2])
	}
	u.mu.Lock()
	u.replied = ans
	u.mu.Unlock()
	if tcp {
		ans = append(binary.BigEndian.AppendUint16(nil, uint16(len(ans))), ans...)
	}
	c.Write(ans)
}

// datagramPipe is net.Pipe with message boundaries: each Write is one
// Read on the other end, as on a UDP socket (the dns package frames
// messages on stream connections only).
func datagramPipe() (net.Conn, net.Conn) {
	a2b, b2a := make(chan []byte, 4), make(chan []byte, 4)
	done := make(chan struct{})
	var once sync.Once
	closeBoth := func() { once.Do(func() { close(done) }) }
	return &datagramConn{in: b2a, out: a2b, done: done, close: closeBoth},
		&datagramConn{in: a2b, out: b2a, done: done, close: closeBoth}
}

type datagramConn struct {
	in, out chan []byte
	done    chan struct{}
	close   func()
}

var errDatagramClosed = errors.New("datagram pipe closed")

func (c *datagramConn) Read(p []byte) (int, error) {
	select {
	case b := <-c.in:
		return copy(p, b), nil
	case <-c.done:
		select {
		case b := <-c.in:
			return copy(p, b), nil
		default:
			return 0, errDatagramClosed
		}
	}
}

func (c *datagramConn) Write(p []byte) (int, error) {
	select {
	case <-c.done:
		return 0, errDatagramClosed
	case c.out <- append([]byte(nil), p...):
		return len(p), nil
	}
}

func (c *datagramConn) ReadFrom(p []byte) (int, net.Addr, error) {
	n, err := c.Read(p)
	return n, c.RemoteAddr(), err
}

func (c *datagramConn) WriteTo(p []byte, _ net.Addr) (int, error) { return c.Write(p) }

func (c *datagramConn) Close() error { c.close(); return nil }
func (c *datagramConn) LocalAddr() net.Addr {
	return &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5353}
}
func (c *datagramConn) RemoteAddr() net.Addr {
	return &net.UDPAddr{IP: net.IPv4(192, 0, 2, 53), Port: 53}
}
func (c *datagramConn) SetDeadline(t time.Time) error      { return nil }
func (c *datagramConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *datagramConn) SetWriteDeadline(t time.Time) error { return nil }
