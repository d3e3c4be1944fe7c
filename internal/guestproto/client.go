package guestproto

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"sync/atomic"
	"time"
)

// helloRetry is how often Hello retransmits HELLO while it waits: a HELLO
// that reached an agent still inside a stale frame is found by the next one.
const helloRetry = time.Second

// Client is the host end of the protocol over one connection to one guest
// agent (for QEMU, the virtio-serial chardev's unix socket).
//
// Call Hello first: it starts the session (and the client's goroutines) and
// nothing else works before it. All methods are safe for concurrent use; any
// number of execs and file operations can run at once. Cancelling the ctx of
// an operation aborts its stream with RESET (an exec's process group is
// killed). After a restore of the guest, use a new Client on the new
// connection: a Client serves one session.
type Client struct {
	rwc io.ReadWriteCloser
	w   *frameWriter
	m   *mux

	startOnce   sync.Once
	established atomic.Bool
	closed      chan struct{}
	closeOnce   sync.Once
	err         error // set before closed is closed

	mu        sync.Mutex
	hello     *helloWait
	barrier   chan struct{} // receives BARRIER_ACK while a barrier is pending
	inBarrier bool
	pings     map[uint64]chan struct{}
	nextPing  uint64
	nextID    uint32
}

type helloWait struct {
	session string
	reply   chan HelloReply
}

// NewClient returns a client speaking over rwc. It starts nothing; Hello
// starts the read and write loops. The client owns rwc and closes it.
func NewClient(rwc io.ReadWriteCloser) *Client {
	w := newFrameWriter(rwc)
	c := &Client{
		rwc:    rwc,
		w:      w,
		m:      newMux(true, w),
		closed: make(chan struct{}),
		pings:  make(map[uint64]chan struct{}),
	}
	w.onError = func(err error) { c.fail(fmt.Errorf("write guest frame: %w", err)) }
	return c
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

func (c *Client) fail(err error) {
	c.closeOnce.Do(func() {
		c.err = err
		close(c.closed)
		_ = c.rwc.Close()
		c.w.close(ErrClosed)
		if !errors.Is(err, ErrClosed) {
			err = fmt.Errorf("%w: %v", ErrClosed, err)
		}
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
	var r HelloReply
	if json.Unmarshal(payload, &r) != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hello != nil && c.hello.session == r.Session
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
	}
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
	select {
	case <-ack:
		return nil
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
	select {
	case <-pong:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("ping: %w", ctx.Err())
	case <-c.closed:
		return fmt.Errorf("ping: %w", c.connErr(ErrClosed))
	}
}

// open starts a stream. Until the stream ends, cancelling ctx aborts it with
// RESET.
func (c *Client) open(ctx context.Context, req *OpenRequest) (*Stream, error) {
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
		s = c.m.add(id, 0)
	}
	s.setStop(context.AfterFunc(ctx, func() {
		s.abort(ctx.Err(), &Error{Code: CodeCanceled, Message: "canceled by host"})
	}))
	if err := c.w.enqueue(&outFrame{f: Frame{Type: FrameOpen, Stream: s.id, Payload: payload}}, false); err != nil {
		s.abort(c.connErr(err), nil)
		return nil, c.connErr(err)
	}
	return s, nil
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
		return r, r.Error
	}
	return r, nil
}

// call runs a request that needs no data in either direction.
func (c *Client) call(ctx context.Context, req *OpenRequest) (Reply, error) {
	s, err := c.open(ctx, req)
	if err != nil {
		return Reply{}, err
	}
	defer s.detach()
	if err := s.CloseWrite(); err != nil {
		return Reply{}, err
	}
	return c.waitFrame(s, s.reply, "REPLY")
}

// Stat describes path (lstat: a symlink is described, not followed).
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	if err := ValidPath(path); err != nil {
		return FileInfo{}, fmt.Errorf("stat %s: %w", path, err)
	}
	r, err := c.call(ctx, &OpenRequest{Op: OpStat, Path: path})
	if err != nil {
		return FileInfo{}, fmt.Errorf("stat %s: %w", path, err)
	}
	if r.Info == nil {
		return FileInfo{}, fmt.Errorf("stat %s: %w", path, Errorf(CodeInternal, "reply without info"))
	}
	return *r.Info, nil
}

// Mkdir creates path and any missing parents (mkdir -p); an existing
// directory is not an error.
func (c *Client) Mkdir(ctx context.Context, path string) error {
	if err := ValidPath(path); err != nil {
		return fmt.Errorf("mkdir %s: %w", path, err)
	}
	if _, err := c.call(ctx, &OpenRequest{Op: OpMkdir, Path: path}); err != nil {
		return fmt.Errorf("mkdir %s: %w", path, err)
	}
	return nil
}

