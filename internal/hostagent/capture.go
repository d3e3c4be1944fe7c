package hostagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/failpoint"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/hostagent/internal/memimage"
	"github.com/pandastack/pandastack/internal/hostagent/internal/storesync"
	"github.com/pandastack/pandastack/internal/hostagent/internal/volume"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"golang.org/x/sys/unix"
)

// CaptureStats describes one capture of a running sandbox: the host
// contract's.
type CaptureStats = host.CaptureStats

// captureTimeout bounds one capture (barrier, pause, save, resume).
const captureTimeout = 60 * time.Second

// runOnTimeout bounds continuing a machine after a capture: QMP cont and
// RESUME to a guest that may not read its port.
const runOnTimeout = 10 * time.Second

// capture saves a running sandbox into dir (created): device state,
// memory image (a reflink of the sandbox's base image patched with the
// pages it dirtied) and disk (a reflink taken while the vCPUs are
// stopped, so disk and memory agree). The guest channel is quiesced with a
// barrier first so that any copy restored from dir starts at a frame
// boundary. Unless keepPaused, the sandbox then runs on: its open streams
// and processes continue; with keepPaused it stays stopped and the caller
// must either stop its VMM or call runOn. A failed capture always runs
// the sandbox on and removes dir. The caller holds s's operation slot.
func (a *Agent) capture(ctx context.Context, s *sandbox, dir string, keepPaused bool) (CaptureStats, error) {
	var st CaptureStats
	s.mu.Lock()
	m, client := s.m, s.client
	s.mu.Unlock()
	if m == nil || client == nil {
		return st, fmt.Errorf("sandbox %s has no running machine: %w", s.rec.ID, ErrConflict)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return st, classifyIOError(err)
	}
	// Bounded: a hung guest or VMM must not hold the operation slot
	// forever (and a kill cancels ctx at once).
	ctx, cancel := context.WithTimeout(ctx, captureTimeout)
	defer cancel()
	if err := client.Barrier(ctx); err != nil {
		a.runOn(s, nil, client)
		os.RemoveAll(dir)
		return st, fmt.Errorf("quiesce guest agent: %w", err)
	}
	t0 := time.Now()
	if err := m.Pause(ctx); err != nil {
		a.runOn(s, m, client)
		os.RemoveAll(dir)
		return st, err
	}
	failpoint.Hit("capture-stopped")
	err := a.saveMachine(ctx, s, m, dir, &st)
	if !keepPaused || err != nil {
		if rerr := a.runOn(s, m, client); rerr != nil && err == nil {
			err = rerr
		}
	}
	st.Paused = time.Since(t0)
	st.PausedMS = ms(st.Paused)
	if err != nil {
		os.RemoveAll(dir)
		return st, err
	}
	return st, nil
}

// runOn continues a machine that a capture stopped (m, if not nil) and
// ends the guest channel's barrier, each bounded in time: a guest that
// does not read its port fails its connection instead of blocking here.
func (a *Agent) runOn(s *sandbox, m vmm.Machine, client *guestproto.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), runOnTimeout)
	defer cancel()
	var err error
	if m != nil {
		if err = m.Resume(ctx); err != nil {
			a.log.Warn("continue vmm after capture", "sandbox_id", s.rec.ID, "err", err)
		}
	}
	if rerr := client.Resume(ctx); rerr != nil {
		a.log.Warn("resume guest channel after capture", "sandbox_id", s.rec.ID, "err", rerr)
		if err == nil {
			err = fmt.Errorf("resume guest agent: %w", rerr)
		}
	}
	return err
}

func (a *Agent) saveMachine(ctx context.Context, s *sandbox, m vmm.Machine, dir string, st *CaptureStats) error {
	if err := m.SaveState(ctx, filepath.Join(dir, stateFile)); err != nil {
		return err
	}
	r, err := m.RAMMapping()
	if err != nil {
		return err
	}
	region := memimage.Region{PID: r.PID, Start: r.Start, Size: r.Size}
	pm, err := memimage.Scan(region)
	if err != nil {
		return err
	}
	st.DirtyBytes, st.Runs = pm.DirtyBytes, len(pm.Dirty)
	s.mu.Lock()
	spec := s.rec.Spec
	s.mu.Unlock()
	if _, err := memimage.Write(filepath.Join(dir, memFile), spec.MemoryFile, a.lazy.CloneMemory, region, pm.Dirty); err != nil {
		return classifyIOError(err)
	}
	if err := volume.Clone(spec.Disk, filepath.Join(dir, diskFile)); err != nil {
		return classifyIOError(err)
	}
	return nil
}

