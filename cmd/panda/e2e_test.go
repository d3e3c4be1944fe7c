package main

// End-to-end tests of the panda binary: `panda up` runs as a subprocess on
// its own data directory (a short temporary directory, because unix socket
// paths under it are limited to 108 bytes), with QEMU under TCG and the tiny
// template at 256 MiB. The tests crash it, stop it and restart it on the
// same data directory, and check what survives.
//
// Whatever happens, each test leaves nothing behind: its servers are
// stopped (SIGTERM, then SIGKILL), then any QEMU process still serving its
// data directory is killed, the XFS store is unmounted and the directory
// removed. A passing test must not need that safety net: what it finds is
// reported as an error.
//
// Environment: PANDA_BIN (default: go build this package), PANDA_TEST_IMAGES
// (default /var/lib/pandastack/images, from `make setup`). Needs root (the
// store is a loop-mounted XFS image). Skipped with -short.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apispec "github.com/pandastack/pandastack/api"
	pandastack "github.com/pandastack/pandastack/sdk/go"
	"golang.org/x/sys/unix"
)

// pandaBin is the binary under test.
var pandaBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	pandaBin = os.Getenv("PANDA_BIN")
	if pandaBin == "" {
		dir, err := os.MkdirTemp("", "pebin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = "/usr/local/go/bin/go"
		}
		pandaBin = filepath.Join(dir, "panda")
		if out, err := exec.Command(goBin, "build", "-o", pandaBin, ".").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build ./cmd/panda: %v\n%s", err, out)
			return 1
		}
	}
	return m.Run()
}

func testImages() string {
	if d := os.Getenv("PANDA_TEST_IMAGES"); d != "" {
		return d
	}
	return "/var/lib/pandastack/images"
}

// e2e marks a test as slow (real servers, real VMs) and checks what it needs.
func e2e(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Fatal("end-to-end tests need root: panda up loop-mounts an XFS image")
	}
	if _, err := os.Stat(filepath.Join(testImages(), "rootfs-tiny.ext4")); err != nil {
		t.Fatalf("guest images missing (run make setup or set PANDA_TEST_IMAGES): %v", err)
	}
}

// newDataDir makes a short temporary data directory and registers its
// clean-up first, so that it runs last, after every server of the test
// has been stopped.
func newDataDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pe")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cleanDataDir(t, dir) })
	return dir
}

