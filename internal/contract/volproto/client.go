package volproto

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"io"
	"sync"
	"syscall"
)

// Client is the guest's end of the volume protocol: it sends requests on
// the stream attached last and matches the answers to them.
//
// The stream comes and goes (a session ends at a restore or a fork; the
// host opens a new one): while no stream is attached, requests wait; when
// a stream ends, the requests outstanding on it are re-sent, marked
// FlagRetry, on the next one. A request waits until it is answered or its
// ctx ends (a FUSE interrupt): a volume behaves as a hard NFS mount.
//
// Request ids start at a random value, so that the ids of two clones of
// one guest (fork children) do not collide with their parent's past ones
// in a pattern.
type Client struct {
	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]*call
	conn    io.ReadWriteCloser // nil while detached
	gen     uint64             // attachments so far

	wmu sync.Mutex // one message written at a time
}

type call struct {
	req     *Request
	sentGen uint64 // the attachment it was last sent on (0: never)
	done    chan *Response
}

// NewClient returns a client with no stream attached.
func NewClient() *Client {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Client{nextID: binary.BigEndian.Uint64(b[:]) >> 1, pending: make(map[uint64]*call)}
}

// Do sends req (its ID is set here) and returns the host's answer. It
// fails only when ctx ends (with EINTR); an answer's errno is in the
// Response.
func (c *Client) Do(ctx context.Context, req *Request) (*Response, error) {
	cl := &call{req: req, done: make(chan *Response, 1)}
	c.mu.Lock()
	c.nextID++
	req.ID = c.nextID
	c.pending[req.ID] = cl
	conn, gen := c.conn, c.gen
	if conn != nil {
		cl.sentGen = gen
	}
	c.mu.Unlock()
	if conn != nil {
		c.send(conn, req)
	}
	select {
	case r := <-cl.done:
		return r, nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, req.ID)
		c.mu.Unlock()
		return nil, syscall.EINTR
	}
}

// send writes req on conn; a failed write closes conn, which ends its
// Serve and so makes the request wait for the next stream.
func (c *Client) send(conn io.ReadWriteCloser, req *Request) {
	b := AppendRequest(make([]byte, 0, 128+len(req.Path)+len(req.Path2)+len(req.Data)), req)
	c.wmu.Lock()
	_, err := conn.Write(b)
	c.wmu.Unlock()
	if err != nil {
		conn.Close()
	}
}

// Serve attaches conn, replacing (and closing) the stream attached
// before; sends it the requests waiting or outstanding (re-sent ones
// marked FlagRetry); and reads the answers until conn ends, which it
// returns with (nil at a clean end). A malformed answer ends the stream
// (and closes conn): its requests are re-sent on the next. An answer to
// no outstanding request (one whose ctx ended) is dropped.
func (c *Client) Serve(conn io.ReadWriteCloser) error {
	c.mu.Lock()
	old := c.conn
	c.gen++
	gen := c.gen
	c.conn = conn
	var resend []*Request
	for _, cl := range c.pending {
		r := *cl.req // a send of the previous stream may be encoding cl.req
		if cl.sentGen != 0 {
			r.Flags |= FlagRetry
		}
		cl.sentGen = gen
		resend = append(resend, &r)
	}
	c.mu.Unlock()
	if old != nil {
		old.Close()
	}
	defer func() {
		c.mu.Lock()
		if c.gen == gen {
			c.conn = nil
		}
		c.mu.Unlock()
		conn.Close()
	}()
	go func() {
		for _, r := range resend {
			c.send(conn, r)
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		body, err := ReadMessage(conn, buf)
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		resp, err := DecodeResponse(body)
		if err != nil {
			return err
		}
		if resp.Data != nil {
			// body is reused for the next message.
			resp.Data = append([]byte(nil), resp.Data...)
		}
		c.mu.Lock()
		cl := c.pending[resp.ID]
		if cl != nil && cl.sentGen == gen {
			delete(c.pending, resp.ID)
		} else {
			cl = nil
		}
		c.mu.Unlock()
		if cl != nil {
			cl.done <- resp
		}
	}
}

// Detach ends the attached stream, if any (its Serve returns); requests
// outstanding on it wait for the next.
func (c *Client) Detach() {
	c.mu.Lock()
	conn := c.conn
	c.conn = nil
	c.gen++
	c.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

// Outstanding is the number of requests sent or waiting, not answered.
func (c *Client) Outstanding() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}
