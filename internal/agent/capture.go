package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/memimage"
	"github.com/pandastack/pandastack/internal/vmm"
	"github.com/pandastack/pandastack/internal/volume"
	"golang.org/x/sys/unix"
)

// CaptureStats describes one capture of a running sandbox.
type CaptureStats struct {
	// Paused is how long the sandbox's vCPUs were stopped.
	Paused time.Duration `json:"-"`
	// PausedMS is Paused in milliseconds.
	PausedMS float64 `json:"paused_ms"`
	// DirtyBytes is how much guest RAM the sandbox had written since its
	// restore: what the capture copied.
	DirtyBytes int64 `json:"dirty_bytes"`
	// Runs is the number of contiguous dirty ranges.
	Runs int `json:"runs"`
}

// captureTimeout bounds one capture (barrier, pause, save, resume).
const captureTimeout = 60 * time.Second

// capture saves a running sandbox into dir (created): device state,
// memory image (a reflink of the sandbox's base image patched with the
// pages it dirtied) and disk (a reflink taken while the vCPUs are
// stopped, so disk and memory agree). The guest channel is quiesced with a
// barrier first so that any copy restored from dir starts at a frame
// boundary. Unless keepPaused, the sandbox then runs on: its open streams
// and processes continue. The caller holds s.op.
func (a *Agent) capture(ctx context.Context, s *sandbox, dir string, keepPaused bool) (CaptureStats, error) {
	var st CaptureStats
	s.mu.Lock()
	m, client, state := s.m, s.client, s.state
	s.mu.Unlock()
	if state != StateRunning || m == nil || client == nil {
		return st, fmt.Errorf("sandbox %s is %s, not running: %w", s.rec.ID, state, ErrConflict)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return st, classifyIOError(err)
	}
	// Bounded: a hung guest or VMM must not hold s.op (and so block Kill)
	// forever.
	ctx, cancel := context.WithTimeout(ctx, captureTimeout)
	defer cancel()
	if err := client.Barrier(ctx); err != nil {
		client.Resume(context.WithoutCancel(ctx))
		return st, fmt.Errorf("quiesce guest agent: %w", err)
	}
	t0 := time.Now()
	if err := m.Pause(ctx); err != nil {
		client.Resume(context.WithoutCancel(ctx))
		return st, err
	}
	err := a.saveMachine(ctx, s, m, dir, &st)
	if !keepPaused || err != nil {
		// Always run the sandbox on after a failed capture.
		bg := context.WithoutCancel(ctx)
		if rerr := m.Resume(bg); rerr != nil && err == nil {
			err = rerr
		}
		st.Paused = time.Since(t0)
		if rerr := client.Resume(bg); rerr != nil && err == nil {
			err = fmt.Errorf("resume guest agent: %w", rerr)
		}
	} else {
		st.Paused = time.Since(t0)
	}
	st.PausedMS = ms(st.Paused)
	if err != nil {
		os.RemoveAll(dir)
		return st, err
	}
	return st, nil
}

