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

	var wmu sync.Mutex // one writer at a time
	send := func(typ websocket.MessageType, p []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return c.Write(ctx, typ, p)
	}
	sendControl := func(m ttyControl) error {
		b, _ := json.Marshal(m)
		return send(websocket.MessageText, b)
	}
	sendError := func(err error) error {
		ae := classify(err)
		return sendControl(ttyControl{Type: "error", Error: &errorDetail{Code: ae.Code, Message: ae.Message}})
	}

	// Input: until the client closes or ctx ends.
	go func() {
		defer cancel()
		for {
			typ, p, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if len(p) > 0 {
					if err := pg.WriteProcessStdin(ctx, pid, p); err != nil && !errors.Is(err, guestproto.ErrExited) {
						_ = sendError(err)
					}
				}
				continue
			}
			var m ttyControl
			if err := json.Unmarshal(p, &m); err != nil || m.Type != "resize" {
				_ = sendError(invalid(`a text frame must be {"type":"resize","rows":R,"cols":C}`))
				continue
			}
			if err := (ptySize{Rows: m.Rows, Cols: m.Cols}).validate(); err != nil {
				_ = sendError(err)
				continue
			}
			if err := pg.ResizeProcess(ctx, pid, m.Rows, m.Cols); err != nil && !errors.Is(err, guestproto.ErrExited) {
				_ = sendError(err)
			}
		}
	}()

	// Output: re-attach where it stopped when the attach lags.
	offs := [2]int64{a.Start.StdoutOffset, a.Start.StderrOffset}
	for {
		var wg sync.WaitGroup
		copyOut := func(i int, rd io.Reader) {
			defer wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := rd.Read(buf)
				if n > 0 {
					offs[i] += int64(n)
					if send(websocket.MessageBinary, buf[:n]) != nil {
						cancel()
						io.Copy(io.Discard, rd)
						return
					}
				}
				if err != nil {
					return
				}
			}
		}
		wg.Add(2)
		go copyOut(0, a.Stdout)
		go copyOut(1, a.Stderr)
		wg.Wait()
		if ctx.Err() != nil {
			a.Close()
			return
		}
		proc, lagged, err := a.End()
		if err != nil {
			_ = sendError(err)
			_ = c.Close(websocket.StatusInternalError, "attach failed")
			return
		}
		if !lagged {
			e := proc.Exit
			_ = sendControl(ttyControl{Type: "exit", ExitCode: &e.ExitCode, Signal: e.Signal})
			_ = c.Close(websocket.StatusNormalClosure, "")
			return
		}
		if a, err = pg.AttachProcess(ctx, pid, offs[0], offs[1]); err != nil {
			_ = sendError(err)
			_ = c.Close(websocket.StatusInternalError, "attach failed")
			return
		}
	}
}
