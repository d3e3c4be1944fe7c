package guestproto_test

// Connections to the guest's ports through the agent (DialPort), end to
// end over the in-memory transport: the agent's dial handler (dialHandler,
// which connects as the guest agent does and serves with ServeConn)
// reaches TCP servers the test runs on this machine's loopback. The
// hostile guest's side is played by the peer of hostile_test.go.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// dialHandler is a guest agent that serves dial streams only: it connects
// to 127.0.0.1:port and carries the connection with ServeConn.
type dialHandler struct {
	features []string
}

func (h dialHandler) Hello(context.Context, *guestproto.HelloRequest) guestproto.HelloReply {
	return guestproto.HelloReply{AgentVersion: "test", Features: h.features}
}

func (dialHandler) ServeStream(ctx context.Context, s *guestproto.Stream, req *guestproto.OpenRequest) {
	if req.Op != guestproto.OpDial {
		_ = s.Reply(guestproto.Reply{Error: guestproto.Errorf(guestproto.CodeInvalid, "unknown op %q", req.Op)})
		return
	}
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", req.Port))
	if errors.Is(err, syscall.ECONNREFUSED) {
		_ = s.Reply(guestproto.Reply{Error: guestproto.Errorf(guestproto.CodeRefused, "nothing listens on port %d", req.Port)})
		return
	}
	if err != nil {
		_ = s.Reply(guestproto.Reply{Error: guestproto.Errorf(guestproto.CodeInternal, "%v", err)})
		return
	}
	guestproto.ServeConn(ctx, s, conn)
}

// dialWorld is an agent serving dial streams and a client connected to it.
type dialWorld struct {
	agent *guestproto.Agent
	c     *guestproto.Client
}

func newDialWorld(t *testing.T, features ...string) *dialWorld {
	t.Helper()
	if features == nil {
		features = []string{guestproto.FeatureDial}
	}
	tr := guestprototest.New()
	w := &dialWorld{agent: guestproto.NewAgent(tr, dialHandler{features: features}, nil)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.agent.Run(ctx) }()
	t.Cleanup(func() { cancel(); _ = tr.Close(); <-done })
	w.c = guestproto.NewClient(tr.Connect(true))
	t.Cleanup(func() { _ = w.c.Close() })
	if _, err := w.c.Hello(testContext(t), guestproto.HelloRequest{Session: "dial"}); err != nil {
		t.Fatalf("Hello: %v", err)
	}
	return w
}

