package hostagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/hostagent/internal/storesync"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"golang.org/x/sys/unix"
)

// Recovered is the outcome of Recover for one sandbox directory.
type Recovered struct {
	ID string
	// State is what the sandbox is now: running (its VMM adopted) or
	// paused (its capture kept). Unset when Err is set.
	State State
	// Err says why the sandbox could not be kept: its VMM was gone (its
	// memory with it) or it was interrupted while starting. Its files are
	// removed, unless they held a capture that could not be read: those
	// are moved to lost+found in the store for an operator to inspect.
	Err error
}

// Recovery bounds: adoption runs in parallel, each VMM with a short
// deadline; a guest that has not answered HELLO within adoptHelloWait is
// adopted anyway and keeps being greeted in the background.
const (
	adoptParallel  = 16
	adoptTimeout   = 10 * time.Second
	adoptHelloWait = 5 * time.Second
)

// Recover adopts what an earlier agent left: VMMs still running are
// continued (a crash during a capture leaves them stopped) and reconnected
// to, paused sandboxes are kept, and an operation the crash interrupted is
// finished or rolled back: a pause whose capture is complete and sealed is
// finished (the VMM is stopped), one whose capture is not is rolled back
// (the capture is removed, the VMM continued); a resume is rolled back
// (the new VMM is stopped; the capture was never touched). Nothing whose
// memory or disk can still be used is deleted. Then leftovers of
// interrupted work are removed: fork and snapshot captures that were not
// complete, transient captures (SnapshotTransient), bakes, run
// directories. With an object store, snapshot
// uploads and deletes from the store that the earlier agent did not finish
// start again in the background (store.go).
func (a *Agent) Recover(ctx context.Context) []Recovered {
	a.lazy.MountAtStart() // lazy.go: lazily fetched images point into it
	ents, _ := os.ReadDir(a.sbDir)
	out := make([]Recovered, len(ents))
	sem := make(chan struct{}, adoptParallel)
	var wg sync.WaitGroup
	for i, e := range ents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			id := e.Name()
			st, err := a.recoverOne(ctx, id)
			if err != nil {
				a.log.Warn("sandbox not recovered", "sandbox_id", id, "err", err)
			}
			out[i] = Recovered{ID: id, State: st, Err: err}
		}()
	}
	wg.Wait()
	a.cleanLeftovers(ctx)
	a.cleanNetworks(ctx)
	a.dropTransient()
	a.resumeStore()
	return out
}

// dropTransient deletes the transient captures (SnapshotTransient's, and
// copies fetched from another host's) an earlier run left, locally and in
// the object store: they only carried a sandbox to other hosts during a
// cross-host fork, which the restart has failed, and nobody else knows of
// them.
func (a *Agent) dropTransient() {
	for _, si := range a.Snapshots() {
		if !si.Transient {
			continue
		}
		if err := a.DeleteSnapshot(si.ID); err != nil {
			a.log.Warn("delete a transient capture an earlier run left", "snapshot_id", si.ID, "err", err)
			continue
		}
		a.log.Info("deleted a transient capture an earlier run left", "snapshot_id", si.ID)
	}
}

