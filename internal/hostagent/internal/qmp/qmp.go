// Package qmp is a small client for the QEMU Machine Protocol over a unix
// socket: capability negotiation, synchronous commands (optionally passing
// file descriptors with SCM_RIGHTS) and an event stream. One Client serves
// one connection; commands from several goroutines are serialized.
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Error is an error reply from QEMU.
type Error struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *Error) Error() string { return fmt.Sprintf("qmp %s: %s", e.Class, e.Desc) }

// Event is an asynchronous QMP event.
type Event struct {
	Name string          `json:"event"`
	Data json.RawMessage `json:"data"`
}

// ErrClosed is returned for commands on a closed or broken connection.
var ErrClosed = errors.New("qmp connection closed")

type reply struct {
	Return json.RawMessage `json:"return"`
	Error  *Error          `json:"error"`
	Event  string          `json:"event"`
	Data   json.RawMessage `json:"data"`
	ID     json.RawMessage `json:"id"`
}

// Client is a QMP connection.
type Client struct {
	conn *net.UnixConn

	mu      sync.Mutex // serializes commands
	replies chan reply

	events    chan Event
	closeOnce sync.Once
	closed    atomic.Bool
	done      chan struct{}
	readErr   error
}

// Dial connects to the QMP socket at path, retrying until ctx is done (the
// socket appears shortly after QEMU starts), and negotiates capabilities.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			cl, err := newClient(ctx, c.(*net.UnixConn))
			if err != nil {
				c.Close()
				return nil, err
			}
			return cl, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial qmp %s: %w", path, err)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func newClient(ctx context.Context, c *net.UnixConn) (*Client, error) {
	cl := &Client{
		conn:    c,
		replies: make(chan reply, 1),
		events:  make(chan Event, 64),
		done:    make(chan struct{}),
	}
	br := bufio.NewReaderSize(c, 64<<10)
	// Greeting.
	if dl, ok := ctx.Deadline(); ok {
		c.SetReadDeadline(dl)
	}
	line, err := readLine(br)
	if err != nil {
		return nil, fmt.Errorf("read qmp greeting: %w", err)
	}
	var greet struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if err := json.Unmarshal(line, &greet); err != nil || greet.QMP == nil {
		return nil, fmt.Errorf("unexpected qmp greeting %q", line)
	}
	c.SetReadDeadline(time.Time{})
	go cl.readLoop(br)
	if err := cl.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		cl.Close()
		return nil, err
	}
	return cl, nil
}

func (c *Client) readLoop(br *bufio.Reader) {
	defer close(c.done)
	defer close(c.events)
	for {
		line, err := readLine(br)
		if err != nil {
			c.readErr = err
			if errors.Is(err, errLineTooLong) {
				c.Close() // out of step for good; stop it sending
			}
			return
		}
		var r reply
		if err := json.Unmarshal(line, &r); err != nil {
			continue
		}
		if r.Event != "" {
			select {
			case c.events <- Event{Name: r.Event, Data: r.Data}:
			default: // nobody listening fast enough; events are advisory
			}
			continue
		}
		select {
		case c.replies <- r:
		default:
		}
	}
}

// maxLine bounds one line from QEMU (a reply or an event; the largest,
// human-monitor-command's text, are kilobytes): a peer that never ends its
// line (a VMM taken over by its guest) must not make the client buffer
// without bound.
const maxLine = 16 << 20

var errLineTooLong = fmt.Errorf("qmp line longer than %d bytes", maxLine)

// readLine reads one line, its newline included, of at most maxLine bytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > maxLine {
			return nil, errLineTooLong
		}
		line = append(line, frag...)
		if err != bufio.ErrBufferFull {
			return line, err
		}
	}
}

// Events returns the event stream. It is closed when the connection ends.
// Events are dropped when the buffer is full.
func (c *Client) Events() <-chan Event { return c.events }

// Done is closed when the connection ends (QEMU exited or Close).
func (c *Client) Done() <-chan struct{} { return c.done }

// Execute runs a command with args (marshalled to JSON, nil for none) and
// decodes its return value into out (nil to ignore).
func (c *Client) Execute(ctx context.Context, cmd string, args any, out any) error {
	return c.ExecuteWithFDs(ctx, cmd, args, out, nil)
}

// ExecuteWithFDs is Execute that passes fds along with the command
// (SCM_RIGHTS), as getfd and add-fd expect.
func (c *Client) ExecuteWithFDs(ctx context.Context, cmd string, args any, out any, fds []int) error {
	msg := map[string]any{"execute": cmd}
	if args != nil {
		msg["arguments"] = args
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("encode qmp %s: %w", cmd, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.Closed() {
		return fmt.Errorf("qmp %s: %w", cmd, ErrClosed)
	}
	// A deadline from an earlier command must not outlive it.
	dl, _ := ctx.Deadline()
	c.conn.SetWriteDeadline(dl)
	if len(fds) > 0 {
		_, _, err = c.conn.WriteMsgUnix(b, unix.UnixRights(fds...), nil)
	} else {
		_, err = c.conn.Write(b)
	}
	if err != nil {
		return fmt.Errorf("send qmp %s: %w", cmd, err)
	}
	select {
	case r := <-c.replies:
		return r.result(cmd, out)
	case <-c.done:
		// The read loop hands a reply over before it ends: one that came
		// just before QEMU hung up (or exited) is the answer.
		select {
		case r := <-c.replies:
			return r.result(cmd, out)
		default:
		}
		return fmt.Errorf("qmp %s: %w", cmd, ErrClosed)
	case <-ctx.Done():
		// The reply may still arrive; the connection is now out of step,
		// so close it rather than hand a stale reply to the next command.
		c.Close()
		return fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
	}
}

// result is what the reply r to cmd means: its error, or its return
// value decoded into out (nil to ignore).
func (r reply) result(cmd string, out any) error {
	if r.Error != nil {
		return fmt.Errorf("qmp %s: %w", cmd, r.Error)
	}
	if out != nil && len(r.Return) > 0 {
		if err := json.Unmarshal(r.Return, out); err != nil {
			return fmt.Errorf("decode qmp %s reply: %w", cmd, err)
		}
	}
	return nil
}

// Close closes the connection. Idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.conn.Close()
	})
	return nil
}

// Closed reports whether the connection can no longer carry commands: it
// was closed (by Close, or by a command whose ctx ended before its reply)
// or it ended (QEMU exited or closed it).
func (c *Client) Closed() bool {
	if c.closed.Load() {
		return true
	}
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}
