package guestproto_test

// Tests of the host Client against a guest agent played by hand: a hostile
// guest. Nothing it sends, or fails to read, may cost the host unbounded
// memory or time.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
)

// peer plays the guest agent over a unix socketpair (the kernel buffers a
// few hundred KiB each way, like the real socket). Its reader answers HELLO
// and PING (and BARRIER if ackBarrier), counts the DATA bytes it reads and
// hands every other frame to the test.
type peer struct {
	t          *testing.T
	conn       net.Conn
	frames     chan guestproto.Frame
	stop       chan struct{}
	stopOnce   sync.Once
	ackBarrier atomic.Bool
	mute       atomic.Bool  // answers no PING
	received   atomic.Int64 // DATA payload bytes read from the host
	features   []string     // listed in HELLO_ACK; set before Hello

	wmu sync.Mutex
}

func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socketpair: %v", err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatalf("socketpair conn: %v", err)
		}
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// newPeer connects a Client with cfg over hostConn (a socketpair end if
// nil) to a peer, and says HELLO.
func newPeer(t *testing.T, cfg guestproto.ClientConfig, wrap func(net.Conn) io.ReadWriteCloser) (*guestproto.Client, *peer) {
	t.Helper()
	return newPeerFeatures(t, cfg, wrap)
}

// newPeerFeatures is newPeer with a peer that lists features.
func newPeerFeatures(t *testing.T, cfg guestproto.ClientConfig, wrap func(net.Conn) io.ReadWriteCloser, features ...string) (*guestproto.Client, *peer) {
	t.Helper()
	hostEnd, guestEnd := socketPair(t)
	var rwc io.ReadWriteCloser = hostEnd
	if wrap != nil {
		rwc = wrap(hostEnd)
	}
	c, err := guestproto.NewClientConfig(rwc, cfg)
	if err != nil {
		t.Fatalf("NewClientConfig: %v", err)
	}
	p := &peer{t: t, conn: guestEnd, frames: make(chan guestproto.Frame, 1<<12), stop: make(chan struct{}), features: features}
	p.ackBarrier.Store(true)
	go p.readLoop()
	t.Cleanup(func() {
		_ = c.Close()
		_ = guestEnd.Close()
	})
	if _, err := c.Hello(testContext(t), guestproto.HelloRequest{Session: "hostile"}); err != nil {
		t.Fatalf("Hello: %v", err)
	}
	return c, p
}

func (p *peer) readLoop() {
	defer close(p.frames)
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		f, err := guestproto.ReadFrame(p.conn)
		if err != nil {
			return
		}
		switch f.Type {
		case guestproto.FrameHello:
			var req guestproto.HelloRequest
			_ = json.Unmarshal(f.Payload, &req)
			b, _ := json.Marshal(guestproto.HelloReply{Session: req.Session, AgentVersion: "hostile", Features: p.features})
			p.send(guestproto.Frame{Type: guestproto.FrameHelloAck, Payload: b})
			continue
		case guestproto.FramePing:
			if !p.mute.Load() {
				p.send(guestproto.Frame{Type: guestproto.FramePong, Payload: f.Payload})
			}
			continue
		case guestproto.FrameBarrier:
			if p.ackBarrier.Load() {
				p.send(guestproto.Frame{Type: guestproto.FrameBarrierAck})
			}
		case guestproto.FrameData:
			p.received.Add(int64(len(f.Payload)))
			continue
		}
		p.frames <- f
	}
}

// stopReading makes the peer read nothing more (after at most the frame it
// is reading).
func (p *peer) stopReading() { p.stopOnce.Do(func() { close(p.stop) }) }

func (p *peer) sendRaw(b []byte) {
	p.t.Helper()
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_ = p.conn.SetWriteDeadline(time.Now().Add(testTimeout))
	if _, err := p.conn.Write(b); err != nil {
		p.t.Errorf("peer write: %v", err)
	}
}

