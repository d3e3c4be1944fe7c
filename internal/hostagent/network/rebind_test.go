package network

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
)

func testFilter() *addrFilter {
	h := hostTable{
		pool:    netip.MustParsePrefix("10.234.0.0/16"),
		allowed: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.7.0/24")},
	}
	h.blocked = append(slices.Clone(alwaysBlocked), h.pool, netip.MustParsePrefix("198.18.0.0/30"))
	return h.filter()
}

func TestAddrFilter(t *testing.T) {
	f := testFilter()
	for _, tc := range []struct {
		addr    string
		blocked bool
	}{
		{"203.0.113.10", false},
		{"8.8.8.8", false},
		{"127.0.0.1", true},
		{"169.254.169.254", true},
		{"172.16.0.1", true},
		{"172.31.255.255", true},
		{"172.32.0.1", false},
		{"192.168.1.1", true},
		{"192.168.7.9", false}, // the operator's exception
		{"100.64.0.1", true},
		{"10.1.2.3", false},   // the operator's exception
		{"10.234.0.1", true},  // the pool: never an exception
		{"198.18.0.2", true},  // a host subnet
		{"224.0.0.251", true}, // multicast
		{"0.0.0.0", true},
		{"::ffff:127.0.0.1", true},
	} {
		if got := f.blocks(netip.MustParseAddr(tc.addr)); got != tc.blocked {
			t.Errorf("blocks(%s) = %v, want %v", tc.addr, got, tc.blocked)
		}
	}
}