// dial opens a connection to port, closed when the test ends.
func (w *dialWorld) dial(t *testing.T, port int) net.Conn {
	t.Helper()
	conn, err := w.c.DialPort(testContext(t), port)
	if err != nil {
		t.Fatalf("DialPort %d: %v", port, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// settled waits until neither side holds a stream any more.
func (w *dialWorld) settled(t *testing.T) {
	t.Helper()
	if !testkit.Poll(testTimeout, func() bool { return w.c.StreamsForTest() == 0 && w.agent.StreamsForTest() == 0 }) {
		t.Errorf("streams left: host %d, agent %d; want none", w.c.StreamsForTest(), w.agent.StreamsForTest())
	}
}

// tcpServer runs h on each connection to a listener on 127.0.0.1 until
// the test ends, and returns its port.
func tcpServer(t *testing.T, h func(net.Conn)) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
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
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// closedPort is a port of 127.0.0.1 nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestDialEcho: 8 MiB each way at once, through an echo server; then the
// host's half-close reaches the server, whose close is the host's EOF.
func TestDialEcho(t *testing.T) {
	w := newDialWorld(t)
	port := tcpServer(t, func(c net.Conn) { io.Copy(c, c) })
	conn := w.dial(t, port)
	if got, want := conn.RemoteAddr().String(), fmt.Sprintf("127.0.0.1:%d", port); got != want || conn.RemoteAddr().Network() != "guest" {
		t.Errorf("RemoteAddr = %s %q, want guest %q", conn.RemoteAddr().Network(), got, want)
	}
	if conn.LocalAddr() == nil || conn.LocalAddr().String() == "" {
		t.Errorf("LocalAddr = %v, want an address", conn.LocalAddr())
	}
	const size = 8 << 20
	sent := sha256.New()
	wrote := make(chan error, 1)
	go func() {
		_, err := io.Copy(conn, io.TeeReader(guestprototest.PatternReader(8, size), sent))
		if err == nil {
			err = conn.(interface{ CloseWrite() error }).CloseWrite()
		}
		wrote <- err
	}()
	got := sha256.New()
	n, err := io.Copy(got, conn)
	if err != nil || n != size {
		t.Fatalf("read back %d bytes, %v; want %d and EOF", n, err, size)
	}
	if err := await(t, wrote, testTimeout, "the write of 8 MiB"); err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got.Sum(nil), sent.Sum(nil)) {
		t.Errorf("the 8 MiB echoed differ from those sent")
	}
	w.settled(t)
	if err := conn.Close(); err != nil {
		t.Errorf("Close after both directions ended: %v", err)
	}
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close = %v, want net.ErrClosed", err)
	}
}

// TestDialRefused: nothing listens: an error matching ECONNREFUSED, and
// nothing is left open.
func TestDialRefused(t *testing.T) {
	w := newDialWorld(t)
	conn, err := w.c.DialPort(testContext(t), closedPort(t))
	if err == nil {
		conn.Close()
	}
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.Is(err, guestproto.ErrRefused) {
		t.Errorf("DialPort of a closed port = %v, want ECONNREFUSED", err)
	}
	for _, port := range []int{0, -1, 65536} {
		if _, err := w.c.DialPort(testContext(t), port); !errors.Is(err, guestproto.ErrInvalid) {
			t.Errorf("DialPort %d = %v, want ErrInvalid", port, err)
		}
	}
	w.settled(t)
}

// TestDialHalfClose: either side may end its direction first and go on
// with the other; either side's close ends the connection for the other.
func TestDialHalfClose(t *testing.T) {
	w := newDialWorld(t)
	t.Run("host first", func(t *testing.T) {
		// The server answers once the host has finished sending.
		port := tcpServer(t, func(c net.Conn) {
			b, _ := io.ReadAll(c)
			fmt.Fprintf(c, "got %d bytes: %s", len(b), b)
		})
		conn := w.dial(t, port)
		io.WriteString(conn, "hello")
		if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Fatalf("CloseWrite: %v", err)
		}
		if _, err := conn.Write([]byte("more")); err == nil {
			t.Errorf("Write after CloseWrite succeeded")
		}
		if b, err := io.ReadAll(conn); string(b) != "got 5 bytes: hello" || err != nil {
			t.Errorf("after the half-close: read %q, %v", b, err)
		}
		w.settled(t)
	})
	t.Run("guest first", func(t *testing.T) {
		// The server speaks, half-closes, then reads what the host sends.
		heard := make(chan string, 1)
		port := tcpServer(t, func(c net.Conn) {
			io.WriteString(c, "banner")
			c.(*net.TCPConn).CloseWrite()
			b, _ := io.ReadAll(c)
			heard <- string(b)
		})
		conn := w.dial(t, port)
		if b, err := io.ReadAll(conn); string(b) != "banner" || err != nil {
			t.Fatalf("read to the server's end of file: %q, %v", b, err)
		}
		if _, err := io.WriteString(conn, "after your end of file"); err != nil {
			t.Fatalf("Write after the guest's end of file: %v", err)
		}
		conn.(interface{ CloseWrite() error }).CloseWrite()
		if got := await(t, heard, testTimeout, "the server's read"); got != "after your end of file" {
			t.Errorf("the server read %q after its half-close", got)
		}
		w.settled(t)
	})
	t.Run("guest closes", func(t *testing.T) {
		port := tcpServer(t, func(c net.Conn) { io.WriteString(c, "bye") })
		conn := w.dial(t, port)
		if b, err := io.ReadAll(conn); string(b) != "bye" || err != nil {
			t.Fatalf("read: %q, %v", b, err)
		}
		conn.Close()
		w.settled(t)
	})
	t.Run("host closes", func(t *testing.T) {
		ended := make(chan error, 1)
		port := tcpServer(t, func(c net.Conn) {
			_, err := io.Copy(io.Discard, c)
			ended <- err
		})
		conn := w.dial(t, port)
		io.WriteString(conn, "and now")
		conn.Close()
		await(t, ended, testTimeout, "the server's read after the host's Close")
		w.settled(t)
		if _, err := conn.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Write after Close = %v, want net.ErrClosed", err)
		}
	})
	t.Run("guest resets", func(t *testing.T) {
		port := tcpServer(t, func(c net.Conn) {
			c.(*net.TCPConn).SetLinger(0)
			c.Read(make([]byte, 1))
		})
		conn := w.dial(t, port)
		io.WriteString(conn, "x")
		_, err := io.ReadAll(conn)
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("read from a connection the server reset = %v, want ECONNRESET", err)
		}
		w.settled(t)
	})
}