func (p *peer) send(f guestproto.Frame) { p.sendRaw(guestproto.AppendFrame(nil, f)) }

func (p *peer) sendJSON(typ guestproto.FrameType, stream uint32, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		p.t.Fatal(err)
	}
	p.send(guestproto.Frame{Type: typ, Stream: stream, Payload: b})
}

// waitFor returns the next frame of type typ (on stream, unless 0) that
// the host sent, skipping others.
func (p *peer) waitFor(typ guestproto.FrameType, stream uint32) guestproto.Frame {
	p.t.Helper()
	timeout := time.After(testTimeout)
	for {
		select {
		case f, ok := <-p.frames:
			if !ok {
				p.t.Fatalf("connection ended while waiting for %v", typ)
			}
			if f.Type == typ && (stream == 0 || f.Stream == stream) {
				return f
			}
		case <-timeout:
			p.t.Fatalf("no %v from the host within %v", typ, testTimeout)
		}
	}
}

// waitReset waits for a RESET on stream and returns its error.
func (p *peer) waitReset(stream uint32) guestproto.Error {
	p.t.Helper()
	f := p.waitFor(guestproto.FrameReset, stream)
	var e guestproto.Error
	if err := json.Unmarshal(f.Payload, &e); err != nil {
		p.t.Fatalf("RESET payload %q: %v", f.Payload, err)
	}
	return e
}

// within runs fn and fails the test unless it returns within d.
func within[T any](t *testing.T, d time.Duration, what string, fn func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	go func() { ch <- fn() }()
	return await(t, ch, d, what)
}

// await waits for a result that fn's goroutine sends on ch.
func await[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
	panic("unreachable")
}

func dataFrames(stream uint32, b []byte) []byte {
	var out []byte
	for len(b) > 0 {
		k := min(len(b), guestproto.MaxPayload)
		out = guestproto.AppendFrame(out, guestproto.Frame{Type: guestproto.FrameData, Stream: stream, Payload: b[:k]})
		b = b[k:]
	}
	return out
}

// gateWriter blocks every Write until open is closed.
type gateWriter struct {
	open chan struct{}
	n    atomic.Int64
}

func (w *gateWriter) Write(p []byte) (int, error) {
	<-w.open
	w.n.Add(int64(len(p)))
	return len(p), nil
}

func TestHostileDataBeyondCreditResetsStream(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	c, p := newPeer(t, guestproto.ClientConfig{}, nil)
	ctx := testContext(t)
	stdout := &gateWriter{open: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"flood"}}, nil, stdout, nil)
		done <- err
	}()
	open := p.waitFor(guestproto.FrameOpen, 0)
	p.sendJSON(guestproto.FrameReply, open.Stream, guestproto.Reply{PID: 7})
	// 4 MiB, 16 times the credit, without waiting for a WINDOW; the host's
	// consumer is stuck in stdout, so it grants nothing.
	p.sendRaw(dataFrames(open.Stream, make([]byte, 4<<20)))
	if e := p.waitReset(open.Stream); e.Code != guestproto.CodeInvalid {
		t.Errorf("host RESET the flooded stream with %v, want code invalid", e)
	}
	close(stdout.open)
	err := await(t, done, testTimeout, "Exec of a flooding guest")
	if !errors.Is(err, guestproto.ErrInternal) || !strings.Contains(err.Error(), "exceed") {
		t.Errorf("Exec = %v, want an internal error about DATA exceeding the credit", err)
	}
	if got := stdout.n.Load(); got > guestproto.InitialWindow {
		t.Errorf("the host passed on %d bytes of a flood, want at most the %d of credit", got, guestproto.InitialWindow)
	}
	if err := c.Ping(ctx); err != nil {
		t.Errorf("Ping after a flooded stream: %v; the connection should survive", err)
	}
	if got := c.StreamsForTest(); got != 0 {
		t.Errorf("%d streams open after the flood, want 0", got)
	}
}