func (a *Agent) recoverOne(ctx context.Context, id string) (State, error) {
	dir := filepath.Join(a.sbDir, id)
	runDir := filepath.Join(a.cfg.RunDir, id)
	var rec record
	b, err := os.ReadFile(filepath.Join(dir, "sandbox.json"))
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err == nil && rec.ID != id {
		err = fmt.Errorf("it names sandbox %q", rec.ID)
	}
	if err != nil {
		if _, perr := os.Stat(filepath.Join(dir, pausedDir)); perr == nil {
			a.quarantine(dir, id, "unreadable sandbox.json next to a pause capture")
		} else {
			a.removeSandboxDir(dir) // a create interrupted before it recorded anything
		}
		os.RemoveAll(runDir)
		return "", fmt.Errorf("read sandbox.json: %v", err)
	}
	s := newSandbox(rec, dir, runDir, rec.State)
	paused := filepath.Join(dir, pausedDir)
	switch {
	case rec.State == StatePaused || rec.State == StateResuming:
		// A paused sandbox has no VMM. One that still runs was left by a
		// resume the crash interrupted (rolled back: the capture was only
		// linked from), or by a crash after the pause was recorded and
		// before its VMM was stopped (finished): stop it either way.
		a.killStale(ctx, rec.Spec)
		a.removeLiveFiles(s)
		return a.keepPaused(s)
	case rec.Op == opPause && captureComplete(paused):
		// Finish the pause: the capture is all the sandbox needs.
		a.killStale(ctx, rec.Spec)
		a.removeLiveFiles(s)
		return a.keepPaused(s)
	case rec.State == StateRunning || rec.State == StatePausing:
		os.RemoveAll(filepath.Join(dir, pausedTmpDir))
		os.RemoveAll(paused)
		return a.adoptRunning(ctx, s)
	default:
		// Starting (a create or a fork child that never answered) or
		// stopping: nothing a user was given.
		a.killStale(ctx, rec.Spec)
		a.removeSandboxDir(dir)
		os.RemoveAll(runDir)
		return "", fmt.Errorf("it was %s when the host agent stopped", rec.State)
	}
}

// captureComplete reports whether dir holds a whole pause capture: sealed
// with every file at its size, or (made before captures were sealed) with
// its files present.
func captureComplete(dir string) bool {
	err := manifest.Check(dir)
	if errors.Is(err, manifest.ErrNoManifest) {
		_, serr := os.Stat(filepath.Join(dir, stateFile))
		return serr == nil
	}
	return err == nil
}

// keepPaused registers s as paused if its capture is complete.
func (a *Agent) keepPaused(s *sandbox) (State, error) {
	if !captureComplete(filepath.Join(s.dir, pausedDir)) {
		a.quarantine(s.dir, s.rec.ID, "paused, but its capture is incomplete")
		os.RemoveAll(s.runDir)
		return "", errors.New("paused sandbox lost its capture")
	}
	s.mu.Lock()
	s.state, s.rec.Op = StatePaused, ""
	s.mu.Unlock()
	if err := s.writeRecord(true); err != nil {
		return "", fmt.Errorf("record paused sandbox: %w", err)
	}
	a.mu.Lock()
	a.sandboxes[s.rec.ID] = s
	a.mu.Unlock()
	return StatePaused, nil
}

// adoptRunning takes over s's VMM, continues it (a capture may have left
// it stopped) and greets its guest. A VMM that is gone took the sandbox's
// memory with it: the sandbox's files are removed.
func (a *Agent) adoptRunning(ctx context.Context, s *sandbox) (State, error) {
	actx, cancel := context.WithTimeout(ctx, adoptTimeout)
	defer cancel()
	fail := func(err error) (State, error) {
		a.removeSandboxDir(s.dir)
		os.RemoveAll(s.runDir)
		return "", err
	}
	m, err := a.driver.Adopt(actx, s.rec.Spec)
	if err != nil {
		return fail(err)
	}
	if err := m.Resume(actx); err != nil {
		m.Kill()
		return fail(fmt.Errorf("continue vmm: %w", err))
	}
	conn, err := (&net.Dialer{}).DialContext(actx, "unix", m.AgentSocket())
	if err != nil {
		m.Kill()
		return fail(fmt.Errorf("connect to guest agent: %w", err))
	}
	client := s.newClient(conn)
	ready := make(chan struct{})
	a.adoptNet(actx, s)
	s.mu.Lock()
	s.m, s.client, s.ready = m, client, ready
	s.state, s.rec.Op = StateRunning, ""
	s.mu.Unlock()
	s.writeRecord(false)
	a.mu.Lock()
	a.sandboxes[s.rec.ID] = s
	a.mu.Unlock()
	go a.watch(s, m)
	// Greet the guest until it answers or the sandbox goes; Recover waits
	// a little so that most sandboxes are ready when it returns.
	go a.greet(s, client, ready)
	go a.keepGuest(s, m, client)
	select {
	case <-ready:
	case <-time.After(adoptHelloWait):
		a.log.Warn("adopted sandbox's guest agent has not answered yet; still trying", "sandbox_id", s.rec.ID)
	}
	return StateRunning, nil
}

