package guestproto

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sync"
	"sync/atomic"
	"time"
)

// helloRetry is how often Hello retransmits HELLO while it waits: a HELLO
// that reached an agent still inside a stale frame is found by the next one.
const helloRetry = time.Second

// Defaults of ClientConfig.
const (
	DefaultWriteTimeout   = 10 * time.Second
	DefaultCallTimeout    = 60 * time.Second
	DefaultExecGrace      = 10 * time.Second
	DefaultProbeAfter     = 5 * time.Second
	DefaultProbeTimeout   = 20 * time.Second
	DefaultMaxStreams     = 64
	DefaultMaxDials       = 256
	DefaultMaxListEntries = 10000
	DefaultMaxListBytes   = 8 << 20
)

// maxListLine bounds one line (one JSON FileInfo) of a listing. The largest
// real entry is a path and a symlink target of PATH_MAX bytes each, every
// byte escaped (\u00XX): about 50 KiB.
const maxListLine = 64 << 10

// ClientConfig bounds what a guest can cost the host through a Client: the
// guest is not trusted. A zero field takes its default.
type ClientConfig struct {
	// WriteTimeout bounds each write of buffered frames (at most 64 KiB)
	// to the connection: one that does not complete in time fails the
	// connection with ErrUnresponsive (the guest stopped reading its
	// channel). The deadline is set with SetWriteDeadline when the
	// connection has it; otherwise a watchdog closes the connection.
	// Default DefaultWriteTimeout (10 s).
	WriteTimeout time.Duration
	// CallTimeout bounds each wait for an answer a working guest gives at
	// once: the REPLY to every OPEN (so the start of an exec, download or
	// upload), the whole of Stat, Mkdir, Remove, Rename and ListDir,
	// BARRIER_ACK and PONG. A sooner deadline of the ctx wins. When it
	// expires the operation fails with a *Error of CodeTimeout (which
	// matches context.DeadlineExceeded). Default DefaultCallTimeout (60 s).
	CallTimeout time.Duration
	// ProbeAfter and ProbeTimeout tell a guest that answers nothing from
	// one that is slow: when the REPLY to an OPEN has not come ProbeAfter
	// after the OPEN was sent, the client PINGs the guest (one PING at a
	// time, none during a barrier); if no PONG comes within ProbeTimeout,
	// the connection fails with ErrSilent, so that its owner can connect
	// again instead of every call waiting CallTimeout in vain. Defaults
	// DefaultProbeAfter (5 s) and DefaultProbeTimeout (20 s).
	ProbeAfter   time.Duration
	ProbeTimeout time.Duration
	// ExecGrace: the host aborts an exec with TimeoutMS > 0 that has not
	// ended TimeoutMS + ExecGrace after it started (CodeTimeout). The guest
	// enforces TimeoutMS; this only bounds a guest that does not. Default
	// DefaultExecGrace (10 s).
	ExecGrace time.Duration
	// MaxStreams bounds the operations in flight at once (each exec, file
	// transfer and file operation is one stream). Beyond it, operations
	// fail at once with a *Error of CodeBusy (errors.Is ErrTooManyStreams).
	// Default DefaultMaxStreams (64).
	MaxStreams int
	// MaxDials bounds the connections to the guest's ports open at once
	// (DialPort), counted apart from MaxStreams: a web application's
	// connections must not starve the sandbox's execs, nor they it.
	// Beyond it, DialPort fails at once with a *Error of CodeBusy.
	// Default DefaultMaxDials (256); the guest agent serves at most
	// MaxGuestDials.
	MaxDials int
	// MaxListEntries and MaxListBytes bound a directory listing: ListDir of
	// a directory with more entries, or whose entries take more bytes of
	// JSON, fails with a *Error of CodeTooLarge. Defaults
	// DefaultMaxListEntries (10,000) and DefaultMaxListBytes (8 MiB).
	MaxListEntries int
	MaxListBytes   int
	// ExecCwd is the working directory of execs that name none (absolute;
	// "": the guest's default, $HOME or /). The host sets it from the
	// WORKDIR of a user template's image; an exec's own Cwd wins.
	ExecCwd string
	// ExecUser is the user of execs that name none ("": root; see
	// ValidateUser). The host sets it from the USER of a user template's
	// image; an exec's own User wins. A guest agent that does not list
	// FeatureExecUser (a snapshot taken before it existed) runs such execs
	// as root, as it always did.
	ExecUser string
}

