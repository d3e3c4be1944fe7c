package hostile_test

// Every hostile mode against the real host Client and guest Agent, over a
// unix socketpair: the protocol logic that the end-to-end test in cmd/panda
// repeats through a real VM and the REST API.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
	"github.com/pandastack/pandastack/internal/testing/hostile"
)

const testTimeout = 30 * time.Second

// connTransport is an agent transport over one connection, no reconnects.
type connTransport struct{ net.Conn }

func (t connTransport) WaitHost(ctx context.Context) error { return net.ErrClosed }

// echoServer is the well-behaved handler the hostile Guest wraps.
type echoServer struct{}

func (echoServer) Hello(context.Context, *guestproto.HelloRequest) guestproto.HelloReply {
	return guestproto.HelloReply{AgentVersion: "echo"}
}

func (echoServer) ServeStream(ctx context.Context, s *guestproto.Stream, req *guestproto.OpenRequest) {
	if req.Op == guestproto.OpStat {
		_ = s.Reply(guestproto.Reply{Info: &guestproto.FileInfo{Name: "x", Path: req.Path}})
		return
	}
	_ = s.Reply(guestproto.Reply{PID: 1})
	_, _ = s.Write([]byte("hello\n"))
	_ = s.Exit(guestproto.Reply{Exec: &guestproto.ExecResult{}})
}

// start runs a hostile guest agent and returns a Client with cfg that said
// HELLO to it.
func start(t *testing.T, cfg guestproto.ClientConfig) *guestproto.Client {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	g := hostile.New(connTransport{conns[1]}, echoServer{})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- guestproto.NewAgent(g, g, nil).Run(ctx) }()
	c, err := guestproto.NewClientConfig(conns[0], cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		cancel()
		_ = g.Close()
		_ = conns[1].Close()
		select {
		case <-ran:
		case <-time.After(testTimeout):
			t.Errorf("the hostile agent did not stop")
		}
	})
	hctx, hcancel := context.WithTimeout(ctx, testTimeout)
	defer hcancel()
	if _, err := c.Hello(hctx, guestproto.HelloRequest{Session: "s"}); err != nil {
		t.Fatalf("Hello: %v", err)
	}
	// It serves normally until told otherwise.
	var out bytes.Buffer
	if _, err := c.Exec(hctx, guestproto.ExecRequest{Argv: []string{"echo"}}, nil, &out, nil); err != nil || out.String() != "hello\n" {
		t.Fatalf("a normal exec = %q, %v; want hello", out.String(), err)
	}
	return c
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func hostileExec(ctx context.Context, c *guestproto.Client, mode string, args ...string) error {
	_, err := c.Exec(ctx, guestproto.ExecRequest{Argv: append([]string{"hostile", mode}, args...)}, nil, io.Discard, io.Discard)
	return err
}

func TestFlood(t *testing.T) {
	c := start(t, guestproto.ClientConfig{})
	ctx := testContext(t)
	// Nobody reads stdout, so the host grants nothing: the flood is over
	// the credit after 256 KiB, however fast the host is.
	p, err := c.StartExec(ctx, guestproto.ExecRequest{Argv: []string{"hostile", "flood"}})
	if err != nil {
		t.Fatalf("flood exec: %v", err)
	}
	_, err = p.Wait()
	if !errors.Is(err, guestproto.ErrInternal) || !strings.Contains(err.Error(), "exceed") {
		t.Fatalf("flood exec = %v, want an internal error about DATA over the credit", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Errorf("Ping after the flood: %v", err)
	}
	var out bytes.Buffer
	if _, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"echo"}}, nil, &out, nil); err != nil || out.String() != "hello\n" {
		t.Errorf("exec after the flood = %q, %v; want hello", out.String(), err)
	}
}

func TestGarbage(t *testing.T) {
	c := start(t, guestproto.ClientConfig{})
	err := hostileExec(testContext(t), c, "garbage")
	if !errors.Is(err, guestproto.ErrClosed) || !errors.Is(err, guestproto.ErrInvalidFrame) {
		t.Fatalf("garbage exec = %v, want ErrClosed wrapping ErrInvalidFrame", err)
	}
}

func TestBadReply(t *testing.T) {
	c := start(t, guestproto.ClientConfig{})
	err := hostileExec(testContext(t), c, "bad-reply")
	if !errors.Is(err, guestproto.ErrInternal) || !strings.Contains(err.Error(), "decode REPLY") {
		t.Fatalf("bad-reply exec = %v, want an internal error decoding REPLY", err)
	}
}

func TestHang(t *testing.T) {
	c := start(t, guestproto.ClientConfig{ExecGrace: 100 * time.Millisecond})
	_, err := c.Exec(testContext(t), guestproto.ExecRequest{Argv: []string{"hostile", "hang"}, TimeoutMS: 50}, nil, nil, nil)
	if !errors.Is(err, guestproto.ErrTimeout) {
		t.Fatalf("hang exec = %v, want a timeout", err)
	}
}

