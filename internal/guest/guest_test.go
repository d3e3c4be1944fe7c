package guest_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
	"github.com/pandastack/pandastack/internal/guest"
)

const testTimeout = 60 * time.Second

// reaper is shared by every test, as in the agent: one per process. By
// default it reaps only what it started (the mode for embedding the server in
// a process with other children). With -reap-all, which TestReapAllMode
// passes to a second run of this binary, the test process becomes a child
// subreaper and the reaper reaps every child, as the agent does as PID 1.
var (
	reaper  *guest.Reaper
	reapAll = flag.Bool("reap-all", false, "reap every child as a child subreaper, like the agent as PID 1")
)

func TestMain(m *testing.M) {
	flag.Parse()
	if *reapAll {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, "become child subreaper:", err)
			os.Exit(1)
		}
	}
	reaper = guest.NewReaper(*reapAll)
	ctx, cancel := context.WithCancel(context.Background())
	go reaper.Run(ctx)
	code := m.Run()
	cancel()
	os.Exit(code)
}

// fakeHooks records restore hook calls instead of changing the host.
type fakeHooks struct {
	mu        sync.Mutex
	clock     []time.Time
	entropy   [][]byte
	hostname  []string
	machineID []string
}

func (h *fakeHooks) SetClock(t time.Time) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clock = append(h.clock, t)
	return nil
}

func (h *fakeHooks) AddEntropy(seed []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.entropy = append(h.entropy, seed)
	return nil
}

func (h *fakeHooks) SetHostname(name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hostname = append(h.hostname, name)
	return nil
}

func (h *fakeHooks) SetMachineID(id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.machineID = append(h.machineID, id)
	if id == "ffffffffffffffffffffffffffffffff" {
		return errors.New("read-only /etc")
	}
	return nil
}

func (h *fakeHooks) calls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.clock)
}

type fixture struct {
	tr    *guestprototest.Transport
	hooks *fakeHooks
}

func startGuest(t *testing.T) *fixture {
	t.Helper()
	return startGuestRoot(t, "")
}

// startGuestRoot starts a guest whose accounts are those of root's
// etc/passwd and etc/group ("": the host's).
func startGuestRoot(t *testing.T, root string) *fixture {
	t.Helper()
	f := &fixture{tr: guestprototest.New(), hooks: &fakeHooks{}}
	srv := guest.NewServer(guest.Config{
		Hooks:     f.hooks,
		Reaper:    reaper,
		Version:   "test",
		Env:       []string{"PATH=" + os.Getenv("PATH"), "HOME=/", "BASE=base", "USER=root"},
		Root:      root,
		ExitGrace: 200 * time.Millisecond,
	})
	agent := guestproto.NewAgent(f.tr, srv, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = agent.Run(ctx) }()
	t.Cleanup(func() { cancel(); _ = f.tr.Close(); <-done })
	return f
}

func (f *fixture) connect(t *testing.T, req guestproto.HelloRequest, hangup bool) *guestproto.Client {
	t.Helper()
	c := guestproto.NewClient(f.tr.Connect(hangup))
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Hello(testContext(t), req); err != nil {
		t.Fatalf("Hello: %v", err)
	}
	return c
}

func newClient(t *testing.T) *guestproto.Client {
	t.Helper()
	return startGuest(t).connect(t, guestproto.HelloRequest{Env: map[string]string{"SESSION": "session", "OVER": "session"}}, true)
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// TestReapAllMode runs the exec tests again in reap-all mode, where orphans
// (the killed background children) are re-parented to the test process and
// must be reaped by the reaper.
func TestReapAllMode(t *testing.T) {
	cmd := exec.CommandContext(testContext(t), os.Args[0], "-reap-all", "-test.count=1", "-test.timeout=120s",
		"-test.run=^(TestExec|TestExecStreamsOutput|TestExecTimeoutKillsProcessTree|TestExecCancelKillsProcessGroup|TestConcurrentExecs|TestRestoreStartsNewSession|TestProcessLifecycle|TestProcessErrors|TestPTYProcess)$")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("PASS")) {
		t.Fatalf("exec tests in reap-all mode: %v\n%s", err, out)
	}
}

