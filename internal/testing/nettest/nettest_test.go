package nettest

import (
	"context"
	"io"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestMain(m *testing.M) { MainInNewNetns(m) }

// TestEnv: the test world answers from its host, processes start in its
// namespaces, and the namespaces go at the test's end.
func TestEnv(t *testing.T) {
	var names []string
	t.Run("world", func(t *testing.T) {
		env := NewEnv(t)
		names = []string{env.Host.Name, env.Internet.Name}
		resp, err := env.Host.HTTPClient(3 * time.Second).Get("http://" + WebAddr.String() + "/")
		if err != nil {
			t.Fatalf("host to web: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != Hello(WebAddr) {
			t.Fatalf("web answered %q", b)
		}
		env.AddRecord("new.test", OtherAddr)
		c, err := env.Host.DialContext(context.Background(), "udp4", netip.AddrPortFrom(DNSAddr, 53).String())
		if err != nil {
			t.Fatal(err)
		}
		co := &dns.Conn{Conn: c}
		defer co.Close()
		q := new(dns.Msg)
		q.SetQuestion("new.test.", dns.TypeA)
		co.SetDeadline(time.Now().Add(3 * time.Second))
		if err := co.WriteMsg(q); err != nil {
			t.Fatal(err)
		}
		r, err := co.ReadMsg()
		if err != nil || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != OtherAddr.String() {
			t.Fatalf("new.test: %v, %v", r, err)
		}
		cmd := exec.Command("ip", "-br", "addr")
		var out strings.Builder
		cmd.Stdout = &out
		if err := env.Internet.Start(cmd); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil || !strings.Contains(out.String(), WebAddr.String()) {
			t.Fatalf("ip -br addr in the internet: %v\n%s", err, out.String())
		}
	})
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, n := range names {
		if strings.Contains(string(out), n) {
			t.Errorf("namespace %s left after the test", n)
		}
	}
}