// Validate reports whether c is usable: no field may be negative.
func (c ClientConfig) Validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"WriteTimeout", int64(c.WriteTimeout)}, {"CallTimeout", int64(c.CallTimeout)},
		{"ProbeAfter", int64(c.ProbeAfter)}, {"ProbeTimeout", int64(c.ProbeTimeout)},
		{"ExecGrace", int64(c.ExecGrace)}, {"MaxStreams", int64(c.MaxStreams)}, {"MaxDials", int64(c.MaxDials)},
		{"MaxListEntries", int64(c.MaxListEntries)}, {"MaxListBytes", int64(c.MaxListBytes)},
	} {
		if f.v < 0 {
			return fmt.Errorf("guest client config: %s is negative", f.name)
		}
	}
	if c.ExecCwd != "" && !path.IsAbs(c.ExecCwd) {
		return fmt.Errorf("guest client config: ExecCwd %q is not absolute", c.ExecCwd)
	}
	if err := ValidateUser(c.ExecUser); err != nil {
		return fmt.Errorf("guest client config: ExecUser: %w", err)
	}
	return nil
}

func (c ClientConfig) withDefaults() ClientConfig {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.WriteTimeout, DefaultWriteTimeout)
	def(&c.CallTimeout, DefaultCallTimeout)
	def(&c.ProbeAfter, DefaultProbeAfter)
	def(&c.ProbeTimeout, DefaultProbeTimeout)
	def(&c.ExecGrace, DefaultExecGrace)
	defInt(&c.MaxStreams, DefaultMaxStreams)
	defInt(&c.MaxDials, DefaultMaxDials)
	defInt(&c.MaxListEntries, DefaultMaxListEntries)
	defInt(&c.MaxListBytes, DefaultMaxListBytes)
	return c
}

// Client is the host end of the protocol over one connection to one guest
// agent (for QEMU, the virtio-serial chardev's unix socket).
//
// Call Hello first: it starts the session (and the client's goroutines) and
// nothing else works before it. All methods are safe for concurrent use; up
// to ClientConfig.MaxStreams execs and file operations can run at once.
// Cancelling the ctx of an operation aborts its stream with RESET (an exec's
// process group is killed). After a restore of the guest, use a new Client
// on the new connection: a Client serves one session.
//
// The guest is not trusted: nothing it sends makes a Client block forever or
// hold unbounded memory. How long each call can wait for the guest:
//
//   - Close never blocks, and every call waiting on the guest returns
//     promptly after it (with an error wrapping ErrClosed).
//   - A guest that stops reading its channel fails the connection
//     (ErrUnresponsive) at most WriteTimeout after a write to it stalls.
//   - Hello waits as long as its ctx allows (a cold-booting guest may take
//     long to answer): give it a deadline.
//   - Barrier and Ping wait at most CallTimeout (or ctx); Resume only waits
//     for RESUME to be written (at most WriteTimeout, or ctx).
//   - Stat, Mkdir, Remove, Rename and ListDir take at most CallTimeout (or
//     ctx) in all.
//   - ReadFile, WriteFile, StartExec, Exec and DialPort wait at most
//     CallTimeout (or ctx) for the guest to start the operation. The
//     transfer that follows is bounded by ctx (a connection's by its
//     deadlines and Close), and an exec with TimeoutMS also by TimeoutMS +
//     ExecGrace. Reading a stream waits for the guest's data; writing
//     waits for its credit.
//
// Memory: a stream buffers at most its credit (256 KiB per channel) of
// guest data, and credit is granted only on streams that carry data to the
// host (exec stdout and stderr, downloads, listings, connections), so a
// Client holds at most about MaxStreams × 1 MiB + MaxDials × 512 KiB of
// guest data (in practice what its readers have not read yet), plus one
// 64 KiB frame; a listing at most MaxListBytes. Nothing the host sends is queued: a Write waits until the
// connection takes its bytes.
type Client struct {
	rwc io.ReadWriteCloser
	cfg ClientConfig
	w   *frameWriter
	m   *mux

	startOnce   sync.Once
	established atomic.Bool
	probing     atomic.Bool // a liveness PING is in flight
	execUser    atomic.Bool // the agent lists FeatureExecUser
	watchDir    atomic.Bool // the agent lists FeatureWatchDir
	procs       atomic.Bool // the agent lists FeatureProcesses
	pty         atomic.Bool // the agent lists FeaturePTY
	dials       atomic.Bool // the agent lists FeatureDial
	volumes     atomic.Bool // the agent lists FeatureVolumes
	closed      chan struct{}
	closeOnce   sync.Once
	err         error // set before closed is closed

	mu        sync.Mutex
	hello     *helloWait
	barrier   chan struct{} // receives BARRIER_ACK while a barrier is pending
	inBarrier bool
	barriers  uint64 // Barrier calls so far
	pings     map[uint64]chan struct{}
	nextPing  uint64
	nextID    uint32
}

