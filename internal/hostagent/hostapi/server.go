package hostapi

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/recoverer"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent"
)

// Server serves one host agent's API. Create it with NewServer, wire
// SandboxExited into agent.Config.OnExit, serve it as an http.Handler; at
// shutdown call Shutdown, then Close.
type Server struct {
	a       *hostagent.Agent
	token   [sha256.Size]byte
	log     *slog.Logger
	handler http.Handler

	mu   sync.Mutex
	subs map[chan hostwire.Event]struct{}
	// subscribed is closed when the next client subscribes to events (for
	// WaitSubscriber); nil when nobody waits.
	subscribed chan struct{}
	active     int           // requests in flight, event streams excepted
	idle       chan struct{} // closed when active drops to 0 while draining
	draining   bool
	closed     chan struct{} // closed by Close: event streams and tunnels end
	tunnels    map[*tunnel]struct{}

	// builds and contextDir serve template builds (ServeBuilds; builds.go).
	builds     builds.Builder
	contextDir string
}

// NewServer returns the API of a (serving requests only with the given
// token). It starts no goroutines.
func NewServer(a *hostagent.Agent, token string, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{a: a, token: sha256.Sum256([]byte(token)), log: log, subs: map[chan hostwire.Event]struct{}{}, closed: make(chan struct{}), tunnels: map[*tunnel]struct{}{}}
	s.handler = s.routes()
	return s
}

// BodyMayIdle reports whether the body of r may rightly pause for any
// time: an exec's stdin, which is a process's input, not an upload. An HTTP
// server's body read timeout must not apply to it (the process's own
// timeout does).
func BodyMayIdle(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, hostwire.Prefix+"/sandboxes/") && strings.HasSuffix(r.URL.Path, "/exec")
}

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

