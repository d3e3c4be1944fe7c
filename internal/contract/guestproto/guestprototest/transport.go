// Package guestprototest provides an in-memory guestproto.Transport for tests
// of the agent: hosts connect and disconnect as they do on a virtio-serial
// port, and a host can take over a stream mid-session as a restored VM's new
// host does.
// It also holds what tests of file transfers share: a reader of
// deterministic pseudo-random bytes (PatternReader) and an upload and
// download checked end to end (VerifyFileRoundTrip). Only tests import it.
package guestprototest

import (
	"context"
	"io"
	"net"
	"sync"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// Transport is the agent's end. Bytes that connected hosts write are queued
// for Read in arrival order; the agent's writes go to the current host.
type Transport struct {
	mu     sync.Mutex
	cond   sync.Cond
	segs   []segment
	out    net.Conn
	queued chan struct{} // of out: closed once its bytes and hang-up are queued
	closed bool
}

// segment is a chunk of host bytes, or (eof) a hang-up.
type segment struct {
	data []byte
	eof  bool
}

var _ guestproto.Transport = (*Transport)(nil)

// New returns a transport with no host connected.
func New() *Transport {
	t := &Transport{}
	t.cond.L = &t.mu
	return t
}

// Connect attaches a new host and returns the host's end of the connection;
// the agent writes to it from now on. When the host closes it and hangup is
// true, the agent's Read reports io.EOF once (the virtio-serial host
// disconnected); with hangup false the agent sees nothing, as a restored VM
// does not see its old host go.
//
// The previous host is disconnected first. The host's Close, and Connect
// when it replaces a host, return once whatever that host wrote, and the
// hang-up, are queued for the agent: bytes of a host connected later come
// after, as on a virtio-serial port, where one host at a time is connected.
func (t *Transport) Connect(hangup bool) net.Conn {
	host, agent := net.Pipe()
	done := make(chan struct{})
	t.mu.Lock()
	old, oldQueued := t.out, t.queued
	t.out, t.queued = agent, done
	t.mu.Unlock()
	if old != nil {
		_ = old.Close()
		<-oldQueued
	}
	go func() {
		defer close(done)
		for {
			buf := make([]byte, 64<<10)
			n, err := agent.Read(buf)
			t.mu.Lock()
			if n > 0 {
				t.segs = append(t.segs, segment{data: buf[:n]})
			}
			if err != nil && hangup {
				t.segs = append(t.segs, segment{eof: true})
			}
			t.cond.Broadcast()
			t.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return &hostConn{Conn: host, queued: done}
}

// hostConn is the host's end of a connection.
type hostConn struct {
	net.Conn
	queued chan struct{} // closed when the transport queued all and the hang-up
}

func (c *hostConn) Close() error {
	err := c.Conn.Close()
	<-c.queued
	return err
}

// Read returns queued host bytes, or io.EOF once per hang-up.
func (t *Transport) Read(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.segs) == 0 && !t.closed {
		t.cond.Wait()
	}
	if t.closed {
		return 0, net.ErrClosed
	}
	s := &t.segs[0]
	if s.eof {
		t.segs = t.segs[1:]
		return 0, io.EOF
	}
	n := copy(p, s.data)
	s.data = s.data[n:]
	if len(s.data) == 0 {
		t.segs = t.segs[1:]
	}
	return n, nil
}

// Write writes to the current host.
func (t *Transport) Write(p []byte) (int, error) {
	t.mu.Lock()
	out := t.out
	t.mu.Unlock()
	if out == nil {
		return 0, io.ErrClosedPipe
	}
	return out.Write(p)
}

// WaitHost waits until host bytes are queued.
func (t *Transport) WaitHost(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		t.mu.Lock()
		t.cond.Broadcast()
		t.mu.Unlock()
	})
	defer stop()
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.segs) == 0 && !t.closed && ctx.Err() == nil {
		t.cond.Wait()
	}
	if t.closed {
		return net.ErrClosed
	}
	return ctx.Err()
}

// Close ends the transport: Read and WaitHost fail with net.ErrClosed.
func (t *Transport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.out != nil {
		_ = t.out.Close()
	}
	t.cond.Broadcast()
	return nil
}
