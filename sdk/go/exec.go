package pandastack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/pandastack/pandastack/sdk/go/internal/wire"
)

// NoTimeout as Command.Timeout lets the command run until it exits.
const NoTimeout time.Duration = -1

// Command is a command to run in a sandbox: exactly one of Cmd (a shell
// string, run with /bin/bash -l -c, a login bash whose profiles do not
// override Env, or /bin/sh -c in a sandbox without bash) and Argv (a
// program and its arguments, looked up in PATH).
type Command struct {
	Cmd  string
	Argv []string
	// Env is added to the sandbox's default environment.
	Env map[string]string
	// Cwd is the working directory, absolute (default the user's home if
	// it exists, else /; /root for root).
	Cwd string
	// User runs the command as this user instead of root, written as
	// Docker's USER: "name", "uid", "name:group" or "uid:gid". Names are
	// looked up in the sandbox's /etc/passwd and /etc/group (an unknown one
	// is ErrNotFound). Default: the template image's User, else root.
	User string
	// Timeout kills the command's process group after this long. Zero
	// means the server's default (60 s); NoTimeout means none.
	Timeout time.Duration
	// Stdin is fed to the command's standard input.
	Stdin string
	// OpenStdin keeps a background process's stdin open for
	// Process.WriteStdin (StartProcess only).
	OpenStdin bool
	// PTY runs a background process on a new pseudo-terminal of this size
	// (StartProcess only; Exec refuses it): its stdin, stdout, stderr and
	// controlling terminal, TERM=xterm-256color unless Env sets it. Its
	// output is the terminal's, all read as stdout by Process.Output;
	// Process.WriteStdin sends keystrokes (stdin is always open);
	// Process.Resize changes the size. CloseStdin only stops input: send
	// "\x04" (^D) for end of file. The REST API's WebSocket
	// (GET …/processes/{pid}/tty) serves browsers and the CLI.
	PTY *PTYSize
}

// PTYSize is a terminal's size in characters, each 1 to 1000.
type PTYSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// check rejects a Command the API has no form for.
func (cmd Command) check() error {
	if (cmd.Cmd == "") == (len(cmd.Argv) == 0) {
		return newError(0, CodeInvalid, "a command needs exactly one of Cmd and Argv")
	}
	return nil
}

// timeoutSeconds is Timeout as the API's timeout_seconds: nil for the
// server's default, 0 for none.
func (cmd Command) timeoutSeconds() *float64 {
	switch {
	case cmd.Timeout < 0:
		zero := 0.0
		return &zero
	case cmd.Timeout > 0:
		s := cmd.Timeout.Seconds()
		return &s
	}
	return nil
}

// request is cmd as the body of an exec.
func (cmd Command) request() (wire.ExecRequest, error) {
	if err := cmd.check(); err != nil {
		return wire.ExecRequest{}, err
	}
	if cmd.PTY != nil {
		return wire.ExecRequest{}, newError(0, CodeInvalid, "a terminal (PTY) is for StartProcess, not Exec")
	}
	return wire.ExecRequest{
		Cmd: optional(cmd.Cmd), Argv: optionalSlice(cmd.Argv), Env: optionalMap(cmd.Env), Cwd: optional(cmd.Cwd),
		User: optional(cmd.User), TimeoutSeconds: cmd.timeoutSeconds(), Stdin: optional(cmd.Stdin),
	}, nil
}

// ExecResult is how a command ended. A non-zero exit is not a Go error.
type ExecResult struct {
	// ExitCode is the exit status, or 128+N when killed by signal N.
	ExitCode int `json:"exit_code"`
	// Stdout and Stderr are the output as UTF-8 text (invalid bytes
	// replaced), each cut at 16 MiB (see Truncated). ExecStream leaves
	// them empty: it writes the output to its writers instead.
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	DurationMS int64  `json:"duration_ms"`
	Signal     string `json:"signal,omitempty"` // e.g. SIGKILL
	TimedOut   bool   `json:"timed_out,omitempty"`
	Truncated  bool   `json:"truncated,omitempty"`
}

// Exec runs cmd, waits for it to exit and returns its buffered output.
func (s *Sandbox) Exec(ctx context.Context, cmd Command) (ExecResult, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return ExecResult{}, err
	}
	req, err := cmd.request()
	if err != nil {
		return ExecResult{}, err
	}
	var res ExecResult
	err = s.c.doJSON(ctx, http.MethodPost, path("sandboxes", s.ID, "exec"), nil, req, &res)
	return res, err
}

// execEvent is one line of the exec stream.
type execEvent struct {
	Type       string `json:"type"`
	PID        int    `json:"pid"`
	Data       string `json:"data"`
	ExitCode   int    `json:"exit_code"`
	Signal     string `json:"signal"`
	TimedOut   bool   `json:"timed_out"`
	DurationMS int64  `json:"duration_ms"`
	Error      *Error `json:"error"`
}

// ErrStreamEnded is returned (wrapped) when a stream ends before its last
// event, e.g. because the connection broke.
var ErrStreamEnded = errors.New("stream ended early")

// ExecStream runs cmd and writes its output to stdout and stderr as it is
// produced (either may be nil to drop it). It returns when the command has
// exited; the result's Stdout and Stderr are empty. Cancelling ctx kills
// the command. If a writer fails, the command is killed and the write error
// returned.
func (s *Sandbox) ExecStream(ctx context.Context, cmd Command, stdout, stderr io.Writer) (ExecResult, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return ExecResult{}, err
	}
	r, err := cmd.request()
	if err != nil {
		return ExecResult{}, err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return ExecResult{}, fmt.Errorf("encode request: %w", err)
	}
	// Our own cancel: returning early (a writer failed) must close the
	// connection, which kills the command.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := s.c.newRequest(ctx, http.MethodPost, path("sandboxes", s.ID, "exec", "stream"), nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return ExecResult{}, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := s.c.send(req)
	if err != nil {
		return ExecResult{}, err
	}
	defer resp.Body.Close()
	return readExecStream(resp.Body, stdout, stderr)
}

// readExecStream consumes exec events until exit or error.
func readExecStream(r io.Reader, stdout, stderr io.Writer) (ExecResult, error) {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	dec := json.NewDecoder(r)
	for {
		var ev execEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return ExecResult{}, fmt.Errorf("exec: %w before the command exited", ErrStreamEnded)
			}
			return ExecResult{}, fmt.Errorf("exec: read output stream: %w", err)
		}
		switch ev.Type {
		case "start":
		case "stdout":
			if _, err := io.WriteString(stdout, ev.Data); err != nil {
				return ExecResult{}, fmt.Errorf("exec: write stdout: %w", err)
			}
		case "stderr":
			if _, err := io.WriteString(stderr, ev.Data); err != nil {
				return ExecResult{}, fmt.Errorf("exec: write stderr: %w", err)
			}
		case "exit":
			return ExecResult{
				ExitCode: ev.ExitCode, Signal: ev.Signal, TimedOut: ev.TimedOut, DurationMS: ev.DurationMS,
			}, nil
		case "error":
			if ev.Error == nil {
				return ExecResult{}, newError(0, CodeInternal, "exec stream: error event without an error")
			}
			return ExecResult{}, newError(0, ev.Error.Code, ev.Error.Message)
		default:
			// Unknown events are future additions: skip them.
		}
	}
}
