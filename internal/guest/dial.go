package guest

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"syscall"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// dial serves a dial stream: it connects to the OPEN's port on the
// guest's loopback and carries the connection (guestproto.ServeConn).
//
// Protocol: REPLY {} once connected, then the connection's bytes both
// ways; REPLY {error} if not: refused (nothing listens), timeout (no
// answer within guestproto.GuestDialTimeout), busy (MaxGuestDials
// connections carried already), invalid (a port out of range). The
// address is 127.0.0.1, then ::1 if 127.0.0.1 refused: a server listening
// on "localhost" may have taken either. A RESET from the host, or the
// session's end, closes the connection; so does the agent's stop (ctx).
func (s *Server) dial(ctx context.Context, st *guestproto.Stream, req *guestproto.OpenRequest) {
	if err := guestproto.ValidPort(req.Port); err != nil {
		replyErr(st, err)
		return
	}
	if s.dials.Add(1) > guestproto.MaxGuestDials {
		s.dials.Add(-1)
		replyErr(st, guestproto.Errorf(guestproto.CodeBusy, "the guest agent carries %d connections already, the most it may", guestproto.MaxGuestDials))
		return
	}
	defer s.dials.Add(-1)
	dctx, cancel := context.WithTimeout(ctx, guestproto.GuestDialTimeout)
	// The host gave up (RESET): stop connecting.
	stop := make(chan struct{})
	go func() {
		select {
		case <-st.Done():
			cancel()
		case <-stop:
		}
	}()
	conn, err := dialLoopback(dctx, req.Port)
	close(stop)
	cancel()
	if err != nil {
		replyErr(st, dialError(req.Port, err))
		return
	}
	guestproto.ServeConn(ctx, st, conn)
}

// dialLoopback connects to port on 127.0.0.1, or on ::1 if 127.0.0.1
// refuses.
func dialLoopback(ctx context.Context, port int) (net.Conn, error) {
	var d net.Dialer
	p := strconv.Itoa(port)
	conn, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", p))
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		return conn, err
	}
	if conn6, err6 := d.DialContext(ctx, "tcp6", net.JoinHostPort("::1", p)); err6 == nil {
		return conn6, nil
	}
	return nil, err
}

// dialError is the protocol's error of a failed connect to port.
func dialError(port int, err error) *guestproto.Error {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return guestproto.Errorf(guestproto.CodeRefused, "nothing listens on port %d (connection refused)", port)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT):
		return guestproto.Errorf(guestproto.CodeTimeout, "port %d did not accept the connection within %v", port, guestproto.GuestDialTimeout)
	case errors.Is(err, context.Canceled):
		return guestproto.Errorf(guestproto.CodeCanceled, "the connection to port %d was canceled", port)
	}
	return guestproto.Errorf(guestproto.CodeInternal, "connect to port %d: %v", port, err)
}
