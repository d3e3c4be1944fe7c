package pandastack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/pandastack/pandastack/sdk/go/internal/wire"
)

// Process is a background process in a sandbox, started by
// Sandbox.StartProcess. It runs until it exits, is signalled or killed,
// whether or not anyone follows its output; the sandbox keeps the last
// 1 MiB of each of its stdout and stderr.
type Process struct {
	PID  int
	Info ProcessInfo // as of the call that returned the process
	sb   *Sandbox
}

// ProcessInfo describes a background process.
type ProcessInfo struct {
	PID       int        `json:"pid"`
	Cmd       string     `json:"cmd"`
	State     string     `json:"state"` // "running" or "exited"
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	// ExitCode is nil while it runs; 128+N when killed by signal N.
	ExitCode  *int   `json:"exit_code"`
	Signal    string `json:"signal,omitempty"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	StdinOpen bool   `json:"stdin_open"`
	// PTY is the terminal size of a process started with Command.PTY.
	PTY *PTYSize `json:"pty,omitempty"`
	// StdoutBytes is how many bytes it wrote to stdout in all, of which
	// the first StdoutDropped are no longer kept; likewise for stderr.
	StdoutBytes   int64 `json:"stdout_bytes"`
	StderrBytes   int64 `json:"stderr_bytes"`
	StdoutDropped int64 `json:"stdout_dropped"`
	StderrDropped int64 `json:"stderr_dropped"`
}

// StartProcess starts cmd in the background and returns once it runs.
// Unlike Exec, a zero Timeout means none. With cmd.OpenStdin the process's
// stdin stays open for WriteStdin (cmd.Stdin, if set, is written first);
// otherwise it reads cmd.Stdin, then end of file.
func (s *Sandbox) StartProcess(ctx context.Context, cmd Command) (*Process, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return nil, err
	}
	if err := cmd.check(); err != nil {
		return nil, err
	}
	req := wire.ProcessRequest{
		Cmd: optional(cmd.Cmd), Argv: optionalSlice(cmd.Argv), Env: optionalMap(cmd.Env), Cwd: optional(cmd.Cwd),
		User: optional(cmd.User), Stdin: optional(cmd.OpenStdin || cmd.Stdin != ""),
	}
	if cmd.PTY != nil {
		req.Pty = &wire.TerminalSize{Rows: cmd.PTY.Rows, Cols: cmd.PTY.Cols}
	}
	if cmd.Timeout > 0 {
		req.TimeoutSeconds = cmd.timeoutSeconds()
	}
	var info ProcessInfo
	if err := s.c.doJSON(ctx, http.MethodPost, path("sandboxes", s.ID, "processes"), nil, req, &info); err != nil {
		return nil, err
	}
	p := &Process{PID: info.PID, Info: info, sb: s}
	if cmd.Stdin != "" {
		if err := p.WriteStdin(ctx, []byte(cmd.Stdin)); err != nil {
			return p, err
		}
	}
	if cmd.Stdin != "" && !cmd.OpenStdin {
		if err := p.CloseStdin(ctx); err != nil {
			return p, err
		}
	}
	return p, nil
}

// Processes lists the sandbox's background processes, running and exited.
func (s *Sandbox) Processes(ctx context.Context) ([]ProcessInfo, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return nil, err
	}
	var out struct {
		Processes []ProcessInfo `json:"processes"`
	}
	err := s.c.doJSON(ctx, http.MethodGet, path("sandboxes", s.ID, "processes"), nil, nil, &out)
	return out.Processes, err
}

// Process returns the background process pid (ErrNotFound if there is none).
func (s *Sandbox) Process(ctx context.Context, pid int) (*Process, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return nil, err
	}
	var info ProcessInfo
	if err := s.c.doJSON(ctx, http.MethodGet, procPath(s.ID, pid), nil, nil, &info); err != nil {
		return nil, err
	}
	return &Process{PID: pid, Info: info, sb: s}, nil
}

func procPath(sandboxID string, pid int, rest ...string) string {
	return path(append([]string{"sandboxes", sandboxID, "processes", strconv.Itoa(pid)}, rest...)...)
}

// From where Process.Output starts.
const (
	FromStart int64 = 0  // the earliest byte still kept
	FromNow   int64 = -1 // only what comes next
)

// OutputChunk is a piece of a process's output. Offset is the byte
// offset of Data in the stream's whole output. Dropped, when positive,
// says that many bytes before Offset were asked for but are no longer
// kept (Data is then empty).
type OutputChunk struct {
	Stderr  bool
	Data    string
	Offset  int64
	Dropped int64
}

type processEvent struct {
	execEvent
	Stream string `json:"stream"`
	Offset int64  `json:"offset"`
	Bytes  int64  `json:"bytes"`
}

// Output follows the process's output from offset from (FromStart,
// FromNow or a byte offset, for stdout and stderr alike), calling fn for
// each chunk, until the process exits; then it returns how it ended.
// Cancelling ctx stops following; the process runs on. An error from fn
// stops following and is returned.
func (pr *Process) Output(ctx context.Context, from int64, fn func(OutputChunk) error) (ExecResult, error) {
	q := url.Values{}
	switch {
	case from == FromNow:
		q.Set("from", "now")
	case from >= 0:
		q.Set("from", strconv.FormatInt(from, 10))
	default:
		return ExecResult{}, newError(0, CodeInvalid, "from must be FromStart, FromNow or a byte offset")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := pr.sb.c.newRequest(ctx, http.MethodGet, procPath(pr.sb.ID, pr.PID, "output"), q, nil, "")
	if err != nil {
		return ExecResult{}, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := pr.sb.c.send(req)
	if err != nil {
		return ExecResult{}, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev processEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return ExecResult{}, fmt.Errorf("process output: %w before the process exited", ErrStreamEnded)
			}
			return ExecResult{}, fmt.Errorf("process output: read stream: %w", err)
		}
		var c OutputChunk
		switch ev.Type {
		case "stdout", "stderr":
			c = OutputChunk{Stderr: ev.Type == "stderr", Data: ev.Data, Offset: ev.Offset}
		case "dropped":
			c = OutputChunk{Stderr: ev.Stream == "stderr", Offset: ev.Offset, Dropped: ev.Bytes}
		case "exit":
			return ExecResult{ExitCode: ev.ExitCode, Signal: ev.Signal, TimedOut: ev.TimedOut, DurationMS: ev.DurationMS}, nil
		case "error":
			if ev.Error == nil {
				return ExecResult{}, newError(0, CodeInternal, "process output: error event without an error")
			}
			return ExecResult{}, newError(0, ev.Error.Code, ev.Error.Message)
		default:
			continue // "start", and future additions
		}
		if err := fn(c); err != nil {
			return ExecResult{}, err
		}
	}
}

// WriteStdin writes b to the process's stdin (ErrConflict once it has
// exited or its stdin is closed).
func (pr *Process) WriteStdin(ctx context.Context, b []byte) error {
	return pr.stdin(ctx, b, false)
}

// CloseStdin closes the process's stdin.
func (pr *Process) CloseStdin(ctx context.Context) error { return pr.stdin(ctx, nil, true) }

// WriteAndCloseStdin writes b to the process's stdin and closes it, the
// close going with the last write: a process that exits as soon as it has
// read b does not make the close fail.
func (pr *Process) WriteAndCloseStdin(ctx context.Context, b []byte) error {
	return pr.stdin(ctx, b, true)
}

func (pr *Process) stdin(ctx context.Context, b []byte, closeIt bool) error {
	const chunk = 1 << 20 // the server's bound per request
	for first := true; first || len(b) > 0; first = false {
		n := min(len(b), chunk)
		q := url.Values{}
		if closeIt && n == len(b) {
			q.Set("close", "true")
		}
		req, err := pr.sb.c.newRequest(ctx, http.MethodPost, procPath(pr.sb.ID, pr.PID, "stdin"), q, bytesReader(b[:n]), "application/octet-stream")
		if err != nil {
			return err
		}
		resp, err := pr.sb.c.send(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		b = b[n:]
	}
	return nil
}

// Signal sends a signal, by name ("TERM", "KILL", "INT", "HUP"...), to the
// process's group (ErrInvalid for an unknown one, ErrConflict once it has
// exited).
func (pr *Process) Signal(ctx context.Context, signal string) error {
	return pr.sb.c.doJSON(ctx, http.MethodPost, procPath(pr.sb.ID, pr.PID, "signal"), nil, wire.SignalProcessJSONRequestBody{Signal: signal}, nil)
}

// Resize sets the terminal size of a process started with Command.PTY
// (rows and cols 1 to 1000; ErrInvalid otherwise or for a process
// without a terminal, ErrConflict once it has exited).
func (pr *Process) Resize(ctx context.Context, rows, cols int) error {
	return pr.sb.c.doJSON(ctx, http.MethodPost, procPath(pr.sb.ID, pr.PID, "resize"), nil, wire.ResizeProcessJSONRequestBody{Rows: rows, Cols: cols}, nil)
}

// Wait waits until the process has exited and returns how.
func (pr *Process) Wait(ctx context.Context) (ProcessInfo, error) {
	var info ProcessInfo
	err := pr.sb.c.doJSON(ctx, http.MethodPost, procPath(pr.sb.ID, pr.PID, "wait"), nil, nil, &info)
	if err == nil {
		pr.Info = info
	}
	return info, err
}

// Kill kills the process's group if it runs and forgets the process and
// its output.
func (pr *Process) Kill(ctx context.Context) error {
	return pr.sb.c.doJSON(ctx, http.MethodDelete, procPath(pr.sb.ID, pr.PID), nil, nil, nil)
}

// ProcessHandle returns a handle on the background process pid without
// calling the server (a wrong pid fails the first call, ErrNotFound).
func (s *Sandbox) ProcessHandle(pid int) *Process {
	return &Process{PID: pid, sb: s}
}

// Describe returns the process as it is now.
func (pr *Process) Describe(ctx context.Context) (ProcessInfo, error) {
	p, err := pr.sb.Process(ctx, pr.PID)
	if err != nil {
		return ProcessInfo{}, err
	}
	pr.Info = p.Info
	return p.Info, nil
}
