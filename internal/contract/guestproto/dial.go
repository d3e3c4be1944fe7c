package guestproto

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Connections to the guest's ports carried by the agent (OpDial): the way
// to a server in a guest that the host cannot reach over a network (a host
// without sandbox networking). The host opens a stream naming a port; the
// agent connects to it on the guest's loopback and the stream carries the
// connection's bytes both ways.

// OpDial connects to a TCP port on the guest's loopback (see
// Client.DialPort): OPEN {port} → REPLY {} once connected, then DATA both
// ways; each side's CLOSE ends its own direction only.
const OpDial Op = "dial"

// FeatureDial: the agent serves OpDial.
const FeatureDial = "dial"

const (
	// MaxGuestDials bounds the dial streams a guest agent serves at
	// once; beyond, it answers CodeBusy.
	MaxGuestDials = 1024
	// GuestDialTimeout bounds the agent's connect to a port.
	GuestDialTimeout = 10 * time.Second
)

// ValidPort reports an *Error with CodeInvalid unless port is a TCP port
// (1-65535).
func ValidPort(port int) error {
	if port < 1 || port > 65535 {
		return Errorf(CodeInvalid, "port %d is not between 1 and 65535", port)
	}
	return nil
}

// DialPort opens a TCP connection to port (1-65535) on the guest's
// loopback: the guest agent connects to it (127.0.0.1, or ::1 if nothing
// listens there) and a stream of this connection carries the bytes both
// ways. It returns once the agent has connected. As for net.Dialer, ctx
// bounds the dial only; the connection lives until it is closed, or this
// Client is (a failed connection, the sandbox stopping, a new session).
//
// Errors: a *Error of CodeRefused, which matches syscall.ECONNREFUSED
// (errors.Is), when nothing listens on the port; of CodeTimeout (matches
// context.DeadlineExceeded) when the agent could not connect within
// GuestDialTimeout or did not answer within CallTimeout; of CodeBusy when
// MaxDials connections are open; of CodeInvalid for a port out of range;
// one matching errors.ErrUnsupported, sent nothing, when the agent does
// not list FeatureDial (it was started before the operation existed).
//
// The connection is a net.Conn with CloseWrite:
//
//   - CloseWrite half-closes it: the agent shuts its socket down for
//     writing (the guest's server reads end of file) and Read goes on.
//     The guest's end of file (its server shut down or closed) is Read's
//     io.EOF, and Write goes on. The stream ends once both directions
//     have ended.
//   - Close ends it at once. Unless both directions had ended it aborts
//     the stream (RESET): the agent closes its socket, and bytes written
//     but not yet delivered to the guest's server may be lost, as with a
//     TCP close that resets the connection. For an orderly end, CloseWrite
//     and read until io.EOF.
//   - SetDeadline, SetReadDeadline and SetWriteDeadline work as net.Conn's:
//     a blocked Read or Write returns an error matching
//     os.ErrDeadlineExceeded (a net.Error whose Timeout is true).
//   - Write waits for the guest's credit: a guest that reads nothing
//     blocks it (never the other streams) until its deadline or Close.
//   - Once the stream ends otherwise (the guest's server reset the
//     connection, the agent reset the stream, the guest connection
//     failed), Read and Write fail with an error matching
//     syscall.ECONNRESET; after Close, with net.ErrClosed.
//   - LocalAddr names the stream ("stream 7"), RemoteAddr the guest's
//     port ("127.0.0.1:8080"), both of network "guest".
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	what := fmt.Sprintf("dial port %d", port)
	if err := ValidPort(port); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if c.established.Load() && !c.dials.Load() {
		return nil, fmt.Errorf("%s: %w: this sandbox's guest agent is too old to carry connections to its ports; recreate the sandbox from a current template",
			what, errors.ErrUnsupported)
	}
	s, err := c.openStream(ctx, &OpenRequest{Op: OpDial, Port: port}, 1, true)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if _, err := c.waitFrame(s, s.reply, "REPLY"); err != nil {
		// A failed dial's CLOSE follows its REPLY; a dial stream is not
		// over at the guest's CLOSE alone.
		s.detach()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	s.setDeadline(0, nil)
	// From here on ctx no longer concerns the stream.
	s.mu.Lock()
	stop := s.stop
	s.stop = nil
	s.mu.Unlock()
	if stop != nil && !stop() {
		// ctx ended as the guest answered: its watcher aborts the stream.
		return nil, fmt.Errorf("%s: %w", what, ctx.Err())
	}
	dc := &dialConn{s: s, local: dialAddr(fmt.Sprintf("stream %d", s.id)), remote: dialAddr(fmt.Sprintf("127.0.0.1:%d", port))}
	dc.rd.init()
	dc.wd.init()
	return dc, nil
}

// dialConn is the host's end of a dial stream: see DialPort.
type dialConn struct {
	s             *Stream
	local, remote dialAddr
	rd, wd        deadline
	closed        atomic.Bool
}

var _ net.Conn = (*dialConn)(nil)

func (c *dialConn) Read(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, c.opError("read", net.ErrClosed)
	}
	n, err := c.s.read(0, p, c.rd.wait())
	return n, c.opError("read", err)
}

