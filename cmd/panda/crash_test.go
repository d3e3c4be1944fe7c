package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// Crash recovery at the exact points where a crash used to lose data:
// each server of the story below is started with a failpoint
// (PANDA_FAILPOINTS) that makes it SIGKILL itself at one point of a
// pause, a resume or a snapshot; the next start must find the sandbox
// whole, its operation finished or rolled back, and nothing orphaned.

// crashAt starts `panda up` on dir that dies at the failpoint point ("":
// none).
func crashAt(t *testing.T, name, dir, point string) *proc {
	t.Helper()
	opts := upOptions(dir, "")
	if point != "" {
		opts.Env = []string{"PANDA_FAILPOINTS=" + point + "=crash"}
	}
	return start(t, name, opts)
}

// mustCrash runs req, which must hit the failpoint and take the server
// down: the request fails and the process is gone.
func mustCrash(t *testing.T, p *proc, what string, req func() error) {
	t.Helper()
	if err := req(); err == nil {
		t.Fatalf("%s: succeeded; want the server to crash at its failpoint", what)
	}
	select {
	case <-p.Exited():
	case <-time.After(time.Minute):
		t.Fatalf("%s: server %s still running a minute after its failpoint should have crashed it", what, p.name)
	}
	p.Kill() // record that it was killed: it already is
}

