package guestproto

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// FeatureProcesses: the agent keeps background processes (the proc_* ops).
const FeatureProcesses = "processes"

// FeaturePTY: the agent starts background processes on a pseudo-terminal
// (ExecRequest.PTY) and serves proc_resize.
const FeaturePTY = "pty"

// Background process operations (see api/guest-protocol.md).
const (
	OpProcStart  Op = "proc_start"  // Exec → REPLY {proc}
	OpProcList   Op = "proc_list"   // REPLY {}, then one JSON ProcInfo per line as DATA
	OpProcAttach Op = "proc_attach" // Proc → REPLY {proc, attach}, DATA/DATA|STDERR, EXIT {proc, lagged}
	OpProcStdin  Op = "proc_stdin"  // Proc {pid, data, close_stdin} → REPLY {}
	OpProcSignal Op = "proc_signal" // Proc {pid, signal} → REPLY {}
	OpProcWait   Op = "proc_wait"   // Proc {pid} → REPLY {proc}, EXIT {proc} once it has exited
	OpProcRemove Op = "proc_remove" // Proc {pid} → REPLY {}: SIGKILL to its group if running, then forgotten
	OpProcResize Op = "proc_resize" // Proc {pid, rows, cols} → REPLY {}: a PTY process's terminal size (FeaturePTY)
)

// Bounds of the guest's process table.
const (
	// ProcOutputMax is the ring buffer kept of each of a background
	// process's stdout and stderr; older bytes are dropped.
	ProcOutputMax = 1 << 20
	// MaxProcsRunning bounds the running background processes of a guest.
	MaxProcsRunning = 256
	// MaxProcsExited bounds the exited processes kept with their output;
	// the one that exited first is forgotten to make room.
	MaxProcsExited = 64
	// MaxStdinChunk bounds ProcRequest.Data.
	MaxStdinChunk = 32 << 10
)

// ProcRequest names a background process and what to do with it.
type ProcRequest struct {
	PID int `json:"pid"`
	// StdoutOffset and StderrOffset are where proc_attach starts: a byte
	// offset in the stream's whole output (0: the earliest byte still
	// kept; an offset past the end starts at the end), or -1 for "from
	// now".
	StdoutOffset int64 `json:"stdout_offset,omitempty"`
	StderrOffset int64 `json:"stderr_offset,omitempty"`
	// Data is written to stdin by proc_stdin (at most MaxStdinChunk bytes),
	// then stdin is closed if CloseStdin.
	Data       []byte `json:"data,omitempty"`
	CloseStdin bool   `json:"close_stdin,omitempty"`
	// Signal is a signal name for proc_signal: "TERM", "SIGTERM", "9"...
	Signal string `json:"signal,omitempty"`
	// Rows and Cols are the terminal size for proc_resize.
	Rows int `json:"rows,omitempty"`
	Cols int `json:"cols,omitempty"`
}

// Process states.
const (
	ProcRunning = "running"
	ProcExited  = "exited"
)

// ProcInfo describes a background process.
type ProcInfo struct {
	PID int `json:"pid"`
	// Cmd is the command line (argv joined by spaces; a shell command as
	// given), cut to MaxProcCmd bytes.
	Cmd             string `json:"cmd"`
	State           string `json:"state"`
	StartedUnixNano int64  `json:"started_unix_nano"`
	// Exit is set once the process has exited.
	Exit          *ExecResult `json:"exit,omitempty"`
	EndedUnixNano int64       `json:"ended_unix_nano,omitempty"`
	// StdinOpen reports that stdin is a pipe that is still open.
	StdinOpen bool `json:"stdin_open"`
	// PTY is the terminal size of a process started on a pseudo-terminal
	// (as of the last resize); its output is all stdout.
	PTY *PTYSize `json:"pty,omitempty"`
	// StdoutEnd and StderrEnd are how many bytes each stream produced in
	// all; StdoutDropped and StderrDropped how many of them are no longer
	// kept (the earliest kept byte's offset).
	StdoutEnd     int64 `json:"stdout_end"`
	StderrEnd     int64 `json:"stderr_end"`
	StdoutDropped int64 `json:"stdout_dropped"`
	StderrDropped int64 `json:"stderr_dropped"`
}

