package main

// End-to-end tests of the panda binary: `panda up` runs as a subprocess on
// its own data directory (a short temporary directory, because unix socket
// paths under it are limited to 108 bytes), with QEMU under TCG and the tiny
// template at 256 MiB. The tests crash it, stop it and restart it on the
// same data directory, and check what survives. The processes are started
// by internal/testing/pandatest.
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
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apispec "github.com/pandastack/pandastack/api"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	pandastack "github.com/pandastack/pandastack/sdk/go"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	code := pandatest.Main(m) // stops every server, the security world's too
	closeSecWorld()
	os.Exit(code)
}

// e2e gates an end-to-end test (real servers, real VMs; root, since
// panda up loop-mounts an XFS image) through testkit.
func e2e(t *testing.T) {
	t.Helper()
	testkit.VM(t)
	testkit.Root(t)
}

// newDataDir makes a short temporary data directory and registers its
// clean-up first, so that it runs last, after every server of the test
// has been stopped. Leftovers it finds are errors if the test had passed
// so far.
func newDataDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pe")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		report := t.Errorf
		if t.Failed() {
			report = t.Logf
		}
		left, err := pandatest.RemoveDataDir(dir)
		for _, l := range left {
			report("left behind: %s", l)
		}
		if err != nil {
			t.Error(err)
		}
	})
	return dir
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

// proc is one panda process of a test, named in its messages.
type proc struct {
	*pandatest.Server
	name string
}

// tinyDefaults make creates that name no template tiny at 256 MiB.
var tinyDefaults = []string{"--default-template", "tiny", "--default-memory", "256"}

// upOptions is `panda up` on dataDir at addr ("" for a free port) with
// the tiny defaults and extra flags.
func upOptions(dataDir, addr string, extra ...string) pandatest.Options {
	return pandatest.Options{DataDir: dataDir, Addr: addr, Args: append(slices.Clone(tinyDefaults), extra...)}
}

// startServer starts `panda up` on dataDir: see start.
func startServer(t *testing.T, name, dataDir string, extra ...string) *proc {
	t.Helper()
	return start(t, name, upOptions(dataDir, "", extra...))
}

// start starts panda as opts say and waits until it serves (and, but for
// an agent, has written the admin key). It is stopped when the test ends
// (before the data directory is cleaned); its output is logged if the
// test failed.
func start(t *testing.T, name string, opts pandatest.Options) *proc {
	t.Helper()
	s, err := pandatest.Start(opts)
	if err != nil {
		t.Fatalf("server %s: %v", name, err)
	}
	p := &proc{Server: s, name: name}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("server %s: %v", name, err)
		}
		if t.Failed() {
			t.Logf("server %s stdout:\n%s\nserver %s output:\n%s", name, s.Stdout(), name, s.Log())
		}
	})
	return p
}

// mustStop stops p and reports whether it exited 0 after SIGTERM (an
// error if not).
func mustStop(t *testing.T, p *proc) bool {
	t.Helper()
	if err := p.Stop(); err != nil {
		t.Errorf("server %s: %v; its output:\n%s", p.name, err, p.Log())
		return false
	}
	return true
}