// TestStopReading: requests to a guest that stopped reading fail within
// CallTimeout; stdin waits for credit until Close. (A guest that stops
// reading once it granted more credit than the socket buffers hold is
// TestGrantAndStop.)
func TestStopReading(t *testing.T) {
	c := start(t, guestproto.ClientConfig{CallTimeout: 300 * time.Millisecond})
	ctx := testContext(t)
	p, err := c.StartExec(ctx, guestproto.ExecRequest{Argv: []string{"hostile", "stop-reading"}, Stdin: true})
	if err != nil {
		t.Fatalf("stop-reading exec: %v", err)
	}
	fed := make(chan error, 1)
	go func() {
		_, err := io.Copy(p.Stdin, guestprototest.PatternReader(1, 1<<30))
		fed <- err
	}()
	if _, err := c.Stat(context.Background(), "/x"); !errors.Is(err, guestproto.ErrTimeout) {
		t.Errorf("Stat on a guest that stopped reading = %v, want a timeout", err)
	}
	_ = c.Close()
	select {
	case err := <-fed:
		if !errors.Is(err, guestproto.ErrClosed) {
			t.Errorf("stdin after Close: %v, want ErrClosed", err)
		}
	case <-time.After(testTimeout):
		t.Fatalf("stdin still blocked after Close")
	}
}

func TestNoBarrier(t *testing.T) {
	c := start(t, guestproto.ClientConfig{CallTimeout: 300 * time.Millisecond})
	ctx := testContext(t)
	p, err := c.StartExec(ctx, guestproto.ExecRequest{Argv: []string{"hostile", "no-barrier"}})
	if err != nil {
		t.Fatalf("no-barrier exec: %v", err)
	}
	armed := make([]byte, len("no-barrier armed\n"))
	if _, err := io.ReadFull(p.Stdout, armed); err != nil || string(armed) != "no-barrier armed\n" {
		t.Fatalf("the hostile exec said %q, %v; want %q", armed, err, "no-barrier armed\n")
	}
	line := make(chan string, 1)
	go func() {
		b := make([]byte, len("barrier dropped\n"))
		n, _ := io.ReadFull(p.Stdout, b)
		line <- string(b[:n])
	}()
	if err := c.Barrier(context.Background()); !errors.Is(err, guestproto.ErrTimeout) {
		t.Errorf("Barrier on a guest that drops it = %v, want a timeout", err)
	}
	if got := <-line; got != "barrier dropped\n" {
		t.Errorf("the hostile exec said %q, want %q", got, "barrier dropped\n")
	}
	if err := c.Resume(ctx); err != nil {
		t.Errorf("Resume: %v", err)
	}
	if _, err := c.Stat(ctx, "/x"); err != nil {
		t.Errorf("Stat after the failed barrier: %v", err)
	}
}

type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func TestGrantAndStop(t *testing.T) {
	c := start(t, guestproto.ClientConfig{WriteTimeout: 300 * time.Millisecond})
	ctx := testContext(t)
	if err := hostileExec(ctx, c, "grant-and-stop"); err != nil {
		t.Fatalf("arming grant-and-stop: %v", err)
	}
	src := &countingReader{r: guestprototest.PatternReader(2, 1<<30)}
	_, err := c.WriteFile(ctx, "/upload", src, 0o644)
	if !errors.Is(err, guestproto.ErrUnresponsive) {
		t.Fatalf("upload to a guest that granted a GiB and stopped reading = %v, want ErrUnresponsive", err)
	}
	// The socket buffers take a few hundred KiB; nothing is queued beyond.
	if got := src.n.Load(); got > 4<<20 {
		t.Errorf("the host read %d bytes of the upload before giving up, want at most 4 MiB", got)
	}
}

func TestLists(t *testing.T) {
	tests := []struct {
		mode string
		args []string
		want string
	}{
		{"huge-list", nil, "directory /tmp has more than 10000 entries; list a subdirectory"},
		{"huge-list", []string{"4000"}, "the listing of directory /tmp exceeds 8388608 bytes; list a subdirectory"},
		{"endless-list", nil, "an entry of the listing of directory /tmp exceeds 65536 bytes"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(append([]string{tt.mode}, tt.args...), " "), func(t *testing.T) {
			c := start(t, guestproto.ClientConfig{})
			ctx := testContext(t)
			if err := hostileExec(ctx, c, tt.mode, tt.args...); err != nil {
				t.Fatalf("arming %s: %v", tt.mode, err)
			}
			list, err := c.ListDir(ctx, "/tmp")
			if !errors.Is(err, guestproto.ErrTooLarge) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ListDir = %d entries, %v; want too_large: %s", len(list), err, tt.want)
			}
			if _, err := c.Stat(ctx, "/x"); err != nil {
				t.Errorf("Stat after the listing: %v", err)
			}
		})
	}
}

func TestSilent(t *testing.T) {
	c := start(t, guestproto.ClientConfig{CallTimeout: 300 * time.Millisecond})
	ctx := testContext(t)
	if err := hostileExec(ctx, c, "silent"); err != nil {
		t.Fatalf("arming silent: %v", err)
	}
	if _, err := c.Stat(context.Background(), "/x"); !errors.Is(err, guestproto.ErrTimeout) {
		t.Errorf("Stat on a silent guest = %v, want a timeout", err)
	}
}

func TestUnknownMode(t *testing.T) {
	c := start(t, guestproto.ClientConfig{})
	if err := hostileExec(testContext(t), c, "nonsense"); !errors.Is(err, guestproto.ErrInvalid) {
		t.Errorf("unknown mode = %v, want invalid", err)
	}
}