// MaxProcCmd bounds ProcInfo.Cmd.
const MaxProcCmd = 256

// ProcCmd is the Cmd of ProcInfo for req.
func ProcCmd(req *ExecRequest) string {
	s := req.Shell
	if s == "" {
		s = strings.Join(req.Argv, " ")
	}
	if len(s) > MaxProcCmd {
		s = strings.ToValidUTF8(s[:MaxProcCmd], "")
	}
	return s
}

// AttachStart is where an attach's DATA begins, per stream.
type AttachStart struct {
	StdoutOffset int64 `json:"stdout_offset"`
	StderrOffset int64 `json:"stderr_offset"`
}

// Valid reports whether the request names a process.
func (r *ProcRequest) validate(op Op) error {
	switch {
	case r == nil:
		return Errorf(CodeInvalid, "%s request missing", op)
	case r.PID <= 0:
		return Errorf(CodeInvalid, "pid %d is not a process id", r.PID)
	case r.StdoutOffset < -1 || r.StderrOffset < -1:
		return Errorf(CodeInvalid, "offsets must be -1 (now) or at least 0")
	case len(r.Data) > MaxStdinChunk:
		return Errorf(CodeInvalid, "stdin chunk of %d bytes exceeds %d", len(r.Data), MaxStdinChunk)
	}
	if op == OpProcResize {
		if err := (PTYSize{Rows: r.Rows, Cols: r.Cols}).Validate(); err != nil {
			return Errorf(CodeInvalid, "%v", err)
		}
	}
	return nil
}

// Validate is validate for the guest.
func (r *ProcRequest) Validate(op Op) error { return r.validate(op) }

// needProcs fails with CodeInvalid on an agent without FeatureProcesses.
func (c *Client) needProcs(what string) error {
	if c.established.Load() && !c.procs.Load() {
		return fmt.Errorf("%s: %w", what, Errorf(CodeInvalid,
			"this sandbox's guest agent is too old for background processes; recreate the sandbox from a current template"))
	}
	return nil
}

// needPTY fails with CodeInvalid on an agent without FeaturePTY.
func (c *Client) needPTY(what string) error {
	if c.established.Load() && !c.pty.Load() {
		return fmt.Errorf("%s: %w", what, Errorf(CodeInvalid,
			"this sandbox's guest agent is too old for terminals; recreate the sandbox from a current template"))
	}
	return nil
}

// StartProcess starts a background process, which runs until it exits or
// is signalled or removed, whoever is attached. Exec's fields mean what
// they mean for StartExec (Stdin keeps a stdin pipe open for
// WriteProcessStdin).
func (c *Client) StartProcess(ctx context.Context, req ExecRequest) (ProcInfo, error) {
	if err := c.needProcs("start process"); err != nil {
		return ProcInfo{}, err
	}
	if req.Cwd == "" {
		req.Cwd = c.cfg.ExecCwd
	}
	if req.User == "" && c.execUser.Load() {
		req.User = c.cfg.ExecUser
	}
	if err := req.Validate(); err != nil {
		return ProcInfo{}, fmt.Errorf("start process: %w", Errorf(CodeInvalid, "%v", err))
	}
	if req.PTY != nil {
		if err := c.needPTY("start process"); err != nil {
			return ProcInfo{}, err
		}
	}
	r, err := c.call(ctx, &OpenRequest{Op: OpProcStart, Exec: &req})
	if err != nil {
		return ProcInfo{}, fmt.Errorf("start process: %w", err)
	}
	if r.Proc == nil {
		return ProcInfo{}, fmt.Errorf("start process: %w", Errorf(CodeInternal, "reply without proc"))
	}
	return *r.Proc, nil
}

