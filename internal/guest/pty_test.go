package guest_test

import (
	"errors"
	"io"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

func TestPTYProcess(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	info, err := c.StartProcess(ctx, guestproto.ExecRequest{
		Shell: `test -t 0 && test -t 1 && echo "tty $TERM"; stty size; read line; echo "got $line"; stty size; read line; exit 3`,
		PTY:   &guestproto.PTYSize{Rows: 24, Cols: 80},
	})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	if info.PTY == nil || *info.PTY != (guestproto.PTYSize{Rows: 24, Cols: 80}) || !info.StdinOpen {
		t.Fatalf("started %+v, want pty 24x80 with stdin open", info)
	}
	a, err := c.AttachProcess(ctx, info.PID, 0, 0)
	if err != nil {
		t.Fatalf("AttachProcess: %v", err)
	}
	readUntil(t, a.Stdout, "tty xterm-256color\r\n24 80\r\n")
	if err := c.ResizeProcess(ctx, info.PID, 50, 132); err != nil {
		t.Fatalf("ResizeProcess: %v", err)
	}
	if err := c.WriteProcessStdin(ctx, info.PID, []byte("hello\r")); err != nil {
		t.Fatalf("WriteProcessStdin: %v", err)
	}
	// The terminal echoes the input (with CR as CRLF) before the output.
	readUntil(t, a.Stdout, "hello\r\ngot hello\r\n50 132\r\n")
	if err := c.WriteProcessStdin(ctx, info.PID, []byte("x\r")); err != nil {
		t.Fatalf("WriteProcessStdin: %v", err)
	}
	io.Copy(io.Discard, a.Stdout)
	io.Copy(io.Discard, a.Stderr)
	proc, lagged, err := a.End()
	if err != nil || lagged || proc.Exit == nil || proc.Exit.ExitCode != 3 {
		t.Fatalf("attach End = %+v, %v, %v; want exit 3", proc, lagged, err)
	}
	if proc.StderrEnd != 0 {
		t.Errorf("stderr of a PTY process has %d bytes, want 0: all output is the terminal's", proc.StderrEnd)
	}
	if err := c.ResizeProcess(ctx, info.PID, 10, 10); !errors.Is(err, guestproto.ErrExited) {
		t.Errorf("resize an exited process: %v, want ErrExited", err)
	}
}

func TestPTYErrors(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	plain, err := c.StartProcess(ctx, guestproto.ExecRequest{Argv: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	defer c.RemoveProcess(ctx, plain.PID)
	tests := []struct {
		name string
		do   func() error
	}{
		{"resize a process without a terminal", func() error { return c.ResizeProcess(ctx, plain.PID, 24, 80) }},
		{"resize to zero rows", func() error { return c.ResizeProcess(ctx, plain.PID, 0, 80) }},
		{"resize too wide", func() error { return c.ResizeProcess(ctx, plain.PID, 24, 1001) }},
		{"start with a bad size", func() error {
			_, err := c.StartProcess(ctx, guestproto.ExecRequest{Argv: []string{"true"}, PTY: &guestproto.PTYSize{Rows: -1, Cols: 80}})
			return err
		}},
		{"exec on a terminal", func() error {
			p, err := c.StartExec(ctx, guestproto.ExecRequest{Argv: []string{"true"}, PTY: &guestproto.PTYSize{Rows: 24, Cols: 80}})
			if err == nil {
				_, err = p.Wait()
			}
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.do(); !errors.Is(err, guestproto.ErrInvalid) {
				t.Errorf("got %v, want ErrInvalid", err)
			}
		})
	}
}
