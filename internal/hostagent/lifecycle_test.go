package hostagent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	"golang.org/x/sys/unix"
)

// openSecond opens a host agent of its own on a new data directory (for
// tests that restart an agent), closed and removed when the test ends.
func openSecond(t *testing.T, dir string) *Agent { return openSecondWith(t, dir, nil) }

// openSecondWith is openSecond with mod applied to the agent's Config.
func openSecondWith(t *testing.T, dir string, mod func(*Config)) *Agent {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := Config{
		DataDir: dir, ImagesDir: testkit.Images(), Accel: "tcg", VolumeSize: 8 << 30, AdoptMount: true,
		DefaultTemplate: "tiny", DefaultMemoryMiB: 256,
		Driver: driverT(t, log),
		Logger: log,
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open agent on %s: %v", dir, err)
	}
	return a
}

// restartable makes a data directory whose agents the test opens one
// after the other; whatever is left is closed and removed at the end.
func restartable(t *testing.T) (dir string, open func() *Agent) {
	t.Helper()
	return restartableWith(t, nil)
}

// restartableWith is restartable with mod applied to each agent's Config.
func restartableWith(t *testing.T, mod func(*Config)) (dir string, open func() *Agent) {
	t.Helper()
	dir, err := os.MkdirTemp("", "par")
	if err != nil {
		t.Fatal(err)
	}
	var last *Agent
	t.Cleanup(func() {
		if last != nil {
			last.Close()
		}
		// What is left (the machines of an agent the test detached and
		// never reopened, a failed Open's mounts) is reported, and
		// killed or unmounted.
		left, err := pandatest.RemoveDataDir(dir)
		for _, l := range left {
			t.Errorf("left behind: %s", l)
		}
		if err != nil {
			t.Error(err)
		}
	})
	return dir, func() *Agent {
		last = openSecondWith(t, dir, mod)
		return last
	}
}

func shOn(t *testing.T, a *Agent, id, cmd string) string {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := a.Exec(ctxT(t), id, guestproto.ExecRequest{Shell: cmd}, nil, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q in %s: %v", cmd, id, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %q in %s: exit %d, stderr %q", cmd, id, res.ExitCode, errb.String())
	}
	return out.String()
}