func TestHostileTinyDataFramesBounded(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	tests := []struct {
		name  string
		sizes []int // repeated until the window is full
	}{
		{"one byte", []int{1}},
		{"alternating", []int{1, 4 << 10}},
		{"just under the pack size", []int{4<<10 - 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, p := newPeer(t, guestproto.ClientConfig{}, nil)
			ctx := testContext(t)
			s, err := c.OpenForTest(ctx, &guestproto.OpenRequest{Op: "test", Path: "/tiny"})
			if err != nil {
				t.Fatal(err)
			}
			p.waitFor(guestproto.FrameOpen, s.ID())
			var out []byte
			sent := 0
			for i := 0; ; i++ {
				n := tt.sizes[i%len(tt.sizes)]
				if sent+n > guestproto.InitialWindow {
					n = guestproto.InitialWindow - sent
				}
				if n == 0 {
					break
				}
				out = guestproto.AppendFrame(out, guestproto.Frame{Type: guestproto.FrameData, Stream: s.ID(), Payload: make([]byte, n)})
				sent += n
			}
			out = append(out, guestproto.AppendFrame(nil, guestproto.Frame{Type: guestproto.FrameExit, Stream: s.ID(), Payload: []byte(`{}`)})...)
			p.sendRaw(out)
			// The read loop handles frames in order: after EXIT, all DATA is in.
			if _, err := c.WaitExitForTest(s); err != nil {
				t.Fatalf("EXIT: %v", err)
			}
			if got := s.BufferedForTest(0); got != guestproto.InitialWindow {
				t.Errorf("host buffers %d bytes, want the whole window of %d", got, guestproto.InitialWindow)
			}
			if got := s.BufferCapForTest(0); got > 2*guestproto.InitialWindow {
				t.Errorf("%d buffered bytes take %d bytes of memory, want at most twice as many", guestproto.InitialWindow, got)
			}
			// One byte more is over the credit.
			p.send(guestproto.Frame{Type: guestproto.FrameData, Stream: s.ID(), Payload: []byte{1}})
			if e := p.waitReset(s.ID()); e.Code != guestproto.CodeInvalid {
				t.Errorf("RESET after DATA beyond credit: %v, want code invalid", e)
			}
			if got := s.BufferCapForTest(0); got != 0 {
				t.Errorf("an aborted stream still holds %d bytes", got)
			}
		})
	}
}

// TestHostileDataWhereNoneIsExpected: a stream gets credit only for the
// channels that carry data to the host.
func TestHostileDataWhereNoneIsExpected(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	c, p := newPeer(t, guestproto.ClientConfig{}, nil)
	ctx := testContext(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.Stat(ctx, "/x")
		done <- err
	}()
	open := p.waitFor(guestproto.FrameOpen, 0)
	p.send(guestproto.Frame{Type: guestproto.FrameData, Stream: open.Stream, Payload: []byte("junk")})
	if e := p.waitReset(open.Stream); e.Code != guestproto.CodeInvalid {
		t.Errorf("RESET after DATA on a stat: %v, want code invalid", e)
	}
	if err := await(t, done, testTimeout, "Stat"); !errors.Is(err, guestproto.ErrInternal) {
		t.Errorf("Stat with DATA = %v, want an internal error", err)
	}

	go func() {
		_, err := c.ListDir(ctx, "/x")
		done <- err
	}()
	open = p.waitFor(guestproto.FrameOpen, 0)
	p.sendJSON(guestproto.FrameReply, open.Stream, guestproto.Reply{})
	p.send(guestproto.Frame{Type: guestproto.FrameData, Flags: guestproto.FlagStderr, Stream: open.Stream, Payload: []byte("junk")})
	if e := p.waitReset(open.Stream); e.Code != guestproto.CodeInvalid {
		t.Errorf("RESET after stderr DATA on a listing: %v, want code invalid", e)
	}
	if err := await(t, done, testTimeout, "ListDir"); !errors.Is(err, guestproto.ErrInternal) {
		t.Errorf("ListDir with stderr = %v, want an internal error", err)
	}
}

