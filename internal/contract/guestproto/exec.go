package guestproto

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Process is an exec started by StartExec.
//
// Read Stdout and Stderr concurrently until EOF (the guest's pipes block when
// they are not read), write Stdin and Close it (if the request asked for
// stdin), then call Wait. Cancelling StartExec's ctx or calling Kill kills
// the process group.
type Process struct {
	// PID is the process id in the guest.
	PID    int
	Stdin  io.WriteCloser
	Stdout io.Reader
	Stderr io.Reader

	c *Client
	s *Stream
}

// StartExec starts a process and returns once it runs in the guest. A
// missing executable, cwd or an invalid request fail here with a *Error
// (ErrNotFound, ErrPermission, ErrInvalid). So does a User the guest does
// not know, or any User when the guest's agent does not list
// FeatureExecUser (ErrInvalid: it would run the process as root).
func (c *Client) StartExec(ctx context.Context, req ExecRequest) (*Process, error) {
	if req.Cwd == "" {
		req.Cwd = c.cfg.ExecCwd
	}
	if req.User == "" && c.execUser.Load() {
		req.User = c.cfg.ExecUser
	}
	if req.User != "" && c.established.Load() && !c.execUser.Load() {
		return nil, fmt.Errorf("exec: %w", Errorf(CodeInvalid,
			"this sandbox's guest agent is too old to run commands as another user (user %q); recreate the sandbox from a current template", req.User))
	}
	if err := req.Validate(); err != nil {
		return nil, fmt.Errorf("exec: %w", Errorf(CodeInvalid, "%v", err))
	}
	s, err := c.open(ctx, &OpenRequest{Op: OpExec, Exec: &req}, 2)
	if err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	if !req.Stdin {
		if err := s.CloseWrite(); err != nil {
			s.abort(err, nil)
			return nil, fmt.Errorf("exec: %w", err)
		}
	}
	r, err := c.waitFrame(s, s.reply, "REPLY")
	if err != nil {
		s.detach()
		return nil, fmt.Errorf("exec: %w", err)
	}
	if req.TimeoutMS > 0 {
		limit := time.Duration(req.TimeoutMS) * time.Millisecond
		s.setDeadline(limit+c.cfg.ExecGrace, Errorf(CodeTimeout, "the guest agent did not end the exec within its timeout of %v (and %v of grace)", limit, c.cfg.ExecGrace))
	} else {
		s.setDeadline(0, nil)
	}
	return &Process{
		PID:    r.PID,
		Stdin:  stdinWriter{s},
		Stdout: channelReader{s, 0},
		Stderr: channelReader{s, 1},
		c:      c,
		s:      s,
	}, nil
}

// Wait waits for the process to end and returns how it ended. It does not
// read Stdout or Stderr.
func (p *Process) Wait() (ExecResult, error) {
	r, err := p.c.waitFrame(p.s, p.s.exit, "EXIT")
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec: %w", err)
	}
	if r.Exec == nil {
		return ExecResult{}, fmt.Errorf("exec: %w", Errorf(CodeInternal, "EXIT without result"))
	}
	return *r.Exec, nil
}

// Kill aborts the stream, which kills the process group with SIGKILL.
func (p *Process) Kill() {
	p.s.abort(Errorf(CodeCanceled, "killed by host"), &Error{Code: CodeCanceled, Message: "killed by host"})
}

type stdinWriter struct{ s *Stream }

func (w stdinWriter) Write(p []byte) (int, error) { return w.s.Write(p) }

func (w stdinWriter) Close() error { return w.s.CloseWrite() }

type channelReader struct {
	s  *Stream
	ch int
}

func (r channelReader) Read(p []byte) (int, error) { return r.s.read(r.ch, p, nil) }

// Exec runs a process to completion: stdin (nil for none) is streamed to it,
// its output is copied to stdout and stderr (nil discards) as it is produced.
// A non-zero exit is not an error; see ExecResult.
func (c *Client) Exec(ctx context.Context, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (ExecResult, error) {
	req.Stdin = stdin != nil
	p, err := c.StartExec(ctx, req)
	if err != nil {
		return ExecResult{}, err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	if stdin != nil {
		go func() {
			// Errors end the copy: the process may exit without reading.
			_, _ = io.Copy(p.Stdin, stdin)
			_ = p.Stdin.Close()
		}()
	}
	var wg sync.WaitGroup
	var outErr, errErr error
	wg.Add(2)
	go func() { defer wg.Done(); outErr = copyOut(stdout, p.Stdout) }()
	go func() { defer wg.Done(); errErr = copyOut(stderr, p.Stderr) }()
	wg.Wait()
	for _, err := range []error{outErr, errErr} {
		var we writeError
		if errors.As(err, &we) {
			p.Kill()
			return ExecResult{}, fmt.Errorf("exec: copy output: %w", we.err)
		}
	}
	return p.Wait()
}

type writeError struct{ err error }

func (e writeError) Error() string { return e.err.Error() }

// copyOut copies r to w, telling write errors (writeError) from read errors.
func copyOut(w io.Writer, r io.Reader) error {
	bp := payloadPool.Get().(*[]byte)
	defer payloadPool.Put(bp)
	buf := *bp
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return writeError{werr}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}