// killStale stops the VMM an earlier agent started for spec, if it still
// runs (identified by its run directory, never by PID alone).
func (a *Agent) killStale(ctx context.Context, spec vmm.Spec) {
	if spec.RunDir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, adoptTimeout)
	defer cancel()
	if m, err := a.driver.Adopt(ctx, spec); err == nil {
		m.Kill()
	}
}

// killOrphans kills the QEMU processes that serve a run directory of this
// agent but are not the VMM of a sandbox it runs: VMMs whose start a crash
// interrupted before their PID was recorded (recovery could not find them
// by their PID file; found by panda chaos), and any other a recovery could
// not stop.
func (a *Agent) killOrphans() {
	for pid, name := range a.driver.Processes(a.cfg.RunDir) {
		if s, err := a.get(name); err == nil {
			s.mu.Lock()
			ours := s.m != nil && s.m.PID() == pid
			s.mu.Unlock()
			if ours {
				continue
			}
		}
		a.log.Warn("killing a VMM that serves no sandbox", "pid", pid, "run_dir", filepath.Join(a.cfg.RunDir, name))
		unix.Kill(pid, unix.SIGKILL)
	}
}

// removingDir, in the store, holds sandbox directories being removed.
const removingDir = "removing"

// removeSandboxDir removes a sandbox's directory: first out of the
// sandboxes' directory in one rename, then its files. A crash midway
// leaves its files in removingDir, which recovery empties, never a
// sandbox directory that lost its record but kept its capture (which
// recovery would have to quarantine; found by panda chaos, seed 14 it
// 150: a kill interrupted by a crash).
func (a *Agent) removeSandboxDir(dir string) error {
	trash := filepath.Join(a.vol.Dir, removingDir, filepath.Base(dir)+"-"+randHex(4))
	if err := os.MkdirAll(filepath.Dir(trash), 0o700); err == nil {
		if err := os.Rename(dir, trash); err == nil {
			dir = trash
		} else if errors.Is(err, os.ErrNotExist) {
			return nil
		}
	}
	return os.RemoveAll(dir)
}

// quarantine moves a sandbox directory that holds data recovery cannot use
// to lost+found in the store, for an operator to inspect.
func (a *Agent) quarantine(dir, id, why string) {
	lf := filepath.Join(a.vol.Dir, "lost+found")
	os.MkdirAll(lf, 0o700)
	dst := filepath.Join(lf, fmt.Sprintf("%s-%d", id, time.Now().Unix()))
	if err := os.Rename(dir, dst); err != nil {
		a.log.Error("cannot move sandbox files to lost+found", "sandbox_id", id, "err", err)
		return
	}
	a.log.Error("moved sandbox files to lost+found", "sandbox_id", id, "why", why, "dir", dst)
}