// ListProcesses lists the background processes, running and exited, by pid.
func (c *Client) ListProcesses(ctx context.Context) ([]ProcInfo, error) {
	if err := c.needProcs("list processes"); err != nil {
		return nil, err
	}
	s, err := c.open(ctx, &OpenRequest{Op: OpProcList}, 1)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	defer s.detach()
	if err := s.CloseWrite(); err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	if _, err := c.waitFrame(s, s.reply, "REPLY"); err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	dec := json.NewDecoder(io.LimitReader(s, int64(MaxProcsRunning+MaxProcsExited+1)*4096))
	var out []ProcInfo
	for {
		var p ProcInfo
		err := dec.Decode(&p)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			s.abort(err, &Error{Code: CodeCanceled, Message: "list aborted by host"})
			return nil, fmt.Errorf("list processes: %w", Errorf(CodeInternal, "malformed process listing: %v", err))
		}
		if len(out) == MaxProcsRunning+MaxProcsExited {
			s.abort(err, &Error{Code: CodeCanceled, Message: "list aborted by host"})
			return nil, fmt.Errorf("list processes: %w", Errorf(CodeTooLarge, "the guest listed more than %d processes", len(out)))
		}
		out = append(out, p)
	}
}

// procCall runs a proc_* request answered by one REPLY.
func (c *Client) procCall(ctx context.Context, op Op, req ProcRequest) (Reply, error) {
	what := fmt.Sprintf("%s %d", op, req.PID)
	if err := c.needProcs(what); err != nil {
		return Reply{}, err
	}
	if err := req.validate(op); err != nil {
		return Reply{}, fmt.Errorf("%s: %w", what, err)
	}
	r, err := c.call(ctx, &OpenRequest{Op: op, Proc: &req})
	if err != nil {
		return Reply{}, fmt.Errorf("%s: %w", what, err)
	}
	return r, nil
}

// WriteProcessStdin writes p to the process's stdin, in chunks. It fails
// with CodeExited if the process has exited or its stdin is closed, and
// CodeInvalid if it was started without stdin.
func (c *Client) WriteProcessStdin(ctx context.Context, pid int, p []byte) error {
	for {
		n := min(len(p), MaxStdinChunk)
		if _, err := c.procCall(ctx, OpProcStdin, ProcRequest{PID: pid, Data: p[:n]}); err != nil {
			return err
		}
		p = p[n:]
		if len(p) == 0 {
			return nil
		}
	}
}

// CloseProcessStdin closes the process's stdin (idempotent while it runs).
func (c *Client) CloseProcessStdin(ctx context.Context, pid int) error {
	_, err := c.procCall(ctx, OpProcStdin, ProcRequest{PID: pid, CloseStdin: true})
	return err
}

// SignalProcess sends a signal, by name ("TERM", "SIGKILL") or number, to
// the process's group. An unknown signal is CodeInvalid; an exited
// process CodeExited.
func (c *Client) SignalProcess(ctx context.Context, pid int, signal string) error {
	_, err := c.procCall(ctx, OpProcSignal, ProcRequest{PID: pid, Signal: signal})
	return err
}

// ResizeProcess sets the terminal size of a process started with a PTY
// (CodeInvalid for another process; CodeExited once it has exited). The
// process's foreground group gets SIGWINCH.
func (c *Client) ResizeProcess(ctx context.Context, pid, rows, cols int) error {
	if err := c.needPTY(fmt.Sprintf("resize process %d", pid)); err != nil {
		return err
	}
	_, err := c.procCall(ctx, OpProcResize, ProcRequest{PID: pid, Rows: rows, Cols: cols})
	return err
}

// RemoveProcess kills the process's group if it runs and forgets it.
func (c *Client) RemoveProcess(ctx context.Context, pid int) error {
	_, err := c.procCall(ctx, OpProcRemove, ProcRequest{PID: pid})
	return err
}

// WaitProcess waits until the process has exited, or ctx ends, and
// describes it then.
func (c *Client) WaitProcess(ctx context.Context, pid int) (ProcInfo, error) {
	what := fmt.Sprintf("wait process %d", pid)
	if err := c.needProcs(what); err != nil {
		return ProcInfo{}, err
	}
	req := ProcRequest{PID: pid}
	if err := req.validate(OpProcWait); err != nil {
		return ProcInfo{}, fmt.Errorf("%s: %w", what, err)
	}
	s, err := c.open(ctx, &OpenRequest{Op: OpProcWait, Proc: &req}, 0)
	if err != nil {
		return ProcInfo{}, fmt.Errorf("%s: %w", what, err)
	}
	defer s.detach()
	if err := s.CloseWrite(); err != nil {
		return ProcInfo{}, fmt.Errorf("%s: %w", what, err)
	}
	if _, err := c.waitFrame(s, s.reply, "REPLY"); err != nil {
		return ProcInfo{}, fmt.Errorf("%s: %w", what, err)
	}
	s.setDeadline(0, nil)
	r, err := c.waitFrame(s, s.exit, "EXIT")
	if err != nil {
		return ProcInfo{}, fmt.Errorf("%s: %w", what, err)
	}
	if r.Proc == nil || r.Proc.Exit == nil {
		return ProcInfo{}, fmt.Errorf("%s: %w", what, Errorf(CodeInternal, "EXIT without exit status"))
	}
	return *r.Proc, nil
}