func (c *dialConn) Write(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, c.opError("write", net.ErrClosed)
	}
	n, err := c.s.write(0, p, c.wd.wait())
	return n, c.opError("write", err)
}

// CloseWrite sends the guest end of file (CLOSE). It waits for a Write in
// progress to return.
func (c *dialConn) CloseWrite() error {
	if c.closed.Load() {
		return c.opError("close", net.ErrClosed)
	}
	return c.opError("close", c.s.CloseWrite())
}

// Close ends the connection: gently if both directions have ended, with
// a RESET otherwise. It never blocks.
func (c *dialConn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return c.opError("close", net.ErrClosed)
	}
	c.rd.stop()
	c.wd.stop()
	s := c.s
	s.mu.Lock()
	over := s.err != nil || s.localClosed && s.remoteClosed
	s.mu.Unlock()
	if over {
		s.detach()
		return nil
	}
	s.abort(net.ErrClosed, &Error{Code: CodeCanceled, Message: "connection closed by the host"})
	return nil
}

// opError is err as net.Conn's methods return it: nil and io.EOF as they
// are, else a *net.OpError whose cause matches net.ErrClosed (after
// Close), os.ErrDeadlineExceeded, io.ErrClosedPipe (a write after
// CloseWrite) or, the stream having ended otherwise, syscall.ECONNRESET.
func (c *dialConn) opError(op string, err error) error {
	switch {
	case err == nil, err == io.EOF:
		return err
	case c.closed.Load():
		err = net.ErrClosed
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, io.ErrClosedPipe), errors.Is(err, net.ErrClosed):
	default:
		err = fmt.Errorf("%w: %w", syscall.ECONNRESET, err)
	}
	return &net.OpError{Op: op, Net: "guest", Source: c.local, Addr: c.remote, Err: err}
}

func (c *dialConn) LocalAddr() net.Addr  { return c.local }
func (c *dialConn) RemoteAddr() net.Addr { return c.remote }

func (c *dialConn) SetDeadline(t time.Time) error {
	c.rd.set(t)
	c.wd.set(t)
	return nil
}

func (c *dialConn) SetReadDeadline(t time.Time) error {
	c.rd.set(t)
	return nil
}

func (c *dialConn) SetWriteDeadline(t time.Time) error {
	c.wd.set(t)
	return nil
}

// dialAddr is an address of a dial connection, of network "guest".
type dialAddr string

func (a dialAddr) Network() string { return "guest" }
func (a dialAddr) String() string  { return string(a) }

// deadline is a connection's read or write deadline: a channel that is
// closed while the deadline has passed. A wait takes the channel of the
// moment; setting a new deadline replaces the channel only if it was
// closed (so a blocked wait sees a deadline moved while it waits).
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{}
}

func (d *deadline) init() { d.cancel = make(chan struct{}) }

// set moves the deadline to t (zero: none).
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // it fired: wait until it has closed cancel
	}
	d.timer = nil
	passed := closed(d.cancel)
	if t.IsZero() {
		if passed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if passed {
			d.cancel = make(chan struct{})
		}
		c := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(c) })
		return
	}
	if !passed {
		close(d.cancel)
	}
}

// wait returns the channel closed when the deadline passes.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

// stop stops the timer, if any.
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
	}
}

// ServeConn serves the dial stream s (guest side) with conn, the
// connection the agent opened to the port the OPEN named, and closes
// conn. It sends the REPLY, then copies the host's DATA to conn and
// conn's bytes to the host, each direction until it ends: the host's CLOSE
// half-closes conn (CloseWrite), conn's end of file is sent as CLOSE. A
// failed read or write of conn aborts the stream (RESET, CodeCanceled);
// the host's RESET, the session's end and ctx's (the agent stops) close
// conn. It returns when both directions have ended.
func ServeConn(ctx context.Context, s *Stream, conn net.Conn) {
	defer conn.Close()
	if s.Reply(Reply{}) != nil {
		return
	}
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-s.Done():
		case <-ctx.Done():
		case <-finished:
			return
		}
		conn.Close() // ends a copy blocked on conn
	}()
	fail := func(what string, err error) {
		if s.Err() == nil {
			s.Reset(Errorf(CodeCanceled, "%s %s: %v", what, conn.RemoteAddr(), err))
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the host's bytes to conn
		defer wg.Done()
		bp := payloadPool.Get().(*[]byte)
		defer payloadPool.Put(bp)
		for {
			n, err := s.Read(*bp)
			if n > 0 {
				if _, werr := conn.Write((*bp)[:n]); werr != nil {
					fail("write to", werr)
					return
				}
			}
			if err == io.EOF {
				if cw, ok := conn.(interface{ CloseWrite() error }); ok {
					_ = cw.CloseWrite()
				}
				return
			}
			if err != nil {
				return // the stream ended; conn is closed
			}
		}
	}()
	buf := make([]byte, MaxPayload)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if _, werr := s.Write(buf[:n]); werr != nil {
				break // the stream ended; conn is closed
			}
		}
		if err == io.EOF {
			_ = s.CloseWrite()
			break
		}
		if err != nil {
			fail("read from", err)
			break
		}
	}
	wg.Wait()
}