func TestCrashRecoveryKeepsEveryState(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	const note = "written before the crashes\n"

	// 1. A crash while a snapshot holds the VMM stopped (the VMM was left
	// paused and the next start used to give up on it and delete the
	// sandbox).
	s1 := crashAt(t, "1 snapshot", dir, "capture-stopped")
	c := s1.client(t)
	sb := mustCreate(t, ctx, c)
	writeFile(t, ctx, sb, "/root/note.txt", note)
	mustExec(t, ctx, sb, "echo 42 > /dev/shm/in-memory")
	mustCrash(t, s1, "snapshot", func() error { _, err := sb.Snapshot(ctx, "doomed"); return err })

	s2 := crashAt(t, "2 pause, capture not sealed", dir, "capture-stopped")
	c = s2.client(t)
	sb = c.Sandbox(sb.ID)
	if info := mustGet(t, ctx, c, sb.ID); info.State != pandastack.StateRunning {
		t.Fatalf("after a crash in a snapshot: state %s (%s), want running", info.State, info.StopReason)
	}
	if got := mustExec(t, ctx, sb, "cat /root/note.txt /dev/shm/in-memory"); got != note+"42\n" {
		t.Errorf("after a crash in a snapshot: files %q, want %q", got, note+"42\n")
	}
	if snaps, err := c.Snapshots(ctx); err != nil || len(snaps) != 0 {
		t.Errorf("after a crash in a snapshot: snapshots %v, %v; want none (it never completed)", snaps, err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "store", "snapshots", "*")); len(m) != 0 {
		t.Errorf("after a crash in a snapshot: left in the store: %v", m)
	}

	// 2. A crash in a pause before its capture was complete: rolled back,
	// the sandbox runs on.
	mustCrash(t, s2, "pause", func() error { return sb.Pause(ctx) })
	s3 := crashAt(t, "3 pause, capture sealed", dir, "pause-sealed")
	c = s3.client(t)
	sb = c.Sandbox(sb.ID)
	info := mustGet(t, ctx, c, sb.ID)
	if info.State != pandastack.StateRunning || !strings.Contains(info.LastError, "interrupted") {
		t.Fatalf("after a crash early in a pause: state %s, last_error %q; want running, interrupted", info.State, info.LastError)
	}
	if got := mustExec(t, ctx, sb, "cat /root/note.txt /dev/shm/in-memory"); got != note+"42\n" {
		t.Errorf("after a crash early in a pause: files %q", got)
	}

	// 3. A crash in a pause once its capture was sealed but before it was
	// recorded: finished, the sandbox is paused.
	mustCrash(t, s3, "pause", func() error { return sb.Pause(ctx) })
	s4 := crashAt(t, "4 resume", dir, "resume-restored")
	c = s4.client(t)
	sb = c.Sandbox(sb.ID)
	if info := mustGet(t, ctx, c, sb.ID); info.State != pandastack.StatePaused {
		t.Fatalf("after a crash late in a pause: state %s (%s), want paused", info.State, info.StopReason)
	}
	if pids := testkit.QEMUProcs(dir); len(pids) != 0 {
		t.Errorf("after a crash late in a pause: QEMU processes %v, want none (the pause stops the VMM)", pids)
	}

	// 4. A crash in a resume once the new VMM ran: rolled back, the
	// sandbox is paused with its capture and can be resumed.
	mustCrash(t, s4, "resume", func() error { return sb.Resume(ctx) })
	s5 := crashAt(t, "5 snapshot recorded late", dir, "api-snapshot-taken")
	c = s5.client(t)
	sb = c.Sandbox(sb.ID)
	info = mustGet(t, ctx, c, sb.ID)
	if info.State != pandastack.StatePaused || !strings.Contains(info.LastError, "interrupted") {
		t.Fatalf("after a crash in a resume: state %s, last_error %q; want paused, interrupted", info.State, info.LastError)
	}
	if pids := testkit.QEMUProcs(dir); len(pids) != 0 {
		t.Errorf("after a crash in a resume: QEMU processes %v, want none (rolled back)", pids)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatalf("resume after the crashes: %v", err)
	}
	if got := mustExec(t, ctx, sb, "cat /root/note.txt /dev/shm/in-memory"); got != note+"42\n" {
		t.Errorf("after pause and resume across crashes: files %q, want %q", got, note+"42\n")
	}

	// 5. A crash after the host took a snapshot but before the catalog
	// recorded it: the next start records it.
	mustCrash(t, s5, "snapshot", func() error { _, err := sb.Snapshot(ctx, ""); return err })
	s6 := crashAt(t, "6", dir, "")
	c = s6.client(t)
	snaps, err := c.Snapshots(ctx)
	if err != nil || len(snaps) != 1 || snaps[0].SandboxID != sb.ID {
		t.Fatalf("after a crash between snapshot and record: snapshots %+v, %v; want one of %s", snaps, err, sb.ID)
	}
	child, err := c.Create(ctx, pandastack.CreateOptions{SnapshotID: snaps[0].ID, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("create from the recovered snapshot: %v", err)
	}
	if got := mustExec(t, ctx, child, "cat /root/note.txt /dev/shm/in-memory"); got != note+"42\n" {
		t.Errorf("sandbox from the recovered snapshot: files %q", got)
	}
	if info := mustGet(t, ctx, c, sb.ID); info.State != pandastack.StateRunning {
		t.Errorf("the snapshotted sandbox after the crash: state %s, want running", info.State)
	}
	mustStop(t, s6)
}

// TestAbandonedResume: a client that gives up on a resume (a timeout, a
// dropped connection) used to leave the sandbox stopped with its capture
// deleted. The resume now finishes on the server; the client finds the
// sandbox running later, with its files.
func TestAbandonedResume(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	s := startServer(t, "server", dir)
	c := s.client(t)
	sb := mustCreate(t, ctx, c)
	writeFile(t, ctx, sb, "/root/kept.txt", "kept\n")
	// Tenants' data is root's alone.
	for path, want := range map[string]os.FileMode{
		dir: 0o700, filepath.Join(dir, "store", "sandboxes", sb.ID): 0o700,
		filepath.Join(dir, "store", "sandboxes", sb.ID, "sandbox.json"): 0o600,
		filepath.Join(dir, "panda.db"):                                  0o600,
		filepath.Join(dir, "admin.key"):                                 0o600,
	} {
		st, err := os.Stat(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
		} else if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), want)
		}
	}
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	// The request gives up long before a restore can finish.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	err := sb.Resume(short)
	cancel()
	if err == nil {
		t.Fatal("resume with a 20 ms deadline returned before the restore could finish")
	}
	info := waitState(t, ctx, c, sb.ID, pandastack.StateRunning)
	if info.LastError != "" {
		t.Errorf("last_error %q after a resume that worked", info.LastError)
	}
	if got := mustExec(t, ctx, sb, "cat /root/kept.txt"); got != "kept\n" {
		t.Errorf("after the abandoned resume: file %q, want %q", got, "kept\n")
	}
	mustStop(t, s)
}

