package guestproto_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
)

// testTimeout bounds every wait in these tests; nothing should come close.
const testTimeout = 30 * time.Second

// fakeHandler serves test streams chosen by path.
type fakeHandler struct {
	mu     sync.Mutex
	hellos []guestproto.HelloRequest

	opened   chan *guestproto.Stream // /block and /flood streams
	aborted  chan error              // why /block streams ended
	progress chan int                // /flood: bytes written so far, after each write
}

func newFakeHandler() *fakeHandler {
	return &fakeHandler{
		opened:   make(chan *guestproto.Stream, 100),
		aborted:  make(chan error, 100),
		progress: make(chan int, 1<<16),
	}
}

func (h *fakeHandler) Hello(ctx context.Context, req *guestproto.HelloRequest) guestproto.HelloReply {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hellos = append(h.hellos, *req)
	return guestproto.HelloReply{AgentVersion: "test"}
}

func (h *fakeHandler) helloCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.hellos)
}

func (h *fakeHandler) ServeStream(ctx context.Context, s *guestproto.Stream, req *guestproto.OpenRequest) {
	if err := s.Reply(guestproto.Reply{}); err != nil {
		return
	}
	switch req.Path {
	case "/echo":
		n, err := io.Copy(s, s)
		if err != nil {
			return
		}
		_ = s.Exit(guestproto.Reply{Written: n})
	case "/block":
		h.opened <- s
		<-s.Done()
		h.aborted <- s.Err()
	case "/sink": // reads nothing: the host's DATA gets no credit back
		<-s.Done()
	case "/mib":
		_, _ = s.Write(bytes.Repeat([]byte("m"), 1<<20))
	case "/flood":
		h.opened <- s
		chunk := make([]byte, 1024)
		total := 0
		for {
			if _, err := s.Write(chunk); err != nil {
				return
			}
			total += len(chunk)
			h.progress <- total
		}
	}
}

type fixture struct {
	tr    *guestprototest.Transport
	h     *fakeHandler
	agent *guestproto.Agent
}

func startAgent(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{tr: guestprototest.New(), h: newFakeHandler()}
	f.agent = guestproto.NewAgent(f.tr, f.h, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.agent.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		_ = f.tr.Close()
		if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("agent Run: %v", err)
		}
	})
	return f
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// connect attaches a new Client and says HELLO with session.
func (f *fixture) connect(t *testing.T, session string, hangup bool) *guestproto.Client {
	t.Helper()
	c := guestproto.NewClient(f.tr.Connect(hangup))
	t.Cleanup(func() { _ = c.Close() })
	rep, err := c.Hello(testContext(t), guestproto.HelloRequest{Session: session})
	if err != nil {
		t.Fatalf("Hello: %v", err)
	}
	if rep.Session != session || rep.AgentVersion != "test" {
		t.Fatalf("Hello reply = %+v, want session %q and version test", rep, session)
	}
	return c
}

func openStream(t *testing.T, ctx context.Context, c *guestproto.Client, path string) *guestproto.Stream {
	t.Helper()
	s, err := c.OpenForTest(ctx, &guestproto.OpenRequest{Op: "test", Path: path})
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	if _, err := c.WaitReplyForTest(s); err != nil {
		t.Fatalf("reply of %s: %v", path, err)
	}
	return s
}

// echo sends msg on an echo stream and checks it comes back.
func echo(t *testing.T, s *guestproto.Stream, msg string) {
	t.Helper()
	if _, err := s.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(s, got); err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(got) != msg {
		t.Fatalf("echo got %q, want %q", got, msg)
	}
}

func TestHelloRunsHooksOncePerSession(t *testing.T) {
	f := startAgent(t)
	f.connect(t, "one", true)
	if got := f.h.helloCount(); got != 1 {
		t.Fatalf("hooks ran %d times after the first HELLO_ACK, want 1", got)
	}
	f.connect(t, "two", true)
	if got := f.h.helloCount(); got != 2 {
		t.Fatalf("hooks ran %d times after the second HELLO_ACK, want 2", got)
	}
}

func TestEchoStreamAndExit(t *testing.T) {
	f := startAgent(t)
	c := f.connect(t, "s", true)
	ctx := testContext(t)
	s := openStream(t, ctx, c, "/echo")
	echo(t, s, "hello")
	echo(t, s, "world")
	if err := s.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
	if rest, err := io.ReadAll(s); err != nil || len(rest) != 0 {
		t.Fatalf("after CLOSE read %q, %v; want EOF", rest, err)
	}
	r, err := c.WaitExitForTest(s)
	if err != nil {
		t.Fatalf("exit: %v", err)
	}
	if r.Written != 10 {
		t.Errorf("echoed %d bytes, want 10", r.Written)
	}
}