// waitGone waits until pid has exited and, in reap-all mode where it may be
// our child or orphan, until the reaper has collected it.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(testTimeout/time.Millisecond))
		unix.Close(fd)
		if n != 1 || err != nil {
			t.Fatalf("process %d still runs (poll %d, %v)", pid, n, err)
		}
	}
	if !*reapAll {
		return // dead; an orphan is reaped by the system's init
	}
	// Dead; now the reaper must collect it.
	deadline := time.Now().Add(testTimeout)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("process %d was never reaped", pid)
		}
		time.Sleep(5 * time.Millisecond) // polling the reaper's effect, not synchronizing
	}
}

func TestExec(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	tests := []struct {
		name       string
		req        guestproto.ExecRequest
		stdin      string
		wantOut    string
		wantErrOut string
		wantCode   int
		wantSignal string
	}{
		{name: "argv", req: guestproto.ExecRequest{Argv: []string{"echo", "hello", "world"}}, wantOut: "hello world\n"},
		{name: "shell", req: guestproto.ExecRequest{Shell: "echo out; echo err >&2; exit 3"}, wantOut: "out\n", wantErrOut: "err\n", wantCode: 3},
		{name: "env layers", req: guestproto.ExecRequest{Shell: `echo "$BASE $SESSION $OVER"`, Env: map[string]string{"OVER": "request"}}, wantOut: "base session request\n"},
		{name: "cwd", req: guestproto.ExecRequest{Argv: []string{"pwd"}, Cwd: dir}, wantOut: dir + "\n"},
		{name: "stdin", req: guestproto.ExecRequest{Argv: []string{"tr", "a-z", "A-Z"}}, stdin: "shout\n", wantOut: "SHOUT\n"},
		{name: "no stdin reads eof", req: guestproto.ExecRequest{Argv: []string{"cat"}}, wantOut: ""},
		{name: "signal", req: guestproto.ExecRequest{Shell: "kill -TERM $$"}, wantCode: 128 + 15, wantSignal: "SIGTERM"},
		{name: "missing command in shell", req: guestproto.ExecRequest{Shell: "no-such-command-xyz"}, wantCode: 127, wantErrOut: "no-such-command-xyz"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdin io.Reader
			if tt.stdin != "" {
				stdin = strings.NewReader(tt.stdin)
			}
			var out, errOut bytes.Buffer
			res, err := c.Exec(testContext(t), tt.req, stdin, &out, &errOut)
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if out.String() != tt.wantOut {
				t.Errorf("stdout = %q, want %q", out.String(), tt.wantOut)
			}
			if !strings.Contains(errOut.String(), tt.wantErrOut) || (tt.wantErrOut == "" && errOut.Len() > 0) {
				t.Errorf("stderr = %q, want %q", errOut.String(), tt.wantErrOut)
			}
			if res.ExitCode != tt.wantCode || res.Signal != tt.wantSignal || res.TimedOut {
				t.Errorf("result = %+v, want exit %d signal %q", res, tt.wantCode, tt.wantSignal)
			}
		})
	}
}

func TestExecErrors(t *testing.T) {
	c := newClient(t)
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  guestproto.ExecRequest
		want error
	}{
		{"missing binary", guestproto.ExecRequest{Argv: []string{"no-such-binary-xyz"}}, guestproto.ErrNotFound},
		{"missing path", guestproto.ExecRequest{Argv: []string{"/no/such/binary"}}, guestproto.ErrNotFound},
		{"missing cwd", guestproto.ExecRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"}, guestproto.ErrNotFound},
		{"relative cwd", guestproto.ExecRequest{Argv: []string{"true"}, Cwd: "tmp"}, guestproto.ErrInvalid},
		{"empty", guestproto.ExecRequest{}, guestproto.ErrInvalid},
		{"not executable", guestproto.ExecRequest{Argv: []string{plain}}, guestproto.ErrPermission},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Exec(testContext(t), tt.req, nil, nil, nil)
			if !errors.Is(err, tt.want) {
				t.Errorf("Exec error = %v, want %v", err, tt.want)
			}
		})
	}
}