// runToEnd runs panda as opts say, expecting it to fail, and returns its
// output and how it ended.
func runToEnd(t *testing.T, ctx context.Context, opts pandatest.Options) (string, error) {
	t.Helper()
	cmd, err := pandatest.Command(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (p *proc) client(t *testing.T) *pandastack.Client {
	t.Helper()
	c, err := pandastack.NewClient(pandastack.Options{APIURL: p.URL(), APIKey: p.AdminKey()})
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

	s1.Kill()
	// The VMMs run in their own sessions: they outlive the server.
	if !testkit.Alive(keepPID) || !testkit.Alive(lostPID) {
		t.Fatalf("after SIGKILL of the server: VMM %d alive %v, VMM %d alive %v; want both alive",
			keepPID, testkit.Alive(keepPID), lostPID, testkit.Alive(lostPID))
	}
	if err := unix.Kill(lostPID, unix.SIGKILL); err != nil {
		t.Fatalf("kill VMM %d: %v", lostPID, err)
	}
	if !testkit.WaitGone(lostPID, 10*time.Second) {
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
	if pids := testkit.QEMUProcs(dir); len(pids) != 1 || pids[0] != keepPID {
		t.Errorf("QEMU processes of %s: got %v, want exactly [%d] (the adopted one)", dir, pids, keepPID)
	}
	for _, p := range []string{filepath.Join(dir, "run", lost.ID), filepath.Join(dir, "store", "sandboxes", lost.ID)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("files of the dead sandbox: %s still exists (err %v)", p, err)
		}
	}
	mustStop(t, s2)
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
	if pids := testkit.QEMUProcs(dir); len(pids) != 2 {
		t.Fatalf("QEMU processes with two sandboxes: got %v, want two", pids)
	}

	if !mustStop(t, s1) {
		t.FailNow()
	}
	if pids := testkit.QEMUProcs(dir); len(pids) != 0 {
		t.Errorf("QEMU processes after a graceful stop: got %v, want none", pids)
	}
	if store := filepath.Join(dir, "store"); testkit.Mounted(store) {
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
	mustStop(t, s2)
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

	if !mustStop(t, s1) {
		t.FailNow()
	}
	if !testkit.Alive(pid) {
		t.Fatalf("VMM %d of %s is gone after SIGTERM with --on-shutdown keep", pid, sb.ID)
	}
	if store := filepath.Join(dir, "store"); !testkit.Mounted(store) {
		t.Errorf("%s was unmounted under a running VMM", store)
	}

	// A start that fails (its port is taken) must leave them alone too.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	out, err := runToEnd(t, ctx, upOptions(dir, busy.Addr().String()))
	busy.Close()
	if err == nil || !strings.Contains(out, "cannot listen") {
		t.Errorf("start on a taken port: got %v, want a failure saying cannot listen; output:\n%s", err, out)
	}
	if !testkit.Alive(pid) {
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
	if pids := testkit.QEMUProcs(dir); len(pids) != 1 || pids[0] != pid {
		t.Errorf("QEMU processes after adoption: got %v, want [%d]", pids, pid)
	}
	mustStop(t, s2)
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
	if out := s1.Stdout(); !strings.Contains(out, banner) || !strings.Contains(out, s1.AdminKey()) {
		t.Errorf("first start: stdout does not show the admin key %q:\n%s", s1.AdminKey(), out)
	}
	if !strings.HasPrefix(s1.AdminKey(), "panda_") {
		t.Errorf("admin key %q does not look like a key", s1.AdminKey())
	}
	st, err := os.Stat(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if mode := st.Mode().Perm(); mode != 0o600 {
		t.Errorf("mode of %s: got %o, want 600", keyFile, mode)
	}
	// The server serves the document it was built with.
	res, err := http.Get(s1.URL() + "/v1/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !bytes.Equal(doc, apispec.OpenAPI) {
		t.Errorf("GET /v1/openapi.yaml: got %d bytes, want the embedded api/openapi.yaml (%d bytes)", len(doc), len(apispec.OpenAPI))
	}
	if !mustStop(t, s1) {
		t.FailNow()
	}

	s2 := startServer(t, "second", dir)
	if out := s2.Stdout(); strings.Contains(out, banner) || strings.Contains(out, s1.AdminKey()) {
		t.Errorf("second start printed a key:\n%s", out)
	}
	if s2.AdminKey() != s1.AdminKey() {
		t.Errorf("admin.key changed across a restart: got %q, want %q", s2.AdminKey(), s1.AdminKey())
	}
	if _, err := s2.client(t).List(ctx, pandastack.ListOptions{}); err != nil {
		t.Errorf("the admin key after a restart: %v", err)
	}

	// A second server on the same data directory while s2 runs.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := runToEnd(t, cctx, upOptions(dir, ""))
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Errorf("second server on the same data directory: got %v, want a non-zero exit; output:\n%s", err, out)
	}
	if !strings.Contains(out, "another panda server is running") {
		t.Errorf("second server on the same data directory: output does not say %q:\n%s", "another panda server is running", out)
	}
	if !s2.Healthy() {
		t.Errorf("the running server is not healthy after the refused start")
	}
	mustStop(t, s2)
}

// TestCLIExecExitCode: `panda exec ID -- CMD` streams the output and exits
// with the command's status.
func TestCLIExecExitCode(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	s := startServer(t, "server", dir)
	sb := mustCreate(t, ctx, s.client(t))
	bin, err := pandatest.Binary()
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		cmd      string
		wantCode int
		wantOut  string
	}{
		{"exit 5", 5, ""},
		{"echo hello; exit 0", 0, "hello\n"},
		{"echo oops >&2; false", 1, ""},
	} {
		cmd := exec.CommandContext(ctx, bin, "exec", sb.ID, "--", tc.cmd)
		cmd.Env = append(os.Environ(), "PANDASTACK_API_URL="+s.URL(), "PANDASTACK_API_KEY="+s.AdminKey(), "PANDA_DATA_DIR="+dir)
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
	mustStop(t, s)
}