// TestDialDeadlines: read and write deadlines end blocked calls, in time
// and when moved into the past while they block; a zero deadline lifts
// them.
func TestDialDeadlines(t *testing.T) {
	w := newDialWorld(t)
	say := make(chan string)
	defer close(say) // before the server's clean-up waits for it
	port := tcpServer(t, func(c net.Conn) {
		for s := range say {
			io.WriteString(c, s)
		}
	})
	conn := w.dial(t, port)
	buf := make([]byte, 16)

	conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := conn.Read(buf)
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("Read past its deadline = %v, want a timeout", err)
	}
	if _, err := conn.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Read again past the deadline = %v, want a timeout", err)
	}

	conn.SetReadDeadline(time.Time{})
	read := make(chan error, 1)
	go func() { _, err := conn.Read(buf); read <- err }()
	select {
	case err := <-read:
		t.Fatalf("Read without deadline returned %v with nothing to read", err)
	case <-time.After(50 * time.Millisecond): // it blocks, as it should; no assertion on time
	}
	conn.SetDeadline(time.Unix(1, 0)) // the way net/http interrupts a read
	if err := await(t, read, testTimeout, "a blocked Read after its deadline moved to the past"); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("blocked Read = %v, want a timeout", err)
	}

	conn.SetDeadline(time.Time{})
	go func() { say <- "still works" }()
	if n, err := io.ReadFull(conn, buf[:11]); err != nil || string(buf[:n]) != "still works" {
		t.Errorf("Read after the deadline was lifted: %q, %v", buf[:n], err)
	}
}

// TestDialOverHTTP: net/http's client and reverse proxy idioms over
// DialPort: keep-alive requests, a streamed body.
func TestDialOverHTTP(t *testing.T) {
	w := newDialWorld(t)
	hs := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(rw, "%s %s %d", r.Method, r.URL.Path, len(b))
	}))
	defer hs.Close()
	port := hs.Listener.Addr().(*net.TCPAddr).Port
	var dials atomic.Int32
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		dials.Add(1)
		return w.c.DialPort(ctx, port)
	}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	for i, body := range []string{"", strings.Repeat("b", 3<<20)} {
		res, err := hc.Post("http://guest/p"+fmt.Sprint(i), "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatalf("POST: %v", err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if want := fmt.Sprintf("POST /p%d %d", i, len(body)); string(b) != want {
			t.Errorf("answer %q, want %q", b, want)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d connections for two requests, want one kept alive", n)
	}
	tr.CloseIdleConnections()
	w.settled(t)
}

// TestDialContext: ctx bounds the dial only; cancelling it during the dial
// aborts the stream.
func TestDialContext(t *testing.T) {
	w := newDialWorld(t)
	port := tcpServer(t, func(c net.Conn) { io.Copy(c, c) })
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := w.c.DialPort(ctx, port)
	if err != nil {
		t.Fatalf("DialPort: %v", err)
	}
	defer conn.Close()
	cancel()
	io.WriteString(conn, "after the dial's context")
	got := make([]byte, 24)
	if _, err := io.ReadFull(conn, got); err != nil || string(got) != "after the dial's context" {
		t.Errorf("echo after the dial's ctx ended: %q, %v", got, err)
	}
	if _, err := w.c.DialPort(ctx, port); !errors.Is(err, context.Canceled) {
		t.Errorf("DialPort with an ended ctx = %v, want context.Canceled", err)
	}
}