func (s *Server) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(recoverer.New(s.log, func(w http.ResponseWriter, r *http.Request, err error) { writeError(w, err) }))
	// Liveness, for supervisors: no token, no information.
	r.Get("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.With(s.authenticate).Get(hostwire.Prefix+"/events", s.events)
	// Dials outlive requests: not tracked, ended by Close.
	r.With(s.authenticate).Get(hostwire.Prefix+"/sandboxes/{id}/dial", s.dial)
	// Attaches, waits and watches last as long as the client wants: not
	// tracked either, ended by Close.
	r.With(s.authenticate, s.untilClosed).Group(s.streamRoutes)
	r.With(s.authenticate, s.untilClosed).Get(hostwire.Prefix+"/template-builds/{buildID}/log", s.buildLog)
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate, s.track)
		r.Get(hostwire.Prefix+"/info", s.json(func(r *http.Request) (any, error) { return s.info(), nil }))
		r.Get(hostwire.Prefix+"/sandboxes", s.json(func(r *http.Request) (any, error) {
			return map[string]any{"sandboxes": s.a.List()}, nil
		}))
		r.Post(hostwire.Prefix+"/sandboxes", s.create)
		r.Get(hostwire.Prefix+"/sandboxes/{id}", s.json(func(r *http.Request) (any, error) { return s.a.Get(chi.URLParam(r, "id")) }))
		r.Delete(hostwire.Prefix+"/sandboxes/{id}", s.json(func(r *http.Request) (any, error) {
			return nil, s.a.Kill(r.Context(), chi.URLParam(r, "id"))
		}))
		r.Get(hostwire.Prefix+"/sandboxes/{id}/memory", s.json(func(r *http.Request) (any, error) { return s.a.Memory(chi.URLParam(r, "id")) }))
		r.Post(hostwire.Prefix+"/sandboxes/{id}/fork", s.json(s.fork))
		r.Post(hostwire.Prefix+"/sandboxes/{id}/snapshot", s.json(func(r *http.Request) (any, error) {
			var req hostwire.SnapshotRequest
			if err := decode(r, &req); err != nil {
				return nil, err
			}
			if r.URL.Query().Get("transient") == "true" {
				return contract(s.a.SnapshotTransient(r.Context(), chi.URLParam(r, "id"), req.SnapshotID))
			}
			return contract(s.a.Snapshot(r.Context(), chi.URLParam(r, "id"), req.SnapshotID))
		}))
		r.Get(hostwire.Prefix+"/snapshots/{snapID}/stored", s.json(func(r *http.Request) (any, error) {
			ms, err := strconv.ParseInt(r.URL.Query().Get("wait_ms"), 10, 64)
			if err != nil || ms < 0 {
				return nil, fmt.Errorf("%w: wait_ms must be a number of milliseconds", host.ErrInvalid)
			}
			return contract(s.a.AwaitStored(r.Context(), chi.URLParam(r, "snapID"), min(time.Duration(ms)*time.Millisecond, hostwire.MaxStoredWait)))
		}))
		r.Get(hostwire.Prefix+"/snapshots/{snapID}/pack", s.sendPack)
		r.Post(hostwire.Prefix+"/snapshots/{snapID}/pack", s.receivePack)
		r.Post(hostwire.Prefix+"/snapshots/{snapID}/pack/create", s.receivePackCreate)
		r.Post(hostwire.Prefix+"/snapshots/{snapID}/pack/pull", s.pullPackCreate)
		r.Get(hostwire.Prefix+"/snapshots", s.json(func(r *http.Request) (any, error) {
			sis := s.a.Snapshots()
			out := make([]host.SnapshotInfo, len(sis))
			for i, si := range sis {
				out[i] = si.Contract()
			}
			return map[string]any{"snapshots": out}, nil
		}))
		r.Delete(hostwire.Prefix+"/snapshots/{snapID}", s.json(func(r *http.Request) (any, error) {
			return nil, s.a.DeleteSnapshot(chi.URLParam(r, "snapID"))
		}))
		r.Post(hostwire.Prefix+"/sandboxes/{id}/pause", s.json(func(r *http.Request) (any, error) { return s.a.Pause(r.Context(), chi.URLParam(r, "id")) }))
		r.Post(hostwire.Prefix+"/sandboxes/{id}/resume", s.json(func(r *http.Request) (any, error) { return s.a.Resume(r.Context(), chi.URLParam(r, "id")) }))
		r.Put(hostwire.Prefix+"/sandboxes/{id}/network", s.json(func(r *http.Request) (any, error) {
			var p netpolicy.Policy
			if err := decode(r, &p); err != nil {
				return nil, err
			}
			return nil, s.a.SetNetwork(r.Context(), chi.URLParam(r, "id"), p)
		}))

		r.Get(hostwire.Prefix+"/templates", s.json(func(r *http.Request) (any, error) {
			list, err := hostagent.Local(s.a).Templates().List(r.Context())
			return map[string]any{"templates": list}, err
		}))
		r.Get(hostwire.Prefix+"/templates/names", s.json(func(r *http.Request) (any, error) {
			return map[string]any{"names": s.a.Templates().Names()}, nil
		}))
		r.Post(hostwire.Prefix+"/templates/lookup", s.json(func(r *http.Request) (any, error) {
			var p templates.Params
			if err := decode(r, &p); err != nil {
				return nil, err
			}
			t, reason, err := hostagent.Local(s.a).Templates().Lookup(r.Context(), p)
			return hostwire.LookupReply{Template: t, StaleReason: reason}, err
		}))
		r.Post(hostwire.Prefix+"/templates/bake", s.bake)
		s.buildRoutes(r) // builds.go
		// The user templates' sets in the object store this agent shares
		// (the control plane's sweep of sets its registry does not know).
		r.Get(hostwire.Prefix+"/user-templates/stored", s.json(func(r *http.Request) (any, error) {
			refs, err := s.a.StoredUserTemplates(r.Context())
			return map[string]any{"templates": refs}, err
		}))
		r.Delete(hostwire.Prefix+"/user-templates/stored/{name}/{version}", s.json(func(r *http.Request) (any, error) {
			v, err := strconv.Atoi(chi.URLParam(r, "version"))
			if err != nil || v < 1 {
				return nil, fmt.Errorf("%w: version %q is not a positive number", host.ErrInvalid, chi.URLParam(r, "version"))
			}
			return nil, s.a.UnpublishUserTemplate(r.Context(), chi.URLParam(r, "name"), []int{v})
		}))

		s.volumeRoutes(r) // volumes.go
		r.Post(hostwire.Prefix+"/sandboxes/{id}/exec", s.exec)
		s.processRoutes(r)
		r.Get(hostwire.Prefix+"/sandboxes/{id}/files", s.readFile)
		r.Put(hostwire.Prefix+"/sandboxes/{id}/files", s.writeFile)
		r.Delete(hostwire.Prefix+"/sandboxes/{id}/files", s.guestJSON(func(r *http.Request, g *guestproto.Client) (any, error) {
			recursive, _ := strconv.ParseBool(r.URL.Query().Get("recursive"))
			return nil, g.Remove(r.Context(), r.URL.Query().Get("path"), recursive)
		}))
		r.Get(hostwire.Prefix+"/sandboxes/{id}/files/list", s.guestJSON(func(r *http.Request, g *guestproto.Client) (any, error) {
			list, err := g.ListDir(r.Context(), r.URL.Query().Get("path"))
			return map[string]any{"entries": list}, err
		}))
		r.Get(hostwire.Prefix+"/sandboxes/{id}/files/stat", s.guestJSON(func(r *http.Request, g *guestproto.Client) (any, error) {
			return g.Stat(r.Context(), r.URL.Query().Get("path"))
		}))
		r.Post(hostwire.Prefix+"/sandboxes/{id}/files/mkdir", s.guestJSON(func(r *http.Request, g *guestproto.Client) (any, error) {
			var req hostwire.PathRequest
			if err := decode(r, &req); err != nil {
				return nil, err
			}
			return nil, g.Mkdir(r.Context(), req.Path)
		}))
		r.Post(hostwire.Prefix+"/sandboxes/{id}/files/rename", s.guestJSON(func(r *http.Request, g *guestproto.Client) (any, error) {
			var req hostwire.RenameRequest
			if err := decode(r, &req); err != nil {
				return nil, err
			}
			return nil, g.Rename(r.Context(), req.From, req.To)
		}))
	})
	// A request this agent has no endpoint for comes from a control plane
	// of another version: unsupported (501), not "not found" (which the
	// server would report as the sandbox missing) nor unavailable (which
	// says retry).
	noEndpoint := func(w http.ResponseWriter, r *http.Request) {
		writeError(w, fmt.Errorf("%w: the host agent has no endpoint %s %s (is it another version than the server?)", errors.ErrUnsupported, r.Method, r.URL.Path))
	}
	r.NotFound(noEndpoint)
	r.MethodNotAllowed(noEndpoint)
	return r
}