// TestCorruptPauseCaptureIsRefused: a paused sandbox whose saved memory no
// longer matches its checksums is not restored (409 corrupt); it stays
// paused with its files for an operator.
func TestCorruptPauseCaptureIsRefused(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	s := startServer(t, "server", dir)
	c := s.client(t)
	sb := mustCreate(t, ctx, c)
	mustExec(t, ctx, sb, "head -c 4000000 /dev/urandom > /dev/shm/blob")
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	mem := filepath.Join(dir, "store", "sandboxes", sb.ID, "paused", "vm.mem")
	flipFirstDataByte(t, mem)
	err := sb.Resume(ctx)
	var pe *pandastack.Error
	if !errors.As(err, &pe) || pe.Status != http.StatusConflict || pe.Code != "corrupt" {
		t.Fatalf("resume of a corrupt capture: %v, want 409 corrupt", err)
	}
	if info := mustGet(t, ctx, c, sb.ID); info.State != pandastack.StatePaused || !strings.Contains(info.LastError, "checksum") {
		t.Errorf("after a refused resume: state %s, last_error %q; want paused, a checksum error", info.State, info.LastError)
	}
	if _, err := os.Stat(mem); err != nil {
		t.Errorf("the corrupt capture was removed: %v", err)
	}
	mustStop(t, s)
}

// flipFirstDataByte changes one byte of the first data block of a sparse
// file.
func flipFirstDataByte(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for off := int64(0); ; off += int64(len(buf)) {
		n, err := f.ReadAt(buf, off)
		if i := slices.IndexFunc(buf[:n], func(b byte) bool { return b != 0 }); i >= 0 {
			if _, err := f.WriteAt([]byte{buf[i] ^ 0xff}, off+int64(i)); err != nil {
				t.Fatal(err)
			}
			return
		}
		if err != nil {
			t.Fatalf("no data in %s", path)
		}
	}
}

// waitState polls the sandbox until it is in state want (at most a
// minute) and returns it.
func waitState(t *testing.T, ctx context.Context, c *pandastack.Client, id string, want pandastack.SandboxState) pandastack.SandboxInfo {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		info := mustGet(t, ctx, c, id)
		if info.State == want {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: state %s (last_error %q) after a minute, want %s", id, info.State, info.LastError, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCrashDuringABake: a server killed while it bakes a template used to
// leave the bake's QEMU running and its directories behind. The next start
// removes both, and bakes again.
func TestCrashDuringABake(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	opts := upOptions(dir, "", "--bake")
	opts.Env = []string{"PANDA_FAILPOINTS=bake-booted=crash"}
	cmd, err := pandatest.Command(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("panda up --bake with a crash in the bake exited 0; output:\n%s", out)
	}
	bakes := testkit.QEMUProcs(dir)
	if len(bakes) != 1 {
		t.Fatalf("after a crash in a bake: QEMU processes %v, want the bake's (one)", bakes)
	}
	s := crashAt(t, "after the bake crash", dir, "")
	if !testkit.WaitGone(bakes[0], 30*time.Second) {
		t.Errorf("the interrupted bake's QEMU %d still runs after the next start", bakes[0])
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "store", "templates", ".bake-*")); len(m) != 0 {
		t.Errorf("left in the store: %v", m)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "run", "bake-*")); len(m) != 0 {
		t.Errorf("left in the run directory: %v", m)
	}
	// The template is baked again on first use.
	ctx := ctxFor(t)
	sb := mustCreate(t, ctx, s.client(t))
	if got := mustExec(t, ctx, sb, "echo ok"); got != "ok\n" {
		t.Errorf("exec after the re-bake: %q", got)
	}
	mustStop(t, s)
}