// imageOf is the image a capture of s in dir restores to.
func (s *sandbox) imageOf(dir string) image {
	s.mu.Lock()
	defer s.mu.Unlock()
	return image{Dir: dir, Spec: s.rec.Spec, Template: s.rec.Template}
}

// ForkChild and ForkResult describe a fork: the host contract's.
type (
	ForkChild  = host.ForkChild
	ForkResult = host.ForkResult
)

// Fork captures the running sandbox id once and restores len(ids)
// children from that capture, in parallel. Children see the parent's
// memory and disk as they were at the capture, copy-on-write; each gets
// its own identity, clock and RNG reseed before any command runs. The
// parent keeps its id, processes and open streams. A child that fails to
// start is reported in its ForkChild; the others are unaffected.
func (a *Agent) Fork(ctx context.Context, id string, ids []string) (ForkResult, error) {
	return a.fork(ctx, id, ids, false)
}

// ForkNaive is Fork where every child gets a full private copy of the
// parent's memory (all of guest RAM copied into the child's VMM at start):
// O(RAM) time and memory per child, no page sharing. It exists only
// as the baseline `panda bench fork` measures Fork against.
func (a *Agent) ForkNaive(ctx context.Context, id string, ids []string) (ForkResult, error) {
	return a.fork(ctx, id, ids, true)
}

func (a *Agent) fork(ctx context.Context, id string, ids []string, naive bool) (ForkResult, error) {
	var res ForkResult
	if len(ids) == 0 {
		return res, fmt.Errorf("fork: %w: no children requested", ErrInvalid)
	}
	for _, cid := range ids {
		if !host.ValidID(cid) {
			return res, fmt.Errorf("fork: %w: id %q must be lowercase letters and digits", ErrInvalid, cid)
		}
	}
	parent, err := a.get(id)
	if err != nil {
		return res, err
	}
	if err := a.checkSpace(); err != nil {
		return res, fmt.Errorf("fork: %w", err)
	}
	octx, end, err := parent.begin(ctx, "fork", StateRunning)
	if err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp(filepath.Join(a.vol.Dir, "forks"), id+"-")
	if err != nil {
		end()
		return res, fmt.Errorf("fork: %w", classifyIOError(err))
	}
	// The capture's files live on in the children (hard links, reflinks).
	// A fork's capture is transient: it is neither flushed nor sealed, and
	// recovery removes it after a crash.
	defer os.RemoveAll(dir)
	res.Capture, err = a.capture(octx, parent, dir, false)
	im := parent.imageOf(dir)
	im.fullCopy = naive
	parent.mu.Lock()
	env, cwd, user, owner, policy, lineage := parent.rec.Env, parent.rec.Cwd, parent.rec.User, parent.rec.Owner, parent.rec.Network, parent.rec.lineage()
	parent.mu.Unlock()
	end()
	if err != nil {
		if parent.stopping() {
			return res, errStopped(parent, "fork")
		}
		return res, fmt.Errorf("fork %s: %w", id, err)
	}
	failpoint.Hit("fork-captured")
	a.log.Info("fork captured", "sandbox_id", id, "children", len(ids), "paused_ms", res.Capture.PausedMS,
		"dirty_mib", res.Capture.DirtyBytes>>20)

	res.Children = make([]ForkChild, len(ids))
	var wg sync.WaitGroup
	for i, cid := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := a.register(record{ID: cid, Env: env, Cwd: cwd, User: user, Owner: owner, ParentID: id, Lineage: lineage, Network: policy})
			if err != nil {
				res.Children[i].Err = err
				return
			}
			if err := a.start(ctx, s, im); err != nil {
				res.Children[i].Err = fmt.Errorf("restore child %s: %w", cid, err)
				return
			}
			res.Children[i].Info = s.info()
		}()
	}
	wg.Wait()
	return res, nil
}

// SnapshotInfo is a snapshot as this host records it: capture.Info.
type SnapshotInfo = capture.Info

// snapshotImage is the image a snapshot restores.
func (a *Agent) snapshotImage(si SnapshotInfo) image {
	return image{Dir: a.snapshotDir(si.ID), Spec: si.Spec, Template: si.Template, lineage: lineageOf(si)}
}

func (a *Agent) snapshotDir(id string) string { return filepath.Join(a.vol.Dir, "snapshots", id) }

// snapshotMeta is the snapshot's metadata file inside its directory.
const snapshotMeta = capture.MetaFile

// Snapshot captures the running sandbox id into a durable snapshot
// snapID. The sandbox runs on. When Snapshot returns, the snapshot's files
// are on stable storage with their checksums (a crash before that leaves
// only a temporary directory that recovery removes).
func (a *Agent) Snapshot(ctx context.Context, id, snapID string) (SnapshotInfo, error) {
	return a.snapshot(ctx, id, snapID, false)
}

