package hostapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
)

// Background processes and directory watches: the server side (handlers on
// the agent) and the client side (methods of the remote guest), one wire
// format each, described in the package documentation.

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

// The client side: the remote guest keeps background processes and
// watches directories, as the local one does.
var _ host.ProcessGuest = guest{}

func pidPath(pid int, rest string) string { return "/processes/" + strconv.Itoa(pid) + rest }

func (g guest) StartProcess(ctx context.Context, req guestproto.ExecRequest) (guestproto.ProcInfo, error) {
	var p guestproto.ProcInfo
	err := g.call(ctx, http.MethodPost, "/processes", nil, req, &p)
	return p, err
}

func (g guest) ListProcesses(ctx context.Context) ([]guestproto.ProcInfo, error) {
	var out struct {
		Processes []guestproto.ProcInfo `json:"processes"`
	}
	err := g.call(ctx, http.MethodGet, "/processes", nil, nil, &out)
	return out.Processes, err
}

// WriteProcessStdin writes p in requests of at most MaxStdinBody bytes.
func (g guest) WriteProcessStdin(ctx context.Context, pid int, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), hostwire.MaxStdinBody)
		if err := g.stdin(ctx, pid, p[:n], false); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

func (g guest) CloseProcessStdin(ctx context.Context, pid int) error {
	return g.stdin(ctx, pid, nil, true)
}

func (g guest) stdin(ctx context.Context, pid int, data []byte, close bool) error {
	var q url.Values
	if close {
		q = url.Values{"close": {"true"}}
	}
	req, err := g.c.request(ctx, http.MethodPost, sandboxPath(g.id, pidPath(pid, "/stdin")), q, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	res, err := g.c.do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, res.Body)
	return res.Body.Close()
}

func (g guest) SignalProcess(ctx context.Context, pid int, signal string) error {
	return g.call(ctx, http.MethodPost, pidPath(pid, "/signal"), nil, hostwire.SignalRequest{Signal: signal}, nil)
}

func (g guest) ResizeProcess(ctx context.Context, pid, rows, cols int) error {
	return g.call(ctx, http.MethodPost, pidPath(pid, "/resize"), nil, hostwire.ResizeRequest{Rows: rows, Cols: cols}, nil)
}

func (g guest) RemoveProcess(ctx context.Context, pid int) error {
	return g.call(ctx, http.MethodDelete, pidPath(pid, ""), nil, nil, nil)
}

// WaitProcess holds one request open until the process exits or ctx ends.
func (g guest) WaitProcess(ctx context.Context, pid int) (guestproto.ProcInfo, error) {
	var p guestproto.ProcInfo
	err := g.call(ctx, http.MethodPost, pidPath(pid, "/wait"), nil, nil, &p)
	return p, err
}

// AttachProcess streams the process's output; see the package
// documentation. Cancelling ctx or Close detaches.
func (g guest) AttachProcess(ctx context.Context, pid int, stdoutOffset, stderrOffset int64) (*guestproto.Attachment, error) {
	ctx, cancel := context.WithCancel(ctx)
	q := url.Values{"stdout_offset": {strconv.FormatInt(stdoutOffset, 10)}, "stderr_offset": {strconv.FormatInt(stderrOffset, 10)}}
	req, err := g.c.request(ctx, http.MethodGet, sandboxPath(g.id, pidPath(pid, "/attach")), q, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	res, err := g.c.do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	typ, payload, err := hostwire.ReadFrame(res.Body, nil)
	if err != nil || typ != hostwire.FrameAttach {
		res.Body.Close()
		cancel()
		if err == nil {
			err = fmt.Errorf("attach stream began with frame %q", typ)
		}
		return nil, g.c.transportError(ctx, err)
	}
	var st hostwire.AttachFrame
	if err := json.Unmarshal(payload, &st); err != nil {
		res.Body.Close()
		cancel()
		return nil, fmt.Errorf("attach process %d: decode start: %w", pid, err)
	}
	at := &attachment{done: make(chan struct{})}
	stdout, stdoutW := io.Pipe()
	stderr, stderrW := io.Pipe()
	go at.demux(g.c, ctx, res.Body, stdoutW, stderrW)
	return guestproto.NewAttachment(st.Start, st.Proc, stdout, stderr, at.end, func() {
		cancel()
		// Unblocks demux if nobody reads the output any more.
		detached := guestproto.Errorf(guestproto.CodeCanceled, "detached by host")
		stdout.CloseWithError(detached)
		stderr.CloseWithError(detached)
	}), nil
}

// attachment is a remote attach's end.
type attachment struct {
	done chan struct{}
	end_ hostwire.AttachEndFrame
	err  error
}

func (a *attachment) end() (guestproto.ProcInfo, bool, error) {
	<-a.done
	return a.end_.Proc, a.end_.Lagged, a.err
}

// demux reads the response until the attach end or error frame.
func (a *attachment) demux(c *Client, ctx context.Context, body io.ReadCloser, stdout, stderr *io.PipeWriter) {
	defer close(a.done)
	a.err = demuxFrames(c, ctx, "attach process", body, stdout, stderr, hostwire.FrameAttachEnd, func(payload []byte) error {
		if err := json.Unmarshal(payload, &a.end_); err != nil {
			return fmt.Errorf("decode end: %w", err)
		}
		return nil
	})
}

// WatchDir watches a directory on the guest; see guestproto.Client.WatchDir
// for the contract. Cancelling ctx or Close ends the watch.
func (g guest) WatchDir(ctx context.Context, path string, recursive bool) (*guestproto.DirWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	q := pathQuery(path)
	q.Set("recursive", strconv.FormatBool(recursive))
	req, err := g.c.request(ctx, http.MethodGet, sandboxPath(g.id, "/watch"), q, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	res, err := g.c.do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 0, 4<<10), 64<<10)
	var ended error // sticky: the watch's end
	next := func() (guestproto.WatchEvent, error) {
		if ended != nil {
			return guestproto.WatchEvent{}, ended
		}
		if !sc.Scan() {
			ended = sc.Err()
			if ended == nil {
				ended = io.ErrUnexpectedEOF
			}
			ended = g.c.transportError(ctx, fmt.Errorf("watch %s: %w", path, ended))
			return guestproto.WatchEvent{}, ended
		}
		var l hostwire.WatchLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			ended = fmt.Errorf("watch %s: malformed event: %w", path, err)
			return guestproto.WatchEvent{}, ended
		}
		switch l.Type {
		case hostwire.WatchEnd:
			ended = io.EOF
			return guestproto.WatchEvent{}, ended
		case hostwire.WatchError:
			ended = errors.New("watch ended")
			if l.Error != nil {
				ended = l.Error.Err()
			}
			return guestproto.WatchEvent{}, ended
		}
		return l.WatchEvent, nil
	}
	return guestproto.NewDirWatch(next, func() error {
		cancel()
		return res.Body.Close()
	}), nil
}
