package daemon

import (
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// serveOptions say how startServing serves: the HTTP timeouts of the REST
// API and of the host API (docs/configuration.md). Neither server has a
// whole-request ReadTimeout or WriteTimeout: exec streams, event streams
// and transfers of many GB last as long as they last. What they bound is
// each wait for the client instead:
//   - readHeader: the TLS handshake (host API) and a request's headers,
//     from the start of the connection or the end of the previous request;
//   - idle: a keep-alive connection between requests;
//   - bodyRead: each read of a request body, so a client that stops
//     sending mid-body (a JSON body, an upload) is cut off, while an upload
//     that keeps moving runs for any time. Not a deadline on the whole body:
//     a handler that reads slowly (the guest is slow to take an upload) is
//     not timed while it is not reading.
//
// Zero turns a timeout off.
type serveOptions struct {
	readHeader, idle, bodyRead time.Duration
	// bodyMayIdle are requests whose body may pause for any time (an
	// exec's stdin on the host API); bodyRead does not apply to them.
	bodyMayIdle func(*http.Request) bool
	// log receives the HTTP server's own errors (TLS handshakes, panics).
	log *slog.Logger
}

// serveOptions are cfg's HTTP timeouts.
func (c *Config) serveOptions(log *slog.Logger) serveOptions {
	return serveOptions{
		readHeader: time.Duration(c.HTTPReadHeaderTimeout),
		idle:       time.Duration(c.HTTPIdleTimeout),
		bodyRead:   time.Duration(c.HTTPBodyReadTimeout),
		log:        log,
	}
}

// httpServer is the http.Server of h with opts.
func (o serveOptions) httpServer(h http.Handler) *http.Server {
	if o.bodyRead > 0 {
		h = bodyReadTimeout(h, o.bodyRead, o.bodyMayIdle)
	}
	// No ReadTimeout: zero header and idle timeouts are then none.
	hs := &http.Server{Handler: h, ReadHeaderTimeout: o.readHeader, IdleTimeout: o.idle}
	if o.log != nil {
		hs.ErrorLog = log.New(serverLog{o.log}, "", 0)
	}
	return hs
}

// serverLog logs an http.Server's errors: at warn, but for a connection
// that closed before its TLS handshake (a TCP health check, a port scan):
// debug.
type serverLog struct{ log *slog.Logger }

func (l serverLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	lvl := slog.LevelWarn
	if strings.Contains(msg, "TLS handshake error") && strings.HasSuffix(msg, ": EOF") {
		lvl = slog.LevelDebug
	}
	l.log.Log(context.Background(), lvl, "http server", "err", msg)
	return len(p), nil
}

// bodyReadTimeout fails a read of a request body that waits more than d
// for the client (but for requests that exempt says may idle).
func bodyReadTimeout(h http.Handler, d time.Duration, exempt func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody && (exempt == nil || !exempt(r)) {
			b := &timedBody{ReadCloser: r.Body, rc: http.NewResponseController(w), d: d}
			// Also bounds net/http's read of what the handler left unread
			// (after it returns, to reuse the connection).
			if b.rc.SetReadDeadline(time.Now().Add(d)) == nil {
				r.Body = b
			}
		}
		h.ServeHTTP(w, r)
	})
}

// timedBody sets the connection's read deadline before each read of the
// body. At the body's end it clears it: net/http then reads the connection
// in the background to notice a client that goes away (and cancel the
// request's context), which must not time out. After a failed read it
// leaves it passed: net/http gives up on the connection at once instead of
// waiting for the rest of the body.
type timedBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	d    time.Duration
	done bool // the body ended or failed: no more deadlines
}

func (b *timedBody) Read(p []byte) (int, error) {
	if b.done {
		return b.ReadCloser.Read(p)
	}
	b.rc.SetReadDeadline(time.Now().Add(b.d))
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	default:
		b.done = true
		b.rc.SetReadDeadline(time.Now())
	}
	return n, err
}