func listLines(n int, name func(i int) string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for i := range n {
		_ = enc.Encode(guestproto.FileInfo{Name: name(i), Path: "/d/" + name(i), Mode: 0o644})
	}
	return b.Bytes()
}

func TestHostileListingLimits(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	short := func(i int) string { return fmt.Sprintf("f%05d", i) }
	long := func(i int) string { return fmt.Sprintf("%0200d", i) }
	endless := append([]byte(`{"name":"`), bytes.Repeat([]byte("a"), 200<<10)...)
	tests := []struct {
		name     string
		data     []byte
		wantN    int // entries, on success
		wantCode guestproto.Code
		wantMsg  string
	}{
		{"at the entry limit", listLines(100, short), 100, "", ""},
		{"over the entry limit", listLines(101, short), 0, guestproto.CodeTooLarge, "directory /d has more than 100 entries; list a subdirectory"},
		{"over the byte limit", listLines(80, long), 0, guestproto.CodeTooLarge, "the listing of directory /d exceeds 32768 bytes"},
		{"endless entry", endless, 0, guestproto.CodeTooLarge, "an entry of the listing of directory /d exceeds"},
		{"malformed entry", []byte("{\"name\":\"a\"}\nnot json\n"), 0, guestproto.CodeInternal, "malformed entry 2"},
		{"deep nesting", append(bytes.Repeat([]byte("["), 20<<10), '\n'), 0, guestproto.CodeInternal, "malformed entry 1"},
		{"empty", nil, 0, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, p := newPeer(t, guestproto.ClientConfig{MaxListEntries: 100, MaxListBytes: 32 << 10}, nil)
			ctx := testContext(t)
			type result struct {
				list []guestproto.FileInfo
				err  error
			}
			done := make(chan result, 1)
			go func() {
				list, err := c.ListDir(ctx, "/d")
				done <- result{list, err}
			}()
			open := p.waitFor(guestproto.FrameOpen, 0)
			p.sendJSON(guestproto.FrameReply, open.Stream, guestproto.Reply{})
			p.sendRaw(dataFrames(open.Stream, tt.data))
			p.send(guestproto.Frame{Type: guestproto.FrameClose, Stream: open.Stream})
			r := await(t, done, testTimeout, "ListDir")
			if tt.wantCode == "" {
				if r.err != nil || len(r.list) != tt.wantN {
					t.Fatalf("ListDir = %d entries, %v; want %d entries", len(r.list), r.err, tt.wantN)
				}
				return
			}
			if guestproto.CodeOf(r.err) != tt.wantCode || !strings.Contains(r.err.Error(), tt.wantMsg) {
				t.Fatalf("ListDir = %d entries, %v; want code %s with %q", len(r.list), r.err, tt.wantCode, tt.wantMsg)
			}
			if e := p.waitReset(open.Stream); e.Code != guestproto.CodeCanceled {
				t.Errorf("host RESET the listing with %v, want code canceled", e)
			}
			if got := c.StreamsForTest(); got != 0 {
				t.Errorf("%d streams open after the listing, want 0", got)
			}
		})
	}
}