// TestExecStreamsOutput proves output is streamed as produced: the process
// prints a line and then blocks until it reads stdin, which the test sends
// only after it has read that line.
func TestExecStreamsOutput(t *testing.T) {
	c := newClient(t)
	p, err := c.StartExec(testContext(t), guestproto.ExecRequest{Shell: "echo ready; read x; echo got $x", Stdin: true})
	if err != nil {
		t.Fatalf("StartExec: %v", err)
	}
	out := bufio.NewReader(p.Stdout)
	if line, err := out.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("first line = %q, %v; want ready", line, err)
	}
	if _, err := io.WriteString(p.Stdin, "go\n"); err != nil {
		t.Fatalf("write stdin: %v", err)
	}
	if err := p.Stdin.Close(); err != nil {
		t.Fatalf("close stdin: %v", err)
	}
	rest, err := io.ReadAll(out)
	if err != nil || string(rest) != "got go\n" {
		t.Fatalf("rest = %q, %v; want \"got go\\n\"", rest, err)
	}
	res, err := p.Wait()
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Wait = %+v, %v; want exit 0", res, err)
	}
}

func TestExecTimeoutKillsProcessTree(t *testing.T) {
	c := newClient(t)
	var out bytes.Buffer
	res, err := c.Exec(testContext(t), guestproto.ExecRequest{Shell: "sleep 1000 & echo $!; wait", TimeoutMS: 300}, nil, &out, nil)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if !res.TimedOut || res.Signal != "SIGKILL" || res.ExitCode != 137 {
		t.Errorf("result = %+v, want timed out by SIGKILL, exit 137", res)
	}
	child, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("shell printed %q, want the background pid", out.String())
	}
	waitGone(t, child)
}

func TestExecCancelKillsProcessGroup(t *testing.T) {
	c := newClient(t)
	ctx, cancel := context.WithCancel(testContext(t))
	p, err := c.StartExec(ctx, guestproto.ExecRequest{Shell: "sleep 1000 & echo $!; wait"})
	if err != nil {
		t.Fatalf("StartExec: %v", err)
	}
	line, err := bufio.NewReader(p.Stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("read pid: %v", err)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(line))
	cancel()
	if _, err := p.Wait(); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait after cancel = %v, want context.Canceled", err)
	}
	waitGone(t, p.PID)
	waitGone(t, child)
}

func TestConcurrentExecs(t *testing.T) {
	c := newClient(t)
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			res, err := c.Exec(testContext(t), guestproto.ExecRequest{Argv: []string{"sh", "-c", `echo "$0"; exit $(($0 % 7))`, strconv.Itoa(i)}}, nil, &out, nil)
			switch {
			case err != nil:
				errs <- err
			case out.String() != fmt.Sprintf("%d\n", i) || res.ExitCode != i%7:
				errs <- fmt.Errorf("exec %d: stdout %q exit %d, want %q exit %d", i, out.String(), res.ExitCode, fmt.Sprintf("%d\n", i), i%7)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestExecLargeOutput(t *testing.T) {
	c := newClient(t)
	var out, errOut countWriter
	res, err := c.Exec(testContext(t), guestproto.ExecRequest{Shell: "head -c 20000000 /dev/zero; head -c 3000000 /dev/zero >&2"}, nil, &out, &errOut)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec = %+v, %v", res, err)
	}
	if out.n != 20000000 || errOut.n != 3000000 {
		t.Errorf("got %d stdout and %d stderr bytes, want 20000000 and 3000000", out.n, errOut.n)
	}
}

type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

func TestBarrierResumeKeepsExecAlive(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	p, err := c.StartExec(ctx, guestproto.ExecRequest{Shell: "echo one; read x; echo two $x", Stdin: true})
	if err != nil {
		t.Fatalf("StartExec: %v", err)
	}
	out := bufio.NewReader(p.Stdout)
	if line, _ := out.ReadString('\n'); line != "one\n" {
		t.Fatalf("first line %q, want one", line)
	}
	if err := c.Barrier(ctx); err != nil {
		t.Fatalf("Barrier: %v", err)
	}
	if err := c.Resume(ctx); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	_, _ = io.WriteString(p.Stdin, "x\n")
	_ = p.Stdin.Close()
	if line, _ := out.ReadString('\n'); line != "two x\n" {
		t.Fatalf("second line %q, want \"two x\"", line)
	}
	if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
		t.Fatalf("Wait = %+v, %v", res, err)
	}
}

