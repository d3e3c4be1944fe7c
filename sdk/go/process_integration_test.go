package pandastack_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// errEnough stops Output once a test has seen what it waits for.
var errEnough = errors.New("enough")

// outputUntil follows p's stdout from from until it contains want, and
// returns what it read; ctx bounds the wait.
func outputUntil(ctx context.Context, t *testing.T, p *pandastack.Process, from int64, want string) string {
	t.Helper()
	var got strings.Builder
	_, err := p.Output(ctx, from, func(c pandastack.OutputChunk) error {
		if !c.Stderr {
			got.WriteString(c.Data)
		}
		if strings.Contains(got.String(), want) {
			return errEnough
		}
		return nil
	})
	if !errors.Is(err, errEnough) {
		t.Fatalf("output from %d: read %q, want %q: %v", from, got.String(), want, err)
	}
	return got.String()
}

// logOnFailure shows the server's log if the test fails.
func logOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", testServer(t).Log())
		}
	})
}

func TestIntegrationProcesses(t *testing.T) {
	logOnFailure(t)
	ctx := testCtx(t)
	sb := create(t, adminClient(t), pandastack.CreateOptions{})
	p, err := sb.StartProcess(ctx, pandastack.Command{Cmd: "echo start; read line; echo got $line; sleep 1000", OpenStdin: true})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	if p.PID <= 0 || p.Info.State != "running" {
		t.Fatalf("started %+v, want a running process", p.Info)
	}
	// Attach from the start, then disconnect: the process runs on.
	if got := outputUntil(ctx, t, p, pandastack.FromStart, "start\n"); got != "start\n" {
		t.Errorf("from start: %q, want %q", got, "start\n")
	}

	if err := p.WriteStdin(ctx, []byte("hello\n")); err != nil {
		t.Fatalf("WriteStdin: %v", err)
	}
	if got := outputUntil(ctx, t, p, pandastack.FromStart, "got hello\n"); got != "start\ngot hello\n" {
		t.Errorf("re-attach from start: %q, want %q", got, "start\ngot hello\n")
	}
	if got := outputUntil(ctx, t, p, 6, "got hello\n"); got != "got hello\n" {
		t.Errorf("attach from offset 6: %q, want %q", got, "got hello\n")
	}

	// Two followers at once both see the output as it comes.
	q, err := sb.StartProcess(ctx, pandastack.Command{Cmd: "read a; echo one $a; read b; echo two $b; sleep 1000", OpenStdin: true})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	outs := make([]string, 2)
	var fw sync.WaitGroup
	for i := range outs {
		fw.Add(1)
		go func() {
			defer fw.Done()
			outs[i] = outputUntil(ctx, t, q, pandastack.FromStart, "two y\n")
		}()
	}
	if err := q.WriteStdin(ctx, []byte("x\n")); err != nil {
		t.Fatalf("WriteStdin: %v", err)
	}
	if err := q.WriteStdin(ctx, []byte("y\n")); err != nil {
		t.Fatalf("WriteStdin: %v", err)
	}
	fw.Wait()
	for i, o := range outs {
		if o != "one x\ntwo y\n" {
			t.Errorf("follower %d read %q, want %q", i, o, "one x\ntwo y\n")
		}
	}
	if err := q.Kill(ctx); err != nil {
		t.Errorf("Kill: %v", err)
	}

	if err := p.Signal(ctx, "TERM"); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	end, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if end.ExitCode == nil || *end.ExitCode != 143 || end.Signal != "SIGTERM" || end.State != "exited" {
		t.Errorf("after TERM: %+v, want exited 143 by SIGTERM", end)
	}
	list, err := sb.Processes(ctx)
	if err != nil {
		t.Fatalf("Processes: %v", err)
	}
	found := false
	for _, pi := range list {
		if pi.PID == p.PID {
			found = pi.State == "exited" && pi.ExitCode != nil && *pi.ExitCode == 143
		}
	}
	if !found {
		t.Errorf("list %+v does not show pid %d exited with 143", list, p.PID)
	}
	wantErr(t, "stdin to an exited process", p.WriteStdin(ctx, []byte("x")), pandastack.ErrConflict)
	wantErr(t, "bad signal", q.Signal(ctx, "NOPE"), pandastack.ErrNotFound) // q was removed
	r, err := sb.StartProcess(ctx, pandastack.Command{Argv: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	wantErr(t, "bad signal", r.Signal(ctx, "NOPE"), pandastack.ErrInvalid)
	_, err = sb.Process(ctx, 999999)
	wantErr(t, "unknown pid", err, pandastack.ErrNotFound)
	if err := r.Kill(ctx); err != nil {
		t.Errorf("Kill: %v", err)
	}

	// More output than the 1 MiB buffer: an attach from the start says
	// how much was dropped.
	big, err := sb.StartProcess(ctx, pandastack.Command{Cmd: "head -c 1100000 /dev/zero | tr '\\0' a"})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	if _, err := big.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	var dropped, n int64
	res, err := big.Output(ctx, pandastack.FromStart, func(c pandastack.OutputChunk) error {
		dropped += c.Dropped
		n += int64(len(c.Data))
		return nil
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Output: %+v, %v", res, err)
	}
	if dropped != 1100000-1<<20 || n != 1<<20 {
		t.Errorf("dropped %d and read %d bytes, want %d and %d", dropped, n, 1100000-1<<20, 1<<20)
	}
}

// TestIntegrationProcessFork: a fork's child has a copy of the parent's
// background processes (same pids, output so far), which run on in each
// copy independently.
func TestIntegrationProcessFork(t *testing.T) {
	logOnFailure(t)
	ctx := testCtx(t)
	c := adminClient(t)
	sb := create(t, c, pandastack.CreateOptions{})
	p, err := sb.StartProcess(ctx, pandastack.Command{Cmd: "echo before; read line; echo got $line; sleep 1000", OpenStdin: true})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	outputUntil(ctx, t, p, pandastack.FromStart, "before\n")
	kids, err := sb.Fork(ctx, 1)
	if err != nil {
		t.Fatalf("Fork: %v", err)
	}
	kid := kids[0]
	t.Cleanup(func() { _ = kid.Kill(context.Background()) })
	list, err := kid.Processes(ctx)
	if err != nil {
		t.Fatalf("child Processes: %v", err)
	}
	if len(list) != 1 || list[0].PID != p.PID || list[0].State != "running" || list[0].StdoutBytes != 7 {
		t.Fatalf("child lists %+v, want pid %d running with 7 bytes of stdout", list, p.PID)
	}
	kp, err := kid.Process(ctx, p.PID)
	if err != nil {
		t.Fatalf("child Process: %v", err)
	}
	if err := kp.WriteStdin(ctx, []byte("child\n")); err != nil {
		t.Fatalf("child WriteStdin: %v", err)
	}
	if err := p.WriteStdin(ctx, []byte("parent\n")); err != nil {
		t.Fatalf("parent WriteStdin: %v", err)
	}
	if got := outputUntil(ctx, t, kp, pandastack.FromStart, "got child\n"); got != "before\ngot child\n" {
		t.Errorf("child's copy: %q", got)
	}
	if got := outputUntil(ctx, t, p, pandastack.FromStart, "got parent\n"); got != "before\ngot parent\n" {
		t.Errorf("parent's: %q", got)
	}
	for _, x := range []*pandastack.Process{kp, p} {
		if err := x.Kill(ctx); err != nil {
			t.Errorf("Kill: %v", err)
		}
	}
}

func TestIntegrationProcessPTY(t *testing.T) {
	logOnFailure(t)
	ctx := testCtx(t)
	sb := create(t, adminClient(t), pandastack.CreateOptions{})
	p, err := sb.StartProcess(ctx, pandastack.Command{Cmd: `test -t 0 && echo "tty $TERM"; read x; stty size; exit 4`, PTY: &pandastack.PTYSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	if p.Info.PTY == nil || *p.Info.PTY != (pandastack.PTYSize{Rows: 24, Cols: 80}) || !p.Info.StdinOpen {
		t.Fatalf("started %+v, want pty 24x80 with stdin open", p.Info)
	}
	outputUntil(ctx, t, p, pandastack.FromStart, "tty xterm-256color\r\n")
	if err := p.Resize(ctx, 40, 120); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if err := p.WriteStdin(ctx, []byte("go\r")); err != nil {
		t.Fatalf("WriteStdin: %v", err)
	}
	outputUntil(ctx, t, p, pandastack.FromStart, "go\r\n40 120\r\n")
	info, err := p.Wait(ctx)
	if err != nil || info.ExitCode == nil || *info.ExitCode != 4 {
		t.Fatalf("Wait = %+v, %v; want exit 4", info, err)
	}
	if err := p.Resize(ctx, 10, 10); !errors.Is(err, pandastack.ErrConflict) {
		t.Errorf("resize an exited process: %v, want ErrConflict", err)
	}
	if _, err := sb.Exec(ctx, pandastack.Command{Cmd: "true", PTY: &pandastack.PTYSize{Rows: 24, Cols: 80}}); !errors.Is(err, pandastack.ErrInvalid) {
		t.Errorf("Exec with a PTY: %v, want ErrInvalid", err)
	}
}