// countingReader counts the bytes read from r.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestHostileGrantsCreditWithoutReading: the guest grants a GiB of upload
// credit and stops reading its channel. The host takes from the upload's
// source only what the connection accepts, and fails the connection with
// ErrUnresponsive one WriteTimeout after its writes stall.
func TestHostileGrantsCreditWithoutReading(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	const writeTimeout = 300 * time.Millisecond
	c, p := newPeer(t, guestproto.ClientConfig{WriteTimeout: writeTimeout}, nil)
	ctx := testContext(t)
	src := &countingReader{r: guestprototest.PatternReader(1, 1<<30)}
	done := make(chan error, 1)
	go func() {
		_, err := c.WriteFile(ctx, "/upload", src, 0o644)
		done <- err
	}()
	open := p.waitFor(guestproto.FrameOpen, 0)
	p.sendJSON(guestproto.FrameReply, open.Stream, guestproto.Reply{})
	p.send(guestproto.Frame{Type: guestproto.FrameWindow, Stream: open.Stream, Payload: binary.BigEndian.AppendUint32(nil, 1<<30-guestproto.InitialWindow)})
	p.stopReading()
	// ErrUnresponsive is the stalled write's own verdict (nothing else
	// makes it): the host gave up on the write, not on the whole call.
	err := await(t, done, testTimeout, "WriteFile to a guest that stopped reading")
	if !errors.Is(err, guestproto.ErrUnresponsive) || !errors.Is(err, guestproto.ErrClosed) {
		t.Errorf("WriteFile = %v, want ErrUnresponsive and ErrClosed", err)
	}
	// Credit is charged as bytes go to the connection: what left the source
	// is what the peer read, what the socket buffers hold, and a frame or
	// two in the writer's hands, not the GiB of credit.
	const socketBuffers = 4 << 20
	if got, read := src.n.Load(), p.received.Load(); got > read+socketBuffers {
		t.Errorf("the host read %d bytes from the upload's source, the guest %d: more than %d queued on the host", got, read, socketBuffers)
	}
	if err := c.Err(); !errors.Is(err, guestproto.ErrUnresponsive) {
		t.Errorf("client Err = %v, want ErrUnresponsive", err)
	}
	if _, err := c.Stat(ctx, "/x"); !errors.Is(err, guestproto.ErrClosed) {
		t.Errorf("Stat after the failure = %v, want ErrClosed", err)
	}
}

// stuckConn is a connection whose writes block, once stuck, until it is
// closed: a guest that stopped reading. It hides SetWriteDeadline, so the
// client bounds its writes with its watchdog.
type stuckConn struct {
	rwc       io.ReadWriteCloser
	stuck     atomic.Bool
	entered   chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
}

func newStuckConn(c net.Conn) io.ReadWriteCloser {
	return &stuckConn{rwc: c, entered: make(chan struct{}, 1), closed: make(chan struct{})}
}

func (c *stuckConn) Read(p []byte) (int, error) { return c.rwc.Read(p) }

func (c *stuckConn) Write(p []byte) (int, error) {
	if c.stuck.Load() {
		select {
		case c.entered <- struct{}{}:
		default:
		}
		<-c.closed
		return 0, net.ErrClosed
	}
	return c.rwc.Write(p)
}

func (c *stuckConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.rwc.Close()
}

// TestHostileStopsReadingFailsResume: a capture's Resume, with a context
// without deadline, on a guest that stopped reading fails within the
// write timeout instead of hanging (the watchdog path).
func TestHostileStopsReadingFailsResume(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	const writeTimeout = 200 * time.Millisecond
	var sc *stuckConn
	c, _ := newPeer(t, guestproto.ClientConfig{WriteTimeout: writeTimeout}, func(conn net.Conn) io.ReadWriteCloser {
		sc = newStuckConn(conn).(*stuckConn)
		return sc
	})
	if err := c.Barrier(testContext(t)); err != nil {
		t.Fatalf("Barrier: %v", err)
	}
	sc.stuck.Store(true)
	err := within(t, 50*writeTimeout, "Resume on a stuck connection", func() error { return c.Resume(context.Background()) })
	if !errors.Is(err, guestproto.ErrUnresponsive) {
		t.Errorf("Resume = %v, want ErrUnresponsive", err)
	}
	select {
	case <-c.Done():
	default:
		t.Errorf("the connection is still up after a stalled write")
	}
}