func (a *Agent) saveMachine(ctx context.Context, s *sandbox, m vmm.Machine, dir string, st *CaptureStats) error {
	if err := m.SaveState(ctx, filepath.Join(dir, "vm.state")); err != nil {
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
	mem := filepath.Join(dir, "vm.mem")
	if _, err := memimage.Write(mem, s.rec.Spec.MemoryFile, volume.Clone, region, pm.Dirty); err != nil {
		return classifyIOError(err)
	}
	if err := volume.Clone(s.rec.Spec.Disk, filepath.Join(dir, "rootfs.ext4")); err != nil {
		return classifyIOError(err)
	}
	return nil
}

// imageOf is the image a capture of s in dir restores to.
func (s *sandbox) imageOf(dir string) image {
	return image{Dir: dir, Spec: s.rec.Spec, Template: s.rec.Template}
}

// ForkChild is the outcome of one child of a fork.
type ForkChild struct {
	Info Info
	Err  error
}

// ForkResult describes a fork.
type ForkResult struct {
	Children []ForkChild
	Capture  CaptureStats
}

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
		if !ValidID(cid) {
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
	parent.op.Lock()
	dir, err := os.MkdirTemp(filepath.Join(a.vol.Dir, "forks"), id+"-")
	if err != nil {
		parent.op.Unlock()
		return res, fmt.Errorf("fork: %w", classifyIOError(err))
	}
	// The capture's files live on in the children (hard links, reflinks).
	defer os.RemoveAll(dir)
	res.Capture, err = a.capture(ctx, parent, dir, false)
	im := parent.imageOf(dir)
	im.fullCopy = naive
	env := parent.rec.Env
	parent.op.Unlock()
	if err != nil {
		return res, fmt.Errorf("fork %s: %w", id, err)
	}
	a.log.Info("fork captured", "sandbox_id", id, "children", len(ids), "paused_ms", res.Capture.PausedMS,
		"dirty_mib", res.Capture.DirtyBytes>>20)

	res.Children = make([]ForkChild, len(ids))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4) // bound concurrent VMM starts
	for i, cid := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			s, err := a.register(cid, env)
			if err != nil {
				res.Children[i].Err = err
				return
			}
			s.rec.ParentID = id
			if err := a.restore(ctx, s, im, false); err != nil {
				a.discard(s)
				res.Children[i].Err = fmt.Errorf("restore child %s: %w", cid, err)
				return
			}
			res.Children[i].Info = s.info()
		}()
	}
	wg.Wait()
	return res, nil
}

// SnapshotInfo describes a durable snapshot.
type SnapshotInfo struct {
	ID        string       `json:"id"`
	SandboxID string       `json:"sandbox_id"`
	Template  string       `json:"template"`
	Spec      vmm.Spec     `json:"spec"`
	CreatedAt time.Time    `json:"created_at"`
	Capture   CaptureStats `json:"capture"`
	// SizeBytes is the disk space the snapshot holds on its own (blocks
	// not shared with its template through reflinks are not known to the
	// file system; this counts allocated blocks of its files).
	SizeBytes int64 `json:"size_bytes"`
	dir       string
}

func (si SnapshotInfo) image() image {
	return image{Dir: si.dir, Spec: si.Spec, Template: si.Template}
}

func (a *Agent) snapshotDir(id string) string { return filepath.Join(a.vol.Dir, "snapshots", id) }