type helloWait struct {
	session string
	reply   chan HelloReply
}

// NewClient returns a client speaking over rwc with the default
// ClientConfig. It starts nothing; Hello starts the read and write loops.
// The client owns rwc and closes it.
func NewClient(rwc io.ReadWriteCloser) *Client {
	c, _ := NewClientConfig(rwc, ClientConfig{}) // the zero config is valid
	return c
}

// NewClientConfig is NewClient with cfg; it fails only if cfg is invalid.
func NewClientConfig(rwc io.ReadWriteCloser, cfg ClientConfig) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Client{
		rwc:    rwc,
		cfg:    cfg,
		closed: make(chan struct{}),
		pings:  make(map[uint64]chan struct{}),
	}
	sw := &stallWriter{w: rwc, timeout: cfg.WriteTimeout}
	// The watchdog fails the client itself, so that the reason recorded is
	// the stall and not what closing the connection does to the reader.
	sw.onStall = func() { c.fail(fmt.Errorf("write guest frame: %w", sw.stalled())) }
	if d, ok := rwc.(interface{ SetWriteDeadline(time.Time) error }); ok {
		sw.setDeadline = d.SetWriteDeadline
	}
	c.w = newFrameWriter(sw)
	c.m = newMux(true, c.w)
	c.w.onError = func(err error) { c.fail(fmt.Errorf("write guest frame: %w", err)) }
	return c, nil
}

// stallWriter fails a write to the guest that does not complete within
// timeout, with an error wrapping ErrUnresponsive.
type stallWriter struct {
	w           io.Writer
	timeout     time.Duration
	setDeadline func(time.Time) error // nil: use the watchdog
	onStall     func()                // the watchdog: fail the connection
}

func (sw *stallWriter) Write(p []byte) (int, error) {
	if sw.setDeadline != nil && sw.setDeadline(time.Now().Add(sw.timeout)) == nil {
		n, err := sw.w.Write(p)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = sw.stalled()
		}
		return n, err
	}
	var fired atomic.Bool
	t := time.AfterFunc(sw.timeout, func() { fired.Store(true); sw.onStall() })
	n, err := sw.w.Write(p)
	if !t.Stop() && fired.Load() && err != nil {
		err = sw.stalled()
	}
	return n, err
}

func (sw *stallWriter) stalled() error {
	return fmt.Errorf("%w: a write made no progress for %v", ErrUnresponsive, sw.timeout)
}

// Done is closed when the connection is closed or failed.
func (c *Client) Done() <-chan struct{} { return c.closed }