// TestRestoreStartsNewSession models a restored child: a new host says HELLO
// after the old one's BARRIER. The old exec keeps running but is detached
// (its stdin closed, its output discarded); the hooks ran once for the new
// session before its HELLO_ACK.
func TestRestoreStartsNewSession(t *testing.T) {
	f := startGuest(t)
	ctx := testContext(t)
	c1 := f.connect(t, guestproto.HelloRequest{Session: "parent"}, false)
	p, err := c1.StartExec(ctx, guestproto.ExecRequest{Shell: "echo started; exec sleep 1000"})
	if err != nil {
		t.Fatalf("StartExec: %v", err)
	}
	if line, _ := bufio.NewReader(p.Stdout).ReadString('\n'); line != "started\n" {
		t.Fatalf("first line %q", line)
	}
	if err := c1.Barrier(ctx); err != nil {
		t.Fatalf("Barrier: %v", err)
	}
	_ = c1.Close()

	req := guestproto.HelloRequest{Session: "child", TimeUnixNano: 1234567890, Hostname: "child1", MachineID: "0123456789abcdef0123456789abcdef", Entropy: bytes.Repeat([]byte{7}, 64)}
	c2 := f.connect(t, req, false)
	f.hooks.mu.Lock()
	if len(f.hooks.clock) != 2 || !f.hooks.clock[1].Equal(time.Unix(0, req.TimeUnixNano)) ||
		!bytes.Equal(f.hooks.entropy[1], req.Entropy) || f.hooks.hostname[0] != "child1" || f.hooks.machineID[0] != req.MachineID {
		t.Errorf("hooks after the child's HELLO: %+v", f.hooks)
	}
	f.hooks.mu.Unlock()

	if err := syscall.Kill(p.PID, 0); err != nil {
		t.Errorf("the old session's process is gone (%v), want it running", err)
	}
	var out bytes.Buffer
	if _, err := c2.Exec(ctx, guestproto.ExecRequest{Argv: []string{"echo", "child"}}, nil, &out, nil); err != nil || out.String() != "child\n" {
		t.Errorf("exec in the new session: %q, %v", out.String(), err)
	}
	_ = syscall.Kill(-p.PID, syscall.SIGKILL)
	waitGone(t, p.PID)
}

func TestHookErrorsAreReported(t *testing.T) {
	f := startGuest(t)
	c := guestproto.NewClient(f.tr.Connect(true))
	defer c.Close()
	rep, err := c.Hello(testContext(t), guestproto.HelloRequest{MachineID: "ffffffffffffffffffffffffffffffff"})
	if err != nil {
		t.Fatalf("Hello: %v", err)
	}
	if len(rep.HookErrors) != 1 || !strings.Contains(rep.HookErrors[0], "machine_id") {
		t.Errorf("HookErrors = %q, want one machine_id error", rep.HookErrors)
	}
	if rep.PID1 || rep.AgentVersion != "test" {
		t.Errorf("reply = %+v", rep)
	}
}

// TestFileRoundTrip streams 256 MiB up and back with a bounded heap; the VM
// integration test runs the same helper with 1 GiB.
func TestFileRoundTrip(t *testing.T) {
	size := int64(256 << 20)
	if testing.Short() {
		size = 16 << 20
	}
	c := newClient(t)
	path := filepath.Join(t.TempDir(), "new", "dir", "big.bin")

	stop := make(chan struct{})
	peak := make(chan uint64)
	go func() {
		var max uint64
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			max = maxOf(max, ms.HeapInuse)
			select {
			case <-stop:
				peak <- max
				return
			case <-tick.C:
			}
		}
	}()
	_, err := guestprototest.VerifyFileRoundTrip(testContext(t), c, path, size)
	close(stop)
	if err != nil {
		t.Fatal(err)
	}
	got := <-peak
	t.Logf("peak HeapInuse %d MiB for %d MiB each way", got>>20, size>>20)
	if got >= 64<<20 {
		t.Errorf("peak HeapInuse %d MiB during the transfer, want < 64 MiB", got>>20)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != size || fi.Mode().Perm() != 0o644 {
		t.Errorf("stored file: %v, %v", fi, err)
	}
}

