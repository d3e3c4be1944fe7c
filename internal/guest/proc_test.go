package guest_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// readUntil reads r until what has been seen and returns all read; it
// fails the test if r ends first (the test's ctx bounds the wait).
func readUntil(t *testing.T, r io.Reader, what string) string {
	t.Helper()
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for !strings.Contains(got.String(), what) {
		n, err := r.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			t.Fatalf("read %q so far, want %q: %v", got.String(), what, err)
		}
	}
	return got.String()
}

func TestProcessLifecycle(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	info, err := c.StartProcess(ctx, guestproto.ExecRequest{Shell: "echo start; echo warn >&2; read line; echo got $line; exec sleep 1000", Stdin: true})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	if info.PID <= 0 || info.State != guestproto.ProcRunning || !info.StdinOpen {
		t.Fatalf("started %+v, want a running process with stdin open", info)
	}
	pid := info.PID

	a, err := c.AttachProcess(ctx, pid, 0, 0)
	if err != nil {
		t.Fatalf("AttachProcess: %v", err)
	}
	if got := readUntil(t, a.Stdout, "start\n"); got != "start\n" {
		t.Errorf("stdout from start = %q, want %q", got, "start\n")
	}
	if got := readUntil(t, a.Stderr, "warn\n"); got != "warn\n" {
		t.Errorf("stderr from start = %q, want %q", got, "warn\n")
	}
	a.Close() // detach: the process runs on

	// Two attaches from now both see what comes next.
	var live [2]*guestproto.Attachment
	for i := range live {
		if live[i], err = c.AttachProcess(ctx, pid, -1, -1); err != nil {
			t.Fatalf("AttachProcess from now: %v", err)
		}
		if live[i].Start.StdoutOffset != 6 {
			t.Errorf("attach from now starts at %d, want 6", live[i].Start.StdoutOffset)
		}
	}
	if err := c.WriteProcessStdin(ctx, pid, []byte("hello\n")); err != nil {
		t.Fatalf("WriteProcessStdin: %v", err)
	}
	for _, l := range live {
		if got := readUntil(t, l.Stdout, "got hello\n"); got != "got hello\n" {
			t.Errorf("attach from now read %q, want %q", got, "got hello\n")
		}
	}
	again, err := c.AttachProcess(ctx, pid, 0, 0)
	if err != nil {
		t.Fatalf("AttachProcess again: %v", err)
	}
	if got := readUntil(t, again.Stdout, "got hello\n"); got != "start\ngot hello\n" {
		t.Errorf("re-attach from start read %q, want %q", got, "start\ngot hello\n")
	}

	if err := c.SignalProcess(ctx, pid, "TERM"); err != nil {
		t.Fatalf("SignalProcess: %v", err)
	}
	end, err := c.WaitProcess(ctx, pid)
	if err != nil {
		t.Fatalf("WaitProcess: %v", err)
	}
	if end.Exit.ExitCode != 143 || end.Exit.Signal != "SIGTERM" {
		t.Errorf("exit %+v, want 143 by SIGTERM", end.Exit)
	}
	// Every attach ends with the exit.
	for _, l := range append(live[:], again) {
		io.Copy(io.Discard, l.Stdout)
		io.Copy(io.Discard, l.Stderr)
		proc, lagged, err := l.End()
		if err != nil || lagged || proc.Exit == nil || proc.Exit.ExitCode != 143 {
			t.Errorf("attach End = %+v, %v, %v; want exit 143", proc, lagged, err)
		}
	}
	list, err := c.ListProcesses(ctx)
	if err != nil {
		t.Fatalf("ListProcesses: %v", err)
	}
	if len(list) != 1 || list[0].PID != pid || list[0].State != guestproto.ProcExited || list[0].StdoutEnd != 16 {
		t.Errorf("list = %+v, want pid %d exited with 16 bytes of stdout", list, pid)
	}
	if err := c.WriteProcessStdin(ctx, pid, []byte("late")); !errors.Is(err, guestproto.ErrExited) {
		t.Errorf("stdin to an exited process: %v, want ErrExited", err)
	}
	if err := c.RemoveProcess(ctx, pid); err != nil {
		t.Fatalf("RemoveProcess: %v", err)
	}
	if list, _ := c.ListProcesses(ctx); len(list) != 0 {
		t.Errorf("list after remove = %+v, want none", list)
	}
}