// Err returns why Done was closed, or nil.
func (c *Client) Err() error {
	select {
	case <-c.closed:
		return c.err
	default:
		return nil
	}
}

// Close closes the connection; pending and later operations fail with
// ErrClosed. It is idempotent.
func (c *Client) Close() error {
	c.fail(ErrClosed)
	return nil
}

// fail tears the connection down once, with err (wrapped in ErrClosed).
// It never blocks: closing the connection unblocks the read loop and a
// writer stuck in a write.
func (c *Client) fail(err error) {
	c.closeOnce.Do(func() {
		if !errors.Is(err, ErrClosed) {
			err = fmt.Errorf("%w: %w", ErrClosed, err)
		}
		c.err = err
		close(c.closed)
		_ = c.rwc.Close()
		c.w.close(err)
		c.m.abortAll(err)
	})
}

func (c *Client) start() {
	c.startOnce.Do(func() {
		go c.w.run()
		go c.readLoop()
	})
}

func (c *Client) readLoop() {
	br := bufio.NewReaderSize(c.rwc, HeaderSize+MaxPayload)
	for {
		var f Frame
		var err error
		if c.established.Load() {
			f, err = readFrameBuffered(br)
		} else {
			// Until our HELLO_ACK, skip anything: stale frames of an older
			// session, or the tail of one a disconnect cut in half.
			f, err = scanFrame(br, FrameHelloAck, MaxPayload, c.matchHelloAck)
		}
		if err != nil {
			c.fail(fmt.Errorf("read guest frame: %w", err))
			return
		}
		c.dispatch(f)
	}
}

func (c *Client) matchHelloAck(payload []byte) bool {
	c.mu.Lock()
	hw := c.hello
	c.mu.Unlock()
	// Skip the JSON decoding of frames that cannot be ours: the scan may
	// look at a candidate at every few bytes of stale or hostile input.
	if hw == nil || !bytes.Contains(payload, []byte(hw.session)) {
		return false
	}
	var r HelloReply
	return json.Unmarshal(payload, &r) == nil && r.Session == hw.session
}

func (c *Client) dispatch(f Frame) {
	switch f.Type {
	case FrameHelloAck:
		var r HelloReply
		if json.Unmarshal(f.Payload, &r) != nil {
			return
		}
		c.mu.Lock()
		hw := c.hello
		if hw != nil && hw.session == r.Session {
			c.hello = nil
			if r.Error == nil {
				c.execUser.Store(r.HasFeature(FeatureExecUser))
				c.watchDir.Store(r.HasFeature(FeatureWatchDir))
				c.procs.Store(r.HasFeature(FeatureProcesses))
				c.pty.Store(r.HasFeature(FeaturePTY))
				c.dials.Store(r.HasFeature(FeatureDial))
				c.volumes.Store(r.HasFeature(FeatureVolumes))
				c.established.Store(true)
			}
			hw.reply <- r
		}
		c.mu.Unlock()
	case FrameBarrierAck:
		c.mu.Lock()
		if c.barrier != nil {
			notify(c.barrier)
		}
		c.mu.Unlock()
	case FramePong:
		if len(f.Payload) != 8 {
			return
		}
		id := binary.BigEndian.Uint64(f.Payload)
		c.mu.Lock()
		if ch, ok := c.pings[id]; ok {
			delete(c.pings, id)
			close(ch)
		}
		c.mu.Unlock()
	case FrameReply, FrameExit:
		s := c.m.lookup(f.Stream)
		if s == nil {
			return
		}
		if f.Type == FrameReply {
			s.replied.Store(true)
		}
		ch := s.reply
		if f.Type == FrameExit {
			ch = s.exit
		}
		select {
		case ch <- f.Payload:
		default: // a second REPLY or EXIT is a guest bug; keep the first
		}
	case FrameData, FrameWindow, FrameClose, FrameReset:
		c.m.streamFrame(f)
	}
}

