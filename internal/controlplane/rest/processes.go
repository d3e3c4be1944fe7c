package rest

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
)

// processRequest starts a background process: exec's fields, but stdin
// is a flag (keep a stdin pipe open) and there is no timeout by default.
type processRequest struct {
	Cmd            string            `json:"cmd"`
	Argv           []string          `json:"argv"`
	Env            map[string]string `json:"env"`
	Cwd            string            `json:"cwd"`
	User           string            `json:"user"`
	TimeoutSeconds *float64          `json:"timeout_seconds"`
	Stdin          bool              `json:"stdin"`
	// PTY starts the process on a pseudo-terminal of that size.
	PTY *ptySize `json:"pty"`
}

// ptySize is a terminal's size in characters.
type ptySize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

func (z ptySize) validate() error {
	if err := (guestproto.PTYSize{Rows: z.Rows, Cols: z.Cols}).Validate(); err != nil {
		return invalid("%v", err)
	}
	return nil
}

// processInfo is a background process as the REST API shows it.
type processInfo struct {
	PID           int        `json:"pid"`
	Cmd           string     `json:"cmd"`
	State         string     `json:"state"`
	StartedAt     time.Time  `json:"started_at"`
	EndedAt       *time.Time `json:"ended_at,omitempty"`
	ExitCode      *int       `json:"exit_code"`
	Signal        string     `json:"signal,omitempty"`
	TimedOut      bool       `json:"timed_out,omitempty"`
	StdinOpen     bool       `json:"stdin_open"`
	PTY           *ptySize   `json:"pty,omitempty"`
	StdoutBytes   int64      `json:"stdout_bytes"`
	StderrBytes   int64      `json:"stderr_bytes"`
	StdoutDropped int64      `json:"stdout_dropped"`
	StderrDropped int64      `json:"stderr_dropped"`
}

func toProcessInfo(p guestproto.ProcInfo) processInfo {
	out := processInfo{
		PID: p.PID, Cmd: p.Cmd, State: p.State, StartedAt: time.Unix(0, p.StartedUnixNano).UTC(),
		StdinOpen: p.StdinOpen, StdoutBytes: p.StdoutEnd, StderrBytes: p.StderrEnd,
		StdoutDropped: p.StdoutDropped, StderrDropped: p.StderrDropped,
	}
	if p.PTY != nil {
		out.PTY = &ptySize{Rows: p.PTY.Rows, Cols: p.PTY.Cols}
	}
	if p.Exit != nil {
		code := p.Exit.ExitCode
		ended := time.Unix(0, p.EndedUnixNano).UTC()
		out.ExitCode, out.Signal, out.TimedOut, out.EndedAt = &code, p.Exit.Signal, p.Exit.TimedOut, &ended
	}
	return out
}

// processGuest returns the caller's running sandbox's guest
// (limitGuest's), which must keep background processes.
func (s *Server) processGuest(r *http.Request) (host.ProcessGuest, error) {
	sb, err := s.guestSandbox(r)
	if err != nil {
		return nil, err
	}
	g, err := s.host.Guest(r.Context(), sb.ID)
	if err != nil {
		return nil, err
	}
	pg, ok := g.(host.ProcessGuest)
	if !ok {
		return nil, errorf(controlplane.NotImplemented, "this sandbox's host does not keep background processes")
	}
	return pg, nil
}