// Remove removes path; a non-empty directory only if recursive (otherwise
// ErrNotEmpty). A missing path is ErrNotFound.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	if err := ValidPath(path); err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	if _, err := c.call(ctx, &OpenRequest{Op: OpRemove, Path: path, Recursive: recursive}); err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// Rename renames oldpath to newpath (rename(2): replaces a file at newpath).
func (c *Client) Rename(ctx context.Context, oldpath, newpath string) error {
	for _, p := range []string{oldpath, newpath} {
		if err := ValidPath(p); err != nil {
			return fmt.Errorf("rename %s: %w", oldpath, err)
		}
	}
	if _, err := c.call(ctx, &OpenRequest{Op: OpRename, Path: oldpath, NewPath: newpath}); err != nil {
		return fmt.Errorf("rename %s: %w", oldpath, err)
	}
	return nil
}

// ListDir lists the directory path, sorted by name.
func (c *Client) ListDir(ctx context.Context, path string) ([]FileInfo, error) {
	if err := ValidPath(path); err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	s, err := c.open(ctx, &OpenRequest{Op: OpListDir, Path: path})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	defer s.detach()
	if err := s.CloseWrite(); err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	if _, err := c.waitFrame(s, s.reply, "REPLY"); err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	var out []FileInfo
	dec := json.NewDecoder(s)
	for {
		var fi FileInfo
		if err := dec.Decode(&fi); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			s.abort(err, &Error{Code: CodeCanceled, Message: "list aborted"})
			return nil, fmt.Errorf("list %s: %w", path, err)
		}
		out = append(out, fi)
	}
}

// ReadFile opens path for streaming download. ctx governs the whole read;
// Close the reader (before EOF it aborts the transfer).
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, FileInfo, error) {
	if err := ValidPath(path); err != nil {
		return nil, FileInfo{}, fmt.Errorf("read %s: %w", path, err)
	}
	s, err := c.open(ctx, &OpenRequest{Op: OpReadFile, Path: path})
	if err != nil {
		return nil, FileInfo{}, fmt.Errorf("read %s: %w", path, err)
	}
	if err := s.CloseWrite(); err != nil {
		s.abort(err, nil)
		return nil, FileInfo{}, fmt.Errorf("read %s: %w", path, err)
	}
	r, err := c.waitFrame(s, s.reply, "REPLY")
	if err != nil {
		s.detach()
		return nil, FileInfo{}, fmt.Errorf("read %s: %w", path, err)
	}
	if r.Info == nil {
		s.Reset(&Error{Code: CodeCanceled})
		return nil, FileInfo{}, fmt.Errorf("read %s: %w", path, Errorf(CodeInternal, "reply without info"))
	}
	return &fileReader{s: s}, *r.Info, nil
}

type fileReader struct {
	s   *Stream
	eof bool
}

func (r *fileReader) Read(p []byte) (int, error) {
	n, err := r.s.Read(p)
	if errors.Is(err, io.EOF) {
		r.eof = true
	}
	return n, err
}

func (r *fileReader) Close() error {
	if !r.eof {
		r.s.abort(ErrClosed, &Error{Code: CodeCanceled, Message: "download closed by host"})
	}
	r.s.detach()
	return nil
}

// WriteFile stores what r yields at path, streamed: the guest writes to a
// temporary file in the same directory (creating missing parents) and renames
// it into place at the end, so a failed upload leaves no partial file. mode's
// permission bits apply (0 means 0644). It returns the bytes stored.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) (int64, error) {
	if err := ValidPath(path); err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	s, err := c.open(ctx, &OpenRequest{Op: OpWriteFile, Path: path, Mode: unixMode(mode)})
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	defer s.detach()
	if _, err := c.waitFrame(s, s.reply, "REPLY"); err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	bp := payloadPool.Get().(*[]byte)
	defer payloadPool.Put(bp)
	buf := *bp
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if _, err := s.Write(buf[:n]); err != nil {
				if errors.Is(err, ErrStreamDone) {
					// The guest gave up early; its EXIT says why.
					if _, xerr := c.waitFrame(s, s.exit, "EXIT"); xerr != nil {
						err = xerr
					}
				}
				return 0, fmt.Errorf("write %s: %w", path, err)
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			s.Reset(&Error{Code: CodeCanceled, Message: "upload source failed"})
			return 0, fmt.Errorf("write %s: read source: %w", path, rerr)
		}
	}
	if err := s.CloseWrite(); err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	res, err := c.waitFrame(s, s.exit, "EXIT")
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	return res.Written, nil
}