// TestDialOldAgent: an agent that does not list FeatureDial gets nothing;
// the error matches errors.ErrUnsupported.
func TestDialOldAgent(t *testing.T) {
	c, p := newPeer(t, guestproto.ClientConfig{}, nil)
	_, err := c.DialPort(testContext(t), 8080)
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "too old") {
		t.Errorf("DialPort on an old agent = %v, want errors.ErrUnsupported saying it is too old", err)
	}
	select {
	case f := <-p.frames:
		t.Errorf("the old agent got a frame %v", f.Type)
	default:
	}
}

// dialPeer opens a dial stream to a peer, which answers REPLY {}, and
// returns the connection and the stream id.
func dialPeer(t *testing.T, c *guestproto.Client, p *peer) (net.Conn, uint32) {
	t.Helper()
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := c.DialPort(context.Background(), 8080)
		done <- result{conn, err}
	}()
	open := p.waitFor(guestproto.FrameOpen, 0)
	if !bytes.Contains(open.Payload, []byte(`"op":"dial"`)) || !bytes.Contains(open.Payload, []byte(`"port":8080`)) {
		t.Fatalf("OPEN %s, want a dial of port 8080", open.Payload)
	}
	p.sendJSON(guestproto.FrameReply, open.Stream, guestproto.Reply{})
	r := await(t, done, testTimeout, "DialPort")
	if r.err != nil {
		t.Fatalf("DialPort: %v", r.err)
	}
	t.Cleanup(func() { r.conn.Close() })
	return r.conn, open.Stream
}

// TestHostileDialNeverReads: a guest that grants no credit blocks a Write
// until its deadline, or Close; other streams go on.
func TestHostileDialNeverReads(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	c, p := newPeerFeatures(t, guestproto.ClientConfig{}, nil, guestproto.FeatureDial)
	conn, id := dialPeer(t, c, p)

	conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	n, err := conn.Write(make([]byte, 1<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) || n > guestproto.InitialWindow {
		t.Errorf("Write of 1 MiB to a guest granting no credit = %d, %v; want at most the %d of credit and a timeout", n, err, guestproto.InitialWindow)
	}
	conn.SetWriteDeadline(time.Time{})
	wrote := make(chan error, 1)
	go func() { _, err := conn.Write([]byte("more")); wrote <- err }()
	if err := c.Ping(testContext(t)); err != nil {
		t.Errorf("Ping while a dial's Write waits for credit: %v", err)
	}
	within(t, 5*time.Second, "Close", func() error { return conn.Close() })
	if err := await(t, wrote, testTimeout, "the Write blocked at Close"); !errors.Is(err, net.ErrClosed) {
		t.Errorf("blocked Write after Close = %v, want net.ErrClosed", err)
	}
	if e := p.waitReset(id); e.Code != guestproto.CodeCanceled {
		t.Errorf("host RESET the closed connection with %v, want code canceled", e)
	}
	if got := c.StreamsForTest(); got != 0 {
		t.Errorf("%d streams open after Close, want 0", got)
	}
}

// TestHostileDialStopsReading: a guest that grants a GiB of credit and
// stops reading its channel fails the connection one WriteTimeout after
// the writes stall; the dial's Write returns.
func TestHostileDialStopsReading(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	const writeTimeout = 300 * time.Millisecond
	c, p := newPeerFeatures(t, guestproto.ClientConfig{WriteTimeout: writeTimeout}, nil, guestproto.FeatureDial)
	conn, id := dialPeer(t, c, p)
	p.send(guestproto.Frame{Type: guestproto.FrameWindow, Stream: id, Payload: binary.BigEndian.AppendUint32(nil, 1<<30-guestproto.InitialWindow)})
	p.stopReading()
	err := within(t, testTimeout, "Write to a guest that stopped reading", func() error {
		_, err := io.Copy(conn, guestprototest.PatternReader(2, 1<<30))
		return err
	})
	if !errors.Is(err, guestproto.ErrUnresponsive) || !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("Write = %v, want ECONNRESET wrapping ErrUnresponsive", err)
	}
}