// cleanDataDir kills QEMU processes of dir, unmounts its store and removes
// it. Leftovers are errors if the test had passed so far.
func cleanDataDir(t *testing.T, dir string) {
	report := t.Errorf
	if t.Failed() {
		report = t.Logf
	}
	if pids := qemuPIDs(dir); len(pids) > 0 {
		report("left behind: QEMU processes %v of %s; killing them", pids, dir)
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		for _, pid := range pids {
			waitGone(pid, 10*time.Second)
		}
	}
	store := filepath.Join(dir, "store")
	if mounted(store) {
		report("left behind: %s is mounted; unmounting it", store)
		// Files of just-killed processes can take a moment to close.
		var err error
		for i := 0; i < 50; i++ {
			if err = unix.Unmount(store, 0); err == nil || !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Logf("unmount %s: %v (open there: %s); detaching it", store, err, holders(store))
			unix.Unmount(store, unix.MNT_DETACH)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Errorf("remove %s: %v", dir, err)
	}
}

// qemuPIDs lists the live QEMU processes whose command line mentions dir.
func qemuPIDs(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 { // gone, or a zombie
			continue
		}
		argv := bytes.Split(b, []byte{0})
		if strings.Contains(filepath.Base(string(argv[0])), "qemu-system") && bytes.Contains(b, []byte(dir+"/")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...; comm may contain spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func waitGone(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for alive(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// mounted reports whether dir is a mount point in /proc/self/mountinfo.
func mounted(dir string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && fields[4] == dir {
			return true
		}
	}
	return false
}

// vmmPID reads the PID that panda recorded for a sandbox's QEMU.
func vmmPID(t *testing.T, dataDir, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "run", id, "vmm.pid"))
	if err != nil {
		t.Fatalf("read the VMM pid of %s: %v", id, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("vmm.pid of %s: %v", id, err)
	}
	return pid
}

// lockedBuffer is a bytes.Buffer safe for a writer and readers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// upProc is one `panda up` process.
type upProc struct {
	t       *testing.T
	name    string
	dataDir string
	url     string
	key     string
	cmd     *exec.Cmd
	stdout  lockedBuffer
	stderr  lockedBuffer
	exited  chan struct{}
	state   *os.ProcessState
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// upArgs is the command line of `panda up` on dataDir at addr.
func upArgs(dataDir, addr string, extra ...string) []string {
	return append([]string{"up", "--data-dir", dataDir, "--listen", addr, "--images", testImages(),
		"--accel", "tcg", "--default-template", "tiny", "--default-memory", "256"}, extra...)
}

// startServer starts `panda up` on dataDir and waits until /healthz
// answers and the admin key is there. The server is stopped when the test
// ends (before the data directory is cleaned).
func startServer(t *testing.T, name, dataDir string, extra ...string) *upProc {
	t.Helper()
	addr := freeAddr(t)
	s := startPanda(t, name, dataDir, addr, upArgs(dataDir, addr, extra...))
	s.key = readKey(t, name, dataDir)
	return s
}

// readKey reads the admin key that a healthy server wrote to dataDir.
func readKey(t *testing.T, name, dataDir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "admin.key"))
	if err != nil {
		t.Fatalf("server %s is healthy but: %v", name, err)
	}
	return strings.TrimSpace(string(b))
}

// startPanda starts a panda daemon with args, serving on addr, and waits
// until /healthz answers. It is stopped when the test ends (before the
// data directory is cleaned).
func startPanda(t *testing.T, name, dataDir, addr string, args []string) *upProc {
	t.Helper()
	s := &upProc{t: t, name: name, dataDir: dataDir, url: "http://" + addr, exited: make(chan struct{})}
	s.cmd = exec.Command(pandaBin, args...)
	s.cmd.Stdout, s.cmd.Stderr = &s.stdout, &s.stderr
	s.cmd.Env = append(os.Environ(), "PANDA_DATA_DIR=") // flags only
	// If the test binary dies, the kernel stops the server.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", pandaBin, err)
	}
	go func() {
		s.cmd.Wait()
		s.state = s.cmd.ProcessState
		close(s.exited)
	}()
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("server %s stdout:\n%s\nserver %s stderr:\n%s", s.name, s.stdout.String(), s.name, tail(s.stderr.String(), 6000))
		}
	})

	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-s.exited:
			t.Fatalf("server %s exited during start (%v); stderr:\n%s", name, s.state, tail(s.stderr.String(), 4000))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server %s not healthy after 2 minutes; stderr:\n%s", name, tail(s.stderr.String(), 4000))
		}
		if healthy(s.url) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s
}