// unixMode converts the permission bits of an fs.FileMode to st_mode bits.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// Process is an exec started by StartExec.
//
// Read Stdout and Stderr concurrently until EOF (the guest's pipes block when
// they are not read), write Stdin and Close it (if the request asked for
// stdin), then call Wait. Cancelling StartExec's ctx or calling Kill kills
// the process group.
type Process struct {
	// PID is the process id in the guest.
	PID    int
	Stdin  io.WriteCloser
	Stdout io.Reader
	Stderr io.Reader

	c *Client
	s *Stream
}

// StartExec starts a process and returns once it runs in the guest. A
// missing executable, cwd or an invalid request fail here with a *Error
// (ErrNotFound, ErrPermission, ErrInvalid).
func (c *Client) StartExec(ctx context.Context, req ExecRequest) (*Process, error) {
	if err := req.Validate(); err != nil {
		return nil, fmt.Errorf("exec: %w", Errorf(CodeInvalid, "%v", err))
	}
	s, err := c.open(ctx, &OpenRequest{Op: OpExec, Exec: &req})
	if err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	if !req.Stdin {
		if err := s.CloseWrite(); err != nil {
			s.abort(err, nil)
			return nil, fmt.Errorf("exec: %w", err)
		}
	}
	r, err := c.waitFrame(s, s.reply, "REPLY")
	if err != nil {
		s.detach()
		return nil, fmt.Errorf("exec: %w", err)
	}
	return &Process{
		PID:    r.PID,
		Stdin:  stdinWriter{s},
		Stdout: channelReader{s, 0},
		Stderr: channelReader{s, 1},
		c:      c,
		s:      s,
	}, nil
}

// Wait waits for the process to end and returns how it ended. It does not
// read Stdout or Stderr.
func (p *Process) Wait() (ExecResult, error) {
	r, err := p.c.waitFrame(p.s, p.s.exit, "EXIT")
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec: %w", err)
	}
	if r.Exec == nil {
		return ExecResult{}, fmt.Errorf("exec: %w", Errorf(CodeInternal, "EXIT without result"))
	}
	return *r.Exec, nil
}

// Kill aborts the stream, which kills the process group with SIGKILL.
func (p *Process) Kill() {
	p.s.abort(Errorf(CodeCanceled, "killed by host"), &Error{Code: CodeCanceled, Message: "killed by host"})
}

type stdinWriter struct{ s *Stream }

func (w stdinWriter) Write(p []byte) (int, error) { return w.s.Write(p) }
func (w stdinWriter) Close() error                { return w.s.CloseWrite() }

type channelReader struct {
	s  *Stream
	ch int
}

func (r channelReader) Read(p []byte) (int, error) { return r.s.read(r.ch, p) }

// Exec runs a process to completion: stdin (nil for none) is streamed to it,
// its output is copied to stdout and stderr (nil discards) as it is produced.
// A non-zero exit is not an error; see ExecResult.
func (c *Client) Exec(ctx context.Context, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (ExecResult, error) {
	req.Stdin = stdin != nil
	p, err := c.StartExec(ctx, req)
	if err != nil {
		return ExecResult{}, err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	if stdin != nil {
		go func() {
			// Errors end the copy: the process may exit without reading.
			_, _ = io.Copy(p.Stdin, stdin)
			_ = p.Stdin.Close()
		}()
	}
	var wg sync.WaitGroup
	var outErr, errErr error
	wg.Add(2)
	go func() { defer wg.Done(); outErr = copyOut(stdout, p.Stdout) }()
	go func() { defer wg.Done(); errErr = copyOut(stderr, p.Stderr) }()
	wg.Wait()
	for _, err := range []error{outErr, errErr} {
		var we writeError
		if errors.As(err, &we) {
			p.Kill()
			return ExecResult{}, fmt.Errorf("exec: copy output: %w", we.err)
		}
	}
	return p.Wait()
}

type writeError struct{ err error }

func (e writeError) Error() string { return e.err.Error() }

// copyOut copies r to w, telling write errors (writeError) from read errors.
func copyOut(w io.Writer, r io.Reader) error {
	bp := payloadPool.Get().(*[]byte)
	defer payloadPool.Put(bp)
	buf := *bp
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return writeError{werr}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