// TestHostileDialAnswers: floods, missing or malformed answers to a dial
// are errors of the connection alone, never hangs.
func TestHostileDialAnswers(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	const callTimeout = 200 * time.Millisecond
	c, p := newPeerFeatures(t, guestproto.ClientConfig{CallTimeout: callTimeout}, nil, guestproto.FeatureDial)

	t.Run("no reply", func(t *testing.T) {
		err := within(t, testTimeout, "DialPort", func() error { _, err := c.DialPort(context.Background(), 80); return err })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("DialPort unanswered = %v, want a timeout", err)
		}
		open := p.waitFor(guestproto.FrameOpen, 0)
		if e := p.waitReset(open.Stream); e.Code != guestproto.CodeTimeout {
			t.Errorf("host RESET with %v, want code timeout", e)
		}
	})
	t.Run("close without reply", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { _, err := c.DialPort(context.Background(), 80); done <- err }()
		open := p.waitFor(guestproto.FrameOpen, 0)
		p.send(guestproto.Frame{Type: guestproto.FrameClose, Stream: open.Stream})
		if err := await(t, done, testTimeout, "DialPort"); !errors.Is(err, guestproto.ErrInternal) {
			t.Errorf("DialPort = %v, want ErrInternal", err)
		}
	})
	t.Run("flood", func(t *testing.T) {
		conn, id := dialPeer(t, c, p)
		p.sendRaw(dataFrames(id, make([]byte, 2<<20)))
		if e := p.waitReset(id); e.Code != guestproto.CodeInvalid {
			t.Errorf("host RESET the flooded connection with %v, want code invalid", e)
		}
		if _, err := io.ReadAll(conn); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("Read of a flooded connection = %v, want ECONNRESET", err)
		}
	})
	t.Run("stderr", func(t *testing.T) {
		conn, id := dialPeer(t, c, p)
		p.send(guestproto.Frame{Type: guestproto.FrameData, Flags: guestproto.FlagStderr, Stream: id, Payload: []byte("junk")})
		if e := p.waitReset(id); e.Code != guestproto.CodeInvalid {
			t.Errorf("host RESET after stderr DATA with %v, want code invalid", e)
		}
		if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("Read = %v, want ECONNRESET", err)
		}
	})
	t.Run("data after close", func(t *testing.T) {
		conn, id := dialPeer(t, c, p)
		p.send(guestproto.Frame{Type: guestproto.FrameData, Stream: id, Payload: []byte("last")})
		p.send(guestproto.Frame{Type: guestproto.FrameClose, Stream: id})
		p.send(guestproto.Frame{Type: guestproto.FrameData, Stream: id, Payload: []byte("ignored")})
		if b, err := io.ReadAll(conn); string(b) != "last" || err != nil {
			t.Errorf("read %q, %v; want \"last\" then EOF", b, err)
		}
		// The host's side is still open: it may write, then its CLOSE
		// ends the stream.
		if _, err := io.WriteString(conn, "reply"); err != nil {
			t.Errorf("Write after the guest's CLOSE: %v", err)
		}
		if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Errorf("CloseWrite: %v", err)
		}
		p.waitFor(guestproto.FrameClose, id)
		if got := c.StreamsForTest(); got != 0 {
			t.Errorf("%d streams open after both CLOSEs, want 0", got)
		}
	})
}

// TestDialLimit: dials count against MaxDials, apart from MaxStreams.
func TestDialLimit(t *testing.T) {
	c, p := newPeerFeatures(t, guestproto.ClientConfig{MaxStreams: 1, MaxDials: 2}, nil, guestproto.FeatureDial)
	for range 2 {
		dialPeer(t, c, p)
	}
	_, err := c.DialPort(testContext(t), 8080)
	if !errors.Is(err, guestproto.ErrBusy) || !strings.Contains(err.Error(), "at most 2") {
		t.Errorf("a third dial = %v, want ErrBusy naming the limit", err)
	}
	done := make(chan error, 1)
	go func() { _, err := c.Stat(context.Background(), "/x"); done <- err }()
	p.sendJSON(guestproto.FrameReply, p.waitFor(guestproto.FrameOpen, 0).Stream, guestproto.Reply{Info: &guestproto.FileInfo{Name: "x"}})
	if err := await(t, done, testTimeout, "Stat"); err != nil {
		t.Errorf("Stat with MaxDials connections open: %v", err)
	}
}