// TestCloseUnblocksStuckWriter: with a write stuck for good, Close returns
// at once and so does everything waiting on the guest.
func TestCloseUnblocksStuckWriter(t *testing.T) {
	var sc *stuckConn
	c, p := newPeer(t, guestproto.ClientConfig{WriteTimeout: time.Hour, CallTimeout: time.Hour}, func(conn net.Conn) io.ReadWriteCloser {
		sc = newStuckConn(conn).(*stuckConn)
		return sc
	})
	ctx := context.Background() // no deadline anywhere
	if err := c.Barrier(testContext(t)); err != nil {
		t.Fatalf("Barrier: %v", err)
	}
	sc.stuck.Store(true)
	resumed := make(chan error, 1)
	go func() { resumed <- c.Resume(ctx) }()
	<-sc.entered // the writer is stuck writing RESUME
	p.ackBarrier.Store(false)
	pinged := make(chan error, 1)
	go func() { pinged <- c.Ping(ctx) }()
	stated := make(chan error, 1)
	go func() {
		_, err := c.Stat(ctx, "/x")
		stated <- err
	}()

	within(t, 5*time.Second, "Close", func() error { return c.Close() })
	for _, w := range []struct {
		name string
		ch   chan error
	}{{"Resume", resumed}, {"Ping", pinged}, {"Stat", stated}} {
		if err := await(t, w.ch, 5*time.Second, w.name+" after Close"); !errors.Is(err, guestproto.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", w.name, err)
		}
	}
	if err := within(t, 5*time.Second, "Barrier after Close", func() error { return c.Barrier(ctx) }); err == nil {
		t.Errorf("Barrier after Close succeeded")
	}
}

// TestHostileNeverAcksBarrier: Barrier with a context without deadline
// fails after CallTimeout, and Resume still works.
func TestHostileNeverAcksBarrier(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	const callTimeout = 300 * time.Millisecond
	c, p := newPeer(t, guestproto.ClientConfig{CallTimeout: callTimeout}, nil)
	p.ackBarrier.Store(false)
	start := time.Now()
	err := within(t, testTimeout, "Barrier", func() error { return c.Barrier(context.Background()) })
	if !errors.Is(err, guestproto.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Barrier = %v, want a timeout", err)
	}
	if d := time.Since(start); d < callTimeout {
		t.Errorf("Barrier gave up after %v, before the %v CallTimeout", d, callTimeout)
	}
	if err := c.Resume(context.Background()); err != nil {
		t.Fatalf("Resume after a failed barrier: %v", err)
	}
	p.waitFor(guestproto.FrameResume, 0)
}

func TestHostileNeverReplies(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	const callTimeout = 200 * time.Millisecond
	c, p := newPeer(t, guestproto.ClientConfig{CallTimeout: callTimeout}, nil)
	ops := []struct {
		name string
		run  func(ctx context.Context) error
	}{
		{"stat", func(ctx context.Context) error { _, err := c.Stat(ctx, "/x"); return err }},
		{"list", func(ctx context.Context) error { _, err := c.ListDir(ctx, "/x"); return err }},
		{"read", func(ctx context.Context) error { _, _, err := c.ReadFile(ctx, "/x"); return err }},
		{"write", func(ctx context.Context) error {
			_, err := c.WriteFile(ctx, "/x", strings.NewReader("x"), 0)
			return err
		}},
		{"exec", func(ctx context.Context) error {
			_, err := c.StartExec(ctx, guestproto.ExecRequest{Argv: []string{"x"}})
			return err
		}},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			err := within(t, testTimeout, op.name, func() error { return op.run(context.Background()) })
			if !errors.Is(err, guestproto.ErrTimeout) || !strings.Contains(err.Error(), "did not complete") {
				t.Errorf("%s on a guest that never replies = %v, want a timeout", op.name, err)
			}
			open := p.waitFor(guestproto.FrameOpen, 0)
			if e := p.waitReset(open.Stream); e.Code != guestproto.CodeTimeout {
				t.Errorf("host RESET with %v, want code timeout", e)
			}
			if got := c.StreamsForTest(); got != 0 {
				t.Errorf("%d streams open after the timeout, want 0", got)
			}
		})
	}
}

