package hostclient

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
)

var _ host.GuestDialer = (*Client)(nil)

// DialGuest opens a TCP connection to port of the guest of the running
// sandbox id: a connection of its own to the agent (TLS), upgraded to the
// guest's bytes (see hostwire's package documentation). Its errors have
// the classes of the agent's DialGuest's (host.GuestDialer); failing to reach
// the agent is host.ErrUnavailable. ctx bounds the dial only.
func (c *Client) DialGuest(ctx context.Context, id string, port int) (net.Conn, error) {
	u, err := url.Parse(c.base + sandboxPath(id, "/dial"))
	if err != nil {
		return nil, err
	}
	u.RawQuery = url.Values{"port": {strconv.Itoa(port)}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", hostwire.UpgradeProtocol)

	conn, err := c.dialAgent(ctx, u)
	if err != nil {
		return nil, c.transportError(ctx, err)
	}
	// ctx bounds the exchange below: its end unblocks it.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	br := bufio.NewReader(conn)
	res, err := func() (*http.Response, error) {
		if err := req.Write(conn); err != nil {
			return nil, err
		}
		return http.ReadResponse(br, req)
	}()
	if !stop() || err != nil {
		conn.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, c.transportError(ctx, fmt.Errorf("dial port %d of sandbox %s: %w", port, id, err))
	}
	if res.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		if res.StatusCode/100 == 2 {
			return nil, c.transportError(ctx, fmt.Errorf("dial port %d of sandbox %s: host agent answered %s, not 101", port, id, res.Status))
		}
		return nil, hostwire.ReadError(res)
	}
	conn.SetDeadline(time.Time{})
	if br.Buffered() == 0 {
		return conn, nil
	}
	return &bufferedConn{Conn: conn, r: br}, nil
}

// dialAgent opens a connection to the agent: TCP, then TLS for https.
func (c *Client) dialAgent(ctx context.Context, u *url.URL) (net.Conn, error) {
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil || u.Scheme != "https" {
		return conn, err
	}
	cfg := &tls.Config{}
	if c.tls != nil {
		cfg = c.tls.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName = u.Hostname()
	}
	cfg.NextProtos = []string{"http/1.1"}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return tc, nil
}

// bufferedConn is a connection whose first bytes were read ahead.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection, if it can be.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
