package rest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/coder/websocket"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// The WebSocket subprotocols of GET …/processes/{pid}/tty: the server
// selects wsProtocol; a browser, which cannot set an Authorization header
// on a WebSocket, also offers wsBearerPrefix+key (never selected).
const (
	wsProtocol     = "pandastack.v1"
	wsBearerPrefix = "bearer."
)

// ttyControl is a text frame of GET …/tty: "resize" {rows, cols} from the
// client; "exit" {exit_code, signal} or "error" {error} to it, last.
type ttyControl struct {
	Type     string       `json:"type"`
	Rows     int          `json:"rows,omitempty"`
	Cols     int          `json:"cols,omitempty"`
	ExitCode *int         `json:"exit_code,omitempty"`
	Signal   string       `json:"signal,omitempty"`
	Error    *errorDetail `json:"error,omitempty"`
}

// processTTY connects a WebSocket to a background process (meant for one
// started with a PTY): binary frames from the client are its stdin
// (keystrokes), binary frames to the client its output (stdout and
// stderr) from ?from=start (default), now or a byte offset; text frames
// carry ttyControl. The WebSocket ends after the "exit" frame; a client
// that goes away detaches (the process runs on: remove it to end it).
func (s *Server) processTTY(w http.ResponseWriter, r *http.Request) {
	pid, err := processPID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	from, err := parseFrom(r.URL.Query().Get("from"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	pg, err := s.processGuest(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// The handshake's context ends when the handler returns; the attach
	// lives as long as the WebSocket.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	a, err := pg.AttachProcess(ctx, pid, from, from)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// Any origin: the key is never ambient (no cookie), so another site's
	// page cannot use a visitor's credentials here.
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{wsProtocol}, InsecureSkipVerify: true})
	if err != nil {
		a.Close()
		return // Accept answered
	}
	defer c.CloseNow()
	c.SetReadLimit(guestproto.MaxStdinChunk + 1024)
	t := &ttySession{c: c, g: pg, pid: pid, cancel: cancel}
	go t.input(ctx)
	t.output(ctx, a)
}

// ttyGuest is what a tty session needs of a guest.
type ttyGuest interface {
	AttachProcess(ctx context.Context, pid int, stdoutOffset, stderrOffset int64) (*guestproto.Attachment, error)
	WriteProcessStdin(ctx context.Context, pid int, p []byte) error
	ResizeProcess(ctx context.Context, pid, rows, cols int) error
}

// ttySession is one WebSocket of GET …/tty (c), attached to process pid
// of guest g. Its ctx ends with cancel: the client went away, or its
// output could not be sent.
type ttySession struct {
	c      *websocket.Conn
	g      ttyGuest
	pid    int
	cancel context.CancelFunc

	wmu sync.Mutex // one writer at a time
}

func (t *ttySession) send(ctx context.Context, typ websocket.MessageType, p []byte) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	return t.c.Write(ctx, typ, p)
}

func (t *ttySession) sendControl(ctx context.Context, m ttyControl) error {
	b, _ := json.Marshal(m)
	return t.send(ctx, websocket.MessageText, b)
}

func (t *ttySession) sendError(ctx context.Context, err error) error {
	ae := classify(err)
	return t.sendControl(ctx, ttyControl{Type: "error", Error: &errorDetail{Code: ae.Code, Message: ae.Message}})
}

// input passes the client's frames to the process until the client
// closes or ctx ends, then ends the session: binary frames are stdin,
// text frames resize its terminal. What the guest refuses (but for a
// process that exited) goes back as an "error" frame.
func (t *ttySession) input(ctx context.Context) {
	defer t.cancel()
	for {
		typ, p, err := t.c.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			if len(p) > 0 {
				if err := t.g.WriteProcessStdin(ctx, t.pid, p); err != nil && !errors.Is(err, guestproto.ErrExited) {
					_ = t.sendError(ctx, err)
				}
			}
			continue
		}
		var m ttyControl
		if err := json.Unmarshal(p, &m); err != nil || m.Type != "resize" {
			_ = t.sendError(ctx, invalid(`a text frame must be {"type":"resize","rows":R,"cols":C}`))
			continue
		}
		if err := (ptySize{Rows: m.Rows, Cols: m.Cols}).validate(); err != nil {
			_ = t.sendError(ctx, err)
			continue
		}
		if err := t.g.ResizeProcess(ctx, t.pid, m.Rows, m.Cols); err != nil && !errors.Is(err, guestproto.ErrExited) {
			_ = t.sendError(ctx, err)
		}
	}
}

// output sends the process's output from attach a to the client until
// the process exits (then an "exit" frame and a normal close), attaching
// again where it stopped when the attach lags; it returns once ctx ends,
// or after an "error" frame and a close if attaching fails.
func (t *ttySession) output(ctx context.Context, a *guestproto.Attachment) {
	offs := [2]int64{a.Start.StdoutOffset, a.Start.StderrOffset}
	for {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); t.copyOutput(ctx, a.Stdout, &offs[0]) }()
		go func() { defer wg.Done(); t.copyOutput(ctx, a.Stderr, &offs[1]) }()
		wg.Wait()
		if ctx.Err() != nil {
			a.Close()
			return
		}
		proc, lagged, err := a.End()
		if err != nil {
			_ = t.sendError(ctx, err)
			_ = t.c.Close(websocket.StatusInternalError, "attach failed")
			return
		}
		if !lagged {
			e := proc.Exit
			_ = t.sendControl(ctx, ttyControl{Type: "exit", ExitCode: &e.ExitCode, Signal: e.Signal})
			_ = t.c.Close(websocket.StatusNormalClosure, "")
			return
		}
		if a, err = t.g.AttachProcess(ctx, t.pid, offs[0], offs[1]); err != nil {
			_ = t.sendError(ctx, err)
			_ = t.c.Close(websocket.StatusInternalError, "attach failed")
			return
		}
	}
}

// copyOutput sends what rd yields to the client as binary frames until
// EOF, counting it in *off. If a frame cannot be sent it ends the session
// and drains rd.
func (t *ttySession) copyOutput(ctx context.Context, rd io.Reader, off *int64) {
	buf := make([]byte, 32<<10)
	for {
		n, err := rd.Read(buf)
		if n > 0 {
			*off += int64(n)
			if t.send(ctx, websocket.MessageBinary, buf[:n]) != nil {
				t.cancel()
				io.Copy(io.Discard, rd)
				return
			}
		}
		if err != nil {
			return
		}
	}
}
