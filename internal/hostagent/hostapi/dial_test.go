package hostapi_test

// Dials to guests' ports, local and through the host API's upgraded
// connections, compared. Sandboxes have no network yet: the agent's dial
// hook (guestDial) connects a sandbox's port to a TCP server on 127.0.0.1
// that the test registered, to a closed port (connection refused), or
// fails the way a network would.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
	"github.com/pandastack/pandastack/internal/hostagent/hostapi"
)

// Ports the dial hook treats specially.
const (
	portUnsupported = 1 // fails with errors.ErrUnsupported
	portTimeout     = 2 // fails with context.DeadlineExceeded at once
	portHang        = 3 // waits for ctx to end
)

var (
	dialMu      sync.Mutex
	dialTargets = map[string]string{} // "id:port" → address
	refuseAddr  = func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}()
)

// guestDial is the agent's Config.Dial.
func guestDial(ctx context.Context, id string, port int) (net.Conn, error) {
	switch port {
	case portUnsupported:
		return nil, fmt.Errorf("no network here: %w", errors.ErrUnsupported)
	case portTimeout:
		return nil, fmt.Errorf("connect: %w", context.DeadlineExceeded)
	case portHang:
		<-ctx.Done()
		return nil, ctx.Err()
	}
	dialMu.Lock()
	addr, ok := dialTargets[id+":"+strconv.Itoa(port)]
	dialMu.Unlock()
	if !ok {
		addr = refuseAddr
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// tcpServer serves each connection with h on 127.0.0.1 as port of sandbox
// id until the test ends.
func tcpServer(t *testing.T, id string, port int, h func(net.Conn)) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k := id + ":" + strconv.Itoa(port)
	dialMu.Lock()
	dialTargets[k] = ln.Addr().String()
	dialMu.Unlock()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); defer c.Close(); h(c) }()
		}
	}()
	t.Cleanup(func() {
		dialMu.Lock()
		delete(dialTargets, k)
		dialMu.Unlock()
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// hosts are the two ways to reach the agent: in process and over the
// host API.
func hosts() map[string]host.GuestDialer {
	return map[string]host.GuestDialer{"local": local.(host.GuestDialer), "remote": client}
}

func TestDialGuest(t *testing.T) {
	world(t)
	sb := create(t, client)
	// Answers once the client has finished sending (a half-close).
	tcpServer(t, sb.ID, 7000, func(c net.Conn) {
		b, _ := io.ReadAll(c)
		fmt.Fprintf(c, "got %d bytes: %s", len(b), b)
	})
	tcpServer(t, sb.ID, 7001, func(c net.Conn) { io.Copy(c, c) })
	// Speaks first.
	tcpServer(t, sb.ID, 7002, func(c net.Conn) { io.WriteString(c, "banner\n"); io.Copy(io.Discard, c) })
	for name, h := range hosts() {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			c, err := h.DialGuest(ctx, sb.ID, 7000)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close()
			io.WriteString(c, "hello")
			cw, ok := c.(interface{ CloseWrite() error })
			if !ok {
				t.Fatalf("a %T cannot half-close", c)
			}
			if err := cw.CloseWrite(); err != nil {
				t.Fatalf("close write: %v", err)
			}
			if b, err := io.ReadAll(c); string(b) != "got 5 bytes: hello" || err != nil {
				t.Errorf("after half-close: got %q, %v", b, err)
			}

			// 16 MiB both ways at once.
			c2, err := h.DialGuest(ctx, sb.ID, 7001)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c2.Close()
			data := make([]byte, 16<<20)
			rand.Read(data)
			go func() { c2.Write(data) }()
			got := make([]byte, len(data))
			if _, err := io.ReadFull(c2, got); err != nil || sha256.Sum256(got) != sha256.Sum256(data) {
				t.Errorf("echo of 16 MiB: %v, equal %v", err, bytes.Equal(got, data))
			}

			c3, err := h.DialGuest(ctx, sb.ID, 7002)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c3.Close()
			buf := make([]byte, 7)
			if _, err := io.ReadFull(c3, buf); string(buf) != "banner\n" {
				t.Errorf("server speaking first: got %q, %v", buf, err)
			}
		})
	}
}

func TestDialGuestErrors(t *testing.T) {
	world(t)
	sb := create(t, client)
	for name, h := range hosts() {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			for _, tc := range []struct {
				what string
				id   string
				port int
				want error
			}{
				{"unknown sandbox", "nosuch0", 80, host.ErrNotFound},
				{"port 0", sb.ID, 0, host.ErrInvalid},
				{"port 65536", sb.ID, 65536, host.ErrInvalid},
				{"nothing listens", sb.ID, 8123, syscall.ECONNREFUSED},
				{"no networking", sb.ID, portUnsupported, errors.ErrUnsupported},
				{"timeout", sb.ID, portTimeout, context.DeadlineExceeded},
			} {
				c, err := h.DialGuest(ctx, tc.id, tc.port)
				if err == nil {
					c.Close()
				}
				if !errors.Is(err, tc.want) {
					t.Errorf("%s: got %v, want %v", tc.what, err, tc.want)
				}
			}
			// ctx bounds the dial.
			short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			if _, err := h.DialGuest(short, sb.ID, portHang); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("dial that outlives its context: got %v, want context.DeadlineExceeded", err)
			}
		})
	}
	// Not running.
	if _, err := client.Pause(ctxT(t), sb.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	for name, h := range hosts() {
		if _, err := h.DialGuest(ctxT(t), sb.ID, 80); !errors.Is(err, host.ErrConflict) {
			t.Errorf("%s: paused sandbox: got %v, want host.ErrConflict", name, err)
		}
	}
	// The endpoint itself: an upgrade is required, and the token.
	for _, tc := range []struct {
		auth, upgrade string
		status        int
	}{
		{"Bearer " + testToken, "", http.StatusUnprocessableEntity},
		{"Bearer nope", hostwire.UpgradeProtocol, http.StatusUnauthorized},
	} {
		req, _ := http.NewRequest("GET", hs.URL+hostwire.Prefix+"/sandboxes/"+sb.ID+"/dial?port=80", nil)
		req.Header.Set("Authorization", tc.auth)
		if tc.upgrade != "" {
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", tc.upgrade)
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tc.status {
			t.Errorf("dial with auth %q upgrade %q: got %d, want %d", tc.auth, tc.upgrade, res.StatusCode, tc.status)
		}
	}
}

// TestDialEndsAtClose: a host API server's Close ends the dials it
// carries, and it takes no more.
func TestDialEndsAtClose(t *testing.T) {
	world(t)
	sb := create(t, client)
	tcpServer(t, sb.ID, 7001, func(c net.Conn) { io.Copy(c, c) })
	srv := hostapi.NewServer(ag, testToken, nil)
	hs2 := httptest.NewUnstartedServer(srv)
	hs2.TLS = serverTLS(creds)
	hs2.StartTLS()
	defer hs2.Close()
	c2, err := hostclient.Dial(hs2.URL, testToken, hostclient.WithTLS(tlsCfg))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	conn, err := c2.DialGuest(ctxT(t), sb.ID, 7001)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	io.WriteString(conn, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); string(buf) != "ping" {
		t.Fatalf("echo: got %q, %v", buf, err)
	}
	srv.Close()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Read(buf); err == nil || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed) {
		t.Errorf("read after the server's Close: got %v, want the connection ended by the server", err)
	}
	if _, err := c2.DialGuest(ctxT(t), sb.ID, 7001); !errors.Is(err, host.ErrUnavailable) {
		t.Errorf("dial after Close: got %v, want host.ErrUnavailable", err)
	}
}
