package hostapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
)

// Background processes and directory watches: the handlers on the agent,
// for the wire format hostwire's package documentation describes.

// processRoutes adds the routes of requests that answer promptly (tracked
// like any request).
func (s *Server) processRoutes(r chi.Router) {
	r.Post(hostwire.Prefix+"/sandboxes/{id}/processes", s.guestJSON(func(r *http.Request, g *guestproto.Client) (any, error) {
		var req guestproto.ExecRequest
		if err := decodeN(r, &req, hostwire.MaxLine); err != nil {
			return nil, err
		}
		return g.StartProcess(r.Context(), req)
	}))
	r.Get(hostwire.Prefix+"/sandboxes/{id}/processes", s.guestJSON(func(r *http.Request, g *guestproto.Client) (any, error) {
		ps, err := g.ListProcesses(r.Context())
		return map[string]any{"processes": ps}, err
	}))
	r.Delete(hostwire.Prefix+"/sandboxes/{id}/processes/{pid}", s.procJSON(func(r *http.Request, g *guestproto.Client, pid int) error {
		return g.RemoveProcess(r.Context(), pid)
	}))
	r.Post(hostwire.Prefix+"/sandboxes/{id}/processes/{pid}/stdin", s.procJSON(func(r *http.Request, g *guestproto.Client, pid int) error {
		data, err := io.ReadAll(io.LimitReader(r.Body, hostwire.MaxStdinBody+1))
		if err != nil {
			return fmt.Errorf("%w: stdin body: %v", host.ErrInvalid, err)
		}
		if len(data) > hostwire.MaxStdinBody {
			return fmt.Errorf("%w: stdin body over %d bytes", host.ErrInvalid, hostwire.MaxStdinBody)
		}
		if len(data) > 0 {
			if err := g.WriteProcessStdin(r.Context(), pid, data); err != nil {
				return err
			}
		}
		if close, _ := strconv.ParseBool(r.URL.Query().Get("close")); close {
			return g.CloseProcessStdin(r.Context(), pid)
		}
		return nil
	}))
	r.Post(hostwire.Prefix+"/sandboxes/{id}/processes/{pid}/signal", s.procJSON(func(r *http.Request, g *guestproto.Client, pid int) error {
		var req hostwire.SignalRequest
		if err := decode(r, &req); err != nil {
			return err
		}
		return g.SignalProcess(r.Context(), pid, req.Signal)
	}))
	r.Post(hostwire.Prefix+"/sandboxes/{id}/processes/{pid}/resize", s.procJSON(func(r *http.Request, g *guestproto.Client, pid int) error {
		var req hostwire.ResizeRequest
		if err := decode(r, &req); err != nil {
			return err
		}
		return g.ResizeProcess(r.Context(), pid, req.Rows, req.Cols)
	}))
}

// streamRoutes adds the routes whose answers last as long as the client
// wants (attach, wait, watch): like event streams they are not requests
// in flight for Shutdown, and Close ends them.
func (s *Server) streamRoutes(r chi.Router) {
	r.Get(hostwire.Prefix+"/sandboxes/{id}/processes/{pid}/attach", s.attach)
	r.Post(hostwire.Prefix+"/sandboxes/{id}/processes/{pid}/wait", s.json(func(r *http.Request) (any, error) {
		pid, g, err := s.procGuest(r)
		if err != nil {
			return nil, err
		}
		return g.WaitProcess(r.Context(), pid)
	}))
	r.Get(hostwire.Prefix+"/sandboxes/{id}/watch", s.watchDir)
}

// untilClosed cancels the request's context when Close is called, and
// refuses the request once it has been.
func (s *Server) untilClosed(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-s.closed:
			writeError(w, fmt.Errorf("%w: the host agent is shutting down", host.ErrUnavailable))
			return
		default:
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		go func() {
			select {
			case <-s.closed:
				cancel()
			case <-ctx.Done():
			}
		}()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// decodeN is decode with a limit of n bytes.
func decodeN(r *http.Request, v any, n int64) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, n))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: malformed request: %v", host.ErrInvalid, err)
	}
	return nil
}

// procGuest parses {pid} and returns the sandbox's guest.
func (s *Server) procGuest(r *http.Request) (int, *guestproto.Client, error) {
	pid, err := strconv.Atoi(chi.URLParam(r, "pid"))
	if err != nil || pid <= 0 {
		return 0, nil, fmt.Errorf("%w: pid %q", host.ErrInvalid, chi.URLParam(r, "pid"))
	}
	g, err := s.a.Guest(chi.URLParam(r, "id"))
	return pid, g, err
}

// procJSON adapts an operation on one process that answers nothing (204).
func (s *Server) procJSON(fn func(r *http.Request, g *guestproto.Client, pid int) error) http.HandlerFunc {
	return s.json(func(r *http.Request) (any, error) {
		pid, g, err := s.procGuest(r)
		if err != nil {
			return nil, err
		}
		return nil, fn(r, g, pid)
	})
}

// attach streams a process's output from the offsets in the query
// (stdout_offset, stderr_offset; -1: from now) as frames: attach, output,
// then attach end or error. Closing the connection detaches; the process
// runs on.
func (s *Server) attach(w http.ResponseWriter, r *http.Request) {
	pid, g, err := s.procGuest(r)
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	var offs [2]int64
	for i, k := range []string{"stdout_offset", "stderr_offset"} {
		if v := q.Get(k); v != "" {
			if offs[i], err = strconv.ParseInt(v, 10, 64); err != nil {
				writeError(w, fmt.Errorf("%w: %s %q", host.ErrInvalid, k, v))
				return
			}
		}
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel() // detaches
	a, err := g.AttachProcess(ctx, pid, offs[0], offs[1])
	if err != nil {
		writeError(w, err)
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-panda-attach")
	w.WriteHeader(http.StatusOK)
	send := frameSender(w, rc)
	if send(hostwire.JSONFrame(hostwire.FrameAttach, hostwire.AttachFrame{Start: a.Start, Proc: a.Proc})) != nil {
		return
	}
	pumpOutput(send, a.Stdout, a.Stderr, cancel) // client gone: detach
	proc, lagged, err := a.End()
	if err != nil {
		_, we := hostwire.EncodeError(err)
		send(hostwire.JSONFrame(hostwire.FrameError, we))
		return
	}
	send(hostwire.JSONFrame(hostwire.FrameAttachEnd, hostwire.AttachEndFrame{Proc: proc, Lagged: lagged}))
}

// watchDir streams a directory's changes as watchLines; the 200 is sent
// once the guest's watches are in place.
func (s *Server) watchDir(w http.ResponseWriter, r *http.Request) {
	g, err := s.a.Guest(chi.URLParam(r, "id"))
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	recursive, _ := strconv.ParseBool(q.Get("recursive"))
	watch, err := g.WatchDir(r.Context(), q.Get("path"), recursive)
	if err != nil {
		writeError(w, err)
		return
	}
	defer watch.Close()
	out := newNDJSON(w)
	for {
		ev, err := watch.Next()
		if err != nil {
			switch {
			case errors.Is(err, io.EOF):
				out.send(hostwire.WatchLine{WatchEvent: guestproto.WatchEvent{Type: hostwire.WatchEnd}})
			case r.Context().Err() == nil:
				_, we := hostwire.EncodeError(err)
				out.send(hostwire.WatchLine{WatchEvent: guestproto.WatchEvent{Type: hostwire.WatchError}, Error: &we})
			}
			return
		}
		if out.send(hostwire.WatchLine{WatchEvent: ev}) != nil {
			return
		}
	}
}