// SnapshotTransient is Snapshot for a capture that only carries the
// sandbox to other hosts through the object store (a cross-host fork):
// the caller deletes it once they have restored from it. It is neither
// sealed with checksums nor flushed here: the object store's chunks are
// content-addressed and checked on every fetch, and a restart of this
// agent deletes it (SnapshotInfo.Transient; dropTransient), from the store
// too. Everything else is as for Snapshot (it restores, lists and
// deletes as a snapshot), except that its upload starts only once someone
// waits for it (AwaitStored): a capture sent straight to the other hosts
// (SendSnapshot) never goes to the store.
func (a *Agent) SnapshotTransient(ctx context.Context, id, snapID string) (SnapshotInfo, error) {
	return a.snapshot(ctx, id, snapID, true)
}

func (a *Agent) snapshot(ctx context.Context, id, snapID string, transient bool) (SnapshotInfo, error) {
	if !host.ValidID(snapID) {
		return SnapshotInfo{}, fmt.Errorf("snapshot: %w: id %q must be lowercase letters and digits", ErrInvalid, snapID)
	}
	s, err := a.get(id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if err := a.checkSpace(); err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot: %w", err)
	}
	dir := a.snapshotDir(snapID)
	if _, err := os.Stat(dir); err == nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w: exists", snapID, ErrConflict)
	}
	if _, ok := a.sync.Record(snapID); ok {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w: exists (in the object store)", snapID, ErrConflict)
	}
	ctx, end, err := s.begin(ctx, "snapshot", StateRunning)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer end()
	t0 := time.Now()
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	st, err := a.capture(ctx, s, tmp, false)
	if err != nil {
		if s.stopping() {
			return SnapshotInfo{}, errStopped(s, "snapshot")
		}
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	tCapture := time.Since(t0)
	s.mu.Lock()
	si := SnapshotInfo{SnapshotInfo: host.SnapshotInfo{ID: snapID, SandboxID: id, Template: s.rec.Template, CreatedAt: time.Now().UTC(), Capture: st, Transient: transient, Lineage: s.rec.lineage()}, Spec: s.rec.Spec}
	s.mu.Unlock()
	// Per-machine paths are not part of a snapshot.
	si.Spec.MemoryFile, si.Spec.Disk, si.Spec.RunDir, si.Spec.ConsoleLog = "", "", "", ""
	si.SizeBytes = allocated(tmp)
	err = writeJSON(filepath.Join(tmp, snapshotMeta), si, false)
	switch {
	case err != nil:
	case transient:
		// Complete once renamed (recovery removes a .tmp directory, and
		// the snapshot once it is named: it is transient).
		err = os.Rename(tmp, dir)
	default:
		_, err = manifest.Seal(tmp, memFile, stateFile, diskFile, snapshotMeta)
		if err == nil {
			err = manifest.Rename(tmp, dir)
		}
	}
	if err != nil {
		os.RemoveAll(tmp)
		return SnapshotInfo{}, fmt.Errorf("snapshot: %w", classifyIOError(err))
	}
	if fp, err := manifest.Fingerprint(dir); err == nil {
		a.mu.Lock()
		a.verified[snapID] = fp // its checksums were just computed from these files
		a.mu.Unlock()
	}
	a.log.Info("snapshot taken", "sandbox_id", id, "snapshot_id", snapID, "transient", transient, "paused_ms", st.PausedMS, "dirty_mib", st.DirtyBytes>>20,
		"capture_ms", tCapture.Milliseconds(), "seal_ms", (time.Since(t0) - tCapture).Milliseconds(), "dur_ms", time.Since(t0).Milliseconds())
	a.storeState(&si) // uploading (or local): before the upload can end
	if !transient {
		// A transient capture is uploaded once someone waits for it
		// (AwaitStored): one sent straight to another host never is.
		a.sync.StartUpload(snapID)
	}
	return si, nil
}

// GetSnapshot describes a snapshot; ErrNotFound if there is none. A
// snapshot durable in the object store whose directory this host lost is
// described from its record (and fetched by the next create from it).
func (a *Agent) GetSnapshot(id string) (SnapshotInfo, error) {
	if !host.ValidID(id) {
		return SnapshotInfo{}, fmt.Errorf("snapshot %q: %w", id, ErrNotFound)
	}
	rec, stored := a.sync.Record(id)
	if stored && rec.Deleted {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, ErrNotFound)
	}
	dir := a.snapshotDir(id)
	b, err := os.ReadFile(filepath.Join(dir, snapshotMeta))
	if errors.Is(err, os.ErrNotExist) {
		if a.store != nil && stored && rec.Durable {
			si := rec.Snapshot
			a.storeState(&si)
			return si, nil
		}
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("read snapshot %s: %w", id, err)
	}
	var si SnapshotInfo
	if err := json.Unmarshal(b, &si); err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w: unreadable metadata", id, ErrCorrupt)
	}
	a.storeState(&si)
	return si, nil
}