// Attachment is an attach to a background process's output, started by
// AttachProcess. Read Stdout and Stderr concurrently until EOF, then call
// End. Cancelling AttachProcess's ctx or calling Close detaches; the
// process runs on.
type Attachment struct {
	// Start is where Stdout and Stderr begin in the streams' whole output.
	// An attach from offset 0 whose Start is above 0 missed that many
	// dropped bytes.
	Start  AttachStart
	Proc   ProcInfo // as of the attach
	Stdout io.Reader
	Stderr io.Reader

	c *Client
	s *Stream
	// end and close replace c and s in an Attachment made by
	// NewAttachment.
	end   func() (ProcInfo, bool, error)
	close func()
}

// NewAttachment returns an Attachment carried by something other than a
// guest connection (the host API): end and close implement End and Close
// with their contracts.
func NewAttachment(start AttachStart, proc ProcInfo, stdout, stderr io.Reader, end func() (proc ProcInfo, lagged bool, err error), close func()) *Attachment {
	return &Attachment{Start: start, Proc: proc, Stdout: stdout, Stderr: stderr, end: end, close: close}
}

// AttachProcess streams the process's output from the given offsets (0:
// the earliest kept, -1: from now) until it exits.
func (c *Client) AttachProcess(ctx context.Context, pid int, stdoutOffset, stderrOffset int64) (*Attachment, error) {
	what := fmt.Sprintf("attach process %d", pid)
	if err := c.needProcs(what); err != nil {
		return nil, err
	}
	req := ProcRequest{PID: pid, StdoutOffset: stdoutOffset, StderrOffset: stderrOffset}
	if err := req.validate(OpProcAttach); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	s, err := c.open(ctx, &OpenRequest{Op: OpProcAttach, Proc: &req}, 2)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := s.CloseWrite(); err != nil {
		s.abort(err, nil)
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	r, err := c.waitFrame(s, s.reply, "REPLY")
	if err != nil {
		s.detach()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if r.Proc == nil || r.Attach == nil {
		s.detach()
		return nil, fmt.Errorf("%s: %w", what, Errorf(CodeInternal, "attach reply without proc"))
	}
	s.setDeadline(0, nil)
	return &Attachment{Start: *r.Attach, Proc: *r.Proc, Stdout: channelReader{s, 0}, Stderr: channelReader{s, 1}, c: c, s: s}, nil
}

// End waits for the attach's EXIT, after Stdout and Stderr reached EOF.
// lagged reports that the attach fell behind the ring buffer and was
// ended by the guest; attach again from where it stopped (the new
// Attachment's Start says how much was dropped). Otherwise the process
// has exited and proc.Exit says how.
func (a *Attachment) End() (proc ProcInfo, lagged bool, err error) {
	if a.end != nil {
		return a.end()
	}
	r, err := a.c.waitFrame(a.s, a.s.exit, "EXIT")
	if err != nil {
		return ProcInfo{}, false, fmt.Errorf("attach process: %w", err)
	}
	if r.Proc == nil || (!r.Lagged && r.Proc.Exit == nil) {
		return ProcInfo{}, false, fmt.Errorf("attach process: %w", Errorf(CodeInternal, "EXIT without exit status"))
	}
	return *r.Proc, r.Lagged, nil
}

// Close detaches; the process runs on.
func (a *Attachment) Close() {
	if a.close != nil {
		a.close()
		return
	}
	a.s.abort(Errorf(CodeCanceled, "detached by host"), &Error{Code: CodeCanceled, Message: "detached by host"})
}