// ctrl sends a session frame and waits until it is written (bounded by
// WriteTimeout: a stalled write fails the connection).
func (c *Client) ctrl(ctx context.Context, f Frame, gate gateOp) error {
	done := make(chan error, 1)
	if err := c.w.enqueue(&outFrame{f: f, gate: gate, done: done}, true); err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-c.closed:
		return c.connErr(ErrClosed)
	}
}

// callTimer returns a channel that fires after CallTimeout, and its stop.
func (c *Client) callTimer() (<-chan time.Time, func() bool) {
	t := time.NewTimer(c.cfg.CallTimeout)
	return t.C, t.Stop
}

// Hello starts the session: it sends HELLO and waits for HELLO_ACK, by which
// time the agent has dropped any previous session's streams and run its
// restore hooks (clock, RNG reseed, hostname, machine-id). Empty Session,
// zero TimeUnixNano and empty Entropy are filled in from the host. Call it
// once, first, on every new connection; HELLO is retransmitted every second
// until acknowledged.
func (c *Client) Hello(ctx context.Context, req HelloRequest) (HelloReply, error) {
	if req.Session == "" {
		req.Session = randomHex(16)
	}
	if req.TimeUnixNano == 0 {
		req.TimeUnixNano = time.Now().UnixNano()
	}
	if len(req.Entropy) == 0 {
		req.Entropy = make([]byte, MinEntropy)
		_, _ = rand.Read(req.Entropy)
	}
	if err := req.Validate(); err != nil {
		return HelloReply{}, fmt.Errorf("hello: %w", Errorf(CodeInvalid, "%v", err))
	}
	if c.established.Load() {
		return HelloReply{}, errors.New("hello: session already established")
	}
	payload, err := json.Marshal(req)
	if err != nil {
		return HelloReply{}, fmt.Errorf("encode hello: %w", err)
	}
	if len(payload) > MaxHelloPayload {
		return HelloReply{}, fmt.Errorf("hello: %w", Errorf(CodeInvalid, "HELLO of %d bytes exceeds %d", len(payload), MaxHelloPayload))
	}
	hw := &helloWait{session: req.Session, reply: make(chan HelloReply, 1)}
	c.mu.Lock()
	if c.hello != nil {
		c.mu.Unlock()
		return HelloReply{}, errors.New("hello: another Hello is in progress")
	}
	c.hello = hw
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.hello == hw {
			c.hello = nil
		}
		c.mu.Unlock()
	}()

	c.start()
	tick := time.NewTicker(helloRetry)
	defer tick.Stop()
	for {
		if err := c.w.enqueue(&outFrame{f: Frame{Type: FrameHello, Payload: payload}}, true); err != nil {
			return HelloReply{}, fmt.Errorf("send hello: %w", c.connErr(err))
		}
		select {
		case r := <-hw.reply:
			if r.Error != nil {
				return r, fmt.Errorf("hello: %w", r.Error)
			}
			return r, nil
		case <-tick.C:
		case <-ctx.Done():
			return HelloReply{}, fmt.Errorf("hello: %w", ctx.Err())
		case <-c.closed:
			return HelloReply{}, fmt.Errorf("hello: %w", c.connErr(ErrClosed))
		}
	}
}

// connErr prefers the reason the connection failed over err.
func (c *Client) connErr(err error) error {
	if e := c.Err(); e != nil {
		return e
	}
	return err
}