func (s *Server) info() hostwire.Info {
	return hostwire.Info{Accel: s.a.Accel(), Defaults: s.a.TemplateParams("", 0, 0), Resources: host.LocalResources(), NetworkOff: s.a.NetworkOff()}
}

func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Another host agent fetching a pack the control plane sent it
		// for (PackTicket): that pack, and nothing else.
		if t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Ticket "); ok {
			if id, ok := packOf(r); ok && hostwire.TicketGrants(s.token, t, id, time.Now()) {
				next.ServeHTTP(w, r)
				return
			}
			writeError(w, fmt.Errorf("%w: the ticket does not grant %s %s (expired, or another snapshot's)", hostwire.ErrUnauthorized, r.Method, r.URL.Path))
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], s.token[:]) != 1 {
			writeError(w, fmt.Errorf("%w: send Authorization: Bearer <agent token>", hostwire.ErrUnauthorized))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// packOf is the snapshot whose pack r asks for (GET
// /snapshots/{id}/pack), if it does.
func packOf(r *http.Request) (string, bool) {
	if r.Method != http.MethodGet {
		return "", false
	}
	id, ok := strings.CutPrefix(r.URL.Path, hostwire.Prefix+"/snapshots/")
	if !ok {
		return "", false
	}
	if id, ok = strings.CutSuffix(id, "/pack"); !ok || !host.ValidID(id) {
		return "", false
	}
	return id, true
}

// track counts requests in flight so that Shutdown can wait for them, and
// refuses new ones once it has been called.
func (s *Server) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.draining {
			s.mu.Unlock()
			writeError(w, fmt.Errorf("%w: the host agent is shutting down", host.ErrUnavailable))
			return
		}
		s.active++
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.active--
			if s.active == 0 && s.idle != nil {
				close(s.idle)
				s.idle = nil
			}
			s.mu.Unlock()
		}()
		next.ServeHTTP(w, r)
	})
}