func TestConcurrentStreams(t *testing.T) {
	f := startAgent(t)
	c := f.connect(t, "s", true)
	ctx := testContext(t)
	const streams = 50
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data := make([]byte, 300<<10+i)
			_, _ = rand.Read(data)
			s, err := c.OpenForTest(ctx, &guestproto.OpenRequest{Op: "test", Path: "/echo"})
			if err != nil {
				errs <- err
				return
			}
			if _, err := c.WaitReplyForTest(s); err != nil {
				errs <- err
				return
			}
			go func() {
				_, _ = s.Write(data)
				_ = s.CloseWrite()
			}()
			got, err := io.ReadAll(s)
			if err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, data) {
				errs <- fmt.Errorf("stream %d: echoed %d bytes differ from the %d sent", i, len(got), len(data))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestFlowControlStopsWriter(t *testing.T) {
	f := startAgent(t)
	c := f.connect(t, "s", true)
	ctx := testContext(t)
	s := openStream(t, ctx, c, "/flood")
	guestSide := <-f.h.opened

	consumed := 0
	waitFor := func(want int) {
		t.Helper()
		for {
			got := <-f.h.progress
			if got > consumed+guestproto.InitialWindow {
				t.Fatalf("writer got %d bytes out with %d consumed: more than the %d window", got, consumed, guestproto.InitialWindow)
			}
			if got == want {
				return
			}
		}
	}
	// Nobody reads: the writer must stop at exactly one window.
	waitFor(guestproto.InitialWindow)
	if got := guestSide.CreditForTest(0); got != 0 {
		t.Fatalf("writer credit = %d after a full window, want 0", got)
	}
	// Reading returns credit (in WINDOW frames of at least a quarter window);
	// the writer moves on by as much, no more.
	buf := make([]byte, 128<<10)
	if _, err := io.ReadFull(s, buf); err != nil {
		t.Fatalf("read: %v", err)
	}
	consumed += len(buf)
	waitFor(consumed - s.UnackedForTest(0) + guestproto.InitialWindow)
	if got := s.BufferedForTest(0); got > guestproto.InitialWindow {
		t.Errorf("host buffers %d bytes, want at most %d", got, guestproto.InitialWindow)
	}
	s.Reset(&guestproto.Error{Code: guestproto.CodeCanceled})
}

// TestStalledUploadDoesNotBlockOthers: a stream whose writer waits for
// credit the guest never grants holds up nothing else: another stream's
// data and the host's WINDOW grants for it still flow.
func TestStalledUploadDoesNotBlockOthers(t *testing.T) {
	f := startAgent(t)
	c := f.connect(t, "s", true)
	ctx := testContext(t)
	sink := openStream(t, ctx, c, "/sink")
	// The whole credit goes out; the next write waits for credit that
	// never comes.
	if _, err := sink.Write(make([]byte, guestproto.InitialWindow)); err != nil {
		t.Fatalf("write the initial window: %v", err)
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := sink.Write(make([]byte, guestproto.InitialWindow))
		wrote <- err
	}()
	mib := openStream(t, ctx, c, "/mib")
	got, err := io.ReadAll(mib)
	if err != nil || len(got) != 1<<20 {
		t.Fatalf("read %d bytes, %v from a stream next to a stalled one; want 1 MiB", len(got), err)
	}
	select {
	case err := <-wrote:
		t.Fatalf("the write without credit returned %v before its stream was reset", err)
	default:
	}
	if got := sink.CreditForTest(0); got != 0 {
		t.Errorf("stalled writer has %d bytes of credit left, want 0", got)
	}
	sink.Reset(&guestproto.Error{Code: guestproto.CodeCanceled})
	if err := <-wrote; !errors.Is(err, guestproto.ErrCanceled) {
		t.Errorf("the stalled write ended with %v after RESET, want canceled", err)
	}
}

func TestCancelResetsStream(t *testing.T) {
	f := startAgent(t)
	c := f.connect(t, "s", true)
	ctx, cancel := context.WithCancel(testContext(t))
	s := openStream(t, ctx, c, "/block")
	<-f.h.opened
	cancel()
	err := <-f.h.aborted
	if !errors.Is(err, guestproto.ErrCanceled) {
		t.Errorf("guest stream ended with %v, want code canceled", err)
	}
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, context.Canceled) {
		t.Errorf("host read after cancel = %v, want context.Canceled", err)
	}
}

func TestPing(t *testing.T) {
	f := startAgent(t)
	c := f.connect(t, "s", true)
	for range 3 {
		if err := c.Ping(testContext(t)); err != nil {
			t.Fatalf("Ping: %v", err)
		}
	}
}

