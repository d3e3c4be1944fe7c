package guest_test

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
)

// listen serves each connection to a listener on addr ("127.0.0.1:0",
// "[::1]:0") with h until the test ends, and returns its port.
func listen(t *testing.T, addr string, h func(net.Conn)) int {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); defer c.Close(); h(c) }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestDial: the agent carries a connection to a port of its loopback:
// 8 MiB each way, then the host's half-close and the server's answer.
func TestDial(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	port := listen(t, "127.0.0.1:0", func(c net.Conn) {
		h := sha256.New()
		n, _ := io.Copy(io.MultiWriter(h, c), c) // echo, until the host's end of file
		fmt.Fprintf(c, "%d %x", n, h.Sum(nil))
	})
	conn, err := c.DialPort(ctx, port)
	if err != nil {
		t.Fatalf("DialPort: %v", err)
	}
	defer conn.Close()
	const size = 8 << 20
	sent := sha256.New()
	go func() {
		io.Copy(conn, io.TeeReader(guestprototest.PatternReader(3, size), sent))
		conn.(interface{ CloseWrite() error }).CloseWrite()
	}()
	back := sha256.New()
	if n, err := io.CopyN(back, conn, size); err != nil {
		t.Fatalf("read the echo: %d bytes, %v", n, err)
	}
	tail, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("read the server's answer: %v", err)
	}
	want := fmt.Sprintf("%d %x", size, sent.Sum(nil))
	if string(tail) != want || fmt.Sprintf("%x", back.Sum(nil)) != fmt.Sprintf("%x", sent.Sum(nil)) {
		t.Errorf("the server got %q, want %q; the echo matches: %v", tail, want, fmt.Sprintf("%x", back.Sum(nil)) == fmt.Sprintf("%x", sent.Sum(nil)))
	}
}

// TestDialErrors: a refused port; a server listening on ::1
// only is found there.
func TestDialErrors(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	if _, err := c.DialPort(ctx, closed); !errors.Is(err, syscall.ECONNREFUSED) || !errors.Is(err, guestproto.ErrRefused) {
		t.Errorf("DialPort of a closed port = %v, want ECONNREFUSED", err)
	}
	port := listen(t, "[::1]:0", func(c net.Conn) { io.WriteString(c, "on ::1") })
	// The port is 127.0.0.1's too, bound and not listening: refused.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind 127.0.0.1:%d: %v", port, err)
	}
	conn, err := c.DialPort(ctx, port)
	if err != nil {
		t.Fatalf("DialPort of a server on ::1 only: %v", err)
	}
	defer conn.Close()
	if b, err := io.ReadAll(conn); string(b) != "on ::1" || err != nil {
		t.Errorf("read %q, %v; want %q", b, err, "on ::1")
	}
}