// Barrier prepares the guest for a snapshot or fork: it sends BARRIER and
// waits for BARRIER_ACK. From BARRIER on this client writes no frame (stream
// writes wait), and after BARRIER_ACK the agent writes none, so both
// directions rest at a frame boundary. Follow it with Resume on this client
// (the VM goes on with this session) or, for a restored copy, a Hello on a
// new connection. If Barrier fails the client stays gated until Resume.
func (c *Client) Barrier(ctx context.Context) error {
	if !c.established.Load() {
		return fmt.Errorf("barrier: %w", ErrNoSession)
	}
	ack := make(chan struct{}, 1)
	c.mu.Lock()
	if c.inBarrier {
		c.mu.Unlock()
		return errors.New("barrier: already in a barrier")
	}
	c.inBarrier = true
	c.barriers++
	c.barrier = ack
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.barrier = nil
		c.mu.Unlock()
	}()
	if err := c.w.enqueue(&outFrame{f: Frame{Type: FrameBarrier}, gate: gateClose}, true); err != nil {
		return fmt.Errorf("send barrier: %w", c.connErr(err))
	}
	timeout, stop := c.callTimer()
	defer stop()
	select {
	case <-ack:
		return nil
	case <-timeout:
		return fmt.Errorf("barrier: %w", Errorf(CodeTimeout, "the guest agent did not acknowledge BARRIER within %v", c.cfg.CallTimeout))
	case <-ctx.Done():
		return fmt.Errorf("barrier: %w", ctx.Err())
	case <-c.closed:
		return fmt.Errorf("barrier: %w", c.connErr(ErrClosed))
	}
}

// Resume ends a barrier on the same session: it sends RESUME, after which
// both sides write again and every open stream goes on untouched.
func (c *Client) Resume(ctx context.Context) error {
	c.mu.Lock()
	if !c.inBarrier {
		c.mu.Unlock()
		return errors.New("resume: not in a barrier")
	}
	c.inBarrier = false
	c.mu.Unlock()
	if err := c.ctrl(ctx, Frame{Type: FrameResume}, gateOpen); err != nil {
		return fmt.Errorf("send resume: %w", c.connErr(err))
	}
	return nil
}

// Ping checks that the agent answers.
func (c *Client) Ping(ctx context.Context) error {
	if !c.established.Load() {
		return fmt.Errorf("ping: %w", ErrNoSession)
	}
	pong := make(chan struct{})
	c.mu.Lock()
	c.nextPing++
	id := c.nextPing
	c.pings[id] = pong
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pings, id)
		c.mu.Unlock()
	}()
	payload := binary.BigEndian.AppendUint64(nil, id)
	if err := c.w.enqueue(&outFrame{f: Frame{Type: FramePing, Payload: payload}}, true); err != nil {
		return fmt.Errorf("send ping: %w", c.connErr(err))
	}
	timeout, stop := c.callTimer()
	defer stop()
	select {
	case <-pong:
		return nil
	case <-timeout:
		return fmt.Errorf("ping: %w", Errorf(CodeTimeout, "the guest agent did not answer PING within %v", c.cfg.CallTimeout))
	case <-ctx.Done():
		return fmt.Errorf("ping: %w", ctx.Err())
	case <-c.closed:
		return fmt.Errorf("ping: %w", c.connErr(ErrClosed))
	}
}

// open starts a stream whose first dataIn channels (0: none, 1: stdout or
// file data, 2: and stderr) may carry DATA to the host: the others get no
// credit, so DATA on them is a protocol error. Until the stream ends,
// cancelling ctx aborts it with RESET. The stream's deadline is armed with
// CallTimeout for the guest's REPLY.
func (c *Client) open(ctx context.Context, req *OpenRequest, dataIn int) (*Stream, error) {
	return c.openStream(ctx, req, dataIn, false)
}