// processPID parses {pid}; it checks nothing else: the guest says 404.
func processPID(r *http.Request) (int, error) {
	pid, err := strconv.Atoi(chi.URLParam(r, "pid"))
	if err != nil || pid <= 0 {
		return 0, notFound("no process %q: a pid is a positive number", chi.URLParam(r, "pid"))
	}
	return pid, nil
}

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) {
	var req processRequest
	if err := decodeJSON(r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.TimeoutSeconds == nil {
		none := 0.0
		req.TimeoutSeconds = &none
	}
	er := execRequest{Cmd: req.Cmd, Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: req.User, TimeoutSeconds: req.TimeoutSeconds}
	g, err := er.toGuest()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	g.Stdin = req.Stdin
	if req.PTY != nil {
		if err := req.PTY.validate(); err != nil {
			s.writeError(w, r, err)
			return
		}
		g.PTY = &guestproto.PTYSize{Rows: req.PTY.Rows, Cols: req.PTY.Cols}
		g.Stdin = true // a terminal always takes input
	}
	pg, err := s.processGuest(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := pg.StartProcess(r.Context(), g)
	if err != nil {
		if guestproto.CodeOf(err) == guestproto.CodeBusy {
			err = errorf(controlplane.TooManyRequests, "%s", controlplane.GuestMessage(err))
		}
		s.writeError(w, r, err)
		return
	}
	kind := controlplane.CommandProcess
	if req.PTY != nil {
		kind = controlplane.CommandPTY
	}
	s.cp.StartCommand(chi.URLParam(r, "id"), kind, controlplane.CommandLine(req.Cmd, req.Argv), p.PID, p.StartedUnixNano)
	writeJSON(w, http.StatusCreated, toProcessInfo(p))
}

// noteProcesses records in sandbox id's command history the ends of the
// processes of ps that have exited.
func (s *Server) noteProcesses(id string, ps ...guestproto.ProcInfo) {
	for _, p := range ps {
		if p.Exit != nil {
			s.cp.ProcessEnded(id, p.PID, p.StartedUnixNano, p.Exit.ExitCode, p.Exit.Signal, p.Exit.DurationMS)
		}
	}
}

// listNoting lists the processes of r's sandbox, noting those that have
// ended in its history (noteProcesses).
func (s *Server) listNoting(r *http.Request) ([]guestproto.ProcInfo, error) {
	pg, err := s.processGuest(r)
	if err != nil {
		return nil, err
	}
	ps, err := pg.ListProcesses(r.Context())
	if err != nil {
		return nil, err
	}
	s.noteProcesses(chi.URLParam(r, "id"), ps...)
	return ps, nil
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) {
	ps, err := s.listNoting(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]processInfo, 0, len(ps))
	for _, p := range ps {
		out = append(out, toProcessInfo(p))
	}
	writeJSON(w, http.StatusOK, map[string]any{"processes": out})
}

func (s *Server) getProcess(w http.ResponseWriter, r *http.Request) {
	pid, err := processPID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ps, err := s.listNoting(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	for _, p := range ps {
		if p.PID == pid {
			writeJSON(w, http.StatusOK, toProcessInfo(p))
			return
		}
	}
	s.writeError(w, r, notFound("no background process %d in this sandbox", pid))
}

// processCall parses {pid} and runs do against the sandbox's guest; it
// answers 204 or the error.
func (s *Server) processCall(w http.ResponseWriter, r *http.Request, do func(ctx context.Context, pg host.ProcessGuest, pid int) error) {
	pid, err := processPID(r)
	if err == nil {
		var pg host.ProcessGuest
		if pg, err = s.processGuest(r); err == nil {
			err = do(r.Context(), pg, pid)
		}
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) removeProcess(w http.ResponseWriter, r *http.Request) {
	s.processCall(w, r, func(ctx context.Context, pg host.ProcessGuest, pid int) error { return pg.RemoveProcess(ctx, pid) })
}

// maxStdinBody bounds one POST …/stdin.
const maxStdinBody = 1 << 20

func (s *Server) processStdin(w http.ResponseWriter, r *http.Request) {
	closeStdin := false
	if v := r.URL.Query().Get("close"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.writeError(w, r, invalid("close must be true or false"))
			return
		}
		closeStdin = b
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxStdinBody))
	if err != nil {
		s.writeError(w, r, invalid("stdin body: %v (at most %d bytes per request)", err, maxStdinBody))
		return
	}
	s.processCall(w, r, func(ctx context.Context, pg host.ProcessGuest, pid int) error {
		if len(data) > 0 {
			if err := pg.WriteProcessStdin(ctx, pid, data); err != nil {
				return err
			}
		}
		if closeStdin {
			return pg.CloseProcessStdin(ctx, pid)
		}
		return nil
	})
}

func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Signal string `json:"signal"`
	}
	if err := decodeJSON(r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Signal == "" || len(req.Signal) > 16 {
		s.writeError(w, r, invalid("signal must name a signal, such as TERM, KILL, INT or HUP"))
		return
	}
	s.processCall(w, r, func(ctx context.Context, pg host.ProcessGuest, pid int) error {
		return pg.SignalProcess(ctx, pid, req.Signal)
	})
}