// TestHostileAnswersNothing: a guest that acknowledged HELLO and then
// answers nothing (no REPLY, no PONG) costs its connection ProbeAfter +
// ProbeTimeout after a call, not the call's whole CallTimeout; one that
// answers PING keeps its connection, and so does one in a barrier.
func TestHostileAnswersNothing(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	const probeAfter, probeTimeout = 50 * time.Millisecond, 200 * time.Millisecond
	t.Run("silent", func(t *testing.T) {
		c, p := newPeer(t, guestproto.ClientConfig{CallTimeout: time.Hour, ProbeAfter: probeAfter, ProbeTimeout: probeTimeout}, nil)
		p.mute.Store(true)
		start := time.Now()
		err := within(t, testTimeout, "Stat", func() error { _, err := c.Stat(context.Background(), "/x"); return err })
		if !errors.Is(err, guestproto.ErrSilent) || !errors.Is(err, guestproto.ErrClosed) {
			t.Errorf("Stat on a silent guest = %v, want ErrSilent and ErrClosed", err)
		}
		if d := time.Since(start); d < probeAfter+probeTimeout {
			t.Errorf("gave up after %v, before ProbeAfter + ProbeTimeout", d)
		}
		if err := c.Err(); !errors.Is(err, guestproto.ErrSilent) || !strings.Contains(err.Error(), "stat") {
			t.Errorf("client Err = %v, want ErrSilent naming the stat", err)
		}
	})
	t.Run("slow", func(t *testing.T) {
		const callTimeout = 600 * time.Millisecond
		c, p := newPeer(t, guestproto.ClientConfig{CallTimeout: callTimeout, ProbeAfter: probeAfter, ProbeTimeout: probeTimeout}, nil)
		err := within(t, testTimeout, "Stat", func() error { _, err := c.Stat(context.Background(), "/x"); return err })
		if !errors.Is(err, guestproto.ErrTimeout) || errors.Is(err, guestproto.ErrClosed) {
			t.Errorf("Stat on a guest that answers PING only = %v, want a timeout of the call alone", err)
		}
		if err := c.Err(); err != nil {
			t.Errorf("client Err = %v, want the connection kept", err)
		}
		p.waitFor(guestproto.FrameOpen, 0)
	})
	t.Run("barrier", func(t *testing.T) {
		const callTimeout = 600 * time.Millisecond
		c, p := newPeer(t, guestproto.ClientConfig{CallTimeout: callTimeout, ProbeAfter: probeAfter, ProbeTimeout: probeTimeout}, nil)
		p.mute.Store(true)
		p.ackBarrier.Store(false)
		berr := make(chan error, 1)
		go func() { berr <- c.Barrier(context.Background()) }()
		p.waitFor(guestproto.FrameBarrier, 0)
		err := within(t, testTimeout, "Stat", func() error { _, err := c.Stat(context.Background(), "/x"); return err })
		if !errors.Is(err, guestproto.ErrTimeout) || errors.Is(err, guestproto.ErrClosed) {
			t.Errorf("Stat during a barrier = %v, want a timeout of the call alone", err)
		}
		if err := await(t, berr, testTimeout, "Barrier"); !errors.Is(err, guestproto.ErrTimeout) {
			t.Errorf("Barrier = %v, want a timeout", err)
		}
		if err := c.Err(); err != nil {
			t.Errorf("client Err = %v, want the connection kept", err)
		}
	})
}