// TestRecoverContinuesAStoppedVMM: a crash while a capture holds the VMM
// stopped (vCPUs paused, guest channel quiesced) used to make the next
// agent give up on the guest and delete the sandbox. The next agent now
// continues the VMM: the sandbox runs with its memory and files.
func TestRecoverContinuesAStoppedVMM(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	_, open := restartable(t)
	a := open()
	info, err := a.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	shOn(t, a, info.ID, "echo disk > /root/f; echo mem > /dev/shm/m")
	s, _ := a.get(info.ID)
	// What a capture does before it saves, then the agent goes away.
	if err := s.client.Barrier(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := s.m.Pause(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	a.Detach()

	b := open()
	rec := b.Recover(ctxT(t))
	if len(rec) != 1 || rec[0].Err != nil || rec[0].State != StateRunning {
		t.Fatalf("Recover = %+v, want %s running", rec, info.ID)
	}
	if got := shOn(t, b, info.ID, "cat /root/f /dev/shm/m"); got != "disk\nmem\n" {
		t.Errorf("after recovery: %q, want %q", got, "disk\nmem\n")
	}
}

// TestRecoverFinishesOrRollsBackAPause: a pause whose capture was sealed
// when the agent went away is finished (paused, resumable); one whose
// capture was not is rolled back (running). A pause already recorded
// (sandbox.json says paused) whose VMM had not been stopped yet used to
// leave that VMM running forever next to the paused sandbox (found by
// panda chaos at the failpoint pause-recorded); it is stopped.
func TestRecoverFinishesOrRollsBackAPause(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	for _, tc := range []struct {
		name             string
		sealed, recorded bool
	}{{"unsealed", false, false}, {"sealed", true, false}, {"recorded", true, true}} {
		sealed := tc.sealed
		t.Run(tc.name, func(t *testing.T) {
			_, open := restartable(t)
			a := open()
			info, err := a.Create(ctxT(t), CreateRequest{})
			if err != nil {
				t.Fatal(err)
			}
			shOn(t, a, info.ID, "echo disk > /root/f; echo mem > /dev/shm/m")
			s, _ := a.get(info.ID)
			// Pause, as far as the crash lets it go.
			ctx, end, err := s.begin(ctxT(t), "test", StateRunning)
			if err != nil {
				t.Fatal(err)
			}
			s.transition(lifecycle.Pause)
			s.setOp(opPause, false)
			tmp := filepath.Join(s.dir, pausedTmpDir)
			if _, err := a.capture(ctx, s, tmp, true); err != nil {
				t.Fatal(err)
			}
			if sealed {
				if _, err := manifest.Seal(tmp, memFile, stateFile, diskFile); err != nil {
					t.Fatal(err)
				}
				if err := manifest.Rename(tmp, filepath.Join(s.dir, pausedDir)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.recorded {
				s.transition(lifecycle.PauseDone)
				if err := s.setOp("", true); err != nil {
					t.Fatal(err)
				}
			}
			end()
			vmm := s.m.PID()
			a.Detach()

			b := open()
			rec := b.Recover(ctxT(t))
			want := map[bool]State{true: StatePaused, false: StateRunning}[sealed]
			if len(rec) != 1 || rec[0].Err != nil || rec[0].State != want {
				t.Fatalf("Recover = %+v, want %s %s", rec, info.ID, want)
			}
			if sealed {
				if testkit.Alive(vmm) {
					t.Errorf("the paused sandbox's old VMM %d still runs", vmm)
				}
				if _, err := os.Stat(s.runDir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("the paused sandbox's run directory is left: %v", err)
				}
				if _, err := b.Resume(ctxT(t), info.ID); err != nil {
					t.Fatalf("resume: %v", err)
				}
			}
			if _, err := os.Stat(filepath.Join(s.dir, pausedTmpDir)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("an unsealed capture is left: %v", err)
			}
			if got := shOn(t, b, info.ID, "cat /root/f /dev/shm/m"); got != "disk\nmem\n" {
				t.Errorf("after recovery: %q, want %q", got, "disk\nmem\n")
			}
		})
	}
}

// TestRecoverRollsBackAResume: a resume interrupted after its VMM started
// is rolled back: the VMM is stopped and the sandbox is paused with its
// capture, which a later resume restores.
func TestRecoverRollsBackAResume(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	_, open := restartable(t)
	a := open()
	info, err := a.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	shOn(t, a, info.ID, "echo disk > /root/f; echo mem > /dev/shm/m")
	if _, err := a.Pause(ctxT(t), info.ID); err != nil {
		t.Fatal(err)
	}
	s, _ := a.get(info.ID)
	ctx, end, err := s.begin(ctxT(t), "test", StatePaused)
	if err != nil {
		t.Fatal(err)
	}
	s.transition(lifecycle.Resume)
	s.setOp(opResume, false)
	if err := a.restore(ctx, s, s.imageOf(filepath.Join(s.dir, pausedDir))); err != nil {
		t.Fatal(err)
	}
	end()
	vmm := s.m.PID()
	a.Detach()

	b := open()
	rec := b.Recover(ctxT(t))
	if len(rec) != 1 || rec[0].Err != nil || rec[0].State != StatePaused {
		t.Fatalf("Recover = %+v, want %s paused", rec, info.ID)
	}
	if testkit.Alive(vmm) {
		t.Errorf("the interrupted resume's VMM %d still runs", vmm)
	}
	if _, err := b.Resume(ctxT(t), info.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if got := shOn(t, b, info.ID, "cat /root/f /dev/shm/m"); got != "disk\nmem\n" {
		t.Errorf("after the resume: %q, want %q", got, "disk\nmem\n")
	}
}

// TestFailedResumeStaysPaused: a restore that fails (here: device state
// the VMM cannot load) leaves the sandbox paused with its capture, and a
// later resume works once the capture is whole again.
func TestFailedResumeStaysPaused(t *testing.T) {
	shared(t)
	info := create(t)
	sh(t, info.ID, "echo kept > /root/f")
	if _, err := testAgent.Pause(ctxT(t), info.ID); err != nil {
		t.Fatal(err)
	}
	s, _ := testAgent.get(info.ID)
	paused := filepath.Join(s.dir, pausedDir)
	state := filepath.Join(paused, stateFile)
	orig, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	// Garbage that passes the checksums (resealed) but not the VMM.
	if err := os.WriteFile(state, []byte("not a device state"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := manifest.Seal(paused, memFile, stateFile, diskFile); err != nil {
		t.Fatal(err)
	}
	if _, err := testAgent.Resume(ctxT(t), info.ID); err == nil {
		t.Fatal("resume with a garbled device state succeeded")
	}
	if got, _ := testAgent.Get(info.ID); got.State != StatePaused || got.PID != 0 {
		t.Fatalf("after a failed resume: state %s, pid %d; want paused, no VMM", got.State, got.PID)
	}
	if err := os.WriteFile(state, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := manifest.Seal(paused, memFile, stateFile, diskFile); err != nil {
		t.Fatal(err)
	}
	if _, err := testAgent.Resume(ctxT(t), info.ID); err != nil {
		t.Fatalf("resume after repair: %v", err)
	}
	if got := sh(t, info.ID, "cat /root/f"); got != "kept\n" {
		t.Errorf("after resume: %q", got)
	}
}

// TestCorruptCapturesAreRefused: a paused sandbox or a snapshot whose files
// no longer match their checksums is not restored (ErrCorrupt), and the
// paused sandbox stays paused.
func TestCorruptCapturesAreRefused(t *testing.T) {
	shared(t)
	info := create(t)
	sh(t, info.ID, "head -c 1000000 /dev/urandom > /dev/shm/blob")
	snap, err := testAgent.Snapshot(ctxT(t), info.ID, host.NewID())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testAgent.DeleteSnapshot(snap.ID) })
	if _, err := testAgent.Pause(ctxT(t), info.ID); err != nil {
		t.Fatal(err)
	}
	s, _ := testAgent.get(info.ID)
	for _, f := range []string{filepath.Join(s.dir, pausedDir, stateFile), filepath.Join(testAgent.snapshotDir(snap.ID), stateFile)} {
		corrupt(t, f)
	}
	if _, err := testAgent.Resume(ctxT(t), info.ID); !errors.Is(err, ErrCorrupt) {
		t.Errorf("resume of a corrupt capture: %v, want ErrCorrupt", err)
	}
	if got, _ := testAgent.Get(info.ID); got.State != StatePaused {
		t.Errorf("after a refused resume: %s, want paused", got.State)
	}
	if _, err := testAgent.Create(ctxT(t), CreateRequest{SnapshotID: snap.ID}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("create from a corrupt snapshot: %v, want ErrCorrupt", err)
	}
}

func corrupt(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	f.ReadAt(b, 100)
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, 100); err != nil {
		t.Fatal(err)
	}
}

// TestKillDuringAHungCapture: a snapshot waits on a VMM that does not
// answer (stopped with SIGSTOP: neither QMP nor the guest respond). Kill
// still returns within seconds, the snapshot fails, and nothing is left.
func TestKillDuringAHungCapture(t *testing.T) {
	shared(t)
	info := create(t)
	if err := unix.Kill(info.PID, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := testAgent.Snapshot(context.Background(), info.ID, host.NewID())
		done <- err
	}()
	// Wait until the snapshot holds the operation slot.
	s, _ := testAgent.get(info.ID)
	testkit.WaitFor(t, 30*time.Second, "the snapshot holding the sandbox", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.opCancel != nil
	})
	if err := testAgent.Kill(ctxT(t), info.ID); err != nil {
		t.Fatal(err)
	}
	// The kill cancelled the capture and killed its VMM, and the capture
	// unwound: its operation has ended when Kill returns. (A kill that
	// gave up waiting for it, after opUnwindTimeout, returns while the
	// capture still holds the sandbox.)
	s.mu.Lock()
	unwound := s.opCancel == nil
	s.mu.Unlock()
	if !unwound {
		t.Error("Kill returned while the hung capture still held the sandbox: it did not unwind")
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("the snapshot of a killed sandbox: %v, want ErrNotFound (killed meanwhile)", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the snapshot did not return after its sandbox was killed")
	}
	if testkit.Alive(info.PID) {
		t.Errorf("VMM %d of the killed sandbox still runs", info.PID)
	}
	if _, err := os.Stat(s.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("files of the killed sandbox: %v", err)
	}
}

// TestVMMDeathAfterAPauseCapture: a VMM that dies (killed, crashed) once
// a pause has captured it, before the pause stops it, used to make the
// agent stop the sandbox and delete its directory, the pause's sealed
// capture with it, while the pause reported success (found by panda
// chaos). The pause's outcome now decides: the sandbox is paused and
// resumes with its files.
func TestVMMDeathAfterAPauseCapture(t *testing.T) {
	shared(t)
	info := create(t)
	shOn(t, testAgent, info.ID, "echo disk > /root/f; echo mem > /dev/shm/m")
	s, _ := testAgent.get(info.ID)
	// Pause up to a complete capture, as Pause does.
	ctx, end, err := s.begin(ctxT(t), "test", StateRunning)
	if err != nil {
		t.Fatal(err)
	}
	s.transition(lifecycle.Pause)
	s.setOp(opPause, false)
	tmp := filepath.Join(s.dir, pausedTmpDir)
	if _, err := testAgent.capture(ctx, s, tmp, true); err != nil {
		end()
		t.Fatal(err)
	}
	m, client := s.m, s.client
	if err := unix.Kill(m.PID(), unix.SIGKILL); err != nil {
		end()
		t.Fatal(err)
	}
	<-m.Done()
	// The rest of the pause.
	if _, err := manifest.Seal(tmp, memFile, stateFile, diskFile); err != nil {
		end()
		t.Fatal(err)
	}
	if err := manifest.Rename(tmp, filepath.Join(s.dir, pausedDir)); err != nil {
		end()
		t.Fatal(err)
	}
	if err := s.transition(lifecycle.PauseDone); err != nil {
		end()
		t.Fatalf("the sandbox was stopped while its pause completed: %v", err)
	}
	s.setOp("", true)
	s.setMachine(nil, nil, nil)
	client.Close()
	testAgent.removeLiveFiles(s)
	end()

	if _, err := testAgent.Resume(ctxT(t), info.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if got := shOn(t, testAgent, info.ID, "cat /root/f /dev/shm/m"); got != "disk\nmem\n" {
		t.Errorf("after the resume: %q, want %q", got, "disk\nmem\n")
	}
}

// TestKillWinsOverACreate: a kill while a sandbox starts stops it, and the
// create fails instead of resurrecting it.
func TestKillWinsOverACreate(t *testing.T) {
	shared(t)
	id := host.NewID()
	done := make(chan error, 1)
	go func() {
		_, err := testAgent.Create(ctxT(t), CreateRequest{ID: id})
		done <- err
	}()
	testkit.WaitFor(t, 30*time.Second, "the create registering its sandbox", func() bool {
		_, err := testAgent.get(id)
		return err == nil
	})
	if err := testAgent.Kill(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		testAgent.Kill(context.Background(), id)
		// The restore may have finished just before the kill: then the
		// kill stopped a running sandbox, which is fine too.
		if _, gerr := testAgent.Get(id); gerr == nil {
			t.Fatal("a killed sandbox is still there")
		}
	}
	if _, err := testAgent.Get(id); !errors.Is(err, ErrNotFound) {
		t.Errorf("after the kill: Get = %v, want ErrNotFound", err)
	}
}

// TestDeleteSnapshotLeavesNoHalfSnapshot: deleting a snapshot renames its
// directory away before removing it, so that a crash in the middle leaves
// no half-deleted snapshot (its memory gone, its metadata listed: found
// by panda chaos, an agent crash during a delete); recovery removes what
// such a crash leaves.
func TestDeleteSnapshotLeavesNoHalfSnapshot(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	dir, open := restartable(t)
	a := open()
	info, err := a.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	keep, gone := host.NewID(), host.NewID()
	for _, id := range []string{keep, gone} {
		if _, err := a.Snapshot(ctxT(t), info.ID, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.DeleteSnapshot(gone); err != nil {
		t.Fatal(err)
	}
	if got := a.Snapshots(); len(got) != 1 || got[0].ID != keep {
		t.Errorf("snapshots after a delete: %+v, want %s only", got, keep)
	}
	// What a crash during a delete leaves: the renamed directory, in part.
	snaps := filepath.Join(a.StoreDir(), "snapshots")
	half := filepath.Join(snaps, gone+deletingSuffix)
	if err := os.MkdirAll(half, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(half, snapshotMeta), []byte(`{"id":"`+gone+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := a.Snapshots(); len(got) != 1 || got[0].ID != keep {
		t.Errorf("snapshots with a delete in progress: %+v, want %s only", got, keep)
	}
	a.Detach()
	b := open()
	b.Recover(ctxT(t))
	if _, err := os.Stat(half); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after recovery, the interrupted delete's directory: %v, want it removed", err)
	}
	if got := b.Snapshots(); len(got) != 1 || got[0].ID != keep {
		t.Errorf("snapshots after recovery: %+v, want %s only", got, keep)
	}
	if _, err := os.Stat(filepath.Join(dir, "store", "snapshots", keep, snapshotMeta)); err != nil {
		t.Errorf("the kept snapshot: %v", err)
	}
}

// TestRecoverKillsAVMMWhoseStartWasInterrupted: a crash while a create
// (or a fork child) started its VMM, before the VMM's PID was recorded,
// used to leave that VMM running forever: recovery looked for it by its
// PID file only (found by panda chaos). Recovery now kills every VMM that
// serves one of its run directories and no sandbox it runs.
func TestRecoverKillsAVMMWhoseStartWasInterrupted(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	_, open := restartable(t)
	a := open()
	info, err := a.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := a.get(info.ID)
	a.Detach()
	// What the crash left: a sandbox still starting, its VMM running, no
	// PID file.
	if err := os.Remove(filepath.Join(s.runDir, "vmm.pid")); err != nil {
		t.Fatal(err)
	}
	rec := s.rec
	rec.State = StateStarting
	if err := writeJSON(filepath.Join(s.dir, "sandbox.json"), rec, false); err != nil {
		t.Fatal(err)
	}

	b := open()
	if got := b.Recover(ctxT(t)); len(got) != 1 || got[0].Err == nil {
		t.Fatalf("Recover = %+v, want %s not recovered (it was starting)", got, info.ID)
	}
	if !testkit.WaitGone(info.PID, 10*time.Second) {
		t.Fatalf("VMM %d of the interrupted create still runs after recovery", info.PID)
	}
	if _, err := os.Stat(s.runDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run directory of the interrupted create: %v, want it removed", err)
	}
}

// TestKillLeavesNoHalfSandbox: killing a sandbox moves its directory out
// of the sandboxes' directory in one rename before removing its files, so
// that a crash in the middle leaves no sandbox directory without its
// record next to a pause capture (which recovery quarantines: panda chaos
// seed 14 it 150, the server killed during a kill); recovery removes what
// such a crash leaves.
func TestKillLeavesNoHalfSandbox(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	dir, open := restartable(t)
	a := open()
	info, err := a.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Pause(ctxT(t), info.ID); err != nil {
		t.Fatal(err)
	}
	if err := a.Kill(ctxT(t), info.ID); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(dir, "store")
	for _, p := range []string{filepath.Join(store, "sandboxes", info.ID), filepath.Join(store, removingDir, "*"), filepath.Join(store, "lost+found", "*")} {
		if m, _ := filepath.Glob(p); len(m) > 0 {
			t.Errorf("after the kill: %s is there", p)
		}
	}
	// What a crash during the removal leaves now: the moved directory,
	// its record gone, its capture in part.
	half := filepath.Join(store, removingDir, info.ID+"-0a1b2c3d")
	if err := os.MkdirAll(filepath.Join(half, pausedDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(half, pausedDir, memFile), []byte("part"), 0o600); err != nil {
		t.Fatal(err)
	}
	a.Detach()
	b := open()
	if got := b.Recover(ctxT(t)); len(got) != 0 {
		t.Errorf("recovered %+v, want nothing", got)
	}
	if _, err := os.Stat(half); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after recovery, the interrupted removal: %v, want it removed", err)
	}
	if m, _ := filepath.Glob(filepath.Join(store, "lost+found", "*")); len(m) > 0 {
		t.Errorf("recovery quarantined %v", m)
	}
}