// openStream is open; dial makes a dial stream (see Stream.dial),
// counted against MaxDials.
func (c *Client) openStream(ctx context.Context, req *OpenRequest, dataIn int, dial bool) (*Stream, error) {
	if err := c.Err(); err != nil {
		return nil, err
	}
	if !c.established.Load() {
		return nil, ErrNoSession
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	payload, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode %s request: %w", req.Op, err)
	}
	if len(payload) > MaxPayload {
		return nil, Errorf(CodeInvalid, "%s request of %d bytes exceeds %d", req.Op, len(payload), MaxPayload)
	}
	var s *Stream
	for s == nil {
		c.mu.Lock()
		c.nextID++
		if c.nextID == 0 {
			c.nextID++
		}
		id := c.nextID
		c.mu.Unlock()
		limit := c.cfg.MaxStreams
		if dial {
			limit = c.cfg.MaxDials
		}
		if s, err = c.m.add(id, 0, limit, dial); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	for ch := dataIn; ch < len(s.rx); ch++ {
		s.rx[ch].avail = 0
	}
	s.mu.Unlock()
	s.setStop(context.AfterFunc(ctx, func() {
		s.abort(ctx.Err(), &Error{Code: CodeCanceled, Message: "canceled by host"})
	}))
	s.setDeadline(c.cfg.CallTimeout, c.slowGuest(req.Op))
	if err := c.w.enqueue(&outFrame{f: Frame{Type: FrameOpen, Stream: s.id, Payload: payload}}, false); err != nil {
		s.abort(c.connErr(err), nil)
		return nil, c.connErr(err)
	}
	op := req.Op
	s.mu.Lock()
	s.probe = time.AfterFunc(c.cfg.ProbeAfter, func() {
		if !s.replied.Load() && s.Err() == nil {
			c.probe(op)
		}
	})
	s.mu.Unlock()
	return s, nil
}

// probe PINGs the guest because the REPLY to an op is late, and fails the
// connection with ErrSilent if no PONG comes within ProbeTimeout. A
// barrier during the probe keeps PING from being sent (or PONG from being
// answered): the probe then proves nothing and the connection stays.
func (c *Client) probe(op Op) {
	if !c.established.Load() || !c.probing.CompareAndSwap(false, true) {
		return
	}
	c.mu.Lock()
	barriers, inBarrier := c.barriers, c.inBarrier
	c.mu.Unlock()
	if inBarrier {
		c.probing.Store(false)
		return
	}
	go func() {
		defer c.probing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ProbeTimeout)
		defer cancel()
		err := c.Ping(ctx)
		if err == nil || !errors.Is(err, context.DeadlineExceeded) {
			return
		}
		c.mu.Lock()
		quiet := c.barriers == barriers && !c.inBarrier
		c.mu.Unlock()
		if quiet {
			c.fail(fmt.Errorf("%w: no REPLY to %s within %v, then no PONG within %v", ErrSilent, op, c.cfg.ProbeAfter, c.cfg.ProbeTimeout))
		}
	}()
}

// slowGuest is the error of an operation the guest did not complete within
// CallTimeout.
func (c *Client) slowGuest(op Op) *Error {
	return Errorf(CodeTimeout, "the guest agent did not complete %s within %v", op, c.cfg.CallTimeout)
}

// waitFrame waits for the REPLY or EXIT payload of s and decodes it. A Reply
// that carries an error is returned with that *Error.
func (c *Client) waitFrame(s *Stream, ch chan []byte, what string) (Reply, error) {
	var b []byte
	select {
	case b = <-ch:
	case <-s.done:
	case <-s.rclosed:
	}
	if b == nil {
		select {
		case b = <-ch:
		default:
			if err := s.Err(); err != nil {
				return Reply{}, err
			}
			return Reply{}, Errorf(CodeInternal, "stream %d ended without %s", s.id, what)
		}
	}
	var r Reply
	if err := json.Unmarshal(b, &r); err != nil {
		return Reply{}, Errorf(CodeInternal, "decode %s: %v", what, err)
	}
	if r.Error != nil {
		if r.Error.Code == "" {
			// A hostile or broken guest: an error must say what kind it is.
			return r, Errorf(CodeInternal, "guest reported an error without a code: %q", r.Error.Message)
		}
		return r, r.Error
	}
	return r, nil
}

// call runs a request that needs no data in either direction, in at most
// CallTimeout.
func (c *Client) call(ctx context.Context, req *OpenRequest) (Reply, error) {
	s, err := c.open(ctx, req, 0)
	if err != nil {
		return Reply{}, err
	}
	defer s.detach()
	if err := s.CloseWrite(); err != nil {
		return Reply{}, err
	}
	return c.waitFrame(s, s.reply, "REPLY")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