func TestReversePrefix(t *testing.T) {
	for _, tc := range []struct {
		name string
		want string // "" for none
	}{
		{"3.2.1.10.in-addr.arpa.", "10.1.2.3/32"},
		{"2.1.10.IN-ADDR.ARPA", "10.1.2.0/24"},
		{"10.in-addr.arpa.", "10.0.0.0/8"},
		{"in-addr.arpa.", ""},
		{"x.y.3.2.1.10.in-addr.arpa.", "10.1.2.3/32"},
		{"5.x.1.10.in-addr.arpa.", "10.1.0.0/16"},
		{"9.3.2.1.10.in-addr.arpa.", "10.1.2.3/32"}, // 4 octets at most
		{"256.10.in-addr.arpa.", "10.0.0.0/8"},
		{"01.10.in-addr.arpa.", "10.0.0.0/8"},
		{"x.in-addr.arpa.", ""},
		{"example.com.", ""},
		{"in-addr.arpa.example.com.", ""},
		{"1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", "fd00::1/128"},
		{"d.f.ip6.arpa.", "fd00::/8"},
		{"8.e.f.ip6.arpa.", "fe80::/12"},
		{"ip6.arpa.", ""},
		{"zz.d.f.ip6.arpa.", "fd00::/8"},
	} {
		p, ok := reversePrefix(tc.name)
		got := ""
		if ok {
			got = p.String()
		}
		if got != tc.want {
			t.Errorf("reversePrefix(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
	// Every reverse name of an address maps to that address.
	for _, a := range []string{"10.77.0.10", "172.20.1.3", "fd12:3456::1", "fe80::1"} {
		addr := netip.MustParseAddr(a)
		rev, _ := dns.ReverseAddr(a)
		if p, ok := reversePrefix(rev); !ok || p != netip.PrefixFrom(addr, addr.BitLen()) {
			t.Errorf("reversePrefix(%s) = %v, %v; want %s", rev, p, ok, a)
		}
	}
	f := testFilter()
	for _, tc := range []struct {
		name    string
		blocked bool
	}{
		{"1.20.172.in-addr.arpa.", true},
		{"172.in-addr.arpa.", false}, // 172/8 is not all private
		{"7.168.192.in-addr.arpa.", false},
		{"168.192.in-addr.arpa.", true}, // the exception is a part of it
		{"234.10.in-addr.arpa.", true},  // the pool
		{"77.10.in-addr.arpa.", false},
		{"10.100.51.198.in-addr.arpa.", false},
		{"d.f.ip6.arpa.", true},
		{"0.8.e.f.ip6.arpa.", true},
		{"1.0.0.2.ip6.arpa.", false},
	} {
		p, _ := reversePrefix(tc.name)
		if got := f.blocksPrefix(p); got != tc.blocked {
			t.Errorf("blocksPrefix(%s, %s) = %v, want %v", tc.name, p, got, tc.blocked)
		}
	}
}

func TestScrub(t *testing.T) {
	rr := func(s string) dns.RR {
		r, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	in := []dns.RR{
		rr("a.test. 60 IN CNAME b.test."),
		rr("b.test. 60 IN A 203.0.113.10"),
		rr("b.test. 60 IN A 10.234.0.1"),
		rr("b.test. 60 IN A 127.0.0.1"),
		rr("b.test. 60 IN AAAA 2001:db8::1"),
		rr(`b.test. 60 IN HTTPS 1 . alpn="h2" ipv4hint="203.0.113.10,192.168.1.1" ipv6hint="2001:db8::1"`),
		rr(`c.test. 60 IN SVCB 1 . ipv4hint="169.254.169.254"`),
	}
	out, dropped := scrub(in, testFilter())
	var got []string
	for _, r := range out {
		got = append(got, strings.ReplaceAll(r.String(), "\t", " "))
	}
	want := []string{
		"a.test. 60 IN CNAME b.test.",
		"b.test. 60 IN A 203.0.113.10",
		`b.test. 60 IN HTTPS 1 . alpn="h2" ipv4hint="203.0.113.10"`,
		"c.test. 60 IN SVCB 1 .",
	}
	if !slices.Equal(got, want) || dropped != 4 {
		t.Errorf("scrub: %d dropped, kept\n%s\nwant 4 dropped, kept\n%s", dropped, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// logged keeps the records a slog.Logger writes.
type logged struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logged) Enabled(context.Context, slog.Level) bool { return true }
func (l *logged) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
	return nil
}
func (l *logged) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logged) WithGroup(string) slog.Handler      { return l }

func (l *logged) warned() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r.Level >= slog.LevelWarn {
			return true
		}
	}
	return false
}

func TestHostUpstreams(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stub := file("stub.conf", "# systemd-resolved\nnameserver 127.0.0.53\noptions edns0 trust-ad\nsearch corp.example\n")
	resolved := file("resolved.conf", "nameserver 192.0.2.53\nnameserver 127.0.0.1\nnameserver fe80::1%eth0\nnameserver 2001:db8::53\n")
	plain := file("plain.conf", "nameserver 192.0.2.1\nnameserver 192.0.2.2\n")
	local := file("local.conf", "nameserver 127.0.0.1\n")
	onlyLoopback := file("loop.conf", "nameserver 127.0.0.1\n")
	missing := filepath.Join(dir, "missing.conf")
	for _, tc := range []struct {
		what               string
		resolvConf, rsConf string
		want               []string
		warn               bool
	}{
		{"the host's resolvers", plain, resolved, []string{"192.0.2.1:53", "192.0.2.2:53"}, false},
		{"systemd-resolved's upstreams instead of its stub", stub, resolved, []string{"192.0.2.53:53", "[2001:db8::53]:53"}, false},
		{"the stub when resolved names no upstream", stub, onlyLoopback, []string{"127.0.0.53:53"}, true},
		{"the stub when resolved's file is missing", stub, missing, []string{"127.0.0.53:53"}, true},
		{"a local resolver of another kind", local, resolved, []string{"127.0.0.1:53"}, true},
	} {
		t.Run(tc.what, func(t *testing.T) {
			log := &logged{}
			m := &Manager{cfg: Config{ResolvConf: tc.resolvConf, ResolvedConf: tc.rsConf}.withDefaults(), log: slog.New(log)}
			got, err := m.hostUpstreams()
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("hostUpstreams() = %q, %v; want %q", got, err, tc.want)
			}
			if log.warned() != tc.warn {
				t.Errorf("warned: %v, want %v", log.warned(), tc.warn)
			}
		})
	}
	m := &Manager{cfg: Config{ResolvConf: missing}.withDefaults(), log: slog.New(&logged{})}
	if _, err := m.hostUpstreams(); err == nil {
		t.Error("hostUpstreams with no resolv.conf: no error")
	}
}
