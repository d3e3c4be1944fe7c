package hostagent

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// Guest returns the guest agent client of a running sandbox: ErrConflict
// if it is not running, ErrNotReady if it was adopted after a restart and
// its guest has not answered yet.
func (a *Agent) Guest(id string) (*guestproto.Client, error) {
	s, err := a.get(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateRunning || s.client == nil {
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, s.state, ErrConflict)
	}
	select {
	case <-s.ready:
	default:
		return nil, fmt.Errorf("sandbox %s: %w", id, ErrNotReady)
	}
	return s.client, nil
}

// DialGuest opens a TCP connection to port (1-65535) of the guest of the
// running sandbox id: through Config.Dial if set, else over the sandbox's
// network (Config.Network: the guest's address), else, on a host without
// sandbox networking, through the guest agent (guestproto.Client.DialPort:
// the agent connects to the port on the guest's loopback and the agent
// channel carries the bytes). The connection is the caller's to close;
// it is not closed when the sandbox stops (the sandbox's network or its
// agent channel going away ends it). Errors: ErrInvalid (port out of
// range), ErrNotFound (no such sandbox), ErrConflict (not running),
// ErrNotReady (adopted, its guest not answering yet; agent channel only),
// syscall.ECONNREFUSED when nothing listens on the port,
// context.DeadlineExceeded on a timeout, errors.ErrUnsupported when the
// host has no sandbox networking and the sandbox's guest agent is too old
// to carry connections, else Config.Dial's or the agent's. Safe for
// concurrent use.
func (a *Agent) DialGuest(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("dial sandbox %s: %w: port %d is not between 1 and 65535", id, ErrInvalid, port)
	}
	s, err := a.get(id)
	if err != nil {
		return nil, err
	}
	if st := s.getState(); st != StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, st, ErrConflict)
	}
	dial := a.cfg.Dial
	switch {
	case dial != nil:
	case a.cfg.Network != nil:
		dial = func(ctx context.Context, _ string, port int) (net.Conn, error) { return dialNet(ctx, s, port) }
	default:
		dial = a.dialAgent
	}
	c, err := dial(ctx, id, port)
	if err != nil {
		return nil, fmt.Errorf("dial port %d of sandbox %s: %w", port, id, err)
	}
	return c, nil
}

// dialAgent connects to port of sandbox id's guest through its guest
// agent: the way in when the host has no network to its guests.
func (a *Agent) dialAgent(ctx context.Context, id string, port int) (net.Conn, error) {
	c, err := a.Guest(id)
	if err != nil {
		return nil, err
	}
	return c.DialPort(ctx, port)
}

// Exec runs a command in a sandbox; see guestproto.Client.Exec.
func (a *Agent) Exec(ctx context.Context, id string, req guestproto.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (guestproto.ExecResult, error) {
	c, err := a.Guest(id)
	if err != nil {
		return guestproto.ExecResult{}, err
	}
	return c.Exec(ctx, req, stdin, stdout, stderr)
}