// resizeProcess sets a PTY process's terminal size.
func (s *Server) resizeProcess(w http.ResponseWriter, r *http.Request) {
	var req ptySize
	if err := decodeJSON(r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := req.validate(); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.processCall(w, r, func(ctx context.Context, pg host.ProcessGuest, pid int) error {
		return pg.ResizeProcess(ctx, pid, req.Rows, req.Cols)
	})
}

// waitProcess answers once the process has exited, with its description.
func (s *Server) waitProcess(w http.ResponseWriter, r *http.Request) {
	pid, err := processPID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	pg, err := s.processGuest(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := pg.WaitProcess(r.Context(), pid)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.noteProcesses(chi.URLParam(r, "id"), p)
	writeJSON(w, http.StatusOK, toProcessInfo(p))
}

// processEvent is a line of GET …/output.
type processEvent struct {
	Type       string       `json:"type"`
	PID        int          `json:"pid,omitempty"`
	Data       string       `json:"data,omitempty"`
	Stream     string       `json:"stream,omitempty"`
	Offset     *int64       `json:"offset,omitempty"`
	Bytes      int64        `json:"bytes,omitempty"`
	ExitCode   *int         `json:"exit_code,omitempty"`
	Signal     string       `json:"signal,omitempty"`
	TimedOut   *bool        `json:"timed_out,omitempty"`
	DurationMS *int64       `json:"duration_ms,omitempty"`
	Error      *errorDetail `json:"error,omitempty"`
}

// parseFrom reads ?from=start|now|<offset> (default start) as the
// guest's offset (0: earliest kept, -1: now).
func parseFrom(v string) (int64, error) {
	switch v {
	case "", "start":
		return 0, nil
	case "now":
		return -1, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, invalid("from must be start, now or a byte offset")
	}
	return n, nil
}

// processOutput streams a process's output as NDJSON until it exits or
// the client goes away; the process is not killed either way.
func (s *Server) processOutput(w http.ResponseWriter, r *http.Request) {
	pid, err := processPID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	q := r.URL.Query()
	outOff, err := parseFrom(q.Get("from"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	errOff := outOff
	if v := q.Get("stderr_from"); v != "" {
		if errOff, err = parseFrom(v); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	pg, err := s.processGuest(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	a, err := pg.AttachProcess(ctx, pid, outOff, errOff)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := newNDJSON(w)
	out.send(processEvent{Type: "start", PID: pid})
	for {
		nextOut, nextErr, ok := s.followAttach(cancel, out, a, outOff, errOff)
		if !ok {
			return
		}
		proc, lagged, err := a.End()
		if err != nil {
			ae := classify(err)
			out.send(processEvent{Type: "error", Error: &errorDetail{Code: ae.Code, Message: ae.Message}})
			return
		}
		if !lagged {
			s.noteProcesses(chi.URLParam(r, "id"), proc)
			e := proc.Exit
			out.send(processEvent{Type: "exit", ExitCode: &e.ExitCode, Signal: e.Signal, TimedOut: &e.TimedOut, DurationMS: &e.DurationMS})
			return
		}
		// Fell behind the guest's buffer: attach again where we stopped;
		// the new attach reports what was dropped.
		outOff, errOff = nextOut, nextErr
		if a, err = pg.AttachProcess(ctx, pid, outOff, errOff); err != nil {
			ae := classify(err)
			out.send(processEvent{Type: "error", Error: &errorDetail{Code: ae.Code, Message: ae.Message}})
			return
		}
	}
}

// followAttach sends a's output as events, first a "dropped" event for
// each stream whose requested offset is no longer kept. It returns the
// offsets after what it read, and false if the client went away.
func (s *Server) followAttach(cancel func(), out *ndjson, a *guestproto.Attachment, wantOut, wantErr int64) (int64, int64, bool) {
	for _, d := range []struct {
		stream     string
		want, from int64
	}{{"stdout", wantOut, a.Start.StdoutOffset}, {"stderr", wantErr, a.Start.StderrOffset}} {
		if d.want >= 0 && d.from > d.want {
			off := d.from
			out.send(processEvent{Type: "dropped", Stream: d.stream, Bytes: d.from - d.want, Offset: &off})
		}
	}
	var wg sync.WaitGroup
	var gone bool
	var mu sync.Mutex
	ends := [2]int64{a.Start.StdoutOffset, a.Start.StderrOffset}
	pump := func(i int, kind string, rd io.Reader) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		off := ends[i]   // offset of the first byte of carry, then of data
		var carry []byte // an incomplete UTF-8 sequence from the last read
		send := func(data []byte) bool {
			o := off
			if out.send(processEvent{Type: kind, Data: strings.ToValidUTF8(string(data), "\uFFFD"), Offset: &o}) != nil {
				mu.Lock()
				gone = true
				mu.Unlock()
				cancel() // the client went away: detach (the process runs on)
				io.Copy(io.Discard, rd)
				return false
			}
			off += int64(len(data))
			return true
		}
		for {
			n, err := rd.Read(buf)
			if n > 0 {
				data := append(carry, buf[:n]...)
				cut := len(data) - incompleteSuffix(data)
				carry = append([]byte(nil), data[cut:]...)
				if cut > 0 && !send(data[:cut]) {
					return
				}
			}
			if err != nil {
				if len(carry) > 0 && send(carry) {
					carry = nil
				}
				ends[i] = off + int64(len(carry))
				return
			}
		}
	}
	wg.Add(2)
	go pump(0, "stdout", a.Stdout)
	go pump(1, "stderr", a.Stderr)
	wg.Wait()
	if gone {
		return 0, 0, false
	}
	return ends[0], ends[1], true
}
