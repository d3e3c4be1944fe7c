package hostagent

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// TestDialGuestThroughAgent: the shared agent has no sandbox networking
// (no Config.Dial, no Config.Network), so DialGuest reaches a server on
// the guest's loopback through the guest agent: busybox httpd, run as a
// background process, serves a page and 4 MiB; a
// port nothing listens on is refused.
func TestDialGuestThroughAgent(t *testing.T) {
	a := shared(t)
	info := create(t)
	ctx := ctxT(t)
	sum := sh(t, info.ID, "mkdir -p /tmp/www && echo served-through-the-agent > /tmp/www/index.html && "+
		"head -c 4194304 /dev/urandom > /tmp/www/big && sha256sum /tmp/www/big")
	want, _, _ := strings.Cut(sum, " ")
	c, err := a.Guest(info.ID)
	if err != nil {
		t.Fatal(err)
	}
	// On 127.0.0.1 only: the sandbox's network could not reach it.
	p, err := c.StartProcess(ctx, guestproto.ExecRequest{Argv: []string{"busybox", "httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/tmp/www"}})
	if err != nil {
		t.Fatalf("start httpd: %v", err)
	}
	t.Cleanup(func() { c.RemoveProcess(context.Background(), p.PID) })

	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return a.DialGuest(ctx, info.ID, 8000)
	}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: time.Minute}
	var page string
	var lastErr error
	// httpd starts in the background: until it listens, dials are refused.
	testkit.WaitForf(t, time.Minute, func() string { return fmt.Sprintf("httpd in %s answering (last: %v)", info.ID, lastErr) }, func() bool {
		res, err := hc.Get("http://sandbox/index.html")
		if err != nil {
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("GET before httpd listens: %v, want connection refused", err)
			}
			lastErr = err
			return false
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		page = string(b)
		return true
	})
	if page != "served-through-the-agent\n" {
		t.Errorf("GET /index.html: %q", page)
	}
	res, err := hc.Get("http://sandbox/big")
	if err != nil {
		t.Fatalf("GET /big: %v", err)
	}
	h := sha256.New()
	n, err := io.Copy(h, res.Body)
	res.Body.Close()
	if err != nil || n != 4<<20 || fmt.Sprintf("%x", h.Sum(nil)) != want {
		t.Errorf("GET /big: %d bytes, %v, sha256 %x; want 4 MiB of sha256 %s", n, err, h.Sum(nil), want)
	}

	if _, err := a.DialGuest(ctx, info.ID, 8001); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("DialGuest of a port nothing listens on: %v, want ECONNREFUSED", err)
	}
	if _, err := a.DialGuest(ctx, info.ID, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("DialGuest of port 0: %v, want ErrInvalid", err)
	}
}