func healthy(url string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/healthz", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// stop sends SIGTERM and waits (SIGKILL after a minute). It returns the
// exit code (-1 if killed by a signal). Idempotent.
func (s *upProc) stop() int {
	select {
	case <-s.exited:
		return s.state.ExitCode()
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(time.Minute):
		s.t.Errorf("server %s ignored SIGTERM for a minute; killing it", s.name)
		s.cmd.Process.Kill()
		<-s.exited
	}
	return s.state.ExitCode()
}

// crash kills the server with SIGKILL and waits for it.
func (s *upProc) crash() {
	s.cmd.Process.Kill()
	<-s.exited
}

func (s *upProc) client(t *testing.T) *pandastack.Client {
	t.Helper()
	c, err := pandastack.NewClient(pandastack.Options{APIURL: s.url, APIKey: s.key})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func mustCreate(t *testing.T, ctx context.Context, c *pandastack.Client) *pandastack.Sandbox {
	t.Helper()
	sb, err := c.Create(ctx, pandastack.CreateOptions{TTLSeconds: 1800})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if sb.Info.State != pandastack.StateRunning {
		t.Fatalf("create: got state %s, want running", sb.Info.State)
	}
	return sb
}

func mustExec(t *testing.T, ctx context.Context, sb *pandastack.Sandbox, cmd string) string {
	t.Helper()
	r, err := sb.Exec(ctx, pandastack.Command{Cmd: cmd})
	if err != nil {
		t.Fatalf("exec %q in %s: %v", cmd, sb.ID, err)
	}
	if r.ExitCode != 0 {
		t.Fatalf("exec %q in %s: exit %d, stderr %q", cmd, sb.ID, r.ExitCode, r.Stderr)
	}
	return r.Stdout
}

func mustGet(t *testing.T, ctx context.Context, c *pandastack.Client, id string) pandastack.SandboxInfo {
	t.Helper()
	sb, err := c.Get(ctx, id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return sb.Info
}

func writeFile(t *testing.T, ctx context.Context, sb *pandastack.Sandbox, path, content string) {
	t.Helper()
	if _, err := sb.WriteFile(ctx, path, strings.NewReader(content), 0o644); err != nil {
		t.Fatalf("write %s in %s: %v", path, sb.ID, err)
	}
}

// TestRestartAfterCrash: the server is SIGKILLed and one of its two VMMs
// dies while it is down. The next start re-adopts the survivor (running,
// exec works, its files are intact), records the other as stopped with
// vmm_exited, and leaves nothing orphaned.
func TestRestartAfterCrash(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	s1 := startServer(t, "first", dir)
	c := s1.client(t)
	keep := mustCreate(t, ctx, c)
	lost := mustCreate(t, ctx, c)
	writeFile(t, ctx, keep, "/root/survivor.txt", "still here\n")
	keepPID, lostPID := vmmPID(t, dir, keep.ID), vmmPID(t, dir, lost.ID)

	s1.crash()
	// The VMMs run in their own sessions: they outlive the server.
	if !alive(keepPID) || !alive(lostPID) {
		t.Fatalf("after SIGKILL of the server: VMM %d alive %v, VMM %d alive %v; want both alive",
			keepPID, alive(keepPID), lostPID, alive(lostPID))
	}
	if err := unix.Kill(lostPID, unix.SIGKILL); err != nil {
		t.Fatalf("kill VMM %d: %v", lostPID, err)
	}
	if !waitGone(lostPID, 10*time.Second) {
		t.Fatalf("VMM %d still alive 10 s after SIGKILL", lostPID)
	}

	s2 := startServer(t, "second", dir)
	c = s2.client(t)
	if info := mustGet(t, ctx, c, keep.ID); info.State != pandastack.StateRunning {
		t.Errorf("survivor %s: got state %s (%s), want running", keep.ID, info.State, info.StopReason)
	}
	if got := mustExec(t, ctx, c.Sandbox(keep.ID), "cat /root/survivor.txt"); got != "still here\n" {
		t.Errorf("survivor's file: got %q, want %q", got, "still here\n")
	}
	info := mustGet(t, ctx, c, lost.ID)
	if info.State != pandastack.StateStopped || info.StopReason != "vmm_exited" {
		t.Errorf("sandbox whose VMM died: got state %s, stop_reason %q; want stopped, vmm_exited", info.State, info.StopReason)
	}
	if pids := qemuPIDs(dir); len(pids) != 1 || pids[0] != keepPID {
		t.Errorf("QEMU processes of %s: got %v, want exactly [%d] (the adopted one)", dir, pids, keepPID)
	}
	for _, p := range []string{filepath.Join(dir, "run", lost.ID), filepath.Join(dir, "store", "sandboxes", lost.ID)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("files of the dead sandbox: %s still exists (err %v)", p, err)
		}
	}
	if code := s2.stop(); code != 0 {
		t.Errorf("second server: exit code %d after SIGTERM, want 0", code)
	}
}

// TestGracefulShutdownKills: SIGTERM with the default --on-shutdown kill
// exits 0, stops every sandbox, unmounts the store; after a restart the
// sandboxes are recorded as stopped.
func TestGracefulShutdownKills(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	s1 := startServer(t, "first", dir)
	c := s1.client(t)
	a, b := mustCreate(t, ctx, c), mustCreate(t, ctx, c)
	if pids := qemuPIDs(dir); len(pids) != 2 {
		t.Fatalf("QEMU processes with two sandboxes: got %v, want two", pids)
	}

	if code := s1.stop(); code != 0 {
		t.Fatalf("exit code after SIGTERM: got %d, want 0; stderr:\n%s", code, tail(s1.stderr.String(), 3000))
	}
	if pids := qemuPIDs(dir); len(pids) != 0 {
		t.Errorf("QEMU processes after a graceful stop: got %v, want none", pids)
	}
	if store := filepath.Join(dir, "store"); mounted(store) {
		t.Errorf("%s is still mounted after a graceful stop", store)
	}

	s2 := startServer(t, "second", dir)
	c = s2.client(t)
	for _, sb := range []*pandastack.Sandbox{a, b} {
		info := mustGet(t, ctx, c, sb.ID)
		if info.State != pandastack.StateStopped {
			t.Errorf("%s after restart: got state %s, want stopped", sb.ID, info.State)
		}
		if info.StopReason != "server_shutdown" {
			t.Errorf("%s after restart: got stop_reason %q, want server_shutdown", sb.ID, info.StopReason)
		}
	}
	if code := s2.stop(); code != 0 {
		t.Errorf("second server: exit code %d after SIGTERM, want 0", code)
	}
}

// TestShutdownKeep: with --on-shutdown keep the VMMs outlive a SIGTERM and
// the next start adopts them.
func TestShutdownKeep(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	s1 := startServer(t, "first", dir, "--on-shutdown", "keep")
	c := s1.client(t)
	sb := mustCreate(t, ctx, c)
	writeFile(t, ctx, sb, "/root/kept.txt", "kept\n")
	pid := vmmPID(t, dir, sb.ID)

	if code := s1.stop(); code != 0 {
		t.Fatalf("exit code after SIGTERM: got %d, want 0", code)
	}
	if !alive(pid) {
		t.Fatalf("VMM %d of %s is gone after SIGTERM with --on-shutdown keep", pid, sb.ID)
	}
	if store := filepath.Join(dir, "store"); !mounted(store) {
		t.Errorf("%s was unmounted under a running VMM", store)
	}

	// A start that fails (its port is taken) must leave them alone too.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	failed := exec.CommandContext(ctx, pandaBin, upArgs(dir, busy.Addr().String())...)
	failed.Env = append(os.Environ(), "PANDA_DATA_DIR=")
	out, err := failed.CombinedOutput()
	busy.Close()
	if err == nil || !strings.Contains(string(out), "cannot listen") {
		t.Errorf("start on a taken port: got %v, want a failure saying cannot listen; output:\n%s", err, out)
	}
	if !alive(pid) {
		t.Fatalf("VMM %d of %s was killed by a start that failed", pid, sb.ID)
	}

	s2 := startServer(t, "second", dir) // default: kill at its own shutdown
	c = s2.client(t)
	if info := mustGet(t, ctx, c, sb.ID); info.State != pandastack.StateRunning {
		t.Errorf("%s after restart: got state %s (%s), want running", sb.ID, info.State, info.StopReason)
	}
	if got := mustExec(t, ctx, c.Sandbox(sb.ID), "cat /root/kept.txt"); got != "kept\n" {
		t.Errorf("file in the kept sandbox: got %q, want %q", got, "kept\n")
	}
	if pids := qemuPIDs(dir); len(pids) != 1 || pids[0] != pid {
		t.Errorf("QEMU processes after adoption: got %v, want [%d]", pids, pid)
	}
	if code := s2.stop(); code != 0 {
		t.Errorf("second server: exit code %d after SIGTERM, want 0", code)
	}
}

// TestAdminKeyAndLock: the first start prints the admin key once and saves
// it with mode 0600; a restart prints none; a second server on the same
// data directory refuses to start.
func TestAdminKeyAndLock(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	keyFile := filepath.Join(dir, "admin.key")
	const banner = "Created the admin API key"

	s1 := startServer(t, "first", dir)
	if out := s1.stdout.String(); !strings.Contains(out, banner) || !strings.Contains(out, s1.key) {
		t.Errorf("first start: stdout does not show the admin key %q:\n%s", s1.key, out)
	}
	if !strings.HasPrefix(s1.key, "panda_") {
		t.Errorf("admin key %q does not look like a key", s1.key)
	}
	st, err := os.Stat(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if mode := st.Mode().Perm(); mode != 0o600 {
		t.Errorf("mode of %s: got %o, want 600", keyFile, mode)
	}
	// The server serves the document it was built with.
	res, err := http.Get(s1.url + "/v1/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !bytes.Equal(doc, apispec.OpenAPI) {
		t.Errorf("GET /v1/openapi.yaml: got %d bytes, want the embedded api/openapi.yaml (%d bytes)", len(doc), len(apispec.OpenAPI))
	}
	if code := s1.stop(); code != 0 {
		t.Fatalf("exit code after SIGTERM: got %d, want 0", code)
	}

	s2 := startServer(t, "second", dir)
	if out := s2.stdout.String(); strings.Contains(out, banner) || strings.Contains(out, s1.key) {
		t.Errorf("second start printed a key:\n%s", out)
	}
	if s2.key != s1.key {
		t.Errorf("admin.key changed across a restart: got %q, want %q", s2.key, s1.key)
	}
	if _, err := s2.client(t).List(ctx, pandastack.ListOptions{}); err != nil {
		t.Errorf("the admin key after a restart: %v", err)
	}

	// A second server on the same data directory while s2 runs.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	third := exec.CommandContext(cctx, pandaBin, upArgs(dir, freeAddr(t))...)
	third.Env = append(os.Environ(), "PANDA_DATA_DIR=")
	var out bytes.Buffer
	third.Stdout, third.Stderr = &out, &out
	err = third.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Errorf("second server on the same data directory: got %v, want a non-zero exit; output:\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "another panda server is running") {
		t.Errorf("second server on the same data directory: output does not say %q:\n%s", "another panda server is running", out.String())
	}
	if !healthy(s2.url) {
		t.Errorf("the running server is not healthy after the refused start")
	}
	if code := s2.stop(); code != 0 {
		t.Errorf("second server: exit code %d after SIGTERM, want 0", code)
	}
}

// TestCLIExecExitCode: `panda exec ID -- CMD` streams the output and exits
// with the command's status.
func TestCLIExecExitCode(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	s := startServer(t, "server", dir)
	sb := mustCreate(t, ctx, s.client(t))

	for _, tc := range []struct {
		cmd      string
		wantCode int
		wantOut  string
	}{
		{"exit 5", 5, ""},
		{"echo hello; exit 0", 0, "hello\n"},
		{"echo oops >&2; false", 1, ""},
	} {
		cmd := exec.CommandContext(ctx, pandaBin, "exec", sb.ID, "--", tc.cmd)
		cmd.Env = append(os.Environ(), "PANDASTACK_API_URL="+s.url, "PANDASTACK_API_KEY="+s.key, "PANDA_DATA_DIR="+dir)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("panda exec %q: %v", tc.cmd, err)
		}
		if code != tc.wantCode {
			t.Errorf("panda exec %q: got exit status %d, want %d (stderr %q)", tc.cmd, code, tc.wantCode, stderr.String())
		}
		if stdout.String() != tc.wantOut {
			t.Errorf("panda exec %q: got stdout %q, want %q", tc.cmd, stdout.String(), tc.wantOut)
		}
		if strings.Contains(stderr.String(), "panda:") {
			t.Errorf("panda exec %q: a non-zero exit of the command is not panda's error, got stderr %q", tc.cmd, stderr.String())
		}
	}
	if code := s.stop(); code != 0 {
		t.Errorf("exit code after SIGTERM: got %d, want 0", code)
	}
}

// holders lists the processes with files open or mapped under dir.
func holders(dir string) string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		held := false
		fds, _ := os.ReadDir(filepath.Join("/proc", e.Name(), "fd"))
		for _, fd := range fds {
			if l, _ := os.Readlink(filepath.Join("/proc", e.Name(), "fd", fd.Name())); strings.HasPrefix(l, dir+"/") {
				held = true
			}
		}
		if m, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "maps")); bytes.Contains(m, []byte(dir+"/")) {
			held = true
		}
		if held {
			comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
			out = append(out, e.Name()+" ("+strings.TrimSpace(string(comm))+")")
		}
	}
	if len(out) == 0 {
		return "no process"
	}
	return strings.Join(out, ", ")
}