func TestBarrierResumeKeepsStreams(t *testing.T) {
	f := startAgent(t)
	c := f.connect(t, "s", true)
	ctx := testContext(t)
	s := openStream(t, ctx, c, "/echo")
	echo(t, s, "before")
	if err := c.Barrier(ctx); err != nil {
		t.Fatalf("Barrier: %v", err)
	}
	if !f.agent.GatedForTest() {
		t.Fatalf("agent writer is open after BARRIER_ACK")
	}
	if err := c.Resume(ctx); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	echo(t, s, "after")
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("Ping after resume: %v", err)
	}
}

// TestRestoreTakesOverSession models a restored VM: the old host stops after
// BARRIER_ACK without the guest seeing a disconnect, and a new host says
// HELLO on the same byte stream.
func TestRestoreTakesOverSession(t *testing.T) {
	f := startAgent(t)
	ctx := testContext(t)
	c1 := f.connect(t, "parent", false)
	openStream(t, ctx, c1, "/block")
	<-f.h.opened
	if err := c1.Barrier(ctx); err != nil {
		t.Fatalf("Barrier: %v", err)
	}
	_ = c1.Close()

	c2 := f.connect(t, "child", false)
	if got := f.h.helloCount(); got != 2 {
		t.Fatalf("hooks ran %d times, want 2", got)
	}
	if err := <-f.h.aborted; !errors.Is(err, guestproto.ErrSessionReset) {
		t.Fatalf("old session's stream ended with %v, want ErrSessionReset", err)
	}
	s := openStream(t, ctx, c2, "/echo")
	echo(t, s, "child works")
}

func TestHangupEndsSession(t *testing.T) {
	f := startAgent(t)
	ctx := testContext(t)
	c1 := f.connect(t, "first", true)
	openStream(t, ctx, c1, "/block")
	<-f.h.opened
	_ = c1.Close()
	if err := <-f.h.aborted; !errors.Is(err, guestproto.ErrSessionReset) {
		t.Fatalf("stream ended with %v after hang-up, want ErrSessionReset", err)
	}
	c2 := f.connect(t, "second", true)
	echo(t, openStream(t, ctx, c2, "/echo"), "again")
}

// raw is a host that speaks frames directly.
type raw struct {
	t    *testing.T
	conn net.Conn
}

func (r raw) send(f guestproto.Frame) {
	r.t.Helper()
	if err := guestproto.WriteFrame(r.conn, f); err != nil {
		r.t.Fatalf("send %v: %v", f, err)
	}
}

func (r raw) recv() guestproto.Frame {
	r.t.Helper()
	_ = r.conn.SetReadDeadline(time.Now().Add(testTimeout))
	f, err := guestproto.ReadFrame(r.conn)
	if err != nil {
		r.t.Fatalf("recv: %v", err)
	}
	return f
}

func (r raw) expect(typ guestproto.FrameType) guestproto.Frame {
	r.t.Helper()
	f := r.recv()
	if f.Type != typ {
		r.t.Fatalf("got %v, want %v", f, typ)
	}
	return f
}

func (r raw) expectAck(session string) {
	r.t.Helper()
	f := r.expect(guestproto.FrameHelloAck)
	var rep guestproto.HelloReply
	if err := json.Unmarshal(f.Payload, &rep); err != nil || rep.Session != session || rep.Error != nil {
		r.t.Fatalf("HELLO_ACK %s (%v), want session %q without error", f.Payload, err, session)
	}
}

func helloFrame(session string) guestproto.Frame {
	b, _ := json.Marshal(guestproto.HelloRequest{Session: session, TimeUnixNano: 1, Entropy: make([]byte, guestproto.MinEntropy)})
	return guestproto.Frame{Type: guestproto.FrameHello, Payload: b}
}

func ping(id uint64) guestproto.Frame {
	return guestproto.Frame{Type: guestproto.FramePing, Payload: binary.BigEndian.AppendUint64(nil, id)}
}

func TestBarrierGatesAgentWrites(t *testing.T) {
	f := startAgent(t)
	h := raw{t, f.tr.Connect(true)}
	h.send(helloFrame("s1"))
	h.expectAck("s1")

	// Gated: a PING sent after BARRIER_ACK is answered only after RESUME,
	// and the PONG is the first frame after BARRIER_ACK.
	h.send(guestproto.Frame{Type: guestproto.FrameBarrier})
	h.expect(guestproto.FrameBarrierAck)
	h.send(ping(1))
	h.send(guestproto.Frame{Type: guestproto.FrameResume})
	if got := h.expect(guestproto.FramePong); binary.BigEndian.Uint64(got.Payload) != 1 {
		t.Fatalf("PONG for %x, want 1", got.Payload)
	}

	// A HELLO while gated drops what the old session queued: the PONG for
	// ping 2 is never sent and HELLO_ACK comes first.
	h.send(guestproto.Frame{Type: guestproto.FrameBarrier})
	h.expect(guestproto.FrameBarrierAck)
	h.send(ping(2))
	h.send(helloFrame("s2"))
	h.expectAck("s2")
	h.send(ping(3))
	if got := h.expect(guestproto.FramePong); binary.BigEndian.Uint64(got.Payload) != 3 {
		t.Fatalf("PONG for %x, want 3", got.Payload)
	}
	if got := f.h.helloCount(); got != 2 {
		t.Errorf("hooks ran %d times, want 2", got)
	}
}

