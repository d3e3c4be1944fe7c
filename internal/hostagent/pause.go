package hostagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/pandastack/pandastack/internal/contract/failpoint"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/storage/manifest"
)

// The pause capture in a paused sandbox's directory.
const (
	pausedDir    = "paused"
	pausedTmpDir = "paused.tmp"
)

// Pause captures a running sandbox to disk and stops its VMM, freeing its
// memory. Resume brings it back under the same id. The capture is on
// stable storage, sealed with checksums, and the sandbox recorded paused
// before its VMM is stopped: a crash at any point leaves either the
// running sandbox or the paused one.
func (a *Agent) Pause(ctx context.Context, id string) (CaptureStats, error) {
	s, err := a.get(id)
	if err != nil {
		return CaptureStats{}, err
	}
	if err := a.checkSpace(); err != nil {
		return CaptureStats{}, fmt.Errorf("pause: %w", err)
	}
	ctx, end, err := s.begin(ctx, "pause", StateRunning)
	if err != nil {
		return CaptureStats{}, err
	}
	defer end()
	if err := s.transition(lifecycle.Pause); err != nil {
		return CaptureStats{}, err
	}
	fail := func(err error) (CaptureStats, error) {
		os.RemoveAll(filepath.Join(s.dir, pausedTmpDir))
		os.RemoveAll(filepath.Join(s.dir, pausedDir))
		if s.stopping() {
			return CaptureStats{}, errStopped(s, "pause")
		}
		s.transition(lifecycle.PauseFailed)
		s.setOp("", false)
		return CaptureStats{}, fmt.Errorf("pause %s: %w", id, err)
	}
	if err := s.setOp(opPause, false); err != nil {
		return fail(classifyIOError(err))
	}
	tmp, final := filepath.Join(s.dir, pausedTmpDir), filepath.Join(s.dir, pausedDir)
	os.RemoveAll(tmp)
	os.RemoveAll(final)
	st, err := a.capture(ctx, s, tmp, true)
	if err != nil {
		return fail(err)
	}
	s.mu.Lock()
	m, client := s.m, s.client
	s.mu.Unlock()
	// The machine is stopped and its guest channel quiesced: seal the
	// capture, then record the sandbox paused, durably, while the VMM can
	// still be continued if either fails.
	_, err = manifest.Seal(tmp, memFile, stateFile, diskFile)
	if err == nil {
		err = manifest.Rename(tmp, final)
	}
	if err == nil {
		failpoint.Hit("pause-sealed")
		s.mu.Lock()
		s.transitionLocked(lifecycle.PauseDone)
		s.rec.Op = ""
		s.rec.PauseID, s.durablePause, s.fetched = newPauseID(), "", 0
		s.mu.Unlock()
		if err = s.writeRecord(true); err != nil {
			s.mu.Lock()
			s.state = StatePausing // PauseDone is undone below by PauseFailed
			s.rec.PauseID = ""
			s.mu.Unlock()
		}
	}
	if err != nil {
		a.runOn(s, m, client)
		return fail(classifyIOError(err))
	}
	st.SizeBytes = allocated(final)
	failpoint.Hit("pause-recorded")
	s.setMachine(nil, nil, nil) // the watcher ignores the exit of a VMM that is no longer s.m
	client.Close()
	m.Kill()
	// The disk and memory the VMM used are superseded by the capture; the
	// resume gets a new namespace.
	a.releaseNet(s)
	a.removeLiveFiles(s)
	a.log.Info("sandbox paused", "sandbox_id", id, "paused_ms", st.PausedMS, "dirty_mib", st.DirtyBytes>>20)
	a.startPausedUpload(s) // with an object store: paused.go
	return st, nil
}

// Resume restores a paused sandbox from its capture, same id, hostname
// and files; processes continue where they were. The capture is checked
// against its checksums first (ErrCorrupt: not restored). If the restore
// fails the sandbox stays paused with its capture intact.
//
// With an object store, a sandbox this host does not hold is looked for
// in the store (paused/<id>, durable: paused on another host): it is
// downloaded, checked and adopted as a paused sandbox of this host, then
// resumed as above (ErrNotFound if the store does not have it either,
// host.ErrUnavailable if the store cannot be reached). After a resume,
// the capture in the store is stale and removed in the background.
func (a *Agent) Resume(ctx context.Context, id string) (Info, error) {
	t0 := time.Now()
	s, err := a.get(id)
	adopted := false
	if errors.Is(err, ErrNotFound) && a.store != nil {
		s, err = a.adoptPaused(ctx, id)
		adopted = err == nil
	}
	if err != nil {
		return Info{}, err
	}
	ctx, end, err := s.begin(ctx, "resume", StatePaused)
	if err != nil {
		return Info{}, err
	}
	defer end()
	// An upload of the capture must not read it while it is resumed.
	a.sync.StopPausedUpload(id)
	dir := filepath.Join(s.dir, pausedDir)
	if !adopted { // a capture just adopted was checked as it was downloaded
		if err := a.checkResumable(ctx, s); err != nil {
			return Info{}, err
		}
		if err := capture.Verify(dir); err != nil {
			a.log.Error("paused sandbox failed its checksums", "sandbox_id", id, "err", err)
			a.startPausedUpload(s)
			return Info{}, fmt.Errorf("resume %s: %w: its saved memory or disk does not match its checksums", id, ErrCorrupt)
		}
	}
	if err := s.transition(lifecycle.Resume); err != nil {
		a.startPausedUpload(s)
		return Info{}, err
	}
	err = s.setOp(opResume, false)
	if err == nil {
		err = a.restore(ctx, s, s.imageOf(dir))
	}
	if err != nil {
		if s.stopping() {
			return Info{}, errStopped(s, "resume")
		}
		a.log.Error("resume failed; the sandbox stays paused", "sandbox_id", id, "err", err)
		s.transition(lifecycle.ResumeFailed)
		s.setOp("", true)
		a.startPausedUpload(s)
		return Info{}, fmt.Errorf("resume %s: %w", id, err)
	}
	failpoint.Hit("resume-restored")
	s.transition(lifecycle.ResumeDone)
	// The capture is stale from here: tombstoned before the record stops
	// naming it, so that a crash leaves its delete to the next start.
	stale, derr := a.dropPaused(s)
	if derr != nil {
		a.log.Error("record the resumed capture stale; its copy in the object store stays", "sandbox_id", id, "err", derr)
	}
	s.setOp("", false)
	os.RemoveAll(dir) // the sandbox holds links to what it needs
	if stale != "" {
		a.sync.StartPausedDelete(id, stale)
	}
	if adopted {
		a.log.Info("sandbox resumed from the object store", "sandbox_id", id, "dur_ms", time.Since(t0).Milliseconds())
	}
	return s.info(), nil
}