// TestHostileExecNeverEnds: the guest ignores the exec's timeout; the host
// gives up TimeoutMS + ExecGrace after the start.
func TestHostileExecNeverEnds(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	const grace = 100 * time.Millisecond
	c, p := newPeer(t, guestproto.ClientConfig{ExecGrace: grace}, nil)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := c.Exec(context.Background(), guestproto.ExecRequest{Argv: []string{"sleep"}, TimeoutMS: 100}, nil, nil, nil)
		done <- err
	}()
	open := p.waitFor(guestproto.FrameOpen, 0)
	p.sendJSON(guestproto.FrameReply, open.Stream, guestproto.Reply{PID: 9})
	err := await(t, done, testTimeout, "Exec on a guest that ignores the timeout")
	if !errors.Is(err, guestproto.ErrTimeout) {
		t.Errorf("Exec = %v, want a timeout", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond+grace {
		t.Errorf("Exec gave up after %v, before timeout + grace", d)
	}
	if e := p.waitReset(open.Stream); e.Code != guestproto.CodeTimeout {
		t.Errorf("host RESET with %v, want code timeout", e)
	}
}

// TestTooManyStreams: beyond MaxStreams an operation fails at once; slots
// come back when operations end, even if the guest never CLOSEs.
func TestTooManyStreams(t *testing.T) {
	c, p := newPeer(t, guestproto.ClientConfig{MaxStreams: 2}, nil)
	ctx := testContext(t)
	info := guestproto.Reply{Info: &guestproto.FileInfo{Name: "x"}}
	done := make(chan error, 2)
	var opens []uint32
	for range 2 {
		go func() {
			_, err := c.Stat(ctx, "/x")
			done <- err
		}()
		opens = append(opens, p.waitFor(guestproto.FrameOpen, 0).Stream)
	}
	_, err := c.Stat(ctx, "/x")
	if !errors.Is(err, guestproto.ErrTooManyStreams) || !strings.Contains(err.Error(), "at most 2") {
		t.Fatalf("a third Stat = %v, want ErrTooManyStreams naming the limit", err)
	}
	// Answer without ever sending CLOSE.
	for _, id := range opens {
		p.sendJSON(guestproto.FrameReply, id, info)
	}
	for range opens {
		if err := await(t, done, testTimeout, "Stat"); err != nil {
			t.Fatalf("Stat: %v", err)
		}
	}
	if got := c.StreamsForTest(); got != 0 {
		t.Fatalf("%d streams open after both ended, want 0", got)
	}
	go func() {
		_, err := c.Stat(ctx, "/x")
		done <- err
	}()
	p.sendJSON(guestproto.FrameReply, p.waitFor(guestproto.FrameOpen, 0).Stream, info)
	if err := await(t, done, testTimeout, "Stat"); err != nil {
		t.Errorf("Stat after slots came back: %v", err)
	}
}

// TestHostileMalformedFrameFailsConnection: a bad header after the
// handshake ends the connection, and waiting operations return.
func TestHostileMalformedFrameFailsConnection(t *testing.T) {
	t.Parallel() // a peer of its own; waits on timeouts
	c, p := newPeer(t, guestproto.ClientConfig{}, nil)
	done := make(chan error, 1)
	go func() {
		_, err := c.Stat(context.Background(), "/x")
		done <- err
	}()
	p.waitFor(guestproto.FrameOpen, 0)
	p.sendRaw(bytes.Repeat([]byte{0xff}, guestproto.HeaderSize))
	if err := await(t, done, testTimeout, "Stat"); !errors.Is(err, guestproto.ErrClosed) || !errors.Is(err, guestproto.ErrInvalidFrame) {
		t.Errorf("Stat = %v, want ErrClosed and ErrInvalidFrame", err)
	}
	if err := c.Err(); !errors.Is(err, guestproto.ErrInvalidFrame) {
		t.Errorf("client Err = %v, want ErrInvalidFrame", err)
	}
}

func TestClientConfigValidate(t *testing.T) {
	hostEnd, _ := net.Pipe()
	defer hostEnd.Close()
	if _, err := guestproto.NewClientConfig(hostEnd, guestproto.ClientConfig{MaxStreams: -1}); err == nil || !strings.Contains(err.Error(), "MaxStreams") {
		t.Errorf("NewClientConfig with MaxStreams -1 = %v, want an error naming MaxStreams", err)
	}
}
