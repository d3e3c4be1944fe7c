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