// cleanLeftovers removes what interrupted work left: fork captures (their
// children were never handed out), snapshot captures that were not
// complete, snapshots whose deletion was interrupted, downloads from the
// object store, tenants' copies of
// templates that were re-baked, bakes and their VMMs, and run directories
// of sandboxes that are gone.
func (a *Agent) cleanLeftovers(ctx context.Context) {
	a.killOrphans()
	a.tenantGC()
	stale, _ := filepath.Glob(filepath.Join(a.vol.Dir, "forks", "*"))
	tmps, _ := filepath.Glob(filepath.Join(a.vol.Dir, "snapshots", "*.tmp"))
	deleted, _ := filepath.Glob(filepath.Join(a.vol.Dir, "snapshots", "*"+deletingSuffix))
	fetches, _ := filepath.Glob(filepath.Join(a.vol.Dir, "snapshots", "*"+storesync.FetchSuffix))
	adoptions, _ := filepath.Glob(filepath.Join(a.vol.Dir, fetchDir, "*"))
	for _, d := range slices.Concat(stale, tmps, deleted, fetches, adoptions) {
		os.RemoveAll(d)
	}
	removing, _ := filepath.Glob(filepath.Join(a.vol.Dir, removingDir, "*"))
	for _, d := range removing {
		os.RemoveAll(d)
	}
	runs, _ := os.ReadDir(a.cfg.RunDir)
	for _, e := range runs {
		if _, err := a.get(e.Name()); err == nil {
			continue
		}
		dir := filepath.Join(a.cfg.RunDir, e.Name())
		if strings.HasPrefix(e.Name(), "bake-") {
			// A bake's VMM outlives a crash of its agent like any other.
			a.killStale(ctx, vmm.Spec{RunDir: dir})
		}
		os.RemoveAll(dir)
	}
	if n := a.templates.RemoveLeftovers(); n > 0 {
		a.log.Info("removed leftovers of interrupted bakes", "count", n)
	}
	// Cgroups of VMMs that are gone (killOrphans stopped ours that no
	// sandbox owns).
	if _, err := a.driver.CleanupStale(); err != nil {
		a.log.Warn("clean up after vmms that are gone", "err", err)
	}
}

// greet says HELLO to s's guest on client until it answers (then ready is
// closed), the connection fails or the sandbox goes.
func (a *Agent) greet(s *sandbox, client *guestproto.Client, ready chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.gone:
			cancel()
		case <-client.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		err := a.hello(ctx, s, client)
		if err == nil {
			if err := a.openVolumes(ctx, s, client); err != nil {
				// The guest runs on; its volumes' requests wait for
				// the next session.
				a.log.Error("mount volumes of adopted sandbox", "sandbox_id", s.rec.ID, "err", err)
			}
			close(ready)
			return
		}
		if ctx.Err() != nil || client.Err() != nil {
			a.log.Warn("guest agent did not answer", "sandbox_id", s.rec.ID, "err", err)
			return
		}
	}
}

// keepGuest reconnects to s's guest agent whenever its connection fails
// while the sandbox lives: a guest that stops reading its channel or sends
// garbage costs its connection (guestproto bounds what it may cost), and
// the next connection starts a new session, in which the guest agent may
// behave again. Until it answers HELLO, Guest returns ErrNotReady. A
// connection the agent closed itself (pause, stop, detach) ends this.
func (a *Agent) keepGuest(s *sandbox, m vmm.Machine, client *guestproto.Client) {
	for backoff := 100 * time.Millisecond; ; {
		select {
		case <-client.Done():
		case <-s.gone:
			return
		case <-m.Done():
			return
		}
		s.mu.Lock()
		ours := s.client == client && s.m == m && !s.detached && s.state != StateStopping && s.state != StateStopped
		s.mu.Unlock()
		if !ours {
			return
		}
		a.log.Warn("guest channel failed; reconnecting", "sandbox_id", s.rec.ID, "err", client.Err())
		select {
		case <-time.After(backoff): // a guest that breaks every session must not make us spin
		case <-s.gone:
			return
		}
		backoff = min(2*backoff, 10*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), adoptTimeout)
		conn, err := (&net.Dialer{}).DialContext(ctx, "unix", m.AgentSocket())
		cancel()
		if err != nil {
			a.log.Warn("reconnect to guest agent", "sandbox_id", s.rec.ID, "err", err)
			continue
		}
		next := s.newClient(conn)
		ready := make(chan struct{})
		s.mu.Lock()
		ours = s.client == client && s.m == m && !s.detached && s.state != StateStopping && s.state != StateStopped
		if ours {
			s.client, s.ready = next, ready
		}
		s.mu.Unlock()
		if !ours {
			next.Close()
			return
		}
		client = next
		go a.greet(s, client, ready)
	}
}