func TestProcessErrors(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	info, err := c.StartProcess(ctx, guestproto.ExecRequest{Argv: []string{"true"}})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	if _, err := c.WaitProcess(ctx, info.PID); err != nil {
		t.Fatalf("WaitProcess: %v", err)
	}
	running, err := c.StartProcess(ctx, guestproto.ExecRequest{Argv: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	defer c.RemoveProcess(ctx, running.PID)
	const unknown = 1 << 30
	tests := []struct {
		name string
		do   func() error
		want error
	}{
		{"attach unknown pid", func() error { _, err := c.AttachProcess(ctx, unknown, 0, 0); return err }, guestproto.ErrNotFound},
		{"wait unknown pid", func() error { _, err := c.WaitProcess(ctx, unknown); return err }, guestproto.ErrNotFound},
		{"signal unknown pid", func() error { return c.SignalProcess(ctx, unknown, "TERM") }, guestproto.ErrNotFound},
		{"stdin unknown pid", func() error { return c.WriteProcessStdin(ctx, unknown, []byte("x")) }, guestproto.ErrNotFound},
		{"remove unknown pid", func() error { return c.RemoveProcess(ctx, unknown) }, guestproto.ErrNotFound},
		{"bad pid", func() error { return c.SignalProcess(ctx, -1, "TERM") }, guestproto.ErrInvalid},
		{"stdin to exited", func() error { return c.WriteProcessStdin(ctx, info.PID, []byte("x")) }, guestproto.ErrExited},
		{"signal exited", func() error { return c.SignalProcess(ctx, info.PID, "TERM") }, guestproto.ErrExited},
		{"close stdin of exited", func() error { return c.CloseProcessStdin(ctx, info.PID) }, nil},
		{"stdin without stdin", func() error { return c.WriteProcessStdin(ctx, running.PID, []byte("x")) }, guestproto.ErrInvalid},
		{"bad signal", func() error { return c.SignalProcess(ctx, running.PID, "NOPE") }, guestproto.ErrInvalid},
		{"signal out of range", func() error { return c.SignalProcess(ctx, running.PID, "99") }, guestproto.ErrInvalid},
		{"offset below -1", func() error { _, err := c.AttachProcess(ctx, running.PID, -2, 0); return err }, guestproto.ErrInvalid},
		{"missing executable", func() error {
			_, err := c.StartProcess(ctx, guestproto.ExecRequest{Argv: []string{"/no/such"}})
			return err
		}, guestproto.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.do(); !errors.Is(err, tt.want) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
	// An exited process attached from the start gives its output and exit.
	a, err := c.AttachProcess(ctx, info.PID, 0, 0)
	if err != nil {
		t.Fatalf("attach exited: %v", err)
	}
	io.Copy(io.Discard, a.Stdout)
	io.Copy(io.Discard, a.Stderr)
	if p, _, err := a.End(); err != nil || p.Exit == nil || p.Exit.ExitCode != 0 {
		t.Errorf("attach exited End = %+v, %v; want exit 0", p, err)
	}
}

func TestProcessOutputDropped(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	const total = guestproto.ProcOutputMax + 300000
	info, err := c.StartProcess(ctx, guestproto.ExecRequest{Shell: "head -c 1348576 /dev/zero"})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	end, err := c.WaitProcess(ctx, info.PID)
	if err != nil {
		t.Fatalf("WaitProcess: %v", err)
	}
	if end.StdoutEnd != total || end.StdoutDropped != total-guestproto.ProcOutputMax {
		t.Errorf("end %d dropped %d, want %d and %d", end.StdoutEnd, end.StdoutDropped, total, total-guestproto.ProcOutputMax)
	}
	a, err := c.AttachProcess(ctx, info.PID, 0, 0)
	if err != nil {
		t.Fatalf("AttachProcess: %v", err)
	}
	if a.Start.StdoutOffset != total-guestproto.ProcOutputMax {
		t.Errorf("attach from 0 starts at %d, want %d", a.Start.StdoutOffset, total-guestproto.ProcOutputMax)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); io.Copy(io.Discard, a.Stderr) }()
	n, _ := io.Copy(io.Discard, a.Stdout)
	wg.Wait()
	if n != guestproto.ProcOutputMax {
		t.Errorf("read %d bytes, want %d", n, guestproto.ProcOutputMax)
	}
	if _, lagged, err := a.End(); err != nil || lagged {
		t.Errorf("End: lagged %v, %v", lagged, err)
	}
}

// TestProcessAttachLags: an attach whose host does not read while the
// ring buffer overwrites what it has not sent ends with lagged; attaching
// again from where it stopped starts at the earliest kept byte.
func TestProcessAttachLags(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	const total = 3 << 20
	info, err := c.StartProcess(ctx, guestproto.ExecRequest{Shell: "read x; head -c 3145728 /dev/zero", Stdin: true})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	a, err := c.AttachProcess(ctx, info.PID, 0, 0)
	if err != nil {
		t.Fatalf("AttachProcess: %v", err)
	}
	if err := c.WriteProcessStdin(ctx, info.PID, []byte("go\n")); err != nil {
		t.Fatalf("WriteProcessStdin: %v", err)
	}
	if _, err := c.WaitProcess(ctx, info.PID); err != nil {
		t.Fatalf("WaitProcess: %v", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); io.Copy(io.Discard, a.Stderr) }()
	n, _ := io.Copy(io.Discard, a.Stdout)
	wg.Wait()
	_, lagged, err := a.End()
	if err != nil || !lagged {
		t.Fatalf("End after %d bytes: lagged %v, %v; want lagged", n, lagged, err)
	}
	b, err := c.AttachProcess(ctx, info.PID, n, 0)
	if err != nil {
		t.Fatalf("AttachProcess again: %v", err)
	}
	if b.Start.StdoutOffset != total-guestproto.ProcOutputMax || b.Start.StdoutOffset <= n {
		t.Errorf("re-attach from %d starts at %d, want %d", n, b.Start.StdoutOffset, total-guestproto.ProcOutputMax)
	}
	b.Close()
}
