package hostagent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/pandastack/pandastack/internal/contract/failpoint"
	"github.com/pandastack/pandastack/internal/contract/host"
)

// ForkChild and ForkResult describe a fork: the host contract's.
type (
	ForkChild  = host.ForkChild
	ForkResult = host.ForkResult
)

// Fork captures the running sandbox id once and restores len(ids)
// children from that capture, in parallel. Children see the parent's
// memory and disk as they were at the capture, copy-on-write, and mount
// the parent's volumes (the same volumes: what one writes, the others
// read); each gets its own identity, clock and RNG reseed before any
// command runs. The parent keeps its id, processes and open streams. A
// child that fails to start is reported in its ForkChild; the others are
// unaffected.
func (a *Agent) Fork(ctx context.Context, id string, ids []string) (ForkResult, error) {
	return a.fork(ctx, id, specsOf(ids), false)
}

// ForkNaive is Fork where every child gets a full private copy of the
// parent's memory (all of guest RAM copied into the child's VMM at start):
// O(RAM) time and memory per child, no page sharing. It exists only
// as the baseline `panda bench fork` measures Fork against.
func (a *Agent) ForkNaive(ctx context.Context, id string, ids []string) (ForkResult, error) {
	return a.fork(ctx, id, specsOf(ids), true)
}

// ForkWithVolumes is Fork where each child says what it mounts
// (host.ForkSpec): its Branches are cloned from their volumes while the
// parent is stopped for the capture, so that each branch holds what the
// parent's volume held at the instant the child's memory was captured.
// A branch that cannot be made fails the whole fork (the branches made
// are deleted), before any child starts.
func (a *Agent) ForkWithVolumes(ctx context.Context, id string, children []host.ForkSpec) (ForkResult, error) {
	return a.fork(ctx, id, children, false)
}

func specsOf(ids []string) []host.ForkSpec {
	specs := make([]host.ForkSpec, len(ids))
	for i, cid := range ids {
		specs[i] = host.ForkSpec{ID: cid}
	}
	return specs
}

// checkForkSpecs checks the children of a fork: ids, and the volumes they
// mount and branch.
func (a *Agent) checkForkSpecs(children []host.ForkSpec) error {
	if len(children) == 0 {
		return fmt.Errorf("fork: %w: no children requested", ErrInvalid)
	}
	made := map[string]bool{}
	for _, c := range children {
		if !host.ValidID(c.ID) {
			return fmt.Errorf("fork: %w: id %q must be lowercase letters and digits", ErrInvalid, c.ID)
		}
		for _, b := range c.Branches {
			if made[b.To] {
				return fmt.Errorf("fork: %w: volume %s is branched twice", ErrInvalid, b.To)
			}
			made[b.To] = true
			if _, err := a.vols.Get(b.From); err != nil {
				return fmt.Errorf("fork: branch volume %s: %w", b.From, err)
			}
		}
	}
	for _, c := range children {
		if c.Volumes == nil {
			continue
		}
		if err := a.checkMounts(c.Volumes, made); err != nil {
			return fmt.Errorf("fork: child %s: %w", c.ID, err)
		}
	}
	return nil
}

func (a *Agent) fork(ctx context.Context, id string, children []host.ForkSpec, naive bool) (ForkResult, error) {
	var res ForkResult
	if err := a.checkForkSpecs(children); err != nil {
		return res, err
	}
	var branches []host.VolumeBranch
	for _, c := range children {
		branches = append(branches, c.Branches...)
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
	res.Capture, err = a.capture(octx, parent, dir, len(branches) > 0)
	if err == nil && len(branches) > 0 {
		// The parent is stopped: its volumes hold what its memory says
		// they do.
		err = a.branchVolumes(branches)
		parent.mu.Lock()
		m, client := parent.m, parent.client
		parent.mu.Unlock()
		if rerr := a.runOn(parent, m, client); rerr != nil && err == nil {
			err = rerr
		}
	}
	im := parent.imageOf(dir)
	im.fullCopy = naive
	parent.mu.Lock()
	env, cwd, user, owner, policy, lineage, mounts := parent.rec.Env, parent.rec.Cwd, parent.rec.User, parent.rec.Owner, parent.rec.Network, parent.rec.lineage(), parent.rec.Volumes
	parent.mu.Unlock()
	end()
	if err != nil {
		if parent.stopping() {
			return res, errStopped(parent, "fork")
		}
		return res, fmt.Errorf("fork %s: %w", id, err)
	}
	failpoint.Hit("fork-captured")
	a.log.Info("fork captured", "sandbox_id", id, "children", len(children), "paused_ms", res.Capture.PausedMS,
		"dirty_mib", res.Capture.DirtyBytes>>20, "volume_branches", len(branches))

	res.Children = make([]ForkChild, len(children))
	var wg sync.WaitGroup
	for i, c := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vols := mounts
			if c.Volumes != nil {
				vols = c.Volumes
			}
			a.mountMu.RLock()
			err := a.checkMounts(vols, nil) // still there?
			var s *sandbox
			if err == nil {
				s, err = a.register(record{ID: c.ID, Env: env, Cwd: cwd, User: user, Owner: owner, ParentID: id, Lineage: lineage, Network: policy, Volumes: vols})
			}
			a.mountMu.RUnlock()
			if err != nil {
				res.Children[i].Err = err
				return
			}
			s.mu.Lock()
			s.dropMounts = len(mounts) > 0 && len(vols) == 0
			s.mu.Unlock()
			if err := a.start(ctx, s, im); err != nil {
				res.Children[i].Err = fmt.Errorf("restore child %s: %w", c.ID, err)
				return
			}
			res.Children[i].Info = s.info()
		}()
	}
	wg.Wait()
	return res, nil
}

// branchVolumes makes every branch of a fork, or none: on a failure the
// branches made are deleted.
func (a *Agent) branchVolumes(branches []host.VolumeBranch) error {
	for i, b := range branches {
		if _, err := a.vols.Branch(b.From, b.To); err != nil {
			for _, done := range branches[:i] {
				if derr := a.vols.Delete(done.To); derr != nil {
					a.log.Error("delete the branch of a failed fork", "volume_id", done.To, "err", derr)
				}
			}
			return fmt.Errorf("branch volume %s to %s: %w", b.From, b.To, err)
		}
	}
	return nil
}