func maxOf(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

func TestFileOps(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	dir := t.TempDir()
	mustWrite := func(p, data string, mode os.FileMode) {
		t.Helper()
		if n, err := c.WriteFile(ctx, p, strings.NewReader(data), mode); err != nil || n != int64(len(data)) {
			t.Fatalf("WriteFile %s = %d, %v", p, n, err)
		}
	}
	mustWrite(dir+"/a/b/file.txt", "hello", 0o600)
	if err := c.Mkdir(ctx, dir+"/x/y/z"); err != nil {
		t.Fatalf("Mkdir -p: %v", err)
	}
	if err := c.Mkdir(ctx, dir+"/x/y/z"); err != nil {
		t.Fatalf("Mkdir of an existing dir: %v", err)
	}

	fi, err := c.Stat(ctx, dir+"/a/b/file.txt")
	if err != nil || fi.Size != 5 || fi.Mode != 0o600 || fi.IsDir || fi.Name != "file.txt" {
		t.Errorf("Stat = %+v, %v; want 5 bytes, mode 0600", fi, err)
	}
	if fi.FileMode() != 0o600 {
		t.Errorf("FileMode = %v, want -rw-------", fi.FileMode())
	}

	rc, info, err := c.ReadFile(ctx, dir+"/a/b/file.txt")
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	data, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(data) != "hello" || info.Size != 5 {
		t.Errorf("ReadFile = %q (%d), %v", data, info.Size, err)
	}

	if err := os.Symlink("b/file.txt", dir+"/a/link"); err != nil {
		t.Fatal(err)
	}
	entries, err := c.ListDir(ctx, dir+"/a")
	if err != nil {
		t.Fatalf("ListDir: %v", err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, fmt.Sprintf("%s:%v:%v:%s", e.Name, e.IsDir, e.IsSymlink, e.LinkTarget))
	}
	if got, want := strings.Join(names, " "), "b:true:false: link:false:true:b/file.txt"; got != want {
		t.Errorf("ListDir = %s, want %s", got, want)
	}

	if err := c.Rename(ctx, dir+"/a/b/file.txt", dir+"/x/moved.txt"); err != nil {
		t.Fatalf("Rename: %v", err)
	}
	if _, err := c.Stat(ctx, dir+"/x/moved.txt"); err != nil {
		t.Errorf("Stat after rename: %v", err)
	}
	if err := c.Remove(ctx, dir+"/x", true); err != nil {
		t.Fatalf("Remove recursive: %v", err)
	}
	if _, err := os.Stat(dir + "/x"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after recursive remove: %v, want not exist", err)
	}
}

func TestFileOpErrors(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	dir := t.TempDir()
	if err := os.MkdirAll(dir+"/full/sub", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/file", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	readFile := func(p string) error {
		rc, _, err := c.ReadFile(ctx, p)
		if err == nil {
			rc.Close()
		}
		return err
	}
	tests := []struct {
		name string
		op   func() error
		want error
	}{
		{"stat missing", func() error { _, err := c.Stat(ctx, dir+"/nope"); return err }, guestproto.ErrNotFound},
		{"stat relative", func() error { _, err := c.Stat(ctx, "relative/path"); return err }, guestproto.ErrInvalid},
		{"stat nul", func() error { _, err := c.Stat(ctx, "/tmp/a\x00b"); return err }, guestproto.ErrInvalid},
		{"read missing", func() error { return readFile(dir + "/nope") }, guestproto.ErrNotFound},
		{"read dir", func() error { return readFile(dir + "/full") }, guestproto.ErrIsDir},
		{"list file", func() error { _, err := c.ListDir(ctx, dir+"/file"); return err }, guestproto.ErrNotDir},
		{"list missing", func() error { _, err := c.ListDir(ctx, dir+"/nope"); return err }, guestproto.ErrNotFound},
		{"remove non-empty", func() error { return c.Remove(ctx, dir+"/full", false) }, guestproto.ErrNotEmpty},
		{"remove missing", func() error { return c.Remove(ctx, dir+"/nope", true) }, guestproto.ErrNotFound},
		{"mkdir over file", func() error { return c.Mkdir(ctx, dir+"/file") }, guestproto.ErrExists},
		{"mkdir under file", func() error { return c.Mkdir(ctx, dir+"/file/sub") }, guestproto.ErrNotDir},
		{"write onto dir", func() error { _, err := c.WriteFile(ctx, dir+"/full", strings.NewReader("x"), 0); return err }, guestproto.ErrIsDir},
		{"write relative", func() error { _, err := c.WriteFile(ctx, "x.txt", strings.NewReader("x"), 0); return err }, guestproto.ErrInvalid},
		{"rename missing", func() error { return c.Rename(ctx, dir+"/nope", dir+"/nope2") }, guestproto.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.op(); !errors.Is(err, tt.want) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
	if err := c.Remove(ctx, dir+"/full", false); !errors.Is(err, os.ErrExist) && guestproto.CodeOf(err) != guestproto.CodeNotEmpty {
		t.Errorf("CodeOf = %q, want not_empty", guestproto.CodeOf(err))
	}
}

// TestUploadErrorNamesTarget: an upload that cannot be written names the
// path the caller gave, never the temporary file next to it.
func TestUploadErrorNamesTarget(t *testing.T) {
	c := newClient(t)
	// Nothing can be created in /proc, not even as root.
	const target = "/proc/panda-test-upload.txt"
	_, err := c.WriteFile(testContext(t), target, strings.NewReader("x"), 0o644)
	if err == nil {
		t.Fatalf("an upload to %s succeeded", target)
	}
	if msg := err.Error(); !strings.Contains(msg, target) || strings.Contains(msg, ".panda-upload") {
		t.Errorf("got %q, want an error naming %s and not the temporary file", msg, target)
	}
	if guestproto.CodeOf(err) == guestproto.CodeInternal {
		t.Errorf("got code %q for %v, want the errno's class", guestproto.CodeOf(err), err)
	}
}

// TestFailedUploadLeavesNothing aborts an upload midway: neither the target
// nor a temporary file may remain.
func TestFailedUploadLeavesNothing(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	src := io.MultiReader(guestprototest.PatternReader(1, 1<<20), errReader{errors.New("source broke")})
	if _, err := c.WriteFile(testContext(t), dir+"/up.bin", src, 0o644); err == nil {
		t.Fatal("WriteFile succeeded with a failing source")
	}
	// The guest's handler removes its temporary file when the RESET
	// arrives, concurrently with WriteFile returning: wait for it.
	deadline := time.Now().Add(testTimeout)
	for {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %v", entries)
		}
		time.Sleep(5 * time.Millisecond) // polling the handler's cleanup
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestFindPort(t *testing.T) {
	sys := t.TempDir()
	for port, name := range map[string]string{"vport1p1": "org.qemu.guest_agent.0", "vport2p1": "panda"} {
		d := filepath.Join(sys, "class", "virtio-ports", port)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "name"), []byte(name+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := guest.FindPort(sys, "panda"); err != nil || got != "/dev/vport2p1" {
		t.Errorf("FindPort = %q, %v; want /dev/vport2p1", got, err)
	}
	if _, err := guest.FindPort(sys, "other"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("FindPort of a missing name = %v, want not exist", err)
	}
}

func TestPortFromCmdline(t *testing.T) {
	tests := []struct{ cmdline, want string }{
		{"console=ttyS0 panda.port=/dev/vport0p1 quiet", "/dev/vport0p1"},
		{"console=ttyS0 quiet", ""},
		{"panda.portx=1 panda.port=/dev/hvc1", "/dev/hvc1"},
	}
	for _, tt := range tests {
		if got := guest.PortFromCmdline(tt.cmdline); got != tt.want {
			t.Errorf("PortFromCmdline(%q) = %q, want %q", tt.cmdline, got, tt.want)
		}
	}
}

func TestSystemHooksWriteMachineID(t *testing.T) {
	etc := t.TempDir()
	h := guest.SystemHooks{EtcDir: etc}
	if err := h.SetMachineID("0123456789abcdef0123456789abcdef"); err != nil {
		t.Fatalf("SetMachineID: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(etc, "machine-id"))
	if err != nil || string(b) != "0123456789abcdef0123456789abcdef\n" {
		t.Errorf("machine-id = %q, %v", b, err)
	}
}

func TestSystemHooksWriteThroughIdentityLinks(t *testing.T) {
	etc, run := t.TempDir(), filepath.Join(t.TempDir(), "panda")
	os.WriteFile(filepath.Join(etc, "machine-id"), []byte("old\n"), 0o444)
	h := guest.SystemHooks{EtcDir: etc, RunDir: run}
	if err := h.LinkIdentityFiles(); err != nil {
		t.Fatalf("LinkIdentityFiles: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(etc, "machine-id")); string(b) != "old\n" {
		t.Errorf("content through the link = %q, want the old content", b)
	}
	if err := h.SetMachineID("0123456789abcdef0123456789abcdef"); err != nil {
		t.Fatalf("SetMachineID: %v", err)
	}
	if dest, err := os.Readlink(filepath.Join(etc, "machine-id")); err != nil || dest != filepath.Join(run, "machine-id") {
		t.Errorf("machine-id link = %q, %v; the hook must keep the link", dest, err)
	}
	if b, _ := os.ReadFile(filepath.Join(run, "machine-id")); string(b) != "0123456789abcdef0123456789abcdef\n" {
		t.Errorf("machine-id in run dir = %q", b)
	}
	// Idempotent.
	if err := h.LinkIdentityFiles(); err != nil {
		t.Fatalf("second LinkIdentityFiles: %v", err)
	}
}

func TestSystemHooksMapHostname(t *testing.T) {
	etc, run := t.TempDir(), filepath.Join(t.TempDir(), "panda")
	os.WriteFile(filepath.Join(etc, "hosts"), []byte("127.0.0.1 localhost\n127.0.1.1\ttemplate\n10.1.2.3 db # mine"), 0o644)
	h := guest.SystemHooks{EtcDir: etc, RunDir: run}
	if err := h.LinkIdentityFiles(); err != nil {
		t.Fatalf("LinkIdentityFiles: %v", err)
	}
	for _, name := range []string{"first", "second"} {
		if err := h.MapHostname(name); err != nil {
			t.Fatalf("MapHostname: %v", err)
		}
	}
	want := "127.0.0.1 localhost\n10.1.2.3 db # mine\n127.0.1.1\tsecond\n"
	if b, err := os.ReadFile(filepath.Join(etc, "hosts")); err != nil || string(b) != want {
		t.Errorf("hosts = %q, %v; want %q", b, err, want)
	}
	if dest, err := os.Readlink(filepath.Join(etc, "hosts")); err != nil || dest != filepath.Join(run, "hosts") {
		t.Errorf("hosts link = %q, %v; want it to stay a link into the run directory", dest, err)
	}

	// No /etc/hosts at all: localhost and the name.
	etc = t.TempDir()
	if err := (guest.SystemHooks{EtcDir: etc}).MapHostname("solo"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(etc, "hosts")); string(b) != "127.0.0.1\tlocalhost\n127.0.1.1\tsolo\n" {
		t.Errorf("new hosts = %q", b)
	}
}

// TestClientExecCwd: a client's ExecCwd is the working directory of execs
// that name none; an exec's own Cwd wins.
func TestClientExecCwd(t *testing.T) {
	f := startGuest(t)
	dir := t.TempDir()
	c, err := guestproto.NewClientConfig(f.tr.Connect(true), guestproto.ClientConfig{ExecCwd: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := testContext(t)
	if _, err := c.Hello(ctx, guestproto.HelloRequest{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ cwd, want string }{{"", dir}, {"/", "/"}} {
		var out bytes.Buffer
		if _, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"pwd"}, Cwd: tc.cwd}, nil, &out, nil); err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(out.String()); got != tc.want {
			t.Errorf("pwd with Cwd %q: got %q, want %q", tc.cwd, got, tc.want)
		}
	}
	if _, err := guestproto.NewClientConfig(f.tr.Connect(true), guestproto.ClientConfig{ExecCwd: "relative"}); err == nil {
		t.Errorf("a relative ExecCwd was accepted")
	}
}
