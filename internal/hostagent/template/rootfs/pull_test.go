package rootfs_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pandastack/pandastack/internal/hostagent/template/rootfs"
)

func TestRefused(t *testing.T) {
	host := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8:1::/64")}
	for _, tc := range []struct {
		addr    string
		refused bool
	}{
		{"127.0.0.1", true}, {"127.1.2.3", true}, {"::1", true},
		{"0.0.0.0", true}, {"0.1.2.3", true}, {"::", true},
		{"169.254.169.254", true}, {"fe80::1", true},
		{"10.0.0.1", true}, {"172.16.5.4", true}, {"172.31.255.255", true}, {"192.168.1.1", true},
		{"fc00::1", true}, {"fd12:3456::1", true}, {"fec0::1", true},
		{"100.64.0.1", true}, {"100.127.255.254", true},
		{"224.0.0.1", true}, {"239.1.2.3", true}, {"ff02::1", true}, {"ff0e::1", true},
		{"255.255.255.255", true}, {"240.0.0.1", true},
		{"::ffff:127.0.0.1", true}, {"::ffff:10.1.2.3", true},
		{"64:ff9b::7f00:1", true}, {"64:ff9b::a00:1", true},
		{"203.0.113.7", true}, {"2001:db8:1::5", true}, // the host's own subnets
		// Public ones.
		{"8.8.8.8", false}, {"1.1.1.1", false}, {"100.63.255.255", false}, {"100.128.0.1", false},
		{"172.32.0.1", false}, {"192.0.2.1", false}, {"198.51.100.10", false},
		{"2606:4700::1111", false}, {"64:ff9b::808:808", false}, {"::ffff:8.8.8.8", false},
	} {
		got := rootfs.Refused(netip.MustParseAddr(tc.addr), host)
		if (got != "") != tc.refused {
			t.Errorf("Refused(%s) = %q, want refused %v", tc.addr, got, tc.refused)
		}
	}
}

// countingListener listens on addr and counts the connections it accepts
// (closing them at once).
func countingListener(t *testing.T, addr string) (string, *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var n atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return l.Addr().String(), &n
}

// fakeDNS serves A records (name → address) on loopback and returns a
// resolver that asks it.
func fakeDNS(t *testing.T, records map[string]string) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		for _, q := range r.Question {
			if a, ok := records[strings.TrimSuffix(q.Name, ".")]; ok && q.Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: net.ParseIP(a)})
			}
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