// Snapshot captures the running sandbox id into a durable snapshot
// snapID. The sandbox runs on.
func (a *Agent) Snapshot(ctx context.Context, id, snapID string) (SnapshotInfo, error) {
	if !ValidID(snapID) {
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
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	s.op.Lock()
	st, err := a.capture(ctx, s, tmp, false)
	si := SnapshotInfo{ID: snapID, SandboxID: id, Template: s.rec.Template, Spec: s.rec.Spec, CreatedAt: time.Now().UTC(), Capture: st}
	s.op.Unlock()
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	// Per-machine paths are not part of a snapshot.
	si.Spec.MemoryFile, si.Spec.Disk, si.Spec.RunDir, si.Spec.ConsoleLog = "", "", "", ""
	si.SizeBytes = allocated(tmp)
	if err := writeJSON(filepath.Join(tmp, "snapshot.json"), si); err != nil {
		os.RemoveAll(tmp)
		return SnapshotInfo{}, classifyIOError(err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		return SnapshotInfo{}, fmt.Errorf("snapshot: %w", err)
	}
	si.dir = dir
	a.log.Info("snapshot taken", "sandbox_id", id, "snapshot_id", snapID, "paused_ms", st.PausedMS, "dirty_mib", st.DirtyBytes>>20)
	return si, nil
}

// GetSnapshot describes a snapshot; ErrNotFound if there is none.
func (a *Agent) GetSnapshot(id string) (SnapshotInfo, error) {
	if !ValidID(id) {
		return SnapshotInfo{}, fmt.Errorf("snapshot %q: %w", id, ErrNotFound)
	}
	dir := a.snapshotDir(id)
	b, err := os.ReadFile(filepath.Join(dir, "snapshot.json"))
	if errors.Is(err, os.ErrNotExist) {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("read snapshot %s: %w", id, err)
	}
	var si SnapshotInfo
	if err := json.Unmarshal(b, &si); err != nil {
		return SnapshotInfo{}, fmt.Errorf("read snapshot %s: %w", id, err)
	}
	si.dir = dir
	return si, nil
}

// Snapshots lists the snapshots on this host, oldest first.
func (a *Agent) Snapshots() []SnapshotInfo {
	ents, _ := os.ReadDir(filepath.Join(a.vol.Dir, "snapshots"))
	var out []SnapshotInfo
	for _, e := range ents {
		if si, err := a.GetSnapshot(e.Name()); err == nil {
			out = append(out, si)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// DeleteSnapshot removes a snapshot. Sandboxes restored from it keep
// running: they hold their own links to its files.
func (a *Agent) DeleteSnapshot(id string) error {
	if _, err := a.GetSnapshot(id); err != nil {
		return err
	}
	if err := os.RemoveAll(a.snapshotDir(id)); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	return nil
}

// Pause captures a running sandbox to disk and stops its VMM, freeing its
// memory. Resume brings it back under the same id.
func (a *Agent) Pause(ctx context.Context, id string) (CaptureStats, error) {
	s, err := a.get(id)
	if err != nil {
		return CaptureStats{}, err
	}
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	state := s.state
	s.mu.Unlock()
	if state != StateRunning {
		return CaptureStats{}, fmt.Errorf("pause: sandbox %s is %s, not running: %w", id, state, ErrConflict)
	}
	dir := filepath.Join(s.dir, "paused")
	os.RemoveAll(dir) // a leftover of a failed pause
	st, err := a.capture(ctx, s, dir, true)
	if err != nil {
		return st, fmt.Errorf("pause %s: %w", id, err)
	}
	s.mu.Lock()
	m, client := s.m, s.client
	s.m, s.client = nil, nil // the watcher ignores the exit of a VMM that is no longer s.m
	s.state = StatePaused
	s.rec.State = StatePaused
	s.mu.Unlock()
	client.Close()
	m.Kill()
	// The disk and memory the VMM used are superseded by the capture.
	os.Remove(filepath.Join(s.dir, "rootfs.ext4"))
	os.Remove(filepath.Join(s.dir, "vm.mem"))
	os.Remove(filepath.Join(s.dir, "vm.state"))
	if err := writeJSON(filepath.Join(s.dir, "sandbox.json"), s.rec); err != nil {
		return st, classifyIOError(err)
	}
	a.log.Info("sandbox paused", "sandbox_id", id, "paused_ms", st.PausedMS, "dirty_mib", st.DirtyBytes>>20)
	return st, nil
}

// Resume restores a paused sandbox from its capture, same id, hostname
// and files; processes continue where they were.
func (a *Agent) Resume(ctx context.Context, id string) (Info, error) {
	s, err := a.get(id)
	if err != nil {
		return Info{}, err
	}
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	state := s.state
	s.mu.Unlock()
	if state != StatePaused {
		return Info{}, fmt.Errorf("resume: sandbox %s is %s, not paused: %w", id, state, ErrConflict)
	}
	s.mu.Lock()
	s.state = StateStarting
	s.mu.Unlock()
	dir := filepath.Join(s.dir, "paused")
	if err := a.restore(ctx, s, s.imageOf(dir), true); err != nil {
		a.log.Error("resume failed", "sandbox_id", id, "err", err)
		// The capture may have been moved into place already: the sandbox
		// cannot be brought back consistently, so it ends here.
		a.discard(s)
		return Info{}, fmt.Errorf("resume %s: %w", id, err)
	}
	os.RemoveAll(dir)
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