// Shutdown refuses new requests (event streams excepted) and waits until
// those in flight have finished or ctx ends. Exit events sent after it
// still reach connected clients, until Close.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.draining = true
	if s.active == 0 {
		s.mu.Unlock()
		return nil
	}
	if s.idle == nil {
		s.idle = make(chan struct{})
	}
	idle := s.idle
	s.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// WaitSubscriber returns true once a client follows the event stream (at
// once if one does), false if ctx ends first. A shutdown that stops
// sandboxes waits a little for the control plane, which may be
// reconnecting, so that it hears why they stopped.
func (s *Server) WaitSubscriber(ctx context.Context) bool {
	s.mu.Lock()
	if len(s.subs) > 0 {
		s.mu.Unlock()
		return true
	}
	if s.subscribed == nil {
		s.subscribed = make(chan struct{})
	}
	ch := s.subscribed
	s.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// Close ends every event stream and dial and refuses new ones.
// Idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	s.draining = true
	select {
	case <-s.closed:
	default:
		close(s.closed)
	}
	s.mu.Unlock()
	s.closeTunnels()
	return nil
}

// SandboxExited tells connected clients that a sandbox stopped without
// being killed through this API: its VMM exited (wire it into
// agent.Config.OnExit), or, when err is host.ErrHostShutdown, the agent
// stopped it as it shut down. A client too slow to take the event loses
// its stream and reconciles when it reconnects.
func (s *Server) SandboxExited(id string, err error) {
	ev := hostwire.Event{Type: hostwire.EventExit, ID: id, Reason: hostwire.ReasonExited}
	if errors.Is(err, host.ErrHostShutdown) {
		ev.Reason = hostwire.ReasonShutdown
	}
	if err != nil {
		ev.Error = err.Error()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.subs {
		select {
		case ch <- ev:
		default:
			delete(s.subs, ch)
			close(ch)
		}
	}
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	ch := make(chan hostwire.Event, 256)
	s.mu.Lock()
	select {
	case <-s.closed:
		s.mu.Unlock()
		writeError(w, fmt.Errorf("%w: the host agent is shutting down", host.ErrUnavailable))
		return
	default:
	}
	s.subs[ch] = struct{}{}
	if s.subscribed != nil {
		close(s.subscribed)
		s.subscribed = nil
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if _, ok := s.subs[ch]; ok {
			delete(s.subs, ch)
			close(ch)
		}
		s.mu.Unlock()
	}()
	out := newNDJSON(w)
	// Subscribed before hello: whatever happens after the client's
	// reconciliation on hello reaches it.
	info := s.info()
	if out.send(hostwire.Event{Type: hostwire.EventHello, Info: &info}) != nil {
		return
	}
	ping := time.NewTicker(hostwire.PingInterval)
	defer ping.Stop()
	for {
		var ev hostwire.Event
		select {
		case <-r.Context().Done():
			return
		case <-s.closed:
			// Whatever was queued before Close still goes out: the exits
			// of the sandboxes a shutdown stopped are the last events.
			for {
				select {
				case e, ok := <-ch:
					if !ok || out.send(e) != nil {
						return
					}
				default:
					return
				}
			}
		case <-ping.C:
			ev = hostwire.Event{Type: hostwire.EventPing}
		case e, ok := <-ch:
			if !ok {
				s.log.Warn("event stream too slow; dropping it", "remote", r.RemoteAddr)
				return
			}
			ev = e
		}
		if out.send(ev) != nil {
			return
		}
	}
}

// ndjson writes one JSON value a line, flushing each.
type ndjson struct {
	mu  sync.Mutex
	enc *json.Encoder
	rc  *http.ResponseController
}

func newNDJSON(w http.ResponseWriter) *ndjson {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	return &ndjson{enc: json.NewEncoder(w), rc: rc}
}

func (n *ndjson) send(v any) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.enc.Encode(v); err != nil {
		return err
	}
	return n.rc.Flush()
}