// TestPullDialer: a pull's connections are refused when they would reach
// a refused address, whatever name led there (a literal, /etc/hosts, a
// DNS answer), before anything is sent; the operator's allow-lists let
// them through.
func TestPullDialer(t *testing.T) {
	addr, accepted := countingListener(t, "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(addr)
	resolver := fakeDNS(t, map[string]string{"registry.test": "127.0.0.1"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dial := func(p *rootfs.Pull, host string) error {
		p.Resolver = resolver
		c, err := p.DialContext(ctx, "tcp", net.JoinHostPort(host, port))
		if err == nil {
			c.Close()
		}
		return err
	}
	for _, host := range []string{"127.0.0.1", "localhost", "registry.test"} {
		err := dial(&rootfs.Pull{}, host)
		var re *rootfs.RefusedError
		if !errors.As(err, &re) || re.Addr != netip.MustParseAddr("127.0.0.1") || !strings.Contains(re.Class, "loopback") {
			t.Errorf("dial %s: %v, want a *RefusedError for loopback 127.0.0.1", host, err)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("the listener accepted %d connections of refused dials", n)
	}
	// Allowed: by address, or by the registry's name (with or without
	// its port).
	for _, p := range []*rootfs.Pull{
		{AllowNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
		{AllowHosts: []string{"registry.test"}},
		{AllowHosts: []string{"Registry.test:" + port}},
	} {
		if err := dial(p, "registry.test"); err != nil {
			t.Errorf("dial registry.test with %+v: %v", p, err)
		}
	}
	if err := dial(&rootfs.Pull{AllowHosts: []string{"registry.test:1"}}, "registry.test"); err == nil {
		t.Errorf("registry.test allowed on port 1 only: a dial of port %s succeeded", port)
	}
	if _, err := rootfs.ParseAllowNets([]string{"10.0.0.0/8", "127.0.0.1", "::1"}); err != nil {
		t.Errorf("ParseAllowNets: %v", err)
	}
	for _, bad := range []string{"10.0.0.0/33", "x", "10.0.0/8"} {
		if _, err := rootfs.ParseAllowNets([]string{bad}); err == nil {
			t.Errorf("ParseAllowNets(%q) succeeded", bad)
		}
	}
}

// registryTrap serves every request with status and body, counting them.
func registryTrap(t *testing.T, addr string, status int, body string) (string, *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String(), &n
}

// TestPullNoSSRF: FromImage with a Pull never reaches a loopback service
// (not even through a redirect from an allowed registry), and when it is
// allowed to reach a service that is no registry, its errors say what
// kind of failure it was and nothing the service sent.
func TestPullNoSSRF(t *testing.T) {
	needRoot(t)
	const secret = "SECRET-BODY-4242"
	loop := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	teapot, teapotHits := registryTrap(t, "127.0.0.1:0", http.StatusTeapot, secret)
	// Refused outright: no connection.
	_, _, _, err := build(t, teapot+"/x:1", rootfs.Options{SizeMiB: 16, Pull: &rootfs.Pull{}})
	if !errors.Is(err, rootfs.ErrRefused) || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("pull from %s: %v, want ErrRefused saying loopback", teapot, err)
	}
	if n := teapotHits.Load(); n != 0 {
		t.Errorf("a refused pull made %d requests to the loopback service", n)
	}
	// A redirect from an allowed registry to a refused address.
	redirector := &http.Server{Handler: http.RedirectHandler("http://"+teapot+"/v2/", http.StatusFound)}
	rl, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	go redirector.Serve(rl)
	t.Cleanup(func() { redirector.Close() })
	only2 := &rootfs.Pull{AllowNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}}
	_, _, _, err = build(t, rl.Addr().String()+"/x:1", rootfs.Options{SizeMiB: 16, Insecure: true, Pull: only2})
	if !errors.Is(err, rootfs.ErrRefused) || teapotHits.Load() != 0 {
		t.Errorf("a redirect to loopback: %v (%v), %d requests reached it; want ErrRefused and none", err, rootfs.Detail(err), teapotHits.Load())
	}

	// Allowed, but no registry: classes, never the body.
	broken, _ := registryTrap(t, "127.0.0.1:0", http.StatusInternalServerError, secret)
	page, _ := registryTrap(t, "127.0.0.1:0", http.StatusOK, "<html>"+secret+"</html>")
	for _, tc := range []struct {
		host  string
		class error
		want  string
	}{
		{teapot, rootfs.ErrBadImage, "bad manifest"},
		{broken, rootfs.ErrUnreachable, "registry unreachable"},
		{page, rootfs.ErrBadImage, "bad manifest"},
		{"127.0.0.1:1", rootfs.ErrUnreachable, "registry unreachable"},
	} {
		_, _, _, err := build(t, tc.host+"/x:1", rootfs.Options{SizeMiB: 16, Pull: &rootfs.Pull{AllowNets: loop}})
		if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pull from %s: %v, want %v saying %q", tc.host, err, tc.class, tc.want)
		}
		if err != nil && (strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "html")) {
			t.Errorf("pull from %s: the error shows what the service sent: %q", tc.host, err)
		}
		if err != nil && rootfs.Detail(err) == nil {
			t.Errorf("pull from %s: %v has no detail for the log", tc.host, err)
		}
	}
}

// TestPullAnonymous: a Pull sends no credentials from the Docker config
// (the operator's); the operator's own pull (no Pull) does.
func TestPullAnonymous(t *testing.T) {
	needRoot(t)
	var auths atomic.Int32
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			auths.Add(1)
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
		w.WriteHeader(http.StatusUnauthorized)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	host := l.Addr().String()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, host, base64.StdEncoding.EncodeToString([]byte("operator:hunter2")))
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)

	_, _, _, err = build(t, host+"/private:1", rootfs.Options{SizeMiB: 16, Pull: &rootfs.Pull{AllowNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}})
	if !errors.Is(err, rootfs.ErrDenied) || !strings.Contains(err.Error(), "anonymous") {
		t.Errorf("a tenant's pull of a private image: %v, want ErrDenied saying pulls are anonymous", err)
	}
	if n := auths.Load(); n != 0 {
		t.Errorf("a tenant's pull sent credentials %d times", n)
	}
	if _, _, _, err := build(t, host+"/private:1", rootfs.Options{SizeMiB: 16}); !errors.Is(err, rootfs.ErrDenied) {
		t.Errorf("the operator's pull: %v, want ErrDenied (the test registry refuses everyone)", err)
	}
	if auths.Load() == 0 {
		t.Errorf("the operator's pull sent no credentials from its Docker config: is the test's config read?")
	}
}