// verifySnapshot checks a snapshot's files against their checksums before
// a restore: ErrCorrupt if they do not match. Files unchanged since they
// last passed (same fingerprint) are not read again. Snapshots taken
// before checksums existed have no manifest and are trusted as they are.
func (a *Agent) verifySnapshot(si SnapshotInfo) error {
	fp, err := manifest.Fingerprint(a.snapshotDir(si.ID))
	if err == nil {
		a.mu.Lock()
		ok := a.verified[si.ID] == fp
		a.mu.Unlock()
		if ok {
			return nil
		}
	}
	if err := capture.Verify(a.snapshotDir(si.ID)); err != nil {
		a.log.Error("snapshot failed its checksums", "snapshot_id", si.ID, "err", err)
		return fmt.Errorf("snapshot %s: %w: its files do not match their checksums; delete it", si.ID, ErrCorrupt)
	}
	if fp != "" {
		a.mu.Lock()
		a.verified[si.ID] = fp
		a.mu.Unlock()
	}
	return nil
}

// Snapshots lists the snapshots on this host, and those durable in its
// object store whose files it lost, oldest first. A snapshot whose
// metadata cannot be read is listed with its ID only (it exists, but
// nothing more is known of it).
func (a *Agent) Snapshots() []SnapshotInfo {
	ents, _ := os.ReadDir(filepath.Join(a.vol.Dir, "snapshots"))
	var out []SnapshotInfo
	seen := map[string]bool{}
	for _, e := range ents {
		if !host.ValidID(e.Name()) {
			continue // a snapshot being taken (.tmp), fetched (.fetch) or deleted (.deleting)
		}
		seen[e.Name()] = true
		si, err := a.GetSnapshot(e.Name())
		if errors.Is(err, ErrNotFound) {
			continue // deleted, its directory not removed yet
		}
		if err != nil {
			si = SnapshotInfo{SnapshotInfo: host.SnapshotInfo{ID: e.Name()}}
		}
		out = append(out, si)
	}
	if a.store != nil {
		recs, _ := os.ReadDir(filepath.Join(a.vol.Dir, storesync.StoredDir))
		for _, e := range recs {
			id, ok := strings.CutSuffix(e.Name(), ".json")
			if !ok || seen[id] || !host.ValidID(id) {
				continue
			}
			if si, err := a.GetSnapshot(id); err == nil {
				out = append(out, si)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// deletingSuffix marks a snapshot directory being deleted.
const deletingSuffix = ".deleting"

// DeleteSnapshot removes a snapshot. Sandboxes restored from it keep
// running: they hold their own links to its files. The snapshot is gone
// at once (its directory is renamed away, then removed): a crash in the
// middle leaves no half snapshot, only a directory recovery removes.
// With an object store, a tombstone is written first and the snapshot's
// manifest in the store is removed in the background (store.go).
func (a *Agent) DeleteSnapshot(id string) error {
	if !host.ValidID(id) {
		return fmt.Errorf("snapshot %q: %w", id, ErrNotFound)
	}
	dir := a.snapshotDir(id)
	si, err := a.GetSnapshot(id)
	if err != nil {
		if _, serr := os.Stat(dir); serr != nil {
			return fmt.Errorf("snapshot %s: %w", id, ErrNotFound)
		}
		si = SnapshotInfo{SnapshotInfo: host.SnapshotInfo{ID: id}} // unreadable metadata: delete it all the same
	}
	if a.store != nil {
		// Not while a create downloads it (that would put it back).
		defer a.sync.LockSnapshots()()
		// The tombstone first: from here the snapshot is gone, and a
		// crash leaves the rest to the next start.
		if err := a.sync.Forget(id, si); err != nil {
			return err
		}
	}
	gone := dir + deletingSuffix
	if err := os.Rename(dir, gone); err != nil && !(a.store != nil && errors.Is(err, os.ErrNotExist)) {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	if err := os.RemoveAll(gone); err != nil {
		a.log.Error("remove files of a deleted snapshot", "snapshot_id", id, "err", err)
	}
	a.mu.Lock()
	delete(a.verified, id)
	a.mu.Unlock()
	if a.store != nil {
		a.sync.StartDelete(id)
	}
	return nil
}

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

// allocated sums the allocated blocks of the files in dir.
func allocated(dir string) int64 {
	var total int64
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(dir, e.Name()), &st) == nil {
			total += st.Blocks * 512
		}
	}
	return total
}