func TestRetransmittedHelloKeepsSession(t *testing.T) {
	f := startAgent(t)
	h := raw{t, f.tr.Connect(true)}
	h.send(helloFrame("s1"))
	h.expectAck("s1")
	h.send(helloFrame("s1"))
	h.expectAck("s1")
	if got := f.h.helloCount(); got != 1 {
		t.Errorf("hooks ran %d times for one session, want 1", got)
	}
}

func TestAgentResynchronizesOnHello(t *testing.T) {
	f := startAgent(t)
	h := raw{t, f.tr.Connect(true)}
	// The tail of a frame cut off by a reconnection, then a HELLO.
	partial := guestproto.AppendFrame(nil, guestproto.Frame{Type: guestproto.FrameData, Stream: 1, Payload: bytes.Repeat([]byte("x"), 100)})[:40]
	if _, err := h.conn.Write(append([]byte{0x7b, 0x01}, partial...)); err != nil {
		t.Fatal(err)
	}
	h.send(helloFrame("s1"))
	h.expectAck("s1")

	// A corrupt header mid-session ends the session; the next HELLO starts one.
	if _, err := h.conn.Write([]byte{byte(guestproto.FrameData), 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	h.send(helloFrame("s2"))
	h.expectAck("s2")
}

func TestAgentRejectsInvalidHello(t *testing.T) {
	f := startAgent(t)
	h := raw{t, f.tr.Connect(true)}
	b, _ := json.Marshal(guestproto.HelloRequest{Session: "s", Entropy: []byte("short")})
	h.send(guestproto.Frame{Type: guestproto.FrameHello, Payload: b})
	var rep guestproto.HelloReply
	if err := json.Unmarshal(h.expect(guestproto.FrameHelloAck).Payload, &rep); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(rep.Error, guestproto.ErrInvalid) {
		t.Fatalf("HELLO_ACK error = %v, want invalid", rep.Error)
	}
	if got := f.h.helloCount(); got != 0 {
		t.Errorf("hooks ran %d times for an invalid HELLO, want 0", got)
	}
}

// TestClientSkipsStaleBytes plays the guest: before the real HELLO_ACK the
// client sees junk and an older session's HELLO_ACK, and must skip both.
func TestClientSkipsStaleBytes(t *testing.T) {
	hostEnd, guestEnd := net.Pipe()
	c := guestproto.NewClient(hostEnd)
	t.Cleanup(func() { _ = c.Close() })
	go func() {
		f, err := guestproto.ReadFrame(guestEnd)
		if err != nil {
			return
		}
		var req guestproto.HelloRequest
		_ = json.Unmarshal(f.Payload, &req)
		ack := func(session, version string) []byte {
			b, _ := json.Marshal(guestproto.HelloReply{Session: session, AgentVersion: version})
			return guestproto.AppendFrame(nil, guestproto.Frame{Type: guestproto.FrameHelloAck, Payload: b})
		}
		var out []byte
		out = append(out, guestproto.AppendFrame(nil, guestproto.Frame{Type: guestproto.FrameData, Stream: 4, Payload: []byte("stale output")})[5:]...)
		out = append(out, ack("old", "stale")...)
		out = append(out, ack(req.Session, "real")...)
		_, _ = guestEnd.Write(out)
		_, _ = io.Copy(io.Discard, guestEnd) // swallow retransmissions
	}()
	rep, err := c.Hello(testContext(t), guestproto.HelloRequest{Session: "new"})
	if err != nil {
		t.Fatalf("Hello: %v", err)
	}
	if rep.AgentVersion != "real" {
		t.Errorf("Hello took the ACK of version %q, want real", rep.AgentVersion)
	}
}

func TestClientBeforeHello(t *testing.T) {
	hostEnd, _ := net.Pipe()
	c := guestproto.NewClient(hostEnd)
	defer c.Close()
	ctx := testContext(t)
	if _, err := c.Stat(ctx, "/x"); !errors.Is(err, guestproto.ErrNoSession) {
		t.Errorf("Stat before Hello = %v, want ErrNoSession", err)
	}
	if err := c.Barrier(ctx); !errors.Is(err, guestproto.ErrNoSession) {
		t.Errorf("Barrier before Hello = %v, want ErrNoSession", err)
	}
}
