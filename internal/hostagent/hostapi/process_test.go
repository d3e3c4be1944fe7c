package hostapi_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
)

// processGuest is sandbox id's guest through h, which must keep
// background processes.
func processGuest(t *testing.T, h host.Host, id string) host.ProcessGuest {
	t.Helper()
	g, err := h.Guest(ctxT(t), id)
	if err != nil {
		t.Fatalf("guest %s: %v", id, err)
	}
	pg, ok := g.(host.ProcessGuest)
	if !ok {
		t.Fatalf("guest %s through %T: not an host.ProcessGuest", id, h)
	}
	return pg
}

// readAttach reads an attachment to its end.
func readAttach(t *testing.T, a *guestproto.Attachment) (stdout, stderr string, proc guestproto.ProcInfo, lagged bool) {
	t.Helper()
	var out, errOut bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); io.Copy(&out, a.Stdout) }()
	go func() { defer wg.Done(); io.Copy(&errOut, a.Stderr) }()
	wg.Wait()
	proc, lagged, err := a.End()
	if err != nil {
		t.Fatalf("attach end: %v", err)
	}
	return out.String(), errOut.String(), proc, lagged
}

func TestProcesses(t *testing.T) {
	world(t)
	ctx := ctxT(t)
	sb := create(t, client)
	pg := processGuest(t, client, sb.ID)

	p, err := pg.StartProcess(ctx, guestproto.ExecRequest{Shell: "echo hello; echo oops >&2; while read l; do echo got $l; done; exit 5", Stdin: true})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	if p.PID <= 0 || p.State != guestproto.ProcRunning || !p.StdinOpen {
		t.Fatalf("start: got %+v, want a running process with stdin open", p)
	}
	list, err := pg.ListProcesses(ctx)
	if err != nil || len(list) != 1 || list[0].PID != p.PID {
		t.Fatalf("list: got %+v, %v; want the one process", list, err)
	}
	// Through the local host too: the same guest's table.
	if llist, err := processGuest(t, local, sb.ID).ListProcesses(ctx); err != nil || len(llist) != 1 || llist[0].PID != p.PID {
		t.Errorf("list locally: got %+v, %v; want the same process", llist, err)
	}

	a, err := pg.AttachProcess(ctx, p.PID, 0, 0)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	if a.Start.StdoutOffset != 0 || a.Proc.PID != p.PID {
		t.Errorf("attach start: got %+v proc %d, want offset 0 of %d", a.Start, a.Proc.PID, p.PID)
	}
	// Stdin larger than one host API request, then closed.
	big := strings.Repeat("x", 1<<20+100)
	if err := pg.WriteProcessStdin(ctx, p.PID, []byte("one\n"+big+"\n")); err != nil {
		t.Fatalf("stdin: %v", err)
	}
	if err := pg.CloseProcessStdin(ctx, p.PID); err != nil {
		t.Fatalf("close stdin: %v", err)
	}
	stdout, stderr, proc, lagged := readAttach(t, a)
	if want := "hello\ngot one\ngot " + big + "\n"; stdout != want && !lagged {
		t.Errorf("stdout: got %d bytes (%.40q…), want %d", len(stdout), stdout, len(want))
	}
	if stderr != "oops\n" {
		t.Errorf("stderr: got %q, want oops", stderr)
	}
	// An attachment that fell behind (a reader starved of CPU) ends
	// lagged, before the exit: that is the product's contract, not a
	// failure; WaitProcess below checks the exit either way.
	if !lagged && (proc.Exit == nil || proc.Exit.ExitCode != 5) {
		t.Errorf("attach end: got %+v, want exit 5", proc)
	}
	w, err := pg.WaitProcess(ctx, p.PID)
	if err != nil || w.Exit == nil || w.Exit.ExitCode != 5 || w.State != guestproto.ProcExited {
		t.Errorf("wait: got %+v, %v; want exited with 5", w, err)
	}
	// From an offset: the last 4 bytes of stdout, nothing of stderr.
	a, err = pg.AttachProcess(ctx, p.PID, w.StdoutEnd-4, -1)
	if err != nil {
		t.Fatalf("attach from an offset: %v", err)
	}
	if stdout, stderr, _, _ := readAttach(t, a); stdout != "xxx\n" || stderr != "" || a.Start.StdoutOffset != w.StdoutEnd-4 {
		t.Errorf("attach from offset %d: got stdout %q stderr %q from %+v, want xxx and nothing", w.StdoutEnd-4, stdout, stderr, a.Start)
	}
	// Errors keep their guest class.
	if err := pg.WriteProcessStdin(ctx, p.PID, []byte("late")); guestproto.CodeOf(err) != guestproto.CodeExited {
		t.Errorf("stdin after exit: got %v (code %q), want code %q", err, guestproto.CodeOf(err), guestproto.CodeExited)
	}
	if err := pg.SignalProcess(ctx, 99999, "TERM"); guestproto.CodeOf(err) != guestproto.CodeNotFound {
		t.Errorf("signal a missing process: got %v, want code %q", err, guestproto.CodeNotFound)
	}
	if err := pg.RemoveProcess(ctx, p.PID); err != nil {
		t.Errorf("remove: %v", err)
	}
	if list, err := pg.ListProcesses(ctx); err != nil || len(list) != 0 {
		t.Errorf("list after remove: got %+v, %v; want none", list, err)
	}

	t.Run("signal and wait", func(t *testing.T) {
		p, err := pg.StartProcess(ctx, guestproto.ExecRequest{Shell: "sleep 600"})
		if err != nil {
			t.Fatal(err)
		}
		// The wait goes through a server that notes its arrival: the
		// signal comes while the wait is in flight.
		_, cw, waiting := secondServerNoting(t, nil, "/wait")
		done := make(chan error, 1)
		go func() {
			w, err := processGuest(t, cw, sb.ID).WaitProcess(ctx, p.PID)
			if err == nil && (w.Exit == nil || w.Exit.Signal == "") {
				err = errors.New("exited without a signal")
			}
			done <- err
		}()
		inFlight(t, waiting, "the wait")
		if err := pg.SignalProcess(ctx, p.PID, "TERM"); err != nil {
			t.Fatalf("signal: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("wait for a signalled process: %v", err)
		}
	})
	t.Run("pty resize", func(t *testing.T) {
		p, err := pg.StartProcess(ctx, guestproto.ExecRequest{Shell: "read l; stty size", PTY: &guestproto.PTYSize{Rows: 24, Cols: 80}})
		if err != nil {
			t.Fatal(err)
		}
		if err := pg.ResizeProcess(ctx, p.PID, 40, 120); err != nil {
			t.Fatalf("resize: %v", err)
		}
		if err := pg.WriteProcessStdin(ctx, p.PID, []byte("\n")); err != nil {
			t.Fatalf("stdin: %v", err)
		}
		a, err := pg.AttachProcess(ctx, p.PID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if stdout, _, _, _ := readAttach(t, a); !strings.Contains(stdout, "40 120") {
			t.Errorf("stty size after a resize to 40x120: got %q", stdout)
		}
	})
	t.Run("detach", func(t *testing.T) {
		p, err := pg.StartProcess(ctx, guestproto.ExecRequest{Shell: "while :; do echo tick; sleep 0.1; done"})
		if err != nil {
			t.Fatal(err)
		}
		a, err := pg.AttachProcess(ctx, p.PID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(a.Stdout, buf); err != nil || string(buf) != "tick\n" {
			t.Fatalf("read: got %q, %v", buf, err)
		}
		a.Close() // nobody reads stderr or the rest of stdout
		if _, _, err := a.End(); err == nil {
			t.Errorf("end after close: got no error")
		}
		list, err := pg.ListProcesses(ctx)
		if err != nil || !slicesHasRunning(list, p.PID) {
			t.Errorf("after detaching: got %+v, %v; want %d still running", list, err, p.PID)
		}
	})
}

func slicesHasRunning(list []guestproto.ProcInfo, pid int) bool {
	for _, p := range list {
		if p.PID == pid && p.State == guestproto.ProcRunning {
			return true
		}
	}
	return false
}

// dirWatcher is the api's optional ability of a Guest.
type dirWatcher interface {
	WatchDir(ctx context.Context, path string, recursive bool) (*guestproto.DirWatch, error)
}

func TestWatchDir(t *testing.T) {
	world(t)
	ctx := ctxT(t)
	sb := create(t, client)
	g, _ := client.Guest(ctxT(t), sb.ID)
	dw, ok := g.(dirWatcher)
	if !ok {
		t.Fatalf("the remote guest %T cannot watch directories", g)
	}
	if _, err := dw.WatchDir(ctx, "/no/such/dir", false); guestproto.CodeOf(err) != guestproto.CodeNotFound {
		t.Errorf("watch a missing directory: got %v, want code %q", err, guestproto.CodeNotFound)
	}
	mustRun(t, client, sb.ID, "mkdir -p /tmp/w")
	w, err := dw.WatchDir(ctx, "/tmp/w", true)
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Close()
	mustRun(t, client, sb.ID, "touch /tmp/w/a")
	ev, err := w.Next()
	if err != nil || ev.Type != guestproto.WatchCreate || ev.Path != "/tmp/w/a" {
		t.Fatalf("first event: got %+v, %v; want create /tmp/w/a", ev, err)
	}
	mustRun(t, client, sb.ID, "rm -rf /tmp/w")
	for {
		ev, err := w.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("after removing the directory: got %v, want io.EOF", err)
		}
		_ = ev
	}
	// Close ends a watch that is still running.
	mustRun(t, client, sb.ID, "mkdir -p /tmp/w2")
	w2, err := dw.WatchDir(ctx, "/tmp/w2", false)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := w2.Next(); done <- err }()
	w2.Close()
	select {
	case err := <-done:
		if err == nil || err == io.EOF {
			t.Errorf("next after close: got %v, want an error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("next after close blocked")
	}
}

// TestProcessRoutesAuth: every process and watch route wants the token.
func TestProcessRoutesAuth(t *testing.T) {
	world(t)
	for _, r := range []struct{ method, path string }{
		{"POST", "/sandboxes/x/processes"}, {"GET", "/sandboxes/x/processes"},
		{"DELETE", "/sandboxes/x/processes/1"}, {"POST", "/sandboxes/x/processes/1/stdin"},
		{"POST", "/sandboxes/x/processes/1/signal"}, {"POST", "/sandboxes/x/processes/1/resize"},
		{"GET", "/sandboxes/x/processes/1/attach"}, {"POST", "/sandboxes/x/processes/1/wait"},
		{"GET", "/sandboxes/x/watch?path=/tmp"},
	} {
		req, _ := http.NewRequest(r.method, hs.URL+hostwire.Prefix+r.path, nil)
		req.Header.Set("Authorization", "Bearer wrong")
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s %s with a wrong token: got %d, want 401", r.method, r.path, res.StatusCode)
		}
	}
}

// TestCloseEndsProcessStreams: a server's Close ends attaches, waits and
// watches in flight (Shutdown does not wait for them) and refuses new ones.
func TestCloseEndsProcessStreams(t *testing.T) {
	world(t)
	ctx := ctxT(t)
	sb := create(t, client)
	s2, c2, waiting := secondServerNoting(t, nil, "/wait")
	pg := processGuest(t, c2, sb.ID)
	p, err := pg.StartProcess(ctx, guestproto.ExecRequest{Shell: "sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := pg.AttachProcess(ctx, p.PID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := c2.Guest(ctx, sb.ID)
	mustRun(t, client, sb.ID, "mkdir -p /tmp/wc")
	w, err := g.(dirWatcher).WatchDir(ctx, "/tmp/wc", false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	waited := make(chan error, 1)
	go func() { _, err := pg.WaitProcess(ctx, p.PID); waited <- err }()
	watched := make(chan error, 1)
	go func() { _, err := w.Next(); watched <- err }()
	// The watch is open (WatchDir returned after its 200); the wait is
	// in flight once it reached the server.
	inFlight(t, waiting, "the wait")
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s2.Shutdown(sctx); err != nil {
		t.Errorf("shutdown with streams open: %v, want no wait for them", err)
	}
	s2.Close()
	attached := make(chan error, 1)
	go func() {
		go io.Copy(io.Discard, a.Stderr)
		io.Copy(io.Discard, a.Stdout)
		_, _, err := a.End()
		attached <- err
	}()
	for name, ch := range map[string]chan error{"attach": attached, "wait": waited, "watch": watched} {
		select {
		case err := <-ch:
			if err == nil {
				t.Errorf("%s after Close: got no error", name)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s still open 10 s after Close", name)
		}
	}
	if _, err := pg.AttachProcess(ctx, p.PID, 0, 0); !errors.Is(err, host.ErrUnavailable) {
		t.Errorf("attach after Close: got %v, want host.ErrUnavailable", err)
	}
	// The process runs on.
	if list, err := processGuest(t, client, sb.ID).ListProcesses(ctx); err != nil || !slicesHasRunning(list, p.PID) {
		t.Errorf("after Close: got %+v, %v; want %d still running", list, err, p.PID)
	}
}
