package hostagent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/pandastack/pandastack/internal/contract/failpoint"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/memimage"
	"github.com/pandastack/pandastack/internal/hostagent/internal/volume"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
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