// json adapts an operation that returns a value (nil: 204) or an error.
func (s *Server) json(fn func(r *http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := fn(r)
		if err != nil {
			s.log.Debug("host api request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			writeError(w, err)
			return
		}
		if v == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

// guestJSON is json for an operation on a sandbox's guest agent.
func (s *Server) guestJSON(fn func(r *http.Request, g *guestproto.Client) (any, error)) http.HandlerFunc {
	return s.json(func(r *http.Request) (any, error) {
		g, err := s.a.Guest(chi.URLParam(r, "id"))
		if err != nil {
			return nil, err
		}
		return fn(r, g)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	status, we := hostwire.EncodeError(err)
	writeJSON(w, status, hostwire.ErrorBody{Error: we})
}

// decode reads a JSON request body (at most 1 MiB).
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: malformed request: %v", host.ErrInvalid, err)
	}
	return nil
}

// create restores a new sandbox. With ?progress=1 it answers NDJSON: the
// progress of what the create must do first (fetch or bake its template),
// then done with the sandbox's Info, or error.
func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req hostwire.CreateRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	hreq := req.Contract()
	if r.URL.Query().Get("progress") != "1" {
		s.json(func(r *http.Request) (any, error) { return s.a.Create(r.Context(), hreq) })(w, r)
		return
	}
	streamProgress(w, func(progress func(string)) (hostwire.ProgressEvent, error) {
		hreq.Progress = progress
		info, err := s.a.Create(r.Context(), hreq)
		if err != nil {
			s.log.Debug("host api request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		}
		return hostwire.ProgressEvent{Info: &info}, err
	})
}

// streamProgress answers NDJSON: a progress event for each line fn reports,
// then fn's done event (Type set here), or its error.
func streamProgress(w http.ResponseWriter, fn func(progress func(string)) (hostwire.ProgressEvent, error)) {
	out := newNDJSON(w)
	done, err := fn(func(msg string) { out.send(hostwire.ProgressEvent{Type: hostwire.ProgressLine, Message: msg}) })
	if err != nil {
		_, we := hostwire.EncodeError(err)
		out.send(hostwire.ProgressEvent{Type: hostwire.ProgressError, Error: &we})
		return
	}
	done.Type = hostwire.ProgressDone
	out.send(done)
}

func (s *Server) fork(r *http.Request) (any, error) {
	var req hostwire.ForkRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	res, err := s.a.Fork(r.Context(), chi.URLParam(r, "id"), req.IDs)
	if err != nil {
		return nil, err
	}
	return forkReply(res), nil
}

// forkReply is res on the wire.
func forkReply(res hostagent.ForkResult) hostwire.ForkReply {
	out := hostwire.ForkReply{Capture: res.Capture, Children: make([]hostwire.ForkChild, len(res.Children))}
	for i, c := range res.Children {
		out.Children[i].Info = c.Info
		if c.Err != nil {
			_, we := hostwire.EncodeError(c.Err)
			out.Children[i].Error = &we
		}
	}
	return out
}

func (s *Server) bake(w http.ResponseWriter, r *http.Request) {
	var p templates.Params
	if err := decode(r, &p); err != nil {
		writeError(w, err)
		return
	}
	streamProgress(w, func(progress func(string)) (hostwire.ProgressEvent, error) {
		t, err := hostagent.Local(s.a).Templates().Bake(r.Context(), p, progress)
		return hostwire.ProgressEvent{Template: t}, err
	})
}

// writeErrorUnread answers err to a full-duplex request whose body may not
// have been read to its end, and closes the connection after it. (Keeping
// it would have net/http finish reading the body after the handler and
// then read the next request concurrently with its own background read:
// "invalid concurrent Body.Read call", Go 1.26.)
func writeErrorUnread(w http.ResponseWriter, err error) {
	w.Header().Set("Connection", "close")
	writeError(w, err)
}

// readRequestLine reads the JSON line that begins a request's body (a
// what request) into v; its errors are invalid.
func readRequestLine(body *bufio.Reader, v any, what string) error {
	err := hostwire.ReadJSONLine(body, v)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, hostwire.ErrLineTooLong):
		return fmt.Errorf("%w: %s request longer than %d bytes", host.ErrInvalid, what, hostwire.MaxLine)
	default:
		return fmt.Errorf("%w: malformed %s request: %v", host.ErrInvalid, what, err)
	}
}

// exec runs a command, full duplex: see hostwire's package documentation.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	// Read stdin while writing output (HTTP/1; HTTP/2 always can).
	rc.EnableFullDuplex()
	body := bufio.NewReader(r.Body)
	var req guestproto.ExecRequest
	if err := readRequestLine(body, &req, "exec"); err != nil {
		writeErrorUnread(w, err)
		return
	}
	fail := writeErrorUnread // stdin may still be coming
	if !req.Stdin {
		// Reach the body's end: the server then watches the connection
		// and cancels r.Context() when the client goes away.
		io.Copy(io.Discard, io.LimitReader(body, 1<<20))
		fail = writeError
	}
	g, err := s.a.Guest(chi.URLParam(r, "id"))
	if err != nil {
		fail(w, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	p, err := g.StartExec(ctx, req)
	if err != nil {
		fail(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-panda-exec")
	w.WriteHeader(http.StatusOK)
	send := frameSender(w, rc)
	send(hostwire.JSONFrame(hostwire.FrameStart, hostwire.StartFrame{PID: p.PID}))

	stdinDone := make(chan struct{})
	if req.Stdin {
		go func() {
			defer close(stdinDone)
			src := &hostwire.SourceReader{R: body}
			io.Copy(p.Stdin, src)
			if src.Err != nil {
				// The client went away mid-stdin (or the process ended
				// and the read was cut short below: then this is moot).
				cancel()
			}
			p.Stdin.Close()
		}()
	} else {
		close(stdinDone)
	}
	pumpOutput(send, p.Stdout, p.Stderr, cancel) // client gone: kill the command
	res, err := p.Wait()
	if err != nil {
		_, we := hostwire.EncodeError(err)
		send(hostwire.JSONFrame(hostwire.FrameError, we))
	} else {
		send(hostwire.JSONFrame(hostwire.FrameExit, res))
	}
	select {
	case <-stdinDone:
	default:
		// The process is gone: stop waiting for stdin the client still
		// holds open (the connection is then not reused).
		rc.SetReadDeadline(time.Now())
		<-stdinDone
	}
}

// frameSender returns a function that writes one frame to w and flushes
// it; it is safe for concurrent use.
func frameSender(w http.ResponseWriter, rc *http.ResponseController) func(frame []byte) error {
	var mu sync.Mutex
	return func(frame []byte) error {
		mu.Lock()
		defer mu.Unlock()
		if _, err := w.Write(frame); err != nil {
			return err
		}
		return rc.Flush()
	}
}

// pumpOutput sends stdout and stderr as frames until both end. When a send
// fails (the client went away) it calls gone and reads that output to its
// end.
func pumpOutput(send func([]byte) error, stdout, stderr io.Reader, gone func()) {
	var wg sync.WaitGroup
	pump := func(typ byte, rd io.Reader) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		frame := make([]byte, 0, len(buf)+5)
		for {
			n, err := rd.Read(buf)
			if n > 0 && send(hostwire.AppendFrame(frame[:0], typ, buf[:n])) != nil {
				gone()
				io.Copy(io.Discard, rd)
				return
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(2)
	go pump(hostwire.FrameStdout, stdout)
	go pump(hostwire.FrameStderr, stderr)
	wg.Wait()
}

// sendPack answers a snapshot as a pack (agent.Agent.SendSnapshot); an
// error after the first byte arrives in the X-Panda-Error trailer, and
// leaves the pack without its trailer record besides.
func (s *Server) sendPack(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "snapID")
	if _, err := s.a.GetSnapshot(id); err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Trailer", hostwire.HeaderError)
	w.WriteHeader(http.StatusOK)
	// Every write goes out as it is made (the pack's writer buffers):
	// the answer's headers now, then the pack's header at once, so that
	// the receiving host starts early.
	fw := flushWriter{w: w, rc: http.NewResponseController(w)}
	fw.rc.Flush()
	if _, err := s.a.SendSnapshot(r.Context(), id, heldOf(r), fw); err != nil {
		s.log.Warn("send snapshot", "snapshot_id", id, "err", err)
		_, we := hostwire.EncodeError(err)
		b, _ := json.Marshal(we)
		w.Header().Set(hostwire.HeaderError, string(b))
	}
}

// heldOf is the snapshots the requester of a pack says it holds (the
// query's held, comma separated; SnapshotPackFor): what the pack may be
// diffed against. Names that are no snapshot ids are dropped.
func heldOf(r *http.Request) []string {
	var out []string
	for _, id := range strings.Split(r.URL.Query().Get("held"), ",") {
		if host.ValidID(id) && len(out) < maxHeld {
			out = append(out, id)
		}
	}
	return out
}

// maxHeld bounds the snapshots a request for a pack may name.
const maxHeld = 256

// flushWriter flushes each write to the client.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// receivePack keeps the pack of the request body as a snapshot
// (agent.Agent.ReceiveSnapshot). A refusal (another template, say) is
// answered as soon as it is known, before the body is read to its end.
func (s *Server) receivePack(w http.ResponseWriter, r *http.Request) {
	http.NewResponseController(w).EnableFullDuplex()
	si, err := s.a.ReceiveSnapshot(r.Context(), chi.URLParam(r, "snapID"), r.Body)
	if err != nil {
		writeErrorUnread(w, err)
		return
	}
	endBody(w, r.Body)
	writeJSON(w, http.StatusOK, si.Contract())
}

// endBody reads the end of a request body whose pack was read to its
// trailer record: the body's own end (the last chunk of its encoding) is
// read here, not after the handler, since a full duplex request whose
// body reaches EOF once the handler has returned leaves the server
// reading the connection twice (Go 1.26's "invalid concurrent Body.Read
// call"). Junk after the pack closes the connection.
func endBody(w http.ResponseWriter, body io.Reader) {
	if n, _ := io.Copy(io.Discard, io.LimitReader(body, 1<<16)); n == 1<<16 {
		w.Header().Set("Connection", "close") // not read on
	}
}

// receivePackCreate receives a pack and creates a sandbox from it
// (agent.Agent.ReceiveAndCreate): see hostwire's package documentation.
func (s *Server) receivePackCreate(w http.ResponseWriter, r *http.Request) {
	http.NewResponseController(w).EnableFullDuplex()
	body := bufio.NewReaderSize(r.Body, 64<<10)
	var req hostwire.CreateRequest
	if err := readRequestLine(body, &req, "create"); err != nil {
		writeErrorUnread(w, err)
		return
	}
	hreq := req.Contract()
	hreq.SnapshotID = chi.URLParam(r, "snapID")
	s.createFromPack(w, r, hreq, body, body)
}

// createFromPack creates sandbox hreq from pack (agent.ReceiveAndCreate)
// and answers the sandbox and the snapshot, or the error, saying whether
// the snapshot was kept. body, if not nil, is the request body the pack
// comes in: read to its end before the answer, or the connection closed
// after it if the pack was refused unread.
func (s *Server) createFromPack(w http.ResponseWriter, r *http.Request, hreq host.CreateRequest, pack io.Reader, body io.Reader) {
	info, si, err := s.a.ReceiveAndCreate(r.Context(), hreq, pack)
	if err != nil {
		s.log.Debug("host api request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		if si.ID == "" && body != nil {
			writeErrorUnread(w, err)
			return
		}
		if si.ID != "" {
			w.Header().Set(hostwire.HeaderSnapshotKept, "true")
		}
	}
	if body != nil {
		endBody(w, body) // the pack was read to its trailer
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, hostwire.PackCreateResponse{Sandbox: info, Snapshot: si.Contract()})
}

// pullPackCreate fetches the pack of snapshot {snapID} straight from the
// host agent the request names (with the ticket it gives) and creates a
// sandbox from it as it arrives, as receivePackCreate. A pack that cannot
// be fetched at all is unavailable (the control plane sends it another
// way).
func (s *Server) pullPackCreate(w http.ResponseWriter, r *http.Request) {
	var req hostwire.PullRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	hreq := req.Create.Contract()
	hreq.SnapshotID = chi.URLParam(r, "snapID")
	src, err := newPeer(req.From)
	if err != nil {
		writeError(w, err)
		return
	}
	defer src.close()
	rc, err := src.pack(r.Context(), hreq.SnapshotID, s.a.HeldSnapshots())
	if err != nil {
		writeError(w, fmt.Errorf("%w: fetch the pack of snapshot %s from %s: %v", host.ErrUnavailable, hreq.SnapshotID, req.From.URL, err))
		return
	}
	defer rc.Close()
	s.createFromPack(w, r, hreq, rc, nil)
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	g, err := s.a.Guest(chi.URLParam(r, "id"))
	if err != nil {
		writeError(w, err)
		return
	}
	rd, fi, err := g.ReadFile(r.Context(), r.URL.Query().Get("path"))
	sendFile(w, rd, fi, err)
}

// sendFile answers a download: fi as one JSON line, then rd's bytes (an
// error after the first byte in the X-Panda-Error trailer); or err.
func sendFile(w http.ResponseWriter, rd io.ReadCloser, fi guestproto.FileInfo, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	defer rd.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Trailer", hostwire.HeaderError)
	w.WriteHeader(http.StatusOK)
	line, _ := json.Marshal(fi)
	if _, err := w.Write(append(line, '\n')); err != nil {
		return
	}
	src := &hostwire.SourceReader{R: rd}
	if _, err := io.Copy(w, src); err != nil && src.Err != nil {
		_, we := hostwire.EncodeError(src.Err)
		b, _ := json.Marshal(we)
		w.Header().Set(hostwire.HeaderError, string(b))
	}
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	receiveFile(w, r, func(path string, mode fs.FileMode) (int64, error) {
		g, err := s.a.Guest(chi.URLParam(r, "id"))
		if err != nil {
			return 0, err
		}
		return g.WriteFile(r.Context(), path, r.Body, mode)
	})
}

// receiveFile answers an upload (PUT …/files?path=P&mode=M) that write
// makes of the request's body.
func receiveFile(w http.ResponseWriter, r *http.Request, write func(path string, mode fs.FileMode) (int64, error)) {
	// An error can then be answered before the body is read to its end;
	// the client gets it instead of a broken pipe.
	http.NewResponseController(w).EnableFullDuplex()
	q := r.URL.Query()
	mode, err := strconv.ParseUint(q.Get("mode"), 10, 32)
	if err != nil {
		writeErrorUnread(w, fmt.Errorf("%w: mode %q", host.ErrInvalid, q.Get("mode")))
		return
	}
	n, err := write(q.Get("path"), fs.FileMode(mode))
	if err != nil {
		writeErrorUnread(w, err)
		return
	}
	writeJSON(w, http.StatusOK, hostwire.WriteReply{Written: n})
}

// contract is an agent's answer about a snapshot as the host contract's,
// what the wire carries.
func contract(si hostagent.SnapshotInfo, err error) (host.SnapshotInfo, error) {
	return si.Contract(), err
}
