package hostapi

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
)

// dial connects the client to a port of a guest: see hostwire's package
// documentation. The connection is not counted by Shutdown (it may last
// for hours); Close ends it.
func (s *Server) dial(w http.ResponseWriter, r *http.Request) {
	if !headerHasToken(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), hostwire.UpgradeProtocol) {
		writeError(w, fmt.Errorf("%w: a dial asks for Connection: Upgrade and Upgrade: %s", host.ErrInvalid, hostwire.UpgradeProtocol))
		return
	}
	port, err := strconv.Atoi(r.URL.Query().Get("port"))
	if err != nil {
		writeError(w, fmt.Errorf("%w: port %q is not a number", host.ErrInvalid, r.URL.Query().Get("port")))
		return
	}
	s.mu.Lock()
	draining := s.draining
	s.mu.Unlock()
	if draining {
		writeError(w, fmt.Errorf("%w: the host agent is shutting down", host.ErrUnavailable))
		return
	}
	guest, err := s.a.DialGuest(r.Context(), chi.URLParam(r, "id"), port)
	if err != nil {
		s.log.Debug("dial guest", "sandbox_id", chi.URLParam(r, "id"), "port", port, "err", err)
		writeError(w, err)
		return
	}
	client, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		guest.Close()
		writeError(w, fmt.Errorf("dial: take over the connection: %w", err))
		return
	}
	t := &tunnel{a: client, b: guest}
	if !s.addTunnel(t) {
		t.close()
		return
	}
	defer s.removeTunnel(t)
	client.SetDeadline(time.Time{})
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + hostwire.UpgradeProtocol + "\r\n\r\n")
	if err := brw.Flush(); err != nil {
		t.close()
		return
	}
	// Bytes the client sent after its request, already read by net/http.
	var fromClient io.Reader = client
	if n := brw.Reader.Buffered(); n > 0 {
		fromClient = io.MultiReader(io.LimitReader(brw.Reader, int64(n)), client)
	}
	t.splice(fromClient)
}

// headerHasToken reports whether the comma-separated header name has
// token (case-insensitively).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// tunnel is a client's connection spliced to a guest's.
type tunnel struct {
	a, b net.Conn // the client's, the guest's
	once sync.Once
}

func (t *tunnel) close() {
	t.once.Do(func() {
		t.a.Close()
		t.b.Close()
	})
}

// splice copies fromA (a's bytes) to b and b to a until both directions
// end. A direction that reaches its end half-closes its destination
// (CloseWrite: a TLS close_notify or a TCP FIN), so that either side may
// finish sending and still read the answer; one that fails closes both.
func (t *tunnel) splice(fromA io.Reader) {
	var wg sync.WaitGroup
	cp := func(dst net.Conn, src io.Reader) {
		defer wg.Done()
		if _, err := io.Copy(dst, src); err == nil {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
				return
			}
		}
		t.close()
	}
	wg.Add(2)
	go cp(t.b, fromA)
	go cp(t.a, t.b)
	wg.Wait()
	t.close()
}

// addTunnel registers t so that Close ends it; false once Close has run.
func (s *Server) addTunnel(t *tunnel) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.closed:
		return false
	default:
	}
	s.tunnels[t] = struct{}{}
	return true
}

func (s *Server) removeTunnel(t *tunnel) {
	s.mu.Lock()
	delete(s.tunnels, t)
	s.mu.Unlock()
}

// closeTunnels ends every tunnel.
func (s *Server) closeTunnels() {
	s.mu.Lock()
	ts := make([]*tunnel, 0, len(s.tunnels))
	for t := range s.tunnels {
		ts = append(ts, t)
	}
	s.mu.Unlock()
	for _, t := range ts {
		t.close()
	}
}
